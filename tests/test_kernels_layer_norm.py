"""Fused (dropout + residual add) LayerNorm: the Triton kernels (Triton's interpreter on the CPU, or compiled on a
GPU) against the float64 PyTorch reference: output, dx, d(residual), dgamma, dbeta; dropout; torch.library."""
import zlib

import pytest
import torch
import torch.nn.functional as F

from bertkit.kernels.reference import add_layer_norm_reference
from tests.kernel_utils import (
    INTERPRETED,
    TOLERANCE,
    binomial_ok,
    cuda_only,
    interpreter_only,
    parent_only,
    poisoned,
    reference_keep,
    rel_err,
    run_file_under_interpreter,
)

INTERPRETER_CASES = 13


@pytest.mark.slow
@parent_only
def test_under_interpreter():
    run_file_under_interpreter(__file__, INTERPRETER_CASES)


def _inputs(rows, hidden, dtype, residual, gen, device="cpu", strided=False):
    f64 = dict(dtype=torch.float64, device=device, generator=gen)
    x = torch.randn(rows, hidden + (24 if strided else 0), **f64)[:, :hidden]  # strided: row stride > hidden
    r = torch.randn(rows, hidden, **f64) if residual else None
    w = 1.0 + 0.5 * torch.randn(hidden, **f64)
    b = 0.5 * torch.randn(hidden, **f64)
    return [t.to(dtype) if t is not None else None for t in (x, r, w, b)]


def _reference(x, r, w, b, dy, eps, p=0.0, mask=None):
    leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (x, r, w, b)]
    y = add_layer_norm_reference(*leaves, eps, p, dropout_mask=mask)
    y.backward(dy.double())
    return y.detach(), [t.grad if t is not None else None for t in leaves]


@interpreter_only
@pytest.mark.parametrize("dtype,rows,hidden,residual,p", [
    (torch.float32, 37, 128, True, 0.0),
    (torch.float16, 50, 768, True, 0.0),
    (torch.float32, 9, 1000, False, 0.0),
    (torch.float16, 6, 4096, True, 0.0),
    (torch.float32, 40, 256, True, 0.2),
    (torch.float16, 21, 384, False, 0.1),
])
def test_matches_reference(dtype, rows, hidden, residual, p):
    from bertkit.kernels.common import draw_seed
    from bertkit.kernels.layer_norm import add_ln_backward, add_ln_forward, ln_dropout_mask

    gen = torch.Generator().manual_seed(zlib.crc32(f"{dtype}{rows}{hidden}{residual}{p}".encode()))
    x, r, w, b = _inputs(rows, hidden, dtype, residual, gen, strided=(hidden == 1000))
    dy = torch.randn(rows, hidden, generator=gen, dtype=torch.float64).to(dtype)
    eps = 1e-5
    seed = draw_seed("cpu")
    mask = ln_dropout_mask(seed, rows, hidden, p) if p > 0 else None
    store_h = residual or p > 0

    y, h, mean, rstd = add_ln_forward(x, r, w, b, seed, eps, p, y=poisoned(x.shape, dtype),
                                      h=poisoned(x.shape, dtype) if store_h else None)
    dh, dx, dw, db = add_ln_backward(dy, h if store_h else x, w, mean, rstd, seed, p,
                                     dh=poisoned(x.shape, dtype), dx=poisoned(x.shape, dtype) if p > 0 else None)
    grad_x = dx if p > 0 else dh
    ref_y, (ref_dx, ref_dr, ref_dw, ref_db) = _reference(x, r, w, b, dy, eps, p, mask)

    tol = TOLERANCE[dtype]
    assert rel_err(y, ref_y) <= tol
    assert rel_err(grad_x, ref_dx) <= tol
    if residual:
        assert rel_err(dh, ref_dr) <= tol
    assert rel_err(dw, ref_dw) <= tol
    assert rel_err(db, ref_db) <= tol
    if p > 0:
        assert torch.equal(grad_x == 0, ~mask | (dh == 0))  # dropped elements get exactly zero gradient


@interpreter_only
@pytest.mark.parametrize("dtype,p", [(torch.float32, 0.0), (torch.float16, 0.0), (torch.float32, 0.15)])
def test_prenorm_returns_the_sum_and_takes_its_gradient(dtype, p):
    """Pre-LN: (LayerNorm(h), h) with h = dropout(x) + residual from one pass; backward adds h's own incoming gradient
    (the residual stream's) to LayerNorm's, in the kernel. Against the reference with the kernel's dropout mask."""
    from bertkit import kernels
    from bertkit.kernels.common import draw_seed
    from bertkit.kernels.layer_norm import add_layer_norm_triton, ln_dropout_mask

    gen = torch.Generator().manual_seed(7)
    x, r, w, b = _inputs(2 * 13, 160, dtype, True, gen)
    leaves = [t.view(2, 13, 160).requires_grad_() if t.dim() == 2 else t.requires_grad_() for t in (x, r, w, b)]
    dy, dh = (torch.randn(2, 13, 160, generator=gen, dtype=torch.float64).to(dtype) for _ in range(2))
    torch.manual_seed(3)  # the seed the op draws, drawn again below for the reference's mask
    y, h = add_layer_norm_triton(*leaves, 1e-12, p, prenorm=True)
    torch.manual_seed(3)
    mask = ln_dropout_mask(draw_seed("cpu"), 26, 160, p).view(2, 13, 160) if p > 0 else None
    torch.autograd.backward([y, h], [dy, dh])
    ref = [t.detach().double().requires_grad_() for t in leaves]
    ref_y, ref_h = add_layer_norm_reference(*ref, 1e-12, p, prenorm=True, dropout_mask=mask)
    torch.autograd.backward([ref_y, ref_h], [dy.double(), dh.double()])
    tol = TOLERANCE[dtype]
    assert rel_err(y, ref_y) <= tol and rel_err(h, ref_h) <= tol
    for leaf, r64 in zip(leaves, ref):
        assert rel_err(leaf.grad, r64.grad) <= tol
    # only h used (unused outputs get no zero-filled gradient): its gradient alone reaches x and the residual
    for leaf in leaves:
        leaf.grad = None
    torch.manual_seed(3)
    _, h = add_layer_norm_triton(*leaves, 1e-12, p, prenorm=True)
    h.backward(dh)
    for leaf in ref:
        leaf.grad = None
    add_layer_norm_reference(*ref, 1e-12, p, prenorm=True, dropout_mask=mask)[1].backward(dh.double())
    for leaf, r64 in zip(leaves[:2], ref[:2]):
        assert rel_err(leaf.grad, r64.grad) <= tol
    assert not leaves[2].grad.any() and not leaves[3].grad.any()
    with pytest.raises(ValueError, match="needs one"):
        kernels.add_layer_norm(leaves[0], None, leaves[2], leaves[3], 1e-12, 0.0, prenorm=True)


@interpreter_only
def test_public_api_autograd_and_3d_input():
    """kernels.add_layer_norm goes through the torch.library op under the interpreter, on (batch, seq, hidden)."""
    from bertkit import kernels

    gen = torch.Generator().manual_seed(1)
    x, r, w, b = _inputs(3 * 11, 192, torch.float32, True, gen)
    leaves = [t.view(3, 11, 192).requires_grad_() if t.dim() == 2 else t.requires_grad_() for t in (x, r, w, b)]
    y = kernels.add_layer_norm(*leaves, 1e-12, 0.0)
    dy = torch.randn(y.shape, generator=gen)
    y.backward(dy)
    ref_y, ref_grads = _reference(*leaves, dy, 1e-12)
    assert y.shape == (3, 11, 192)
    assert rel_err(y, ref_y) <= 1e-5
    for leaf, ref in zip(leaves, ref_grads):
        assert rel_err(leaf.grad, ref) <= 1e-5

    # autocast-style mix: an fp16 branch onto an fp32 residual stream stays fp32, like PyTorch's add
    x16 = x.view(3, 11, 192).half().requires_grad_()
    r32 = r.view(3, 11, 192).clone().requires_grad_()
    y = kernels.add_layer_norm(x16, r32, w.detach(), b.detach(), 1e-12, 0.0)
    assert y.dtype == torch.float32
    y.backward(dy)
    ref_y, (ref_dx, ref_dr, _, _) = _reference(x16, r32, w, b, dy, 1e-12)
    assert rel_err(y, ref_y) <= 1e-5
    assert x16.grad.dtype == torch.float16 and rel_err(x16.grad, ref_dx) <= 2e-3
    assert rel_err(r32.grad, ref_dr) <= 1e-5


@interpreter_only
def test_dropout_keep_rate_seeding_and_checkpoint_replay():
    from torch.utils.checkpoint import checkpoint

    from bertkit import kernels
    from bertkit.kernels.common import draw_seed
    from bertkit.kernels.layer_norm import ln_dropout_mask

    torch.manual_seed(0)
    seed = draw_seed("cpu")
    p = 0.1
    mask = ln_dropout_mask(seed, 64, 1024, p)
    ok, rate = binomial_ok(mask, p)
    assert ok, f"keep rate {rate} vs {1 - p}"
    assert not torch.equal(mask[0], mask[1])  # rows get their own streams
    assert torch.equal(mask, reference_keep(seed.item(), 0, range(64), range(1024), p))  # independent Philox
    assert not torch.equal(mask, ln_dropout_mask(draw_seed("cpu"), 64, 1024, p))

    gen = torch.Generator().manual_seed(2)
    x, r, w, b = _inputs(12, 128, torch.float32, True, gen)
    dy = torch.randn(12, 128, generator=gen)

    def run(use_checkpoint, torch_seed):
        xx = x.clone().requires_grad_()
        torch.manual_seed(torch_seed)
        f = lambda t: kernels.add_layer_norm(t, r, w, b, 1e-12, 0.3)  # noqa: E731
        y = checkpoint(f, xx, use_reentrant=False) if use_checkpoint else f(xx)
        y.backward(dy)
        return y.detach(), xx.grad

    y1, g1 = run(False, 5)
    y2, g2 = run(True, 5)
    y3, _ = run(False, 6)
    assert torch.equal(y1, y2) and torch.equal(g1, g2)
    assert not torch.equal(y1, y3)


@interpreter_only
def test_opcheck_torch_library_registration():
    from bertkit.kernels.layer_norm import add_ln_fwd_op

    gen = torch.Generator().manual_seed(3)
    x, r, w, b = _inputs(8, 128, torch.float32, True, gen)
    for residual in (r, None):
        args = (x.requires_grad_(), residual, w.requires_grad_(), b.requires_grad_(), w, 1e-5, 0.0)
        torch.library.opcheck(add_ln_fwd_op, args)  # schema, fake tensor, autograd registration, AOT dispatch

    # torch.compile traces the public entry into one graph, dropout included; without dropout, same numbers
    from bertkit import kernels

    for p in (0.0, 0.2):
        f = lambda a, c: kernels.add_layer_norm(a, c, w, b, 1e-5, p)  # noqa: E731
        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
        y = compiled(x, r)
        dx, = torch.autograd.grad(y.square().sum(), x)
        assert y.shape == x.shape and torch.isfinite(dx).all()
        if p == 0.0:
            assert torch.equal(y, f(x, r))
            assert torch.equal(dx, torch.autograd.grad(f(x, r).square().sum(), x)[0])


# --------------------------------------------------------------------------------------------------------------
# GPU: compiled kernels at BERT-base shapes; error <= 2x that of PyTorch's add + layer_norm in the same precision.


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,hidden", [(4096, 768), (2048, 1024), (512, 4096)])
def test_cuda_flash_rule(dtype, rows, hidden):
    from bertkit import kernels

    gen = torch.Generator(device="cuda").manual_seed(rows + hidden)
    x, r, w, b = _inputs(rows, hidden, dtype, True, gen, device="cuda")
    dy = torch.randn(rows, hidden, device="cuda", generator=gen, dtype=torch.float64)
    exact_y, exact_grads = _reference(x, r, w, b, dy, 1e-12)

    low = [t.detach().clone().requires_grad_() for t in (x, r, w, b)]
    low_y = F.layer_norm(low[0] + low[1], (hidden,), low[2], low[3], 1e-12)
    low_y.backward(dy.to(dtype))
    ours = [t.detach().clone().requires_grad_() for t in (x, r, w, b)]
    ours_y = kernels.add_layer_norm(*ours, 1e-12, 0.0)
    ours_y.backward(dy.to(dtype))

    def err(a, e):
        return (a.double() - e).abs().max().item()

    assert err(ours_y, exact_y) <= 2 * err(low_y, exact_y) + 1e-6
    for o, lo, e in zip(ours, low, exact_grads):
        assert err(o.grad, e) <= 2 * err(lo.grad, e) + 1e-6


@cuda_only
def test_cuda_rows_do_not_recompile():
    """The row count is a runtime argument: new token counts reuse the compiled kernel."""
    from bertkit import kernels
    from bertkit.kernels.layer_norm import _add_ln_fwd

    w = torch.ones(768, device="cuda")
    b = torch.zeros(768, device="cuda")
    kernels.add_layer_norm(torch.randn(100, 768, device="cuda"), None, w, b)
    caches = getattr(_add_ln_fwd, "device_caches", None)
    if caches is None:
        pytest.skip("this triton has no JITFunction.device_caches to inspect")
    before = sum(len(c[0]) for c in caches.values())
    for rows in (37, 64, 4099, 1):
        kernels.add_layer_norm(torch.randn(rows, 768, device="cuda"), None, w, b)
    assert sum(len(c[0]) for c in caches.values()) == before


if INTERPRETED:
    def test_dispatch_is_triton_under_interpreter():
        from bertkit import kernels

        assert kernels.INTERPRET and kernels.resolve("cpu") == "triton"


@parent_only
@pytest.mark.parametrize("hidden", [768, 4096])
def test_kernels_compile_for_hopper_without_spills(hidden):
    """The compiled path (not the interpreter): forward and backward lower to sm_90 binaries (bf16, dropout) that
    spill no registers."""
    from bertkit.kernels.offline import compile_layer_norm_kernels, ptxas_usage
    from tests.kernel_utils import nvidia_backend_or_skip

    nvidia_backend_or_skip()

    for name, compiled in compile_layer_norm_kernels(hidden, dropout=True).items():
        registers, spill = ptxas_usage(compiled)
        assert spill == 0, f"{name} at hidden {hidden}: {spill} bytes of register spills"
