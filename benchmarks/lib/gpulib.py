"""What the GPU benchmarks share (the gates attention, layer_norm, host_overhead, modernbert_attention,
attention_tiles, triton_launch): the GPU's environment, a refusal without CUDA, timing by triton's do_bench, the
card's copy bandwidth and matmul peak, and the attention providers timed against each other."""
import json
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from record import RESULTS, run_info

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def environment(benchmark):
    """run_info (date, commit, load) plus the GPU and the library versions."""
    import triton

    try:
        import flash_attn

        fa = flash_attn.__version__
    except ImportError:
        fa = None
    return dict(run_info(benchmark), device=torch.cuda.get_device_name(),
                capability=list(torch.cuda.get_device_capability()), torch=torch.__version__,
                triton=triton.__version__, cuda=torch.version.cuda, flash_attn=fa, host=platform.node())


def no_gpu(script: str) -> bool:
    """Says so and returns True where there is no CUDA GPU (the Triton kernels only compile for GPUs)."""
    if torch.cuda.is_available():
        return False
    print(f"benchmarks/gates/{script} needs a CUDA GPU (the Triton kernels only compile for GPUs); nothing was "
          "measured on this machine.", file=sys.stderr)
    return True


def write_gpu_result(env: dict, out: Path | None, **payload) -> Path:
    """The JSON of a GPU benchmark: `out`, else benchmarks/results/<benchmark>-<date>-<device>.json."""
    name = env["benchmark"]
    path = out or RESULTS / f"{name}-{env['date'][:10]}-{env['device'].replace(' ', '_')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(benchmark=name, environment=env, **payload), indent=1) + "\n")
    print(f"wrote {path}")
    return path


def bench(fn):
    """Median milliseconds (triton.testing.do_bench flushes L2 between runs)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def copy_bandwidth():
    """GB/s of a 1 GiB device-to-device copy (read + write)."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / bench(lambda: dst.copy_(src)) / 1e6


def matmul_peak(dtype):
    """TFLOP/s of an 8192^3 matmul in `dtype`."""
    a = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    b = torch.randn(8192, 8192, device="cuda", dtype=dtype)
    return 2 * 8192**3 / bench(lambda: a @ b) / 1e9


def make_inputs(batch, seq, heads, head_dim, dtype, gen):
    lengths = torch.randint(seq // 4, seq + 1, (batch,), device="cuda", generator=gen, dtype=torch.int32)
    lengths[0] = seq  # the bucket is full at least once, as in a real batch
    qkv = torch.randn(batch, seq, 3, heads, head_dim, device="cuda", dtype=dtype, generator=gen)
    return qkv, lengths


def providers(qkv, lengths, dropout_p, backends=("triton", "torch")):
    """name -> (forward fn returning (output, leaves)); each closure builds its own layout outside the timing."""
    from bertkit.kernels.attention import attention_triton, attention_varlen_triton
    from bertkit.kernels.torch_backend import attention_torch, attention_varlen_torch

    batch, seq, _, heads, head_dim = qkv.shape
    valid = torch.arange(seq, device="cuda")[None, :] < lengths[:, None]
    cu = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    packed = qkv[valid]  # (tokens, 3, heads, head_dim)
    out = {}

    padded_leaf = qkv.detach().clone().requires_grad_()
    packed_leaf = packed.detach().clone().requires_grad_()
    ours = {"triton": ("bertkit", attention_triton, attention_varlen_triton),
            "torch": ("bertkit-torch", attention_torch, attention_varlen_torch)}
    for backend in backends:
        name, padded_fn, varlen_fn = ours[backend]
        out[name] = lambda f=padded_fn: (f(*padded_leaf.unbind(2), lengths, dropout_p), [padded_leaf])
        out[f"{name}-varlen"] = lambda f=varlen_fn: (f(*packed_leaf.unbind(1), cu, seq, dropout_p), [packed_leaf])

    mask = valid[:, None, None, :]  # (batch, 1, 1, keys): broadcast over heads and queries

    def sdpa_mask():
        q, k, v = (t.transpose(1, 2) for t in padded_leaf.unbind(2))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        return o.transpose(1, 2), [padded_leaf]

    out["sdpa-mask"] = sdpa_mask

    offsets = cu.long()
    separate = [t.contiguous().requires_grad_() for t in packed.unbind(1)]  # jagged tensors want contiguous values

    def sdpa_nested():
        q, k, v = (torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2) for t in separate)
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        return o.transpose(1, 2).values(), separate

    out["sdpa-nested"] = sdpa_nested

    try:
        from flash_attn import flash_attn_varlen_func

        def flash():
            q, k, v = packed_leaf.unbind(1)
            return flash_attn_varlen_func(q, k, v, cu, cu, seq, seq, dropout_p), [packed_leaf]

        out["flash-attn-varlen"] = flash
    except ImportError:
        pass
    return out
