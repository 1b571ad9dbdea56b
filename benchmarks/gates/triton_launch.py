"""What one Triton launch costs the host on a GPU (issue 43): is launching the compiled kernel directly worth it?

On the H200 the eager Triton step at 128 tokens spends ~7 ms more of host time than PyTorch's path, about ten times
what our launchers' own Python adds (host_time_cpu.py); the rest is taken to be Triton's launch itself. This times
one kernel (the LayerNorm forward, at a shape too small to compute anything) launched
  triton      the usual way, `kernel[grid](...)`: Triton binds the arguments, builds its specialisation key and looks
              the compiled kernel up on every call;
  compiled    through the CompiledKernel that call returned, `compiled[grid](...)`: what a launcher that cached the
              kernel after its first call would pay;
  launcher    Triton's C launcher alone, called with the arguments Triton itself passed it (the floor);
  torch       `F.layer_norm` on the same tensors, for scale (one PyTorch op: its dispatch and a CUDA launch).
Microseconds per call: the median of 7 rounds of --calls launches queued without synchronising (the GPU finishes
each tiny kernel sooner than the host issues the next, so the wall time is the host's). CUDA only:

    python benchmarks/gates/triton_launch.py --out gpu_out/triton_launch.json
"""
import argparse
import json
import statistics
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
import torch
import torch.nn.functional as F
from gpulib import no_gpu


def per_call_us(fn, calls: int, rounds: int = 7) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append(1e6 * (time.perf_counter() - t) / calls)
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--out", default="gpu_out/triton_launch.json")
    args = ap.parse_args()
    if no_gpu("triton_launch.py"):
        return
    import triton

    from bertkit.kernels.common import cdiv
    from bertkit.kernels.layer_norm import _add_ln_fwd, threshold_and_scale, tile_shape

    n_rows, n = 64, 768
    x, res = (torch.randn(n_rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w, b = torch.ones(n, device="cuda", dtype=torch.bfloat16), torch.zeros(n, device="cuda", dtype=torch.bfloat16)
    y, h = torch.empty_like(x), torch.empty_like(x)
    mean, rstd = (torch.empty(n_rows, device="cuda", dtype=torch.float32) for _ in range(2))
    block_m, block_n, warps = tile_shape(n)
    grid = (cdiv(n_rows, block_m),)
    call_args = (x, res, w, b, y, h, mean, rstd, mean, n_rows, n, n, n, n, n, 1e-12, *threshold_and_scale(0.0))
    meta = dict(BLOCK_M=block_m, BLOCK_N=block_n, HAS_RESIDUAL=True, DROPOUT=False, STORE_H=True, num_warps=warps)

    def triton_way():
        return _add_ln_fwd[grid](*call_args, **meta)

    compiled = triton_way()
    torch.cuda.synchronize()
    captured = []  # what Triton hands its C launcher: grid, stream, function, metadata, hooks, then every argument
    launcher = compiled.run  # (never run on a GPU before its first lease: a Triton without `_run` fails two rows)
    compiled._run = lambda *a: (captured.append(a), launcher(*a))
    triton_way()
    compiled._run = launcher
    launch_args = captured[0] if captured else ()
    kernel_args = launch_args[9:]
    rows = {}
    for name, fn in (("triton", triton_way),
                     ("compiled", lambda: compiled[grid + (1, 1)](*kernel_args)),
                     ("launcher", lambda: launcher(*launch_args)),
                     ("torch", lambda: F.layer_norm(x + res, (n,), w, b, 1e-12))):
        try:
            rows[name] = round(per_call_us(fn, args.calls), 2)
        except Exception as e:  # noqa: BLE001 - a row that cannot run says why and the others still run
            rows[name] = f"{type(e).__name__}: {e}"[:300]
    # the three Triton ways must compute the same thing: y after each, against PyTorch's
    want = F.layer_norm((x + res).float(), (n,), w.float(), b.float(), 1e-12)
    y.zero_()
    if launch_args:
        launcher(*launch_args)
    else:
        triton_way()
    torch.cuda.synchronize()
    agree = bool(torch.allclose(y.float(), want, atol=3e-2, rtol=0))
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "calls": args.calls, "shape": [n_rows, n], "us_per_call": rows, "launcher_output_correct": agree,
              "date": time.strftime("%Y-%m-%d %H:%M")}
    print(f"{'launch':10} {'µs per call':>12}")
    for name, us in rows.items():
        print(f"{name:10} {us:>12}" if isinstance(us, float) else f"{name:10} failed: {us}")
    print(f"the launcher alone computed LayerNorm right: {agree}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
