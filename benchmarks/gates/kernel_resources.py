"""What each Triton kernel costs the GPU, measured without one: compiles every configuration for sm_90 (H100/H200)
on the CPU with Triton's own ptxas, and reports registers per thread, spill bytes, shared memory and whether the
matmuls lowered to Hopper's wgmma. A spilling configuration round-trips registers through local memory in its inner
loop, so configurations that spill are dropped from the autotuning lists; timing still needs a GPU
(benchmarks/gates/attention.py, benchmarks/gates/layer_norm.py).

    python benchmarks/gates/kernel_resources.py                 # the shipped configurations, padded and varlen
    python benchmarks/gates/kernel_resources.py --grid          # every tile shape, padded layout (slow: ~1 s each)
    python benchmarks/gates/kernel_resources.py --head-dims 64 --kernels fwd dq

Prints a table and writes benchmarks/results/kernel_resources.json, kernel_resources_grid.json, or for a subset of
kernels, head dims or hidden sizes kernel_resources_partial.json (so the full record is kept).
"""
import argparse
import itertools
import warnings

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from record import run_info, write_result

ATTENTION_KERNELS = ("fwd", "dkdv", "dq")
MAX_SHARED = 232448  # bytes of shared memory one block may use on sm_90 (227 KiB)
GRID = [(m, n, w, s) for m, n, w, s in itertools.product((32, 64, 128), (32, 64, 128), (4, 8), (2, 3))
        if not (w == 8 and m * n < 64 * 64)]


def _usage(compiled) -> dict:
    from bertkit.kernels.offline import ptxas_usage

    regs, spill = ptxas_usage(compiled)
    shared = compiled.metadata.shared
    return dict(registers=regs, spill_bytes=spill, shared_bytes=shared, fits=spill == 0 and shared <= MAX_SHARED)


def attention_row(kind, config, head_dim, dropout, varlen=False):
    from bertkit.kernels.offline import compile_attention_kernel

    compiled = compile_attention_kernel(kind, config, head_dim, dropout, varlen)
    block_m, block_n, warps, stages = config
    return dict(kernel=kind, block_m=block_m, block_n=block_n, warps=warps, stages=stages, head_dim=head_dim,
                varlen=varlen, dropout=dropout, **_usage(compiled), wgmma="wgmma" in compiled.asm["ptx"])


def layer_norm_rows(hidden, dropout):
    import importlib

    from bertkit.kernels.offline import compile_layer_norm_kernels

    block_m, block_n, warps = importlib.import_module("bertkit.kernels.layer_norm").tile_shape(hidden)
    return [dict(kernel=name, block_m=block_m, block_n=block_n, warps=warps, stages=None, head_dim=None,
                 hidden=hidden, dropout=dropout, **_usage(compiled), wgmma=None)
            for name, compiled in compile_layer_norm_kernels(hidden, dropout).items()]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", nargs="+", default=[*ATTENTION_KERNELS, "layer_norm"])
    ap.add_argument("--head-dims", nargs="+", type=int, default=[32, 64, 128, 256])
    ap.add_argument("--hidden", nargs="+", type=int, default=[768, 1024, 4096])
    ap.add_argument("--grid", action="store_true", help="every tile shape in GRID, not only the shipped lists")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import importlib

    import triton

    attn = importlib.import_module("bertkit.kernels.attention")
    shipped = {"fwd": attn.FWD_CONFIGS, "dkdv": attn.DKDV_CONFIGS, "dq": attn.DQ_CONFIGS}
    rows = []
    header = f"{'kernel':7} {'tile':>9} {'warps':>5} {'stages':>6} {'dim':>5} {'lay':>3} {'drop':>4} {'regs':>4} " \
             f"{'spill B':>7} {'smem KiB':>8} {'wgmma':>5} {'fits':>4}"
    print(header)
    for kind in args.kernels:
        if kind == "layer_norm":
            new = [r for hidden, dropout in itertools.product(args.hidden, (False, True))
                   for r in layer_norm_rows(hidden, dropout)]
        else:
            new = [attention_row(kind, c, d, p, varlen) for d in args.head_dims
                   for c in (GRID if args.grid else shipped[kind][attn.dim_class(attn.block_d_for(d))])
                   for varlen in ((False,) if args.grid else (False, True)) for p in (False, True)]
        for r in new:
            dim = r["head_dim"] if r["head_dim"] is not None else r["hidden"]
            layout = {None: "-", False: "pad", True: "var"}[r.get("varlen")]
            print(f"{r['kernel']:7} {r['block_m']:>4}x{r['block_n']:<4} {r['warps']:>5} {r['stages'] or '-':>6} "
                  f"{dim:>5} {layout:>3} {int(r['dropout']):>4} {r['registers']:>4} {r['spill_bytes']:>7} "
                  f"{r['shared_bytes'] / 1024:>8.1f} {'' if r['wgmma'] is None else r['wgmma']!s:>5} "
                  f"{'yes' if r['fits'] else 'NO':>4}", flush=True)
        rows += new
    info = run_info("kernel_resources")
    info.update(target="sm_90a (compiled on the CPU, no GPU involved)", triton=triton.__version__)
    complete = sorted(args.kernels) == sorted(ap.get_default("kernels")) and args.head_dims == ap.get_default(
        "head_dims") and args.hidden == ap.get_default("hidden")
    name = "kernel_resources_grid" if args.grid else "kernel_resources" + ("" if complete else "_partial")
    write_result(name, {**info, "rows": rows})


if __name__ == "__main__":
    main()
