"""Attention benchmark: bertkit's Triton kernels vs what a PyTorch user gets, at BERT shapes (needs a CUDA GPU).

    python benchmarks/attention.py [--batches 32 128 256] [--seqs 128 512] [--dtype bf16] [--dropout 0.0]

Providers: bertkit (padded, reading Q/K/V from the fused QKV output), bertkit-varlen (packed tokens), the same two
through `--kernels torch` (bertkit-torch, bertkit-torch-varlen: kernels/torch_backend.py), torch SDPA
with a boolean padding mask (lands on the memory-efficient kernel), torch SDPA on a jagged nested tensor (flash),
and flash-attn's varlen kernel when installed. Lengths are uniform in [S/4, S]; FLOPs count only real tokens
(forward 4·Σ L²·H·D, backward 2.5x that), so padding is never credited as work. Bytes are the minimum traffic
of the packed tensors (forward q, k, v, o; backward q, k, v, o, dO, dQ, dK, dV). Fractions are of this GPU's
measured copy bandwidth and bf16 matmul throughput. Prints a table, writes JSON to benchmarks/results/.
"""
import argparse
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
    print(f"benchmarks/{script} needs a CUDA GPU (the Triton kernels only compile for GPUs); nothing was measured on "
          "this machine.", file=sys.stderr)
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


def measure(fn):
    """(forward ms, backward ms, forward+backward ms) or None where the provider fails at this shape."""
    try:
        o, leaves = fn()
        grad = torch.randn_like(o)
        fwd = bench(lambda: fn())
        o, leaves = fn()

        def backward():
            for leaf in leaves:
                leaf.grad = None
            o.backward(grad, retain_graph=True)

        bwd = bench(backward)

        def both():
            for leaf in leaves:
                leaf.grad = None
            y, _ = fn()
            y.backward(grad)

        return fwd, bwd, bench(both)
    except (RuntimeError, NotImplementedError) as e:  # e.g. no SDPA backend for this combination
        print(f"  skipped: {str(e).splitlines()[0][:120]}", file=sys.stderr)
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 128, 256])
    ap.add_argument("--seqs", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--kernels", nargs="+", choices=["triton", "torch"], default=["triton", "torch"],
                    help="bertkit's backends to time (besides SDPA and flash-attn)")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default benchmarks/results/attention-*.json)")
    args = ap.parse_args(argv)
    if no_gpu("attention.py"):
        return 0

    dtype = DTYPES[args.dtype]
    env = environment("attention")
    env["copy_GBps"] = copy_bandwidth()
    env["matmul_TFLOPs"] = matmul_peak(dtype)
    print(f"{env['device']}: copy {env['copy_GBps']:.0f} GB/s, {args.dtype} matmul {env['matmul_TFLOPs']:.0f} TFLOP/s")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    header = f"{'batch':>5} {'seq':>4} {'provider':<18} {'fwd ms':>8} {'bwd ms':>8} {'f+b ms':>8} " \
             f"{'fwd TF/s':>9} {'f+b TF/s':>9} {'fwd %bw':>8} {'bwd %bw':>8} {'f+b %mm':>8}"
    print(header)
    for seq in args.seqs:
        for batch in args.batches:
            qkv, lengths = make_inputs(batch, seq, args.heads, args.head_dim, dtype, gen)
            tokens = int(lengths.sum())
            flops_fwd = 4.0 * float((lengths.double() ** 2).sum()) * args.heads * args.head_dim
            flops_bwd = 2.5 * flops_fwd
            unit = tokens * args.heads * args.head_dim * qkv.element_size()
            bytes_fwd, bytes_bwd = 4 * unit, 8 * unit
            for name, fn in providers(qkv, lengths, args.dropout, args.kernels).items():
                times = measure(fn)
                if times is None:
                    continue
                fwd, bwd, both = times
                row = dict(batch=batch, seq=seq, heads=args.heads, head_dim=args.head_dim, dtype=args.dtype,
                           dropout=args.dropout, tokens=tokens, provider=name, fwd_ms=fwd, bwd_ms=bwd,
                           fwd_bwd_ms=both, fwd_TFLOPs=flops_fwd / fwd / 1e9, bwd_TFLOPs=flops_bwd / bwd / 1e9,
                           fwd_bwd_TFLOPs=(flops_fwd + flops_bwd) / both / 1e9,
                           fwd_GBps=bytes_fwd / fwd / 1e6, bwd_GBps=bytes_bwd / bwd / 1e6)
                row["fwd_frac_copy_bw"] = row["fwd_GBps"] / env["copy_GBps"]
                row["bwd_frac_copy_bw"] = row["bwd_GBps"] / env["copy_GBps"]
                row["fwd_bwd_frac_matmul"] = row["fwd_bwd_TFLOPs"] / env["matmul_TFLOPs"]
                rows.append(row)
                print(f"{batch:>5} {seq:>4} {name:<18} {fwd:8.3f} {bwd:8.3f} {both:8.3f} "
                      f"{row['fwd_TFLOPs']:9.1f} {row['fwd_bwd_TFLOPs']:9.1f} {row['fwd_frac_copy_bw']:8.1%} "
                      f"{row['bwd_frac_copy_bw']:8.1%} {row['fwd_bwd_frac_matmul']:8.1%}", flush=True)
            del qkv
            torch.cuda.empty_cache()

    write_gpu_result(env, args.out, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
