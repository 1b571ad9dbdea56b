"""Which attention backend `--kernels auto` should use on the CPU: PyTorch's SDPA (kernels/torch_backend.py) against
the einsum reference (kernels/reference.py), forward + backward, padded and packed (varlen), fp32.

    python benchmarks/gates/cpu_backends.py [--shapes 16x64x2 32x128x12 8x512x12] [--threads N]

Shapes are batch x seq x heads with head_dim 64; lengths uniform in [S/4, S] (the first full). Packed batches are
also timed on nested jagged tensors (torch's own varlen layout) and one document at a time (torch-docs: what the
CPU uses where the padded grid would be a quarter padding or more).
Times are the best of 5 runs. Prints a table, writes benchmarks/results/cpu_backends.json.
"""
import argparse

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
import torch
from record import best_ms, run_info, write_result


def fwd_bwd(fn, leaf, *args):
    def run():
        leaf.grad = None
        fn(*leaf.unbind(-3), *args).sum().backward()
    return run


def main(argv=None):
    from bertkit.kernels import torch_backend
    from bertkit.kernels.reference import attention_reference, attention_varlen_reference

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["16x64x2", "32x128x2", "32x128x12", "8x512x12"])
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    rows = []
    print(f"{'shape':>12} {'layout':>7} {'backend':>10} {'fwd+bwd ms':>11} {'vs reference':>12}")
    for shape in args.shapes:
        batch, seq, heads = map(int, shape.split("x"))
        lengths = torch.randint(seq // 4, seq + 1, (batch,), generator=gen, dtype=torch.int32)
        lengths[0] = seq
        cu = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
        padded = torch.randn(batch, seq, 3, heads, 64, generator=gen).requires_grad_()
        packed = torch.randn(int(cu[-1]), 3, heads, 64, generator=gen).requires_grad_()
        cases = [
            ("padded", "reference", fwd_bwd(attention_reference, padded, lengths)),
            ("padded", "torch", fwd_bwd(torch_backend.attention_torch, padded, lengths)),
            ("varlen", "reference", fwd_bwd(attention_varlen_reference, packed, cu, seq)),
            ("varlen", "torch-pad", fwd_bwd(torch_backend._varlen_by_padding, packed, cu, seq, 0.0, None)),
            ("varlen", "torch-njt", fwd_bwd(torch_backend._varlen_nested, packed, cu, seq, 0.0, None)),
            ("varlen", "torch-docs", fwd_bwd(torch_backend._varlen_by_document, packed, cu, 0.0, None)),
        ]
        times = {}
        for layout, backend, fn in cases:
            ms = best_ms(fn)
            times[layout, backend] = ms
            speedup = times[layout, "reference"] / ms
            rows.append(dict(batch=batch, seq=seq, heads=heads, head_dim=64, layout=layout, backend=backend,
                             fwd_bwd_ms=round(ms, 3), speedup_vs_reference=round(speedup, 2)))
            print(f"{shape:>12} {layout:>7} {backend:>10} {ms:11.2f} {speedup:11.2f}x", flush=True)
    write_result("cpu_backends", {**run_info("cpu_backends"), "torch": torch.__version__,
                                  "threads": torch.get_num_threads(), "rows": rows})


if __name__ == "__main__":
    main()
