"""Fused kernels with one functional entry each; the model calls only these.

attention(q, k, v, lengths, dropout_p, softmax_scale)
    q, k, v: (batch, seq, heads, head_dim), right-padded (may be strided views of a fused QKV output);
    lengths: (batch,) int32 valid tokens. Returns (batch, seq, heads, head_dim), zero past each length.
attention_varlen(q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale)
    q, k, v: (total_tokens, heads, head_dim); cu_seqlens: (batch + 1,) int32; max_seqlen: a Python int bucket
    (an upper bound on every sequence's length; it is never read back from the GPU).
add_layer_norm(x, residual, weight, bias, eps, dropout_p)
    LayerNorm(dropout(x) + residual) over the last dim; residual may be None.

Dispatch: the Triton kernels (kernels/attention.py, kernels/layer_norm.py, registered as torch.library ops
bertkit::flash_attn_fwd/bwd and bertkit::add_layer_norm_fwd/bwd) on CUDA tensors; the PyTorch reference
(kernels/reference.py) on the CPU, except when TRITON_INTERPRET=1 was set before `kernels` was imported, where the
CPU runs the Triton code itself in Triton's interpreter (that is how the tests check the kernels without a GPU).
"""
from .common import INTERPRET
from .reference import add_layer_norm_reference, attention_reference, attention_varlen_reference

try:
    from .attention import attention_triton, attention_varlen_triton
    from .layer_norm import add_layer_norm_triton

    HAVE_TRITON = True
except ImportError:  # no triton on this platform: the references serve every device
    HAVE_TRITON = False


def _triton_for(t):
    return HAVE_TRITON and (t.is_cuda or (INTERPRET and t.device.type == "cpu"))


def attention(q, k, v, lengths, dropout_p=0.0, softmax_scale=None):
    if _triton_for(q):
        return attention_triton(q, k, v, lengths, dropout_p, softmax_scale)
    return attention_reference(q, k, v, lengths, dropout_p, softmax_scale)


def attention_varlen(q, k, v, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None):
    if _triton_for(q):
        return attention_varlen_triton(q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale)
    return attention_varlen_reference(q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale)


def add_layer_norm(x, residual, weight, bias, eps=1e-12, dropout_p=0.0):
    if _triton_for(x):
        return add_layer_norm_triton(x, residual, weight, bias, eps, dropout_p)
    return add_layer_norm_reference(x, residual, weight, bias, eps, dropout_p)


__all__ = ["attention", "attention_varlen", "add_layer_norm"]
