"""Attention benchmark: bertkit's Triton kernels vs what a PyTorch user gets, at BERT shapes (needs a CUDA GPU).

    python benchmarks/gates/attention.py [--batches 32 128 256] [--seqs 128 512] [--dtype bf16] [--dropout 0.0]

Providers: bertkit (padded, reading Q/K/V from the fused QKV output), bertkit-varlen (packed tokens), the same two
through `--kernels torch` (bertkit-torch, bertkit-torch-varlen: kernels/torch_backend.py), torch SDPA
with a boolean padding mask (lands on the memory-efficient kernel), torch SDPA on a jagged nested tensor (flash),
and flash-attn's varlen kernel when installed. Lengths are uniform in [S/4, S]; FLOPs count only real tokens
(forward 4·Σ L²·H·D, backward 2.5x that), so padding is never credited as work. Bytes are the minimum traffic
of the packed tensors (forward q, k, v, o; backward q, k, v, o, dO, dQ, dK, dV). Fractions are of this GPU's
measured copy bandwidth and bf16 matmul throughput. Prints a table, writes JSON to benchmarks/results/.
"""
import argparse
import sys
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
import torch
from gpulib import (
    DTYPES,
    bench,
    copy_bandwidth,
    environment,
    make_inputs,
    matmul_peak,
    no_gpu,
    providers,
    write_gpu_result,
)


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
