"""Residual-add LayerNorm benchmark: bertkit's fused Triton kernel vs torch's add + F.layer_norm (needs a CUDA GPU).

    python benchmarks/layer_norm.py [--shapes 32768x768 16384x1024] [--dtype bf16] [--dropout 0.0]

Bytes count the traffic the fused op needs: forward reads x and the residual and writes y and the pre-norm sum h
(which backward reads; PyTorch saves its add output the same way), backward reads dy and h and writes dh.
The same byte counts are used for both providers, so GB/s compare times; fractions are of the measured copy
bandwidth. `--kernels torch` runs exactly the "torch add+layer_norm" provider (kernels/torch_backend.py uses it).
Prints a table, writes JSON to benchmarks/results/.
"""
import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention import DTYPES, RESULTS, bench, copy_bandwidth, environment  # noqa: E402  (shared GPU helpers)


def providers(x, r, w, b, dropout_p):
    from bertkit import kernels

    def fused():
        return kernels.add_layer_norm(x, r, w, b, 1e-12, dropout_p)

    def torch_eager():
        return F.layer_norm(F.dropout(x, dropout_p) + r, (x.shape[-1],), w, b, 1e-12)

    out = {"bertkit": fused, "torch add+layer_norm": torch_eager}
    try:
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["32768x768", "16384x1024"], help="ROWSxHIDDEN")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/layer_norm.py needs a CUDA GPU (the Triton kernels only compile for GPUs); nothing was "
              "measured on this machine.", file=sys.stderr)
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
        for name, fn in providers(x, r, w, b, args.dropout).items():
            fwd, bwd = measure(fn, [x, r, w, b])
            row = dict(rows=rows, hidden=hidden, dtype=args.dtype, dropout=args.dropout, provider=name,
                       fwd_ms=fwd, bwd_ms=bwd, fwd_GBps=bytes_fwd / fwd / 1e6, bwd_GBps=bytes_bwd / bwd / 1e6)
            row["fwd_frac_copy_bw"] = row["fwd_GBps"] / env["copy_GBps"]
            row["bwd_frac_copy_bw"] = row["bwd_GBps"] / env["copy_GBps"]
            rows_out.append(row)
            print(f"{rows:>6} {hidden:>6} {name:<30} {fwd:8.3f} {bwd:8.3f} {row['fwd_GBps']:9.0f} "
                  f"{row['bwd_GBps']:9.0f} {row['fwd_frac_copy_bw']:8.1%} {row['bwd_frac_copy_bw']:8.1%}", flush=True)

    path = args.out or RESULTS / f"layer_norm-{env['date'][:10]}-{env['device'].replace(' ', '_')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(benchmark="layer_norm", environment=env, rows=rows_out), indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
