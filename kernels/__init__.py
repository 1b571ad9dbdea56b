"""Fused kernels with one functional entry each; the model calls only these.

attention(q, k, v, lengths, dropout_p, softmax_scale)
    q, k, v: (batch, seq, heads, head_dim), right-padded (may be strided views of a fused QKV output);
    lengths: (batch,) int32 valid tokens. Returns (batch, seq, heads, head_dim), zero past each length.
attention_varlen(q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale)
    q, k, v: (total_tokens, heads, head_dim); cu_seqlens: (batch + 1,) int32; max_seqlen: a Python int bucket
    (an upper bound on every sequence's length; it is never read back from the GPU). Tokens past cu_seqlens[-1]
    belong to no sequence: their output rows and gradients are zero.
    Both take window= (each query sees the keys within ±window positions: ModernBERT's local layers) and
    rope_theta= (q and k turned by rotary position embeddings of that base, positions restarting at each sequence;
    the Triton kernels turn them as they load, with no pass of their own).
add_layer_norm(x, residual, weight, bias, eps, dropout_p, prenorm=False)
    LayerNorm(dropout(x) + residual) over the last dim; residual may be None. prenorm=True returns the sum too,
    (LayerNorm(h), h): a pre-LN encoder's residual stream h and the next sub-layer's input, from one fused pass.
packed_rows_and_positions(cu_seqlens, total_tokens)
    Each packed token's sequence and position in it (the model's pooling and the torch backend share this lookup).

Backends, chosen with `use(name)` (the CLI's --kernels) or the BERTKIT_KERNELS environment variable:
  triton     our kernels (kernels/attention.py, kernels/layer_norm.py; torch.library ops bertkit::flash_attn_fwd/bwd,
             bertkit::add_layer_norm_fwd/bwd), on CUDA tensors, or on the CPU in Triton's interpreter when
             TRITON_INTERPRET=1 was set before this package was imported (how the tests check them without a GPU);
  torch      PyTorch's own ops: SDPA and F.layer_norm (kernels/torch_backend.py);
  reference  the einsum references (kernels/reference.py): the tests' ground truth, slow;
  auto       (default) triton where it can run (CUDA, or the interpreter), else torch, which is faster than the
             reference on the CPU (benchmarks/results/gates.md).
Every backend keeps the same contract: padded query rows are zero, and none reads a value back from the device.
A model's weights never depend on the backend.
"""
import os

import torch

from .common import INTERPRET, packed_rows_and_positions  # noqa: F401 (public: the model reads it)
from .reference import add_layer_norm_reference, attention_reference, attention_varlen_reference
from .torch_backend import add_layer_norm_torch, attention_torch, attention_varlen_torch

try:
    from .attention import attention_triton, attention_varlen_triton
    from .layer_norm import add_layer_norm_triton

    HAVE_TRITON = True
except ImportError:  # no triton on this platform
    HAVE_TRITON = False

BACKENDS = ("auto", "triton", "torch", "reference")
_FUNCTIONS = {
    "torch": (attention_torch, attention_varlen_torch, add_layer_norm_torch),
    "reference": (attention_reference, attention_varlen_reference, add_layer_norm_reference),
}
if HAVE_TRITON:
    _FUNCTIONS["triton"] = (attention_triton, attention_varlen_triton, add_layer_norm_triton)


class BackendError(ValueError):
    """The backend asked for does not exist or cannot run on this device."""


def _check(name: str) -> str:
    if name not in BACKENDS:
        raise BackendError(f"kernels backend {name!r}: choose one of {', '.join(BACKENDS)}")
    return name


_backend = _check(os.environ.get("BERTKIT_KERNELS", "auto"))


def use(name: str) -> None:
    """Choose the backend for this process (auto, triton, torch or reference)."""
    global _backend
    _backend = _check(name)


def backend() -> str:
    """The backend asked for (may be "auto")."""
    return _backend


def resolve(device) -> str:
    """The backend that runs for tensors on `device`: triton, torch or reference. Raises BackendError, saying what
    to do, when the one asked for cannot run there."""
    device = torch.device(device)
    triton_here = HAVE_TRITON and (device.type == "cuda" or (INTERPRET and device.type == "cpu"))
    if _backend == "auto":
        return "triton" if triton_here else "torch"
    if _backend == "triton" and not triton_here:
        why = "triton is not installed" if not HAVE_TRITON else f"they run on CUDA, not {device.type}"
        raise BackendError(f"--kernels triton: the Triton kernels cannot run here ({why}); use --kernels torch "
                         "(or auto)")
    return _backend


def attention(q, k, v, lengths, dropout_p=0.0, softmax_scale=None, window=None, rope_theta=None):
    return _FUNCTIONS[resolve(q.device)][0](q, k, v, lengths, dropout_p, softmax_scale, window=window,
                                            rope_theta=rope_theta)


def attention_varlen(q, k, v, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, window=None,
                     rope_theta=None):
    return _FUNCTIONS[resolve(q.device)][1](q, k, v, cu_seqlens, max_seqlen, dropout_p, softmax_scale,
                                            window=window, rope_theta=rope_theta)


def add_layer_norm(x, residual, weight, bias, eps=1e-12, dropout_p=0.0, prenorm=False):
    return _FUNCTIONS[resolve(x.device)][2](x, residual, weight, bias, eps, dropout_p, prenorm)


__all__ = ["BACKENDS", "BackendError", "add_layer_norm", "attention", "attention_varlen", "backend", "resolve", "use"]
