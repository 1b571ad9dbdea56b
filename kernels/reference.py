"""Plain-PyTorch references for every kernel: the CPU path, and the ground truth in tests."""
import math

import torch
import torch.nn.functional as F

from .common import threshold_and_scale


def attention_reference(q, k, v, lengths, dropout_p=0.0, softmax_scale=None, dropout_mask=None, upcast=True):
    """q, k, v: (batch, seq, heads, head_dim), right-padded; lengths: (batch,) int valid tokens per sequence.

    Returns (batch, seq, heads, head_dim); query rows at or past a sequence's length are zero.
    Computes in fp32 (float64 stays float64); upcast=False keeps the matmuls in the input dtype (softmax in fp32),
    as a user's bf16/fp16 PyTorch code would: FlashAttention's accuracy rule compares against that.
    dropout_mask (batch, heads, seq, seq) bool, when given, replaces the random draw (tests pass the kernels' own).
    """
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32 if upcast else q.dtype
    batch, seq, heads, head_dim = q.shape
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    valid = torch.arange(seq, device=q.device)[None, :] < lengths[:, None]          # (batch, seq)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.to(compute), k.to(compute)) * scale
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores.float() if not upcast else scores, dim=-1).nan_to_num(0.0).to(compute)
    if dropout_mask is not None:
        probs = probs * dropout_mask * threshold_and_scale(dropout_p)[1]
    elif dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v.to(compute))
    return (out * valid[:, :, None, None]).to(q.dtype)


def attention_varlen_reference(q, k, v, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None,
                               dropout_mask=None, upcast=True):
    """q, k, v: (total_tokens, heads, head_dim) packed; cu_seqlens: (batch + 1,) int32 offsets.
    dropout_mask (batch, heads, max_seqlen, max_seqlen) bool: sequence i's mask in its top-left corner."""
    out = torch.zeros_like(q)  # tokens past cu_seqlens[-1] belong to no sequence
    for i in range(cu_seqlens.numel() - 1):
        start, end = int(cu_seqlens[i]), int(cu_seqlens[i + 1])
        n = end - start
        lengths = torch.tensor([n], device=q.device)
        mask = None if dropout_mask is None else dropout_mask[i, :, :n, :n][None]
        out[start:end] = attention_reference(
            q[None, start:end], k[None, start:end], v[None, start:end], lengths, dropout_p, softmax_scale, mask,
            upcast)[0]
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
