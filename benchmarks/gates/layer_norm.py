"""Residual-add LayerNorm benchmark: bertkit's fused Triton kernel vs torch's add + F.layer_norm (needs a CUDA GPU).

    python benchmarks/gates/layer_norm.py [--shapes 32768x768 16384x1024] [--dtype bf16] [--dropout 0.0] [--sweep]

Bytes count the traffic the fused op needs: forward reads x and the residual and writes y and the pre-norm sum h
(which backward reads; PyTorch saves its add output the same way), backward reads dy and h and writes dh.
The same byte counts are used for both providers, so GB/s compare times; fractions are of the measured copy
bandwidth. `--kernels torch` runs exactly the "torch add+layer_norm" provider (kernels/torch_backend.py uses it).
`--sweep` times the fused kernel over launch shapes instead (rows per tile, warps, backward programs per SM), to
choose kernels/layer_norm.py's `tile_shape`. Prints a table, writes JSON to benchmarks/results/.
"""
import argparse
import sys
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
import torch
import torch.nn.functional as F
from gpulib import DTYPES, bench, copy_bandwidth, environment, no_gpu, write_gpu_result


def providers(x, r, w, b, dropout_p):
    from bertkit import kernels

    def fused():
        return kernels.add_layer_norm(x, r, w, b, 1e-12, dropout_p)

    def torch_eager():
        return F.layer_norm(F.dropout(x, dropout_p) + r, (x.shape[-1],), w, b, 1e-12)

    out = {"bertkit": fused, "torch add+layer_norm": torch_eager}
    try:
        torch._functorch.config.donated_buffer = False  # measure() replays one graph's backward (retain_graph)
        compiled = torch.compile(torch_eager)
        compiled()
        out["torch.compile add+layer_norm"] = compiled
    except Exception as e:  # noqa: BLE001 - compile may be unavailable; the eager baseline still runs
        print(f"  torch.compile baseline skipped: {str(e).splitlines()[0][:120]}", file=sys.stderr)
    return out


def measure(fn, leaves):
    y = fn()
    grad = torch.randn_like(y)
    fwd = bench(fn)
    y = fn()

    def backward():
        for leaf in leaves:
            leaf.grad = None
        y.backward(grad, retain_graph=True)

    return fwd, bench(backward)


def kernels_tile(hidden):
    import importlib

    return importlib.import_module("bertkit.kernels.layer_norm").tile_shape(hidden)


def sweep(x, r, w, b, dropout_p, bytes_fwd, bytes_bwd, copy_GBps):
    """The fused kernel at every (rows per tile, warps) and backward program count; rows of the table and JSON."""
    import importlib

    from bertkit import kernels

    ln = importlib.import_module("bertkit.kernels.layer_norm")
    shipped_tile, shipped_programs = ln.tile_shape, ln._num_programs
    block_n = shipped_tile(x.shape[-1])[1]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = []
    try:
        for block_m in (1, 2, 4, 8, 16):
            for warps in (2, 4, 8):
                for per_sm in (2, 4, 8):
                    ln.tile_shape = lambda n, bm=block_m, wp=warps: (bm, block_n, wp)
                    ln._num_programs = lambda n_rows, bm, device, k=per_sm: max(1, min(k * sms, -(-n_rows // bm)))
                    fwd, bwd = measure(lambda: kernels.add_layer_norm(x, r, w, b, 1e-12, dropout_p), [x, r, w, b])
                    out.append(dict(block_m=block_m, warps=warps, programs_per_sm=per_sm, fwd_ms=fwd, bwd_ms=bwd,
                                    fwd_frac_copy_bw=bytes_fwd / fwd / 1e6 / copy_GBps,
                                    bwd_frac_copy_bw=bytes_bwd / bwd / 1e6 / copy_GBps))
    finally:
        ln.tile_shape, ln._num_programs = shipped_tile, shipped_programs
    for key in ("fwd", "bwd"):
        best = sorted(out, key=lambda row: row[f"{key}_ms"])[:3]
        print("  best " + key + ": " + "; ".join(
            f"rows {t['block_m']} warps {t['warps']} programs/SM {t['programs_per_sm']} {t[key + '_ms']:.3f} ms "
            f"({t[key + '_frac_copy_bw']:.0%})" for t in best), flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["32768x768", "16384x1024"], help="ROWSxHIDDEN")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--sweep", action="store_true", help="time the fused kernel's launch shapes instead")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if no_gpu("layer_norm.py"):
        return 0

    dtype = DTYPES[args.dtype]
    env = environment("layer_norm")
    env["copy_GBps"] = copy_bandwidth()
    print(f"{env['device']}: copy {env['copy_GBps']:.0f} GB/s")
    print(f"{'rows':>6} {'hidden':>6} {'provider':<30} {'fwd ms':>8} {'bwd ms':>8} {'fwd GB/s':>9} {'bwd GB/s':>9} "
          f"{'fwd %bw':>8} {'bwd %bw':>8}")
    rows_out = []
    for shape in args.shapes:
        rows, hidden = (int(v) for v in shape.lower().split("x"))
        x = torch.randn(rows, hidden, device="cuda", dtype=dtype, requires_grad=True)
        r = torch.randn(rows, hidden, device="cuda", dtype=dtype, requires_grad=True)
        w = torch.ones(hidden, device="cuda", dtype=dtype, requires_grad=True)
        b = torch.zeros(hidden, device="cuda", dtype=dtype, requires_grad=True)
        unit = rows * hidden * x.element_size()
        bytes_fwd, bytes_bwd = 4 * unit, 3 * unit + (unit if args.dropout > 0 else 0)
        if args.sweep:
            print(f"{rows} x {hidden}: shipped tile {kernels_tile(hidden)}")
            rows_out.append(dict(rows=rows, hidden=hidden, dtype=args.dtype, dropout=args.dropout,
                                 sweep=sweep(x, r, w, b, args.dropout, bytes_fwd, bytes_bwd, env["copy_GBps"])))
            continue
        for name, fn in providers(x, r, w, b, args.dropout).items():
            fwd, bwd = measure(fn, [x, r, w, b])
            row = dict(rows=rows, hidden=hidden, dtype=args.dtype, dropout=args.dropout, provider=name,
                       fwd_ms=fwd, bwd_ms=bwd, fwd_GBps=bytes_fwd / fwd / 1e6, bwd_GBps=bytes_bwd / bwd / 1e6)
            row["fwd_frac_copy_bw"] = row["fwd_GBps"] / env["copy_GBps"]
            row["bwd_frac_copy_bw"] = row["bwd_GBps"] / env["copy_GBps"]
            rows_out.append(row)
            print(f"{rows:>6} {hidden:>6} {name:<30} {fwd:8.3f} {bwd:8.3f} {row['fwd_GBps']:9.0f} "
                  f"{row['bwd_GBps']:9.0f} {row['fwd_frac_copy_bw']:8.1%} {row['bwd_frac_copy_bw']:8.1%}", flush=True)

    write_gpu_result(env, args.out, rows=rows_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
