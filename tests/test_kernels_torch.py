"""The PyTorch backend (--kernels torch) against the einsum reference, float64 as ground truth: padded and packed,
forward and backward, fp32 within 1e-5; dropout's keep rate; no host synchronisation; backend choice and errors."""
import contextlib
import math

import pytest
import torch

from bertkit import kernels
from bertkit.kernels.reference import attention_reference, attention_varlen_reference
from bertkit.kernels.torch_backend import attention_torch, attention_varlen_torch

TOL = 1e-5


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30)).item()


def fused_qkv(tokens_shape, heads, dim, seed):
    """q, k, v as strided views of one (..., 3, H, D) tensor, as the model makes them."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(*tokens_shape, 3, heads, dim, generator=gen, dtype=torch.float64)
    return qkv


@contextlib.contextmanager
def no_host_reads():
    """Fail on any Python-level read of a tensor's value (what would synchronise with a GPU)."""
    names = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__", "numpy", "cpu")
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def refuse(name):
        def f(*args, **kwargs):
            raise AssertionError(f"host read: Tensor.{name}")
        return f

    for n in names:
        setattr(torch.Tensor, n, refuse(n))
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.Tensor, n, f)


@pytest.mark.parametrize("batch,seq,heads,dim", [(3, 17, 2, 16), (4, 64, 4, 64), (2, 33, 3, 32)])
def test_padded_matches_the_reference_forward_and_backward(batch, seq, heads, dim):
    qkv64 = fused_qkv((batch, seq), heads, dim, seed=seq)
    lengths = torch.tensor([seq, 1, seq // 2, 0][:batch], dtype=torch.int32)
    ref = qkv64.clone().requires_grad_()
    ref_out = attention_reference(*ref.unbind(2), lengths)
    dout = torch.randn_like(ref_out)
    (ref_out * dout).sum().backward()

    qkv = qkv64.float().requires_grad_()
    with no_host_reads():
        out = attention_torch(*qkv.unbind(2), lengths)
        (out * dout.float()).sum().backward()
    assert out.dtype == torch.float32 and rel_err(out, ref_out) <= TOL
    assert rel_err(qkv.grad, ref.grad) <= TOL
    valid = torch.arange(seq)[None, :] < lengths[:, None]
    assert (out[~valid] == 0).all() and (qkv.grad[~valid] == 0).all()  # padded rows and their gradients: zero


@pytest.mark.parametrize("tail", [0, 6])
@pytest.mark.parametrize("impl", ["pad", "njt", "documents"])
def test_packed_matches_the_reference_forward_and_backward(impl, tail, monkeypatch):
    """Both packed paths against the float64 reference; a tail of tokens past cu_seqlens[-1] (a fine-tuning
    batch's rounding) belongs to no sequence: zero out, zero gradients."""
    monkeypatch.setenv("BERTKIT_TORCH_VARLEN", impl)
    lengths = [5, 17, 0, 1, 11]  # an empty sequence too (an offset repeated in cu_seqlens)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    qkv64 = fused_qkv((int(cu[-1]) + tail,), 2, 16, seed=3)
    ref = qkv64.clone().requires_grad_()
    ref_out = attention_varlen_reference(*ref.unbind(1), cu, 24)
    dout = torch.randn_like(ref_out)
    (ref_out * dout).sum().backward()

    qkv = qkv64.float().requires_grad_()
    guard = no_host_reads() if impl == "pad" else contextlib.nullcontext()  # the others read offsets on the host
    with guard:
        out = attention_varlen_torch(*qkv.unbind(1), cu, 24)
        (out * dout.float()).sum().backward()
    assert rel_err(out, ref_out) <= TOL and rel_err(qkv.grad, ref.grad) <= TOL
    assert (out[int(cu[-1]):] == 0).all() and (qkv.grad[int(cu[-1]):] == 0).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch's varlen_attn)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_varlen_attn_with_a_tail_follows_the_flash_rule(dtype, monkeypatch):
    """torch's varlen_attn (FlashAttention on cu_seqlens) with a tail past cu_seqlens[-1]: FlashAttention's rule
    (error <= 2x that of PyTorch in the same precision) against float64, and the tail's rows and gradients zero."""
    if not kernels.torch_backend._has_varlen_attn():
        pytest.skip("this torch has no torch.nn.attention.varlen")
    monkeypatch.setenv("BERTKIT_TORCH_VARLEN", "varlen")
    lengths, tail, heads, dim = [37, 128, 1, 90], 29, 4, 64
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    qkv = fused_qkv((int(cu[-1]) + tail,), heads, dim, seed=5).cuda().to(dtype)
    dout = torch.randn(qkv.shape[0], heads, dim, dtype=torch.float64, device="cuda")

    def run(leaf, attention, **kw):
        out = attention(*leaf.unbind(1), cu, 128, **kw)
        out.backward(dout.to(out.dtype))
        return out

    exact_leaf, low_leaf, ours_leaf = (qkv.double().requires_grad_(), qkv.clone().requires_grad_(),
                                       qkv.clone().requires_grad_())
    exact = run(exact_leaf, attention_varlen_reference)
    low = run(low_leaf, attention_varlen_reference, upcast=False)
    ours = run(ours_leaf, attention_varlen_torch)

    def err(a, b):
        return (a.double() - b).abs().max().item()

    assert err(ours, exact) <= 2 * err(low, exact) + 1e-5
    assert err(ours_leaf.grad, exact_leaf.grad) <= 2 * err(low_leaf.grad, exact_leaf.grad) + 1e-5
    end = int(cu[-1])
    assert (ours[end:] == 0).all() and (ours_leaf.grad[end:] == 0).all()


@pytest.mark.parametrize("impl", ["pad", "documents"])
@pytest.mark.parametrize("window,theta", [(4, 10_000.0), (None, 160_000.0), (6, None)])
def test_windows_and_rotary_embeddings_match_the_reference(window, theta, impl, monkeypatch):
    """ModernBERT's layers on the torch backend: padded and packed (each document its own positions and window;
    "pad": one padded grid, with no host reads; "documents", the CPU's default: one document at a time, a long one
    in query chunks, neighbours of one length in one call), with a tail past cu_seqlens[-1], forward and backward,
    against the float64 reference."""
    from bertkit.kernels import torch_backend

    monkeypatch.setenv("BERTKIT_TORCH_VARLEN", impl)
    monkeypatch.setattr(torch_backend, "LOCAL_CHUNK", 5)  # 45 and 19 tokens: several chunks, a short last one
    lengths, tail = [19, 1, 12, 12, 7, 45, 45], 3  # neighbours of one length share a call
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    qkv64 = fused_qkv((int(cu[-1]) + tail,), 2, 16, seed=5)
    ref = qkv64.clone().requires_grad_()
    ref_out = attention_varlen_reference(*ref.unbind(1), cu, 45, window=window, rope_theta=theta)
    dout = torch.randn_like(ref_out)
    (ref_out * dout).sum().backward()
    qkv = qkv64.float().requires_grad_()
    with no_host_reads() if impl == "pad" else contextlib.nullcontext():
        out = attention_varlen_torch(*qkv.unbind(1), cu, 45, window=window, rope_theta=theta)
        (out * dout.float()).sum().backward()
    assert rel_err(out, ref_out) <= TOL and rel_err(qkv.grad, ref.grad) <= TOL
    end = int(cu[-1])
    assert (out[end:] == 0).all() and (qkv.grad[end:] == 0).all()

    padded = torch.zeros(len(lengths), 45, 3, 2, 16, dtype=torch.float64)
    for b, (lo, hi) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        padded[b, :hi - lo] = qkv64[lo:hi]
    out_padded = attention_torch(*padded.float().unbind(2), torch.tensor(lengths), window=window, rope_theta=theta)
    rows = torch.cat([out_padded[b, :n] for b, n in enumerate(lengths)])
    assert rel_err(rows, ref_out[:end]) <= TOL
    if window is not None:  # the band really cuts: the same rows without it differ
        assert rel_err(attention_varlen_reference(*qkv64.unbind(1), cu, 45, rope_theta=theta), ref_out) > 1e-3


def test_the_cpu_attends_document_by_document_where_a_grid_would_waste_or_a_window_cuts():
    from bertkit.kernels.torch_backend import GRID_LIMIT, varlen_impl

    cpu = torch.device("cpu")
    assert varlen_impl(cpu, 0.0, grid_share=1.0, window_cuts=True) == "documents"  # ModernBERT's long documents
    assert varlen_impl(cpu, 0.1, grid_share=GRID_LIMIT) == "documents"  # fine-tuning's mixed lengths
    assert varlen_impl(cpu, 0.0, grid_share=1.1) == "pad"  # pretraining's short full instances: one padded grid
    assert varlen_impl(torch.device("meta"), 0.0, grid_share=2.0, window_cuts=True) == "pad"  # never off the CPU


def test_dropout_keeps_at_the_asked_rate():
    """q = k = 0 gives uniform attention; v one-hot per key turns each output into its row of keep bits."""
    p, seq, heads, batch = 0.3, 64, 4, 8
    q = torch.zeros(batch, seq, heads, seq)
    v = torch.eye(seq).expand(batch, heads, seq, seq).permute(0, 2, 1, 3).contiguous()
    lengths = torch.full((batch,), seq, dtype=torch.int32)
    torch.manual_seed(0)
    out = attention_torch(q, q, v, lengths, dropout_p=p)
    keep = out * seq * (1 - p)  # exactly 1 where kept, 0 where dropped
    assert torch.allclose(keep, keep.round(), atol=1e-4)
    n, kept = keep.numel(), keep.round().sum().item()
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(kept - n * (1 - p)) < 5 * sigma, kept / n


def test_backend_choice_and_errors(monkeypatch):
    from bertkit.commands import KERNEL_BACKENDS

    assert KERNEL_BACKENDS == kernels.BACKENDS
    try:
        kernels.use("auto")
        assert kernels.resolve("cpu") == ("triton" if kernels.INTERPRET else "torch")
        kernels.use("reference")
        assert kernels.resolve("cpu") == "reference"
        kernels.use("triton")
        if not kernels.INTERPRET:
            with pytest.raises(kernels.BackendError, match="--kernels torch"):
                kernels.resolve("cpu")
        with pytest.raises(kernels.BackendError, match="choose one of"):
            kernels.use("cuda")
    finally:
        kernels.use("auto")


def test_model_gives_the_same_outputs_and_gradients_with_every_cpu_backend():
    """A tiny BERT, padded and packed: torch vs reference, fp32."""
    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.preset("tiny", vocab_size=96)).eval()
    ids = torch.randint(5, 96, (3, 20), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    mask[2, 3:] = 0
    inputs = dict(input_ids=ids, token_type_ids=torch.zeros_like(ids), attention_mask=mask,
                  mlm_labels=torch.where(mask.bool(), ids, -100), next_sentence_label=torch.tensor([0, 1, 0]))

    def run(backend):
        kernels.use(backend)
        try:
            model.zero_grad()
            out = model(**inputs)
            out.loss.backward()
            return out.loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]
        finally:
            kernels.use("auto")

    loss_t, grads_t = run("torch")
    loss_r, grads_r = run("reference")
    assert abs(loss_t.item() - loss_r.item()) <= TOL * abs(loss_r.item())
    assert all(rel_err(a, b) <= 1e-4 for a, b in zip(grads_t, grads_r))
