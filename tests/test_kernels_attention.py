"""Fused attention: the Triton kernels (run in Triton's interpreter on the CPU, or compiled on a GPU) against the
float64 PyTorch reference; every output and gradient, padded rows, dropout, determinism, torch.library wiring."""
import math
import zlib

import pytest
import torch

from bertkit.kernels.reference import attention_reference, attention_varlen_reference
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

INTERPRETER_CASES = 25


@pytest.mark.slow
@parent_only
def test_under_interpreter():
    run_file_under_interpreter(__file__, INTERPRETER_CASES)


def _lengths(batch, seq, gen):
    """Random lengths that always include a full row, a single token and (batch >= 4) an empty sequence."""
    lengths = torch.randint(1, seq + 1, (batch,), generator=gen)
    lengths[0] = seq
    lengths[1] = 1
    if batch >= 4:
        lengths[2] = 0
    return lengths.to(torch.int32)


def _fused_qkv(lead, heads, head_dim, dtype, device="cpu", gen=None):
    """q, k, v as strided views of one fused (…, 3, heads, head_dim) projection output."""
    qkv = torch.randn(*lead, 3, heads, head_dim, dtype=torch.float64, device=device, generator=gen).to(dtype)
    return qkv, qkv.unbind(-3)


def _padded_reference(q, k, v, lengths, dout, p=0.0, mask=None):
    """float64 outputs and gradients of the reference on exactly the (rounded) inputs the kernel saw."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = attention_reference(*leaves, lengths.long(), p, None, mask)
    out.backward(dout.double())
    return out.detach(), [t.grad for t in leaves]


def _varlen_reference(q, k, v, cu, dout, p=0.0, mask=None):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    max_seqlen = mask.shape[-1] if mask is not None else int((cu[1:] - cu[:-1]).max())
    out = attention_varlen_reference(*leaves, cu, max_seqlen, p, None, mask)
    out.backward(dout.double())
    return out.detach(), [t.grad for t in leaves]


def _check_padded_rows_zero(tensors, lengths):
    for t in tensors:
        for b, n in enumerate(lengths.tolist()):
            assert torch.equal(t[b, n:], torch.zeros_like(t[b, n:])), "padded rows must be exactly zero"


@interpreter_only
@pytest.mark.parametrize("dtype,head_dim,p", [
    (torch.float32, 32, 0.0), (torch.float16, 64, 0.0), (torch.float32, 128, 0.0), (torch.float32, 32, 0.3),
    (torch.float16, 32, 0.2),
])
def test_padded_matches_reference(dtype, head_dim, p):
    from bertkit.kernels.attention import dropout_mask, flash_attn_backward, flash_attn_forward
    from bertkit.kernels.common import draw_seed

    gen = torch.Generator().manual_seed(zlib.crc32(f"padded{dtype}{head_dim}{p}".encode()))
    batch, seq, heads = 4, 37, 2
    lengths = _lengths(batch, seq, gen)
    _, (q, k, v) = _fused_qkv((batch, seq), heads, head_dim, dtype, gen=gen)
    assert q.stride(1) == 3 * heads * head_dim  # strided, straight from the fused layout
    dout = torch.randn(batch, seq, heads, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    scale = 1.0 / math.sqrt(head_dim)
    seed = draw_seed("cpu")
    mask = dropout_mask(seed, batch * heads, seq, p).view(batch, heads, seq, seq) if p > 0 else None

    out, lse = flash_attn_forward(q, k, v, lengths, seed, seq, False, p, scale,
                                  out=poisoned(q.shape, dtype), lse=poisoned((batch, heads, seq), torch.float32))
    grads = flash_attn_backward(dout, q, k, v, out, lse, lengths, seed, seq, False, p, scale,
                                *(poisoned(q.shape, dtype) for _ in range(3)))
    ref_out, ref_grads = _padded_reference(q, k, v, lengths, dout, p, mask)

    tol = TOLERANCE[dtype]
    assert rel_err(out, ref_out) <= tol
    for name, g, r in zip("qkv", grads, ref_grads):
        assert rel_err(g, r) <= tol, f"d{name}: {rel_err(g, r)}"
    _check_padded_rows_zero([out, *grads], lengths)


@interpreter_only
@pytest.mark.parametrize("dtype,head_dim,p", [
    (torch.float32, 64, 0.0), (torch.float16, 128, 0.0), (torch.float16, 32, 0.0), (torch.float32, 64, 0.25),
])
def test_varlen_matches_reference(dtype, head_dim, p):
    from bertkit.kernels.attention import dropout_mask, flash_attn_backward, flash_attn_forward
    from bertkit.kernels.common import draw_seed

    gen = torch.Generator().manual_seed(zlib.crc32(f"varlen{dtype}{head_dim}{p}".encode()))
    max_seqlen, heads = 40, 2
    lengths = torch.tensor([40, 1, 23, 17, 0, 32])[torch.randperm(6, generator=gen)]
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).to(torch.int32)
    total = int(cu[-1])
    _, (q, k, v) = _fused_qkv((total,), heads, head_dim, dtype, gen=gen)
    dout = torch.randn(total, heads, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    scale = 1.0 / math.sqrt(head_dim)
    seed = draw_seed("cpu")
    mask = dropout_mask(seed, 6 * heads, max_seqlen, p).view(6, heads, max_seqlen, max_seqlen) if p > 0 else None

    out, lse = flash_attn_forward(q, k, v, cu, seed, max_seqlen, True, p, scale, out=poisoned(q.shape, dtype),
                                  lse=poisoned((6, heads, max_seqlen), torch.float32))
    grads = flash_attn_backward(dout, q, k, v, out, lse, cu, seed, max_seqlen, True, p, scale,
                                *(poisoned(q.shape, dtype) for _ in range(3)))
    ref_out, ref_grads = _varlen_reference(q, k, v, cu, dout, p, mask)
    tol = TOLERANCE[dtype]
    assert rel_err(out, ref_out) <= tol
    for name, g, r in zip("qkv", grads, ref_grads):
        assert rel_err(g, r) <= tol, f"d{name}: {rel_err(g, r)}"


@interpreter_only
@pytest.mark.parametrize("window,theta", [(None, None), (4, 10_000.0), (None, 160_000.0)])
def test_varlen_rows_past_the_last_sequence_are_zero(window, theta):
    """A fine-tuning batch's tail (tokens past cu_seqlens[-1], rounding its size) belongs to no sequence: its
    output rows and gradients come out exactly zero (no program writes them), the rest equal the reference."""
    from bertkit import kernels

    gen = torch.Generator().manual_seed(11)
    lengths, tail = torch.tensor([9, 1, 14]), 5
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).to(torch.int32)
    total = int(cu[-1])
    qkv64 = torch.randn(total + tail, 3, 2, 32, generator=gen, dtype=torch.float64)
    dout = torch.randn(total + tail, 2, 32, generator=gen, dtype=torch.float64)
    ref = qkv64.clone().requires_grad_()
    ref_out = attention_varlen_reference(*ref.unbind(1), cu, 16, window=window, rope_theta=theta)
    (ref_out * dout).sum().backward()
    qkv = qkv64.float().requires_grad_()
    kernels.use("triton")
    try:
        out = kernels.attention_varlen(*qkv.unbind(1), cu, 16, window=window, rope_theta=theta)
    finally:
        kernels.use("auto")
    (out * dout.float()).sum().backward()
    assert rel_err(out, ref_out) <= TOLERANCE[torch.float32] and rel_err(qkv.grad, ref.grad) <= TOLERANCE[torch.float32]
    assert torch.equal(out[total:], torch.zeros_like(out[total:]))
    assert torch.equal(qkv.grad[total:], torch.zeros_like(qkv.grad[total:]))


@interpreter_only
@pytest.mark.parametrize("varlen,dtype,window,theta,p", [
    (False, torch.float32, 5, 10_000.0, 0.0),       # local layer, RoPE: window shorter than the blocks (16)
    (False, torch.float16, 40, 160_000.0, 0.0),     # the window longer than every sequence: a global layer's answer
    (True, torch.float32, 7, 160_000.0, 0.25),      # packed documents, dropout: windows stop at each document
    (True, torch.float16, 20, 10_000.0, 0.0),       # a window spanning blocks
    (True, torch.float32, None, 10_000.0, 0.0),     # RoPE alone (a global layer)
    (False, torch.float32, 3, None, 0.3),           # window alone
])
def test_rope_and_window_match_reference(varlen, dtype, window, theta, p):
    """ModernBERT's attention: q and k turned by rotary embeddings inside the kernels (positions restarting at each
    sequence) and a ±window band, forward and every gradient against the float64 reference."""
    from bertkit.kernels.attention import dropout_mask, flash_attn_backward, flash_attn_forward
    from bertkit.kernels.common import draw_seed

    gen = torch.Generator().manual_seed(zlib.crc32(f"rope{varlen}{dtype}{window}{theta}{p}".encode()))
    heads, head_dim = 2, 32
    if varlen:
        lengths = torch.tensor([38, 1, 23, 0, 17])
        seqinfo = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).to(torch.int32)
        max_seqlen, lead, batch = 38, (int(seqinfo[-1]),), 5
    else:
        max_seqlen, batch = 37, 4
        seqinfo = _lengths(batch, max_seqlen, gen)
        lead = (batch, max_seqlen)
    _, (q, k, v) = _fused_qkv(lead, heads, head_dim, dtype, gen=gen)
    dout = torch.randn(*lead, heads, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    scale, seed = 1.0 / math.sqrt(head_dim), draw_seed("cpu")
    mask = dropout_mask(seed, batch * heads, max_seqlen, p).view(batch, heads, max_seqlen, max_seqlen) if p else None
    extra = dict(window=window, rope_theta=theta)
    out, lse = flash_attn_forward(q, k, v, seqinfo, seed, max_seqlen, varlen, p, scale,
                                  out=poisoned(q.shape, dtype), lse=poisoned((batch, heads, max_seqlen), torch.float32),
                                  **extra)
    grads = flash_attn_backward(dout, q, k, v, out, lse, seqinfo, seed, max_seqlen, varlen, p, scale,
                                *(poisoned(q.shape, dtype) for _ in range(3)), **extra)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    if varlen:
        ref = attention_varlen_reference(*leaves, seqinfo, max_seqlen, p, None, mask, **extra)
    else:
        ref = attention_reference(*leaves, seqinfo.long(), p, None, mask, **extra)
    ref.backward(dout.double())
    tol = TOLERANCE[dtype]
    assert rel_err(out, ref) <= tol
    for name, g, r in zip("qkv", grads, leaves):
        assert rel_err(g, r.grad) <= tol, f"d{name}: {rel_err(g, r.grad)}"
    if not varlen:
        _check_padded_rows_zero([out, *grads], seqinfo)


@interpreter_only
def test_a_global_layer_turns_q_and_k_once_before_the_kernels(monkeypatch):
    """A global layer (RoPE, no window) turns q and k in one pass and runs the kernels without RoPE (turning inside
    cost it 1.36x on an H200); a local layer keeps RoPE inside. Padded, each answer equals the float64 reference."""
    import importlib

    from bertkit import kernels

    attn = importlib.import_module("bertkit.kernels.attention")  # the module (kernels.attention is its function)
    seen = []
    run = attn._run
    monkeypatch.setattr(attn, "_run", lambda *a: seen.append(a[-1]) or run(*a))
    gen = torch.Generator().manual_seed(5)
    lengths = torch.tensor([19, 7, 0])
    q, k, v = (torch.randn(3, 19, 2, 32, generator=gen, dtype=torch.float64) for _ in range(3))
    dout = torch.randn(3, 19, 2, 32, generator=gen, dtype=torch.float64)
    kernels.use("triton")
    try:
        for window, theta in ((None, 160_000.0), (4, 10_000.0)):
            leaves = [t.float().requires_grad_() for t in (q, k, v)]
            out = kernels.attention(*leaves, lengths, window=window, rope_theta=theta)
            grads = torch.autograd.grad(out, leaves, dout.float())
            ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            ref = attention_reference(*ref_leaves, lengths, window=window, rope_theta=theta)
            ref_grads = torch.autograd.grad(ref, ref_leaves, dout)
            assert rel_err(out, ref) <= TOLERANCE[torch.float32]
            for g, r in zip(grads, ref_grads):
                assert rel_err(g, r) <= TOLERANCE[torch.float32]
    finally:
        kernels.use("auto")
    assert seen == [None, 10_000.0]


@interpreter_only
def test_a_local_layer_never_visits_tiles_outside_its_window():
    """Keys and values poisoned with NaN where no query of the first block can see them: a visited tile would
    carry the NaN into that block's rows (0 x NaN), so finite rows prove the tile was skipped, in the forward and in
    both backward kernels."""
    from bertkit.kernels.attention import INTERPRETER_CONFIG, flash_attn_backward, flash_attn_forward

    block, window, seq = INTERPRETER_CONFIG[0], 3, 64
    gen = torch.Generator().manual_seed(11)
    q, k, v, dout = (torch.randn(1, seq, 1, 16, generator=gen) for _ in range(4))
    far = slice(3 * block, seq)            # the last tile of keys: out of reach of rows 0 .. block + window
    k[:, far], v[:, far] = float("nan"), float("nan")
    lengths = torch.tensor([seq], dtype=torch.int32)
    out, lse = flash_attn_forward(q, k, v, lengths, lengths, seq, False, 0.0, 0.25, window=window,
                                  rope_theta=10_000.0)
    dq, dk, dv = flash_attn_backward(dout, q, k, v, out, lse, lengths, lengths, seq, False, 0.0, 0.25,
                                     window=window, rope_theta=10_000.0)
    assert torch.isfinite(out[:, :block]).all() and torch.isfinite(dq[:, :block]).all()
    assert torch.isfinite(dk[:, :block]).all() and torch.isfinite(dv[:, :block]).all()
    assert torch.isnan(out[:, far]).any()  # and the poison is real where the window does reach it


@interpreter_only
def test_public_api_autograd_through_fused_qkv():
    """kernels.attention dispatches to the Triton op under the interpreter, and autograd reaches the fused QKV."""
    from bertkit import kernels

    gen = torch.Generator().manual_seed(7)
    batch, seq, heads, head_dim = 3, 33, 2, 32
    lengths = torch.tensor([33, 20, 5], dtype=torch.int32)
    qkv, _ = _fused_qkv((batch, seq), heads, head_dim, torch.float32, gen=gen)
    qkv.requires_grad_()
    out = kernels.attention(*qkv.unbind(2), lengths)
    dout = torch.randn(out.shape, generator=gen)
    out.backward(dout)
    ref_out, ref_grads = _padded_reference(*qkv.detach().unbind(2), lengths, dout)
    assert rel_err(out, ref_out) <= 1e-5
    assert rel_err(qkv.grad, torch.stack(ref_grads, 2)) <= 1e-5

    # varlen entry: the same sequences packed, same answers row for row
    cu = torch.tensor([0, 33, 53, 58], dtype=torch.int32)
    rows = torch.cat([qkv.detach()[b, :n] for b, n in enumerate(lengths.tolist())])
    packed = kernels.attention_varlen(*rows.unbind(1), cu, seq)
    assert torch.allclose(packed, torch.cat([out.detach()[b, :n] for b, n in enumerate(lengths.tolist())]),
                          rtol=0, atol=1e-6)


@interpreter_only
def test_dropout_keep_rate_and_seeding():
    from bertkit.kernels.attention import dropout_mask
    from bertkit.kernels.common import draw_seed

    torch.manual_seed(0)
    seed = draw_seed("cpu")
    p = 0.1
    mask = dropout_mask(seed, 4, 128, p)
    ok, rate = binomial_ok(mask, p)
    assert ok, f"keep rate {rate} vs {1 - p}"
    assert torch.equal(mask, dropout_mask(seed.clone(), 4, 128, p))  # a pure function of the seed
    other = dropout_mask(draw_seed("cpu"), 4, 128, p)
    assert not torch.equal(mask, other)
    # heads and rows get different streams, not copies
    assert not torch.equal(mask[0], mask[1]) and not torch.equal(mask[0, 0], mask[0, 1])
    # one Philox call serves 8 consecutive keys: each of the 8 slots keeps at the right rate, none copies another
    for slot in range(8):
        ok, rate = binomial_ok(mask[..., slot::8], p)
        assert ok, f"slot {slot}: keep rate {rate} vs {1 - p}"
    assert len({mask[..., slot::8].numpy().tobytes() for slot in range(8)}) == 8
    # bit for bit the documented Philox4x32-10 stream, from an independent numpy implementation
    for bh in (0, 3):
        assert torch.equal(mask[bh], reference_keep(seed.item(), bh, range(128), range(128), p))
    # the mask depends on (seed, head, query, key) only, never on the tiles the kernels happen to use
    assert torch.equal(dropout_mask(seed, 2, 100, p, block=16), dropout_mask(seed, 2, 100, p, block=32))
    assert torch.equal(dropout_mask(seed, 2, 100, p, block=16), dropout_mask(seed, 2, 100, p, block=64))


@interpreter_only
def test_dropout_deterministic_and_replayed_by_checkpointing():
    """Same torch seed -> same output and bitwise-identical gradients; checkpoint recompute replays the mask."""
    from torch.utils.checkpoint import checkpoint

    from bertkit import kernels

    gen = torch.Generator().manual_seed(3)
    batch, seq, heads, head_dim = 2, 24, 2, 32
    lengths = torch.tensor([24, 13], dtype=torch.int32)
    base = torch.randn(batch, seq, 3, heads, head_dim, generator=gen)
    dout = torch.randn(batch, seq, heads, head_dim, generator=gen)

    def run(use_checkpoint, seed):
        qkv = base.clone().requires_grad_()
        torch.manual_seed(seed)
        f = lambda t: kernels.attention(*t.unbind(2), lengths, 0.3)  # noqa: E731
        out = checkpoint(f, qkv, use_reentrant=False) if use_checkpoint else f(qkv)
        out.backward(dout)
        return out.detach(), qkv.grad

    out1, g1 = run(False, 11)
    out2, g2 = run(False, 11)
    out3, g3 = run(True, 11)
    out4, _ = run(False, 12)
    assert torch.equal(out1, out2) and torch.equal(g1, g2)
    assert torch.equal(out1, out3) and torch.equal(g1, g3)
    assert not torch.equal(out1, out4)


@interpreter_only
def test_opcheck_torch_library_registration():
    from bertkit.kernels.attention import flash_attn_fwd_op

    gen = torch.Generator().manual_seed(5)
    _, (q, k, v) = _fused_qkv((2, 16), 2, 16, torch.float32, gen=gen)
    lengths = torch.tensor([16, 9], dtype=torch.int32)
    args = (q.contiguous().requires_grad_(), k.contiguous(), v.contiguous(), lengths, lengths, 16, False, 0.0, 0.25)
    torch.library.opcheck(flash_attn_fwd_op, args)  # schema, fake tensor, autograd registration, AOT dispatch

    # torch.compile traces the public entry into one graph (fake impls + registered autograd), same numbers
    from bertkit import kernels

    qkv = torch.randn(2, 16, 3, 2, 16, generator=gen, requires_grad=True)
    f = lambda t: kernels.attention(*t.unbind(2), lengths, 0.0)  # noqa: E731
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    eager_grad, = torch.autograd.grad(f(qkv).square().sum(), qkv)
    out = compiled(qkv)
    assert torch.equal(out, f(qkv))
    assert torch.equal(torch.autograd.grad(out.square().sum(), qkv)[0], eager_grad)


@interpreter_only
def test_tiny_bert_through_triton_matches_reference_path():
    """End to end: BertForPreTraining with every attention and LayerNorm on the Triton kernels gives the loss and
    parameter gradients of the same model on the PyTorch references; with dropout, gradient checkpointing replays
    the kernels' masks exactly."""
    from bertkit import kernels
    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig

    torch.manual_seed(0)
    cfg = BertConfig.preset("tiny", vocab_size=96)
    model = BertForPreTraining(cfg)
    gen = torch.Generator().manual_seed(1)
    batch, seq = 2, 21
    ids = torch.randint(5, 96, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, 13:] = 0
    inputs = dict(input_ids=ids, token_type_ids=torch.zeros_like(ids), attention_mask=mask,
                  mlm_positions=torch.tensor([[1, 4, 7], [2, 5, 12]]),
                  mlm_labels=torch.tensor([[3, 9, 11], [8, 2, 40]]),
                  next_sentence_label=torch.tensor([0, 1]))

    def loss_and_grads(seed=0):
        model.zero_grad()
        torch.manual_seed(seed)
        loss = model(**inputs).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    model.eval()
    loss_triton, grads_triton = loss_and_grads()
    kernels.use("reference")
    try:
        loss_ref, grads_ref = loss_and_grads()
    finally:
        kernels.use("auto")
    assert abs(loss_triton.item() - loss_ref.item()) <= 1e-5 * abs(loss_ref.item())
    assert grads_triton.keys() == grads_ref.keys()
    for name, g in grads_triton.items():
        assert rel_err(g, grads_ref[name]) <= 1e-4, name

    model.train()
    loss_plain, grads_plain = loss_and_grads(seed=4)
    model.bert.gradient_checkpointing = True
    loss_ckpt, grads_ckpt = loss_and_grads(seed=4)
    assert torch.equal(loss_plain, loss_ckpt)
    for name, g in grads_plain.items():
        assert torch.equal(g, grads_ckpt[name]), name


@interpreter_only
def test_tiny_modernbert_through_triton_matches_the_torch_path():
    """A ModernBERT (a global and a local layer) on the Triton kernels, packed and padded, gives the loss and every
    parameter gradient of the same model on PyTorch's SDPA with its own rotary embeddings and band mask."""
    from bertkit import kernels
    from bertkit.models.modernbert import ModernBertConfig, ModernBertForMaskedLM

    torch.manual_seed(0)
    cfg = ModernBertConfig(vocab_size=96, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=96,
                           local_window=8, global_every=2)
    model = ModernBertForMaskedLM(cfg)
    gen = torch.Generator().manual_seed(3)
    lengths = [21, 4, 13]
    ids = torch.randint(5, 96, (sum(lengths),), generator=gen)
    cu = torch.tensor([0, 21, 25, 38], dtype=torch.int32)
    packed = dict(input_ids=ids, cu_seqlens=cu, max_seqlen=24, mlm_positions=torch.tensor([1, 9, 22, 30]),
                  mlm_labels=torch.tensor([3, 9, 11, 40]))
    grid = torch.zeros(3, 21, dtype=torch.long)
    mask = torch.zeros(3, 21, dtype=torch.long)
    for b, (lo, n) in enumerate(zip(cu[:-1].tolist(), lengths)):
        grid[b, :n], mask[b, :n] = ids[lo:lo + n], 1
    padded = dict(input_ids=grid, attention_mask=mask, mlm_positions=torch.tensor([[1, 9], [1, 0], [5, 0]]),
                  mlm_labels=torch.tensor([[3, 9], [11, -100], [40, -100]]))

    def loss_and_grads(inputs):
        model.zero_grad()
        loss = model(**inputs).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    for inputs in (packed, padded):
        loss_triton, grads_triton = loss_and_grads(inputs)
        kernels.use("torch")
        try:
            loss_torch, grads_torch = loss_and_grads(inputs)
        finally:
            kernels.use("auto")
        assert abs(loss_triton.item() - loss_torch.item()) <= 1e-5 * abs(loss_torch.item())
        for name, g in grads_triton.items():
            assert rel_err(g, grads_torch[name]) <= 1e-4, name


# --------------------------------------------------------------------------------------------------------------
# GPU: compiled kernels at BERT shapes; FlashAttention's rule: error <= 2x that of PyTorch in the same precision.


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seq", [128, 512])
def test_cuda_bert_shapes_flash_rule(dtype, seq):
    from bertkit import kernels

    gen = torch.Generator(device="cuda").manual_seed(seq)
    batch, heads, head_dim = 8, 12, 64
    lengths = torch.randint(seq // 4, seq + 1, (batch,), device="cuda", generator=gen).to(torch.int32)
    qkv = torch.randn(batch, seq, 3, heads, head_dim, device="cuda", generator=gen, dtype=torch.float64)
    dout = torch.randn(batch, seq, heads, head_dim, device="cuda", generator=gen, dtype=torch.float64)

    exact_leaf = qkv.to(dtype).double().requires_grad_()
    exact = attention_reference(*exact_leaf.unbind(2), lengths)
    exact.backward(dout)
    low_leaf = qkv.to(dtype).requires_grad_()
    low = attention_reference(*low_leaf.unbind(2), lengths, upcast=False)
    low.backward(dout.to(dtype))
    ours_leaf = qkv.to(dtype).requires_grad_()
    ours = kernels.attention(*ours_leaf.unbind(2), lengths)
    ours.backward(dout.to(dtype))

    def err(a, b):
        return (a.double() - b).abs().max().item()

    assert err(ours, exact) <= 2 * err(low, exact) + 1e-5
    assert err(ours_leaf.grad, exact_leaf.grad) <= 2 * err(low_leaf.grad, exact_leaf.grad) + 1e-5
    _check_padded_rows_zero([ours.detach(), ours_leaf.grad[:, :, 0]], lengths.cpu())


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_varlen_and_dropout(dtype):
    from bertkit.kernels.attention import dropout_mask, flash_attn_backward, flash_attn_forward
    from bertkit.kernels.common import draw_seed

    gen = torch.Generator(device="cuda").manual_seed(1)
    heads, head_dim, max_seqlen = 12, 64, 128
    lengths = torch.tensor([128, 1, 77, 0, 100, 64], device="cuda")
    cu = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)
    total = int(cu[-1])
    _, (q, k, v) = _fused_qkv((total,), heads, head_dim, dtype, device="cuda", gen=gen)
    dout = torch.randn(total, heads, head_dim, device="cuda", generator=gen).to(dtype)
    p, scale = 0.1, head_dim ** -0.5
    seed = draw_seed("cuda")
    mask = dropout_mask(seed, 6 * heads, max_seqlen, p).view(6, heads, max_seqlen, max_seqlen)
    out, lse = flash_attn_forward(q, k, v, cu, seed, max_seqlen, True, p, scale,
                                  out=poisoned(q.shape, dtype, "cuda"))
    grads = flash_attn_backward(dout, q, k, v, out, lse, cu, seed, max_seqlen, True, p, scale,
                                *(poisoned(q.shape, dtype, "cuda") for _ in range(3)))
    ref_out, ref_grads = _varlen_reference(q, k, v, cu, dout, p, mask)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert rel_err(out, ref_out) <= tol
    for g, r in zip(grads, ref_grads):
        assert rel_err(g, r) <= tol
    ok, rate = binomial_ok(dropout_mask(seed, 48, 512, p), p)
    assert ok, rate


if INTERPRETED:
    # the child process must not pick up the CUDA cases' device, only prove the interpreter path is active
    def test_dispatch_is_triton_under_interpreter():
        from bertkit import kernels

        assert kernels.INTERPRET and kernels.resolve("cpu") == "triton"


@parent_only
@pytest.mark.parametrize("kind", ["fwd", "dkdv", "dq"])
def test_kernels_compile_for_hopper_without_spills(kind):
    """The compiled path (not the interpreter): each kernel in its default config lowers to an sm_90 binary, with
    dropout, the varlen layout and bf16 (the training configuration), using wgmma and spilling no registers (a
    spill puts local-memory round trips in the inner loop)."""
    import importlib

    from bertkit.kernels.offline import compile_attention_kernel, ptxas_usage
    from tests.kernel_utils import nvidia_backend_or_skip

    nvidia_backend_or_skip()

    attn = importlib.import_module("bertkit.kernels.attention")
    default = {"fwd": attn.FWD_CONFIGS, "dkdv": attn.DKDV_CONFIGS, "dq": attn.DQ_CONFIGS}[kind][64][0]
    # BERT (dropout on and off), then ModernBERT's global (RoPE) and local (RoPE + window) layers
    for dropout, rope, local in ((True, False, False), (False, False, False), (False, True, False),
                                 (False, True, True), (True, True, True)):
        compiled = compile_attention_kernel(kind, default, head_dim=64, dropout=dropout, varlen=True, rope=rope,
                                            local=local)
        assert "wgmma" in compiled.asm["ptx"], "the matmuls did not lower to Hopper's wgmma"
        registers, spill = ptxas_usage(compiled)
        assert spill == 0, (f"{kind} {default} dropout={dropout} rope={rope} local={local}: {spill} bytes of "
                            "register spills")


@parent_only
def test_rows_too_far_apart_for_32_bit_offsets_are_refused():
    """The kernels address rows with 32-bit offsets inside a sequence; a layout that would overflow them is an
    error naming the fix, not a silent wrap-around."""
    from bertkit.kernels.attention import _check_offsets, _strides

    fine = torch.empty_strided((2, 512, 12, 64), (512 * 2304, 2304, 64, 1), device="meta")  # fused QKV, BERT-base
    _check_offsets(512, _strides(fine, False))
    huge = torch.empty_strided((1, 2**16, 1, 64), (2**32, 2**16, 64, 1), device="meta")
    with pytest.raises(ValueError, match="32-bit offsets"):
        _check_offsets(2**16, _strides(fine, False), _strides(huge, False))
    packed = torch.empty_strided((2**16, 1, 64), (2**16, 64, 1), device="meta")  # (tokens, heads, dim): rows on axis 0
    with pytest.raises(ValueError, match="32-bit offsets"):
        _check_offsets(2**16, _strides(packed, True))


@parent_only
def test_numpy_philox_reference_matches_random123_known_answers():
    """The reference the dropout tests trust is itself checked: Random123's known-answer vectors for
    Philox4x32-10 (kat_vectors: zeros, all ones, digits of pi)."""
    import numpy as np

    from tests.kernel_utils import philox4x32_10

    cases = [
        ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
        ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
        ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
         [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
    ]
    for counter, key, expected in cases:
        got = philox4x32_10([np.array([c], dtype=np.uint32) for c in counter], key)
        assert [int(w[0]) for w in got] == expected


@parent_only
def test_dropout_threshold_of_one_compiles():
    """Triton's launcher turns an int argument equal to 1 into a constant; a drop probability near 1/65536 gives
    threshold 1, and the compiled kernels must take it as well as any other value."""
    import importlib

    from bertkit.kernels.offline import compile_for_gpu
    from tests.kernel_utils import nvidia_backend_or_skip

    nvidia_backend_or_skip()

    attn = importlib.import_module("bertkit.kernels.attention")
    assert attn.threshold_and_scale(1e-5)[0] == 1
    compile_for_gpu(attn._dropout_mask_kernel, {"MASK": "*i8", "SEED": "*i64"}, (),
                    dict(threshold=1, BLOCK=16))
