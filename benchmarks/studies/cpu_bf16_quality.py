"""Quality against steps, fp32 against bf16 autocast, for pretraining on the CPU: the same run (preset, recipe,
instances, seed) in each precision, its held-out loss and [MASK]-only accuracy at every evaluation. Not a timing
(it may run beside other jobs); `cpu_bf16.py` times the step.

    python benchmarks/studies/cpu_bf16_quality.py --instances INSTANCES --work WORK            # BERT tiny, 3,000 steps
    python benchmarks/studies/cpu_bf16_quality.py --instances INSTANCES --work WORK --seed 43  # another seed

Each run resumes if killed (its folder under WORK); the table and results/cpu_bf16_quality.json follow both.
"""
import argparse
import json
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from record import read_result, run_info, write_result

PRECISIONS = ("fp32", "bf16")


def run(instances: Path, out: Path, precision: str, args) -> dict:
    """{step: (held-out loss, [MASK]-only accuracy)} of one run, trained (or resumed) to args.steps first."""
    from bertkit.pretrain import PretrainConfig, pretrain

    metrics = out / "metrics.jsonl"

    def evaluations() -> dict:
        rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
        return {r["step"]: (r["eval_loss"], r.get("eval_mlm_mask_acc")) for r in rows if "eval_loss" in r}

    if args.steps not in evaluations():
        pretrain(PretrainConfig(instances=str(instances), out=str(out), model=args.model, recipe="budget",
                                lr=args.lr, seed=args.seed, max_steps=args.steps, precision=precision,
                                eval_every=args.eval_every, eval_batches=20, save_every=args.eval_every, keep_last=1,
                                num_workers=1, progress=False, log_every=100,
                                resume=(out / "checkpoints" / "latest").is_file()))
    return evaluations()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--instances", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True, help="the runs' folders")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args(argv)
    evals = {p: run(args.instances, args.work / f"{args.model}-{p}-{args.steps}-seed{args.seed}", p, args)
             for p in PRECISIONS}
    print(f"\n{'step':>6}  {'fp32 loss / [MASK] acc':>24}  {'bf16 loss / [MASK] acc':>24}  bf16 - fp32")
    rows = []
    for step in sorted(evals["fp32"]):
        (a, a_acc), (b, b_acc) = evals["fp32"][step], evals["bf16"].get(step, (float("nan"), None))
        rows.append({"step": step, "fp32_loss": a, "fp32_mask_acc": a_acc, "bf16_loss": b, "bf16_mask_acc": b_acc})
        print(f"{step:6}  {a:10.3f} / {a_acc:8.2%}  {b:10.3f} / {b_acc or 0:8.2%}  {b - a:+.3f}")
    # one entry per seed: a second seed adds to the file instead of replacing the first (the top level is seed 42's,
    # as first written)
    held = read_result("cpu_bf16_quality")
    entry = {**run_info("cpu_bf16_quality"), "model": args.model, "lr": args.lr, "seed": args.seed,
             "instances": str(args.instances), "rows": rows}
    if args.seed == held.get("seed", args.seed):
        held.update(entry)
    else:
        held.setdefault("seeds", {})[str(args.seed)] = entry
    write_result("cpu_bf16_quality", held)


if __name__ == "__main__":
    main()
