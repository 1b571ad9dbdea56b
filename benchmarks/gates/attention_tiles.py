"""Which tiles the attention backward wants on this GPU: ModernBERT's global layer (RoPE, no window) at one length,
fwd + bwd time with each candidate (BLOCK_M, BLOCK_N, warps, stages) forced on dK/dV (dQ as autotuned) and then on dQ
(dK/dV as autotuned). Candidates outside the shipped lists are the point: the lists were chosen by compile reports,
not by timings at 8,192 tokens. Stops at --deadline seconds and prints what it has (needs a CUDA GPU).

    python benchmarks/gates/attention_tiles.py [--seq 8192] [--tokens 32768] [--deadline 150] [--out FILE]
"""
import argparse
import itertools
import sys
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
import torch
from gpulib import bench, environment, no_gpu, write_gpu_result

HEADS, HEAD_DIM, THETA = 12, 64, 160_000.0


def candidates():
    """(m, n, warps, stages), three stages first (the shipped lists' usual choice)."""
    grid = itertools.product((3, 2), (32, 64, 128), (64, 128, 32), (8, 4))
    return [(m, n, w, st) for st, m, n, w in grid]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--deadline", type=float, default=150.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if no_gpu("attention_tiles.py"):
        return 0
    from bertkit import kernels
    from bertkit.kernels.attention import forced_configs

    kernels.use("triton")
    start, env = time.monotonic(), environment("attention_tiles")
    docs = max(1, args.tokens // args.seq)
    cu = torch.arange(0, docs + 1, device="cuda", dtype=torch.int32) * args.seq
    q, k, v = (torch.randn(docs * args.seq, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn_like(q)

    def step():
        out = kernels.attention_varlen(q, k, v, cu, args.seq, rope_theta=THETA)
        return torch.autograd.grad(out, (q, k, v), dout)

    rows = [{"kernel": "autotuned", "config": None, "fwd_bwd_ms": bench(step)}]
    print(f"autotuned: {rows[0]['fwd_bwd_ms']:.3f} ms", flush=True)
    for kernel, config in [(kn, c) for kn in ("dkdv", "dq") for c in candidates()]:
        if time.monotonic() - start > args.deadline:
            print("deadline reached", flush=True)
            break
        try:
            with forced_configs(**{kernel: config}):
                ms = bench(step)
            rows.append({"kernel": kernel, "config": list(config), "fwd_bwd_ms": ms})
            print(f"{kernel:5} {config}: {ms:.3f} ms", flush=True)
        except Exception as e:  # too much shared memory, a failed compile: a row that says so
            rows.append({"kernel": kernel, "config": list(config), "error": f"{type(e).__name__}: {str(e)[:120]}"})
            print(f"{kernel:5} {config}: {type(e).__name__}", flush=True)
    timed = sorted((r for r in rows if "fwd_bwd_ms" in r), key=lambda r: r["fwd_bwd_ms"])
    print(f"\n{env['device']}, global layer, {docs} x {args.seq} tokens, bf16; fastest first:")
    for r in timed[:10]:
        print(f"  {r['kernel']:9} {r['config']}  {r['fwd_bwd_ms']:.3f} ms")
    write_gpu_result(env, args.out, seq=args.seq, tokens=args.tokens, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
