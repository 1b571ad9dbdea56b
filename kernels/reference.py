"""Plain-PyTorch references for every kernel: the CPU path, and the ground truth in tests."""
import math

import torch
import torch.nn.functional as F

from .common import threshold_and_scale


def rotary_tables(seq: int, head_dim: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (seq, head_dim) fp32 for positions 0..seq-1 (RoPE, Su et al. 2021, in the rotate-half layout that
    ModernBERT and transformers use: both halves of a head turn by the same angles). The Triton kernels read these
    same tables, so the two agree to the last bit on the angles."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float) / head_dim)
    angles = torch.arange(seq, device=device, dtype=torch.float)[:, None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


_TABLES = {}


def cached_rotary_tables(seq: int, head_dim: int, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """rotary_tables, made once per (length, dim, base, device): every layer of every step asks for the same."""
    key = (int(seq), int(head_dim), float(theta), str(device))
    if key not in _TABLES:
        if len(_TABLES) > 64:
            _TABLES.clear()
        _TABLES[key] = tuple(t.contiguous() for t in rotary_tables(seq, head_dim, theta, device))
    return _TABLES[key]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, computed in fp32 (float64 stays float64), returned in x's dtype."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.to(compute) * cos.to(compute) + rotated.to(compute) * sin.to(compute)).to(x.dtype)


def attention_reference(q, k, v, lengths, dropout_p=0.0, softmax_scale=None, dropout_mask=None, upcast=True,
                        window=None, rope_theta=None):
    """q, k, v: (batch, seq, heads, head_dim), right-padded; lengths: (batch,) int valid tokens per sequence.

    Returns (batch, seq, heads, head_dim); query rows at or past a sequence's length are zero.
    Computes in fp32 (float64 stays float64); upcast=False keeps the matmuls in the input dtype (softmax in fp32),
    as a user's bf16/fp16 PyTorch code would: FlashAttention's accuracy rule compares against that.
    dropout_mask (batch, heads, seq, seq) bool, when given, replaces the random draw (tests pass the kernels' own).
    window: a query sees only the keys within ±window positions (a sliding-window, "local", layer); None: all.
    rope_theta: q and k are first turned by rotary position embeddings of this base, positions 0.. per sequence.
    """
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32 if upcast else q.dtype
    batch, seq, heads, head_dim = q.shape
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    if rope_theta is not None:
        cos, sin = rotary_tables(seq, head_dim, rope_theta, q.device)
        q, k = apply_rotary(q, cos[:, None], sin[:, None]), apply_rotary(k, cos[:, None], sin[:, None])
    valid = torch.arange(seq, device=q.device)[None, :] < lengths[:, None]          # (batch, seq)
    keys = valid[:, None, None, :]
    if window is not None:
        idx = torch.arange(seq, device=q.device)
        keys = keys & ((idx[:, None] - idx[None, :]).abs() <= window)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.to(compute), k.to(compute)) * scale
    scores = scores.masked_fill(~keys, float("-inf"))
    probs = torch.softmax(scores.float() if not upcast else scores, dim=-1).nan_to_num(0.0).to(compute)
    if dropout_mask is not None:
        probs = probs * dropout_mask * threshold_and_scale(dropout_p)[1]
    elif dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v.to(compute))
    return (out * valid[:, :, None, None]).to(q.dtype)


def attention_varlen_reference(q, k, v, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None,
                               dropout_mask=None, upcast=True, window=None, rope_theta=None):
    """q, k, v: (total_tokens, heads, head_dim) packed; cu_seqlens: (batch + 1,) int32 offsets.
    dropout_mask (batch, heads, max_seqlen, max_seqlen) bool: sequence i's mask in its top-left corner.
    Each sequence is attended alone: its positions (rotary) and window start at its first token."""
    out = torch.zeros_like(q)  # tokens past cu_seqlens[-1] belong to no sequence
    for i in range(cu_seqlens.numel() - 1):
        start, end = int(cu_seqlens[i]), int(cu_seqlens[i + 1])
        n = end - start
        lengths = torch.tensor([n], device=q.device)
        mask = None if dropout_mask is None else dropout_mask[i, :, :n, :n][None]
        out[start:end] = attention_reference(
            q[None, start:end], k[None, start:end], v[None, start:end], lengths, dropout_p, softmax_scale, mask,
            upcast, window, rope_theta)[0]
    return out


def add_layer_norm_reference(x, residual, weight, bias, eps=1e-12, dropout_p=0.0, prenorm=False, dropout_mask=None):
    """LayerNorm(dropout(x) + residual): BERT's post-LN sub-layer output. residual may be None.
    prenorm: returns (LayerNorm(h), h) with h = dropout(x) + residual, the residual stream of a pre-LN encoder.

    dropout_mask (x's shape, bool), when given, replaces the random draw (tests pass the kernels' own mask)."""
    if dropout_mask is not None:
        x = x * dropout_mask * threshold_and_scale(dropout_p)[1]
    elif dropout_p > 0.0:
        x = F.dropout(x, p=dropout_p)
    if residual is not None:
        x = x + residual
    y = F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    return (y, x) if prenorm else y
