"""The PyTorch backend (`--kernels torch`): the same three functions as the Triton kernels, built on maintained
PyTorch ops, with the same contract (kernels/__init__.py): padded query rows come out as zeros, and nothing reads
a value back from the device.

Attention is F.scaled_dot_product_attention with the key padding as a boolean mask. Packed (varlen) batches are
scattered into a padded batch of the host-side bucket `max_seqlen`, attended, and gathered back ("pad"); on CUDA
with no dropout, torch.nn.attention.varlen.varlen_attn (FlashAttention on cu_seqlens, no dropout argument) is used
instead ("varlen"); on the CPU a batch whose padded grid would be a quarter padding or more, or a local layer
whose window cuts its documents (ModernBERT), attends each document alone ("documents": no padded grid, a local
layer's long documents in query chunks that see only their window, neighbours of one length in one call);
`BERTKIT_TORCH_VARLEN=pad|njt|varlen|documents` forces one (njt: SDPA on nested jagged tensors).
Measured on the CPU (torch 2.13, benchmarks/gates/cpu_backends.py, forward + backward): SDPA is 1.0-3.4x faster than the
einsum reference on padded batches; on packed ones padding runs at 0.77-1.9x the speed of the reference's
per-sequence loop (which reads lengths back from the device, so it cannot serve a GPU), nested tensors are 1.5-5.5x
slower than padding, and flex_attention has no CPU backward: so "pad".
"""
import os

import torch
import torch.nn.functional as F

from .common import packed_rows_and_positions
from .reference import add_layer_norm_reference, cached_rotary_tables

VARLEN_IMPLS = ("auto", "pad", "njt", "varlen", "documents")


def _key_mask(lengths, seq: int):
    """(B, S) bool: position < length. A zero-length row attends to its first key (never NaN); its output is
    zeroed with the other padded rows, so that key gets no gradient from it."""
    return torch.arange(seq, device=lengths.device)[None, :] < lengths.clamp(min=1)[:, None].to(torch.int64)


_BANDS = {}


def _band(seq: int, window: int, device) -> torch.Tensor:
    """(seq, seq) bool: |query - key| <= window, made once per (length, window, device)."""
    key = (seq, window, str(device))
    if key not in _BANDS:
        if len(_BANDS) > 64:
            _BANDS.clear()
        idx = torch.arange(seq, device=device)
        _BANDS[key] = (idx[:, None] - idx[None, :]).abs() <= window
    return _BANDS[key]


def _turn(x, cos, sin, sign: float):
    """x * cos + rotate_half(x) * sin * sign, in fp32 (float64 stays float64): one product and two in-place
    multiply-adds on its halves, where the formula makes four temporaries (the halves' concatenation among them)."""
    half = x.shape[-1] // 2
    out = x * cos
    out[..., :half].addcmul_(x[..., half:], sin[..., :half], value=-sign)
    out[..., half:].addcmul_(x[..., :half], sin[..., half:], value=sign)
    return out


class _Rotary(torch.autograd.Function):
    """Rotary embeddings whose backward is the inverse turn (a rotation's transpose): nothing of x is kept for it."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _turn(x, cos, sin, 1.0).to(x.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _turn(grad, cos, sin, -1.0).to(grad.dtype), None, None


def rotate(x, cos, sin):
    """kernels.reference.apply_rotary's result (rotate-half layout; cos and sin broadcast against x)."""
    return _Rotary.apply(x, cos, sin)


def turn_padded(q, k, theta: float):
    """q and k (B, S, H, D) turned by rotary embeddings at positions 0..S-1."""
    cos, sin = cached_rotary_tables(q.shape[1], q.shape[-1], theta, q.device)
    return rotate(q, cos[:, None], sin[:, None]), rotate(k, cos[:, None], sin[:, None])


def turn_packed(q, k, cu_seqlens, table_len: int, theta: float):
    """q and k (T, H, D) turned by rotary embeddings, each token at its position in its sequence (table_len: a bound
    on every length). Tokens past cu_seqlens[-1] belong to no sequence: any angle, their rows are dropped."""
    pos = packed_rows_and_positions(cu_seqlens, q.shape[0])[1]
    cos, sin = cached_rotary_tables(table_len, q.shape[-1], theta, q.device)
    cos, sin = cos[pos][:, None], sin[pos][:, None]
    return rotate(q, cos, sin), rotate(k, cos, sin)


def _half_on_cpu(q) -> bool:
    """A bf16 (autocast) step on the CPU attends in fp32: PyTorch's CPU attention backward in bf16 ran 5x slower
    than in fp32 at pretraining's shapes (modernbert-tiny, 64 tokens; docs/studies/2026-11-26-cpu-bf16.md)."""
    return q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)


def attention_torch(q, k, v, lengths, dropout_p=0.0, softmax_scale=None, window=None, rope_theta=None,
                    zero_padding=True):
    """q, k, v: (B, S, H, D), right-padded (strided views allowed); lengths: (B,). Returns (B, S, H, D).
    window: ±keys each query sees (a band mask); rope_theta: q and k turned by rotary embeddings first.
    zero_padding=False leaves the padded rows as SDPA computed them (for a caller that never reads them)."""
    if _half_on_cpu(q):
        with torch.autocast("cpu", enabled=False):
            return attention_torch(q.float(), k.float(), v.float(), lengths, dropout_p, softmax_scale, window,
                                   rope_theta, zero_padding).to(q.dtype)
    seq = q.shape[1]
    if rope_theta is not None:
        q, k = turn_padded(q, k, rope_theta)
    keys = _key_mask(lengths, seq)[:, None, None, :]
    if window is not None:
        keys = keys & _band(seq, window, q.device)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=keys, dropout_p=dropout_p, scale=softmax_scale)
    if not zero_padding:
        return out.transpose(1, 2)
    rows = torch.arange(seq, device=q.device)[None, :] < lengths[:, None].to(torch.int64)
    return torch.where(rows[:, :, None, None], out.transpose(1, 2), 0.0).to(q.dtype)


def _varlen_by_padding(q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale, window=None, rope_theta=None):
    total, heads, dim = q.shape
    batch = cu_seqlens.numel() - 1
    cu = cu_seqlens.to(torch.int64)
    lengths = cu[1:] - cu[:-1]
    # Each cell (sequence b, position p) of the padded grid gathers packed token cu[b] + p, and cells past a
    # sequence's end are zeroed (torch.where also zeroes their gradients, so nothing flows back from them).
    # A width that is a multiple of 8 keeps the key mask's rows aligned as CUDA's SDPA kernels want them, so
    # Inductor has no mask to pad and slice back; at most 7 idle columns.
    width = -(-max_seqlen // 8) * 8
    position = torch.arange(width, device=q.device)
    source = (cu[:-1, None] + position).clamp(max=max(total - 1, 0)).reshape(-1)
    inside = (position < lengths[:, None]).reshape(-1, 1, 1, 1)
    grid = torch.where(inside, torch.stack((q, k, v), 1).index_select(0, source), 0.0)
    qp, kp, vp = grid.view(batch, width, 3, heads, dim).unbind(2)
    out = attention_torch(qp, kp, vp, lengths, dropout_p, softmax_scale, window, rope_theta, zero_padding=False)
    seq, pos = packed_rows_and_positions(cu_seqlens, total)
    valid = seq < batch  # tokens past cu_seqlens[-1] belong to no sequence: zero out
    slot = torch.where(valid, seq * width + pos, 0)
    out = out.reshape(batch * width, heads, dim).index_select(0, slot)
    return out * valid[:, None, None].to(out.dtype)


LOCAL_CHUNK = 64  # a local layer's long document: queries in chunks of this many, each against its window's keys


def _varlen_by_document(q, k, v, cu_seqlens, dropout_p, softmax_scale, window=None, rope_theta=None):
    """CPU only ("documents"): each document attended alone at its own length (no padded grid, no mask for a
    global layer), rotary embeddings turned on the packed tokens, and a local layer's long documents split into
    query chunks that each see only the keys their window reaches, so its cost grows with length x window rather
    than length squared. Neighbours of one length (pretraining's full-length instances) go in one call. It reads
    cu_seqlens on the host, which costs nothing on the CPU."""
    bounds = cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    if rope_theta is not None:
        q, k = turn_packed(q, k, cu_seqlens, max([1, *lengths]), rope_theta)
    runs = []  # (documents, length) of each run of neighbours with one length
    for n in lengths:
        if runs and runs[-1][1] == n:
            runs[-1][0] += 1
        else:
            runs.append([1, n])
    sizes = [m * n for m, n in runs] + [q.shape[0] - bounds[-1]]  # the tail last
    # split, not slicing: a slice's backward writes a whole zero tensor per piece
    pieces = [_attend_documents(*(x.view(m, n, *x.shape[1:]) for x in xs), dropout_p, softmax_scale, window)
              .reshape(m * n, *q.shape[1:])
              for (m, n), xs in zip(runs, zip(q.split(sizes)[:-1], k.split(sizes)[:-1], v.split(sizes)[:-1]))]
    return torch.cat(pieces + [q.new_zeros(sizes[-1], *q.shape[1:])])


def _attend_documents(q, k, v, dropout_p, softmax_scale, window):
    """m documents of one length n: (m, n, H, D) q, k, v -> (m, n, H, D)."""
    m, n = q.shape[:2]
    if window is None or n <= LOCAL_CHUNK + 2 * window:  # whole: no mask where every key is within reach
        band = None if window is None or n <= window + 1 else _band(n, window, q.device)
        out = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), attn_mask=band,
                                             dropout_p=dropout_p, scale=softmax_scale)
        return out.transpose(1, 2)
    c, w = LOCAL_CHUNK, window
    chunks = -(-n // c)
    qc = F.pad(q, (0, 0, 0, 0, 0, chunks * c - n)).view(m * chunks, c, *q.shape[2:])
    # chunk i's queries are positions i*c .. i*c+c-1; its keys i*c-w .. i*c+c-1+w (padding outside the document)
    kc, vc = (F.pad(x, (0, 0, 0, 0, w, chunks * c - n + w)).unfold(1, c + 2 * w, c).permute(0, 1, 4, 2, 3)
              .reshape(m * chunks, c + 2 * w, *q.shape[2:]) for x in (k, v))
    key_pos = torch.arange(chunks, device=q.device)[:, None] * c - w + torch.arange(c + 2 * w, device=q.device)
    query_pos = torch.arange(chunks, device=q.device)[:, None] * c + torch.arange(c, device=q.device)
    near = (query_pos[:, :, None] - key_pos[:, None, :]).abs() <= w
    mask = near & (key_pos >= 0)[:, None, :] & (key_pos < n)[:, None, :]
    mask |= (query_pos >= n)[:, :, None]  # padded query rows (dropped below) see everything: never an empty row
    out = F.scaled_dot_product_attention(qc.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2),
                                         attn_mask=mask.repeat(m, 1, 1)[:, None], dropout_p=dropout_p,
                                         scale=softmax_scale)
    return out.transpose(1, 2).reshape(m, chunks * c, *q.shape[2:])[:, :n]


def _varlen_nested(q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale):
    offsets = cu_seqlens.to(torch.int64)
    end, used = q.shape[0], int(offsets[-1])  # nested tensors read their offsets on the host anyway

    def nested(x):
        return torch.nested.nested_tensor_from_jagged(x[:used].contiguous(), offsets,
                                                      max_seqlen=max_seqlen).transpose(1, 2)

    out = F.scaled_dot_product_attention(nested(q), nested(k), nested(v), dropout_p=dropout_p, scale=softmax_scale)
    values = out.transpose(1, 2).values()
    return values if values.shape[0] == end else F.pad(values, (0, 0, 0, 0, 0, end - values.shape[0]))


def _varlen_flash(q, k, v, cu_seqlens, max_seqlen, softmax_scale):
    from torch.nn.attention.varlen import varlen_attn

    cu = cu_seqlens.to(torch.int32)
    # rows past cu[-1] belong to no sequence: zero them going in (so their gradients are zero whatever the kernel
    # leaves there) and coming out, without reading cu[-1] back from the GPU
    used = (torch.arange(q.shape[0], device=q.device) < cu[-1])[:, None, None]
    q, k, v = (torch.where(used, x, 0.0) for x in (q, k, v))
    return torch.where(used, varlen_attn(q, k, v, cu, cu, max_seqlen, max_seqlen, scale=softmax_scale), 0.0)


GRID_LIMIT = 1.25  # on the CPU, a padded grid this many times the real tokens or more: attend document by document


def varlen_impl(device: torch.device, dropout_p: float, grid_share: float = 1.0, window_cuts: bool = False) -> str:
    """Which varlen path runs: BERTKIT_TORCH_VARLEN, else on the CPU each document alone where the padded grid would
    be `grid_share` >= GRID_LIMIT times the real tokens (fine-tuning's mixed lengths) or a local layer's window cuts
    documents long enough to chunk (`window_cuts`); batches of near-full instances keep the grid, whose one call is
    cheaper than many small ones. (The budget recipe's 64-token MLM batches, grid about 1.3x their tokens, go by
    document: a pace A/B against the grid was within its noise, benchmarks/results/gates.md.) Else varlen_attn on CUDA
    without dropout, else padding."""
    impl = os.environ.get("BERTKIT_TORCH_VARLEN", "auto")
    if impl not in VARLEN_IMPLS:
        raise ValueError(f"BERTKIT_TORCH_VARLEN={impl!r}: choose one of {', '.join(VARLEN_IMPLS)}")
    if impl == "auto":
        flash = device.type == "cuda" and dropout_p == 0.0 and _has_varlen_attn()
        by_document = device.type == "cpu" and (window_cuts or grid_share >= GRID_LIMIT)
        impl = "documents" if by_document else "varlen" if flash else "pad"
    return impl


def _has_varlen_attn() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401  (torch >= 2.9)
    except ImportError:
        return False
    return True


def attention_varlen_torch(q, k, v, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, window=None,
                           rope_theta=None):
    """q, k, v: (T, H, D) packed; cu_seqlens: (B + 1,) int32; max_seqlen: a host-side bound on every length.
    A window or rotary embeddings go document by document or through padding (varlen_attn and nested SDPA take
    neither)."""
    if _half_on_cpu(q):
        with torch.autocast("cpu", enabled=False):
            return attention_varlen_torch(q.float(), k.float(), v.float(), cu_seqlens, max_seqlen, dropout_p,
                                          softmax_scale, window, rope_theta).to(q.dtype)
    modern = window is not None or rope_theta is not None
    grid_share = (cu_seqlens.numel() - 1) * max_seqlen / max(1, q.shape[0])
    impl = varlen_impl(q.device, dropout_p, grid_share, window is not None and max_seqlen > LOCAL_CHUNK + 2 * window)
    if impl == "documents":
        out = _varlen_by_document(q, k, v, cu_seqlens, dropout_p, softmax_scale, window, rope_theta)
    elif modern:
        out = _varlen_by_padding(q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale, window, rope_theta)
    elif impl == "varlen":
        if dropout_p > 0.0:
            raise ValueError("BERTKIT_TORCH_VARLEN=varlen: varlen_attn has no dropout; use pad or njt")
        out = _varlen_flash(q, k, v, cu_seqlens, max_seqlen, softmax_scale)
    elif impl == "njt":
        out = _varlen_nested(q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale)
    else:
        out = _varlen_by_padding(q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale)
    return out.to(q.dtype)


# LayerNorm(dropout(x) + residual): F.dropout, the add and F.layer_norm, which is what the reference already is
add_layer_norm_torch = add_layer_norm_reference
