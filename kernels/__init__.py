"""Fused kernels with one functional entry each; the model calls only these.

attention(q, k, v, lengths, dropout_p, softmax_scale)
    q, k, v: (batch, seq, heads, head_dim), right-padded (may be strided views of a fused QKV output);
    lengths: (batch,) int32 valid tokens. Returns (batch, seq, heads, head_dim), zero past each length.
attention_varlen(q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale)
    q, k, v: (total_tokens, heads, head_dim); cu_seqlens: (batch + 1,) int32; max_seqlen: a Python int bucket.
add_layer_norm(x, residual, weight, bias, eps, dropout_p)
    LayerNorm(dropout(x) + residual) over the last dim; residual may be None.

Dispatch: Triton on CUDA tensors; the PyTorch reference on the CPU (Triton under TRITON_INTERPRET=1).
Until the Triton kernels land, every device uses the reference.
"""
from kernels.reference import (
    add_layer_norm_reference as add_layer_norm,
    attention_reference as attention,
    attention_varlen_reference as attention_varlen,
)

__all__ = ["attention", "attention_varlen", "add_layer_norm"]
