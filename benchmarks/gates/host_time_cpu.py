"""Host time of the Triton path, measured on the CPU (issue 43, part 1): every Triton launch replaced by a stand-in
that returns at once, so what is timed is the Python around it, the same on any machine.

    python benchmarks/gates/host_time_cpu.py [--calls 2000]

Rows: each launcher (flash_attn_forward / backward, add_ln_forward / backward) and each public autograd entry
(attention_triton and add_layer_norm_triton, forward + backward), beside PyTorch's own host time for the same
layer on a tensor too small to compute anything (SDPA and F.layer_norm forward + backward on the CPU). Goal: at
most 10 µs per forward launch and 15 µs per backward, and the autograd entries within 1.5x of PyTorch's. A last
row times an autograd.Function of layer norm's signature that does no work: the floor under any Python one.
Microseconds are the median of 7 rounds of --calls calls. Prints a table and writes
benchmarks/results/host_time_cpu.json (with the load average: time it on an otherwise idle machine).
"""
import argparse
import importlib
import statistics
import time

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
import torch
import torch.nn.functional as F
from record import run_info, write_result


class StandIn:
    """In place of a @triton.jit kernel: `kernel[grid](...)` does nothing (and counts the launches)."""

    def __init__(self):
        self.launches = 0

    def __getitem__(self, grid):
        return self.launch

    def launch(self, *args, **kwargs):
        self.launches += 1


def stand_in_kernels():
    """Every kernel of the Triton path replaced; returns the stand-ins by name."""
    attn = importlib.import_module("bertkit.kernels.attention")
    ln = importlib.import_module("bertkit.kernels.layer_norm")
    stand_ins = {}
    for launcher_name in ("_fwd_launch", "_dkdv_launch", "_dq_launch"):
        launcher = getattr(attn, launcher_name)
        launcher.kernel, launcher.tuned = StandIn(), None
        stand_ins[launcher_name] = launcher.kernel
    for module, names in ((attn, ("_attn_bwd_delta",)), (ln, ("_add_ln_fwd", "_add_ln_bwd"))):
        for name in names:
            stand_ins[name] = StandIn()
            setattr(module, name, stand_ins[name])
    return stand_ins


def per_call_us(fn, calls: int, rounds: int = 7) -> float:
    for _ in range(max(10, calls // 10)):
        fn()
    samples = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append(1e6 * (time.perf_counter() - t) / calls)
    return statistics.median(samples)


def cases():
    """name -> (function, PyTorch's counterpart or None, kind: launch-fwd | launch-bwd | autograd)."""
    attn = importlib.import_module("bertkit.kernels.attention")
    ln = importlib.import_module("bertkit.kernels.layer_norm")
    from bertkit.kernels.attention import attention_triton
    from bertkit.kernels.layer_norm import add_layer_norm_triton

    b, s, h, d, hidden = 2, 16, 2, 16, 32
    qkv = torch.randn(b, s, 3, h, d, requires_grad=True)
    q, k, v = qkv.unbind(2)
    lengths = torch.tensor([s, s // 2], dtype=torch.int32)
    seed = torch.zeros(1, dtype=torch.int64)
    out, lse = attn.flash_attn_forward(q, k, v, lengths, seed, s, False, 0.0, 0.25)
    dout = torch.randn_like(out)
    x, res = torch.randn(b * s, hidden, requires_grad=True), torch.randn(b * s, hidden, requires_grad=True)
    w, bias = torch.ones(hidden, requires_grad=True), torch.zeros(hidden, requires_grad=True)
    y, hsum, mean, rstd = ln.add_ln_forward(x, res, w, bias, seed, 1e-12, 0.0)
    dy = torch.randn_like(y)
    mask = (torch.arange(s)[None, :] < lengths[:, None])[:, None, None, :]

    def attention_ours():
        o = attention_triton(q, k, v, lengths)
        torch.autograd.grad(o, (qkv,), dout)

    def attention_torch():
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        torch.autograd.grad(o, (qkv,), dout.transpose(1, 2))

    def layer_norm_ours():
        torch.autograd.grad(add_layer_norm_triton(x, res, w, bias), (x, res, w, bias), dy)

    def layer_norm_torch():
        torch.autograd.grad(F.layer_norm(x + res, (hidden,), w, bias, 1e-12), (x, res, w, bias), dy)

    class NoWork(torch.autograd.Function):
        """Layer norm's autograd signature (7 inputs, 2 outputs, 5 saved tensors) with no work: the host time any
        Python autograd.Function of that shape costs before its launchers run."""

        @staticmethod
        def forward(ctx, x, residual, weight, bias, seed, eps, dropout_p):
            y, h = torch.empty_like(x), torch.empty_like(x)
            ctx.save_for_backward(h, weight, h, h, seed)
            ctx.set_materialize_grads(False)
            return y, h

        @staticmethod
        def backward(ctx, dy, dh):
            h, weight, _, _, _ = ctx.saved_tensors
            grads = torch.empty_like(dy), torch.empty_like(dy), torch.empty_like(weight), torch.empty_like(weight)
            return *grads, None, None, None

    def layer_norm_floor():
        torch.autograd.grad(NoWork.apply(x, res, w, bias, w, 1e-12, 0.0)[0], (x, res, w, bias), dy)

    return {
        "attention forward launcher": (lambda: attn.flash_attn_forward(q, k, v, lengths, seed, s, False, 0.0, 0.25),
                                       None, "launch-fwd"),
        "attention backward launcher": (lambda: attn.flash_attn_backward(dout, q, k, v, out, lse, lengths, seed, s,
                                                                         False, 0.0, 0.25), None, "launch-bwd"),
        "layer norm forward launcher": (lambda: ln.add_ln_forward(x, res, w, bias, seed, 1e-12, 0.0), None,
                                        "launch-fwd"),
        "layer norm backward launcher": (lambda: ln.add_ln_backward(dy, hsum, w, mean, rstd, seed, 0.0), None,
                                         "launch-bwd"),
        "attention forward + backward (autograd)": (attention_ours, attention_torch, "autograd"),
        "layer norm forward + backward (autograd)": (layer_norm_ours, layer_norm_torch, "autograd"),
        "  floor: an autograd.Function doing nothing": (layer_norm_floor, layer_norm_torch, "floor"),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    stand_ins = stand_in_kernels()
    rows = []
    for name, (ours, theirs, kind) in cases().items():
        before = sum(s.launches for s in stand_ins.values())
        ours()
        launches = sum(s.launches for s in stand_ins.values()) - before
        row = {"case": name, "kind": kind, "launches": launches, "us": per_call_us(ours, args.calls)}
        if theirs is not None:
            row["torch_us"] = per_call_us(theirs, args.calls)
            row["ratio"] = row["us"] / row["torch_us"]
        rows.append(row)
    goals = {"launch-fwd": 10.0, "launch-bwd": 15.0}
    print(f"\n{'case':42} {'launches':>8} {'µs':>8} {'torch µs':>9} {'ratio':>6}  goal")
    for r in rows:
        if r["kind"] == "floor":
            print(f"{r['case']:42} {r['launches']:8} {r['us']:8.1f} {r['torch_us']:9.1f} {r['ratio']:6.2f}  (no goal)")
            continue
        goal = f"<= {goals[r['kind']]:.0f} µs" if r["kind"] in goals else "<= 1.5x torch"
        met = r["us"] <= goals[r["kind"]] if r["kind"] in goals else r["ratio"] <= 1.5
        print(f"{r['case']:42} {r['launches']:8} {r['us']:8.1f} {r.get('torch_us', float('nan')):9.1f} "
              f"{r.get('ratio', float('nan')):6.2f}  {goal} {'met' if met else 'NOT met'}")
    write_result("host_time_cpu", {**run_info("host_time_cpu"), "calls": args.calls, "torch": torch.__version__,
                                   "rows": rows})


if __name__ == "__main__":
    main()
