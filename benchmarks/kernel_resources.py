"""What each Triton kernel costs the GPU, measured without one: compiles every configuration for sm_90 (H100/H200)
on the CPU with Triton's own ptxas, and reports registers per thread, spill bytes, shared memory and whether the
matmuls lowered to Hopper's wgmma. A spilling configuration round-trips registers through local memory in its inner
loop, so configurations that spill are dropped from the autotuning lists; timing still needs a GPU
(benchmarks/attention.py, benchmarks/layer_norm.py).

    python benchmarks/kernel_resources.py                 # the shipped configurations, padded and varlen
    python benchmarks/kernel_resources.py --grid          # every tile shape, padded layout (slow: ~1 s each)
    python benchmarks/kernel_resources.py --head-dims 64 --kernels fwd dq

Prints a table and writes benchmarks/results/kernel_resources[_grid].json.
"""
import argparse
import itertools
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import run_info, write_result  # noqa: E402

ATTENTION_KERNELS = ("fwd", "dkdv", "dq")
MAX_SHARED = 232448  # bytes of shared memory one block may use on sm_90 (227 KiB)
GRID = [(m, n, w, s) for m, n, w, s in itertools.product((32, 64, 128), (32, 64, 128), (4, 8), (2, 3))
        if m * n <= 128 * 128 and not (w == 8 and m * n < 64 * 64)]


def attention_row(kind, config, head_dim, dropout, varlen=False):
    import importlib

    from tests.kernel_utils import ATTENTION_DIVISIBLE, compile_for_gpu, ptxas_usage

    attn = importlib.import_module("kernels.attention")
    kernel = {"fwd": attn._attn_fwd, "dkdv": attn._attn_bwd_dkdv, "dq": attn._attn_bwd_dq}[kind]
    block_m, block_n, warps, stages = config
    pointers = {name: "*bf16" for name in ["Q", "K", "V", "O", "DO", "DK", "DV", "DQ"]}
    pointers.update(LSE="*fp32", DELTA="*fp32", SEQ="*i32", SEED="*i64")
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=head_dim, VARLEN=varlen,
                      DROPOUT=dropout, DOT_PREC="tf32")
    compiled = compile_for_gpu(kernel, pointers, ("qk_scale", "sm_scale", "dropout_scale"), constexprs, warps, stages,
                               divisible=ATTENTION_DIVISIBLE)
    regs, spill = ptxas_usage(compiled)
    return dict(kernel=kind, block_m=block_m, block_n=block_n, warps=warps, stages=stages, head_dim=head_dim,
                varlen=varlen, dropout=dropout, registers=regs, spill_bytes=spill, shared_bytes=compiled.metadata.shared,
                wgmma="wgmma" in compiled.asm["ptx"], fits=spill == 0 and compiled.metadata.shared <= MAX_SHARED)


def layer_norm_rows(hidden, dropout):
    import importlib

    from tests.kernel_utils import LAYER_NORM_DIVISIBLE, compile_for_gpu, ptxas_usage

    ln = importlib.import_module("kernels.layer_norm")
    block_m, block_n, warps = ln._tile(hidden)
    pointers = {name: "*bf16" for name in ["X", "R", "W", "B", "Y", "H", "DY", "DH", "DX"]}
    pointers.update(MEAN="*fp32", RSTD="*fp32", SEED="*i64", DW_PART="*fp32", DB_PART="*fp32")
    rows = []
    for kind, kernel, constexprs in [
            ("ln_fwd", ln._add_ln_fwd, dict(HAS_RESIDUAL=True, DROPOUT=dropout, STORE_H=True)),
            ("ln_bwd", ln._add_ln_bwd, dict(DROPOUT=dropout))]:
        compiled = compile_for_gpu(kernel, pointers, ("eps", "dropout_scale"),
                                   dict(BLOCK_M=block_m, BLOCK_N=block_n, **constexprs), warps,
                                   divisible=LAYER_NORM_DIVISIBLE)
        regs, spill = ptxas_usage(compiled)
        rows.append(dict(kernel=kind, block_m=block_m, block_n=block_n, warps=warps, stages=None, head_dim=None,
                         hidden=hidden, dropout=dropout, registers=regs, spill_bytes=spill,
                         shared_bytes=compiled.metadata.shared, wgmma=None,
                         fits=spill == 0 and compiled.metadata.shared <= MAX_SHARED))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", nargs="+", default=[*ATTENTION_KERNELS, "layer_norm"])
    ap.add_argument("--head-dims", nargs="+", type=int, default=[32, 64, 128, 256])
    ap.add_argument("--hidden", nargs="+", type=int, default=[768, 1024, 4096])
    ap.add_argument("--grid", action="store_true", help="every tile shape in GRID, not only the shipped lists")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import triton

    import importlib

    attn = importlib.import_module("kernels.attention")
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
                   for c in (GRID if args.grid else shipped[kind][attn._dim_class(attn._block_d(d))])
                   for varlen in ((False,) if args.grid else (False, True)) for p in (False, True)]
        for r in new:
            dim = r["head_dim"] if r["head_dim"] is not None else r["hidden"]
            print(f"{r['kernel']:7} {r['block_m']:>4}x{r['block_n']:<4} {r['warps']:>5} {r['stages'] or '-':>6} "
                  f"{dim:>5} {('var' if r.get('varlen') else 'pad'):>3} {int(r['dropout']):>4} {r['registers']:>4} {r['spill_bytes']:>7} "
                  f"{r['shared_bytes'] / 1024:>8.1f} {'' if r['wgmma'] is None else r['wgmma']!s:>5} "
                  f"{'yes' if r['fits'] else 'NO':>4}", flush=True)
        rows += new
    info = run_info("kernel_resources")
    info.update(target="sm_90a (compiled on the CPU, no GPU involved)", triton=triton.__version__)
    write_result("kernel_resources_grid" if args.grid else "kernel_resources", {**info, "rows": rows})


if __name__ == "__main__":
    main()
