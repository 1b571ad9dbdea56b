"""Host (CPU) time per call of each layer of the Triton path, on a GPU: where a step goes when the GPU waits.

    python benchmarks/gates/host_overhead.py [--calls 300]

On an H100 the BERT-base step at 128 tokens spent less GPU time with the Triton kernels than with PyTorch's, yet
ran slower: the host could not launch work fast enough (torch.profiler, 2026-11-24). This times, at a small shape
where the GPU is never the bottleneck, the CPU microseconds per call of: the raw Triton launch, the launcher
function (allocation, strides, tile choice), the torch.library custom op, and the public autograd entry, forward
and backward, beside PyTorch's own ops. Prints a table, writes JSON to benchmarks/results/.
"""
import argparse
import importlib
import sys
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
import torch
import torch.nn.functional as F
from gpulib import environment, make_inputs, no_gpu, providers, write_gpu_result


def host_us(fn, calls):
    """Mean CPU microseconds per call, the GPU kept ahead of (small shapes: it idles, never the host)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t
    torch.cuda.synchronize()
    return 1e6 * elapsed / calls


def layer_norm_rows(calls):
    ln = importlib.import_module("bertkit.kernels.layer_norm")
    from bertkit import kernels

    rows, hidden = 1024, 768
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn_like(x, requires_grad=True)
    w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn_like(w, requires_grad=True)
    seed = torch.zeros(1, dtype=torch.int64, device="cuda")
    y, h, mean, rstd = ln.add_ln_forward(x, r, w, b, seed, 1e-12, 0.0)
    dy = torch.randn_like(y)
    block_m, block_n, warps = ln.tile_shape(hidden)
    y2, h2 = torch.empty_like(x), torch.empty_like(x)

    def raw_launch():
        ln._add_ln_fwd[(triton_cdiv(rows, block_m),)](
            x, r, w, b, y2, h2, mean, rstd, mean, rows, hidden, hidden, hidden, hidden, hidden, 1e-12, 0, 1.0,
            BLOCK_M=block_m, BLOCK_N=block_n, HAS_RESIDUAL=True, DROPOUT=False, STORE_H=True, num_warps=warps)

    def both(fn):
        def run():
            for leaf in (x, r, w, b):
                leaf.grad = None
            fn().backward(dy)
        return run

    with torch.no_grad():
        out = {
            "layer_norm fwd: raw Triton launch": host_us(raw_launch, calls),
            "layer_norm fwd: launcher (add_ln_forward)": host_us(
                lambda: ln.add_ln_forward(x, r, w, b, seed, 1e-12, 0.0), calls),
            "layer_norm fwd: custom op": host_us(
                lambda: torch.ops.bertkit.add_layer_norm_fwd(x, r, w, b, seed, 1e-12, 0.0), calls),
            "layer_norm bwd: launcher (add_ln_backward)": host_us(
                lambda: ln.add_ln_backward(dy, h, w, mean, rstd, seed, 0.0), calls),
            "layer_norm bwd: custom op": host_us(
                lambda: torch.ops.bertkit.add_layer_norm_bwd(dy, h, w, mean, rstd, seed, 0.0), calls),
            "layer_norm fwd: torch add + F.layer_norm": host_us(
                lambda: F.layer_norm(x + r, (hidden,), w, b, 1e-12), calls),
        }
    kernels.use("triton")
    out["layer_norm fwd+bwd: bertkit triton (autograd)"] = host_us(
        both(lambda: kernels.add_layer_norm(x, r, w, b, 1e-12, 0.0)), calls)
    kernels.use("torch")
    out["layer_norm fwd+bwd: bertkit torch (autograd)"] = host_us(
        both(lambda: kernels.add_layer_norm(x, r, w, b, 1e-12, 0.0)), calls)
    return out


def attention_rows(calls):
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv, lengths = make_inputs(8, 128, 12, 64, torch.bfloat16, gen)
    out = {}
    for name, fn in providers(qkv, lengths, 0.0).items():
        if name not in ("bertkit", "bertkit-torch", "sdpa-mask"):
            continue
        o, leaves = fn()
        grad = torch.randn_like(o)
        with torch.no_grad():
            out[f"attention fwd: {name}"] = host_us(lambda f=fn: f(), calls)

        def both(f=fn):
            for leaf in leaves:
                leaf.grad = None
            y, _ = f()
            y.backward(grad)

        out[f"attention fwd+bwd: {name} (autograd)"] = host_us(both, calls)
    return out


def triton_cdiv(a, b):
    return -(-a // b)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if no_gpu("host_overhead.py"):
        return 0
    env = environment("host_overhead")
    rows = {**layer_norm_rows(args.calls), **attention_rows(args.calls)}
    for name, us in rows.items():
        print(f"{name:<52} {us:8.1f} us", flush=True)
    write_gpu_result(env, args.out, host_us=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
