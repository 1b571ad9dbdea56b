"""One optimizer step on the CPU: torch's AdamW as a loop over tensors (its CPU default), with `foreach`, and fused
(what bertkit uses), against bertkit's StableAdamW and LAMB, over the parameters of real presets
(random weights, random gradients, BERT's parameter groups). Milliseconds per step, best of 5 runs of 10 steps.

    python benchmarks/gates/optimizer_step.py     # prints the table, writes benchmarks/results/optimizer_step.json
"""
import argparse
import time

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from record import run_info, write_result

PRESETS = ("tiny", "modernbert-tiny", "mini", "modernbert-mini")


def optimizers():
    import torch

    from bertkit.optim import Lamb, StableAdamW, adamw

    kw = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-6)
    return {
        "adamw (loop)": lambda g: torch.optim.AdamW(g, foreach=False, **kw),
        "adamw (foreach)": lambda g: torch.optim.AdamW(g, foreach=True, **kw),
        "adamw (fused)": lambda g: adamw(g, **kw),
        "stableadamw": lambda g: StableAdamW(g, **kw),
        "lamb": lambda g: Lamb(g, **kw),
    }


def ms_per_step(make, model) -> float:
    from bertkit.optim import param_groups

    opt = make(param_groups(model, 0.01))
    for _ in range(2):
        opt.step()
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(10):
            opt.step()
        runs.append((time.perf_counter() - t) / 10 * 1e3)
    return min(runs)


def main(argv=None):
    import torch

    from bertkit.models import build_pretraining
    from bertkit.models.bert_config import BertConfig
    from bertkit.models.modernbert import ModernBertConfig

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=16000, help="vocabulary size (the Korean benchmark's)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    header = run_info("optimizer_step")
    rows = []
    print(f"{'preset':>16} {'parameters':>11} " + " ".join(f"{n:>16}" for n in optimizers()))
    for name in PRESETS:
        torch.manual_seed(0)
        shape = (ModernBertConfig.from_spec(name, args.vocab) if name.startswith("modernbert-")
                 else BertConfig.from_spec(name, args.vocab))
        model = build_pretraining(shape.to_dict(), "mlm")
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        n = sum(p.numel() for p in model.parameters())
        ms = {opt: round(ms_per_step(make, model), 2) for opt, make in optimizers().items()}
        rows.append({"preset": name, "parameters": n, "ms_per_step": ms})
        print(f"{name:>16} {n:>11,} " + " ".join(f"{v:>16.2f}" for v in ms.values()))
    write_result("optimizer_step", {**header, "threads": args.threads, "vocab_size": args.vocab, "rows": rows})


if __name__ == "__main__":
    main()
