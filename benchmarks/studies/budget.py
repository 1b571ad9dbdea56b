"""Which recipe turns a fixed amount of CPU time into the most useful model? Quality against wall-clock (a benchmark).

Every arm pretrains on the transfer benchmark's English corpus and tokenizer (benchmarks/studies/pretrain_transfer.py
prepares them) for the same wall-clock budget with `pretrain --time-budget`, one arm at a time, on this machine;
then, from its export: the held-out MLM loss and [MASK]-only accuracy on one fixed yardstick (the same 400 held-out
rows of 128 tokens, 15 % masked, for every arm; ELECTRA's is its small generator's), and a quick probe (SST-2 and
STS-B fine-tunes, one seed, lr 5e-4, the transfer benchmark's settings; ELECTRA's from its discriminator).
The peer arm is what a user of transformers' run_mlm.py gets in the same time:
its own pipeline (BertTokenizerFast loaded from our tokenizer folder, group_texts-style chunks of 128 tokens,
DataCollatorForLanguageModeling, BertForMaskedLM) in a plain loop, on the same budget-aware schedule.

    python benchmarks/studies/budget.py --budget 30m                     # the screening arms, one after another
    python benchmarks/studies/budget.py --budget 30m --arms tiny-mlm-d0 peer
    python benchmarks/studies/budget.py --report                         # table and plot from the results so far
    python benchmarks/studies/budget.py --budget 2h --paced --arms modernbert-tiny-d0-seq64  # beside other work (below)

Each finished arm is appended to benchmarks/results/budget.json (keyed by arm and budget), so a killed benchmark
continues with the next arm; `--work` keeps the stages' folders (default outside the repository). Every arm records
the load average before and after it: compare arms only where it stayed near 2 (this benchmark alone on 2 cores).

`--paced` makes the budget a step count, as the Korean transfer benchmark does: a short probe alone on the machine
(PACE_STEPS; stop other work for its minute or two) measures the arm's steps per second, and the arm trains for as
many steps as the budget buys at that pace, on the same schedule over steps. Its curve is then read against
`paced_s` (step / pace), not its wall clock, so the arm may run beside other work. A paced arm skips the time its
evaluations would have taken (about 1 % of a wall-clock arm's steps).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
import transfer
from benchlib import masked_only_accuracy, say
from record import RESULTS, run_info
from transfer import BUDGETS, finetune_one, prepare, task_metric

REPO = Path(__file__).resolve().parents[2]

PROBE_TASKS = ("sst2", "stsb")
PROBE_LR = 5e-4
PROBE_POOLING = "cls"  # every arm's probe reads [CLS], whatever its export's config.json says
PACE_STEPS = 300  # --paced: the probe's length; timed over steps 100-300 (pretrain_transfer.steps_per_second)
YARDSTICK_RUN = "pretrain_transfer_budget_2h.json"  # --recipe budget's 2 hours, alone on the machine: the goal


@dataclass
class Arm:
    preset: str = "tiny"
    lr: float = 1e-3
    dropout: float | None = None       # None: the preset's 0.1
    objective: str = "nsp"             # nsp | sop | none (MLM only)
    masked_lm_prob: float = 0.15
    seq: int = 128
    micro_batch: int = 32
    warmup: float = 0.05
    electra: bool = False              # replaced-token detection (--objective electra); its probe fine-tunes the
                                       # discriminator, its yardstick is the generator's MLM
    extra: list = field(default_factory=list)  # more pretrain flags (--norm pre, ...)


ARMS = {
    "tiny-electra-d0": Arm(objective="none", dropout=0.0, electra=True),
    "tiny-mlm-d0": Arm(objective="none", dropout=0.0),
    "tiny-pre-mlm-d0": Arm(objective="none", dropout=0.0, extra=["--norm", "pre"]),
    "tiny-bert": Arm(),                                             # BERT's recipe, the transfer benchmark's
    "mini-mlm-d0": Arm(preset="mini", objective="none", dropout=0.0, lr=5e-4),
    "tiny-mlm-d0-lr3e-3": Arm(objective="none", dropout=0.0, lr=3e-3),
    "tiny-mlm-d0-lr3e-4": Arm(objective="none", dropout=0.0, lr=3e-4),
    "tiny-mlm-d0-seq64": Arm(objective="none", dropout=0.0, seq=64, micro_batch=64),
    "tiny-mlm-d0-mask30": Arm(objective="none", dropout=0.0, masked_lm_prob=0.3),
    "tiny-sop-d0": Arm(objective="sop", dropout=0.0),
    "tiny-bert-d0": Arm(dropout=0.0),
    "peer": Arm(objective="none", dropout=0.1),                     # transformers' own pipeline, BERT-tiny shape
    "peer-budget": Arm(objective="none", dropout=0.0, seq=64, micro_batch=64),  # ... with --recipe budget's settings
    # ModernBERT (issue 37): modernbert-tiny (4 x 128, GLU 192: 0.56M parameters outside the embeddings against BERT
    # tiny's 0.39M) on --recipe budget's settings at three rates, and transformers' ModernBertForMaskedLM trained so
    "modernbert-tiny-d0-seq64": Arm(preset="modernbert-tiny", objective="none", dropout=0.0, seq=64, micro_batch=64),
    "modernbert-tiny-d0-seq64-lr3e-4": Arm(preset="modernbert-tiny", objective="none", dropout=0.0, seq=64,
                                           micro_batch=64, lr=3e-4),
    "modernbert-tiny-d0-seq64-lr3e-3": Arm(preset="modernbert-tiny", objective="none", dropout=0.0, seq=64,
                                           micro_batch=64, lr=3e-3),
    # ... at the family's best rate of the three (3e-3), as its arm
    "peer-modernbert": Arm(preset="modernbert-tiny", objective="none", dropout=0.0, seq=64, micro_batch=64, lr=3e-3),
    # ... and bertkit's arm packed to the peer's tokens a step: the budget instances end at sentence and document
    # boundaries (49.4 tokens a row against the peer's 64), so 64 rows carry 1.27x fewer tokens; 4,096 by best fit
    "modernbert-tiny-d0-seq64-lr3e-3-tb4096": Arm(preset="modernbert-tiny", objective="none", dropout=0.0, seq=64,
                                                  micro_batch=64, lr=3e-3, extra=["--token-budget", "4096"]),
    "random": Arm(),                                                # no pretraining: the probe's floor
}


def instances_for(work: Path, en: dict, arm: Arm) -> Path:
    from bertkit.pipelines.make_instances import InstancesConfig, make_instances

    out = work / f"inst-{arm.objective}-{arm.masked_lm_prob:g}-{arm.seq}"
    if not (out / "manifest.json").is_file():
        say(f"make-instances {out.name}")
        make_instances(en["corpus"], en["tokenizer"], out,
                       InstancesConfig.from_flags(dict(max_seq_length=arm.seq, mode="dynamic", dupe=1, workers=2,
                                                       objective=arm.objective, masked_lm_prob=arm.masked_lm_prob)),
                       progress=False)
    return out


def steps_per_eval(arm: Arm) -> int:
    return {"tiny": 250, "mini": 100}.get(arm.preset.removeprefix("modernbert-"), 100) * 128 // arm.seq


def pretrain_arm(name: str, arm: Arm, instances: Path, run: Path, length: list[str], probe: bool = False) -> Path:
    """`bertkit pretrain` for `length` (--time-budget or --max-steps) in its own process (resumed if killed), then
    export; a pace probe neither evaluates, saves nor exports."""
    export_dir = run.parent / f"{run.name}-export"
    if (export_dir / "model.safetensors").is_file():
        return export_dir
    every = 10 ** 9 if probe else steps_per_eval(arm)  # 20 held-out batches: as the --recipe budget 2 h run (the goal)
    cmd = [str(Path(sys.executable).parent / "bertkit"), "pretrain", "--instances", str(instances), "--out", str(run),
           "--model", arm.preset, *length, "--micro-batch", str(arm.micro_batch),
           "--optimizer", "adamw", "--lr", str(arm.lr), "--warmup", str(arm.warmup), "--eval-every",
           str(every), "--eval-batches", "20", "--save-every", str(10 * every), "--keep-last", "1",
           "--log-every", "50", "--report-to", "none", "--no-progress", "--precision", "fp32", *arm.extra]
    if arm.electra:
        cmd += ["--objective", "electra"]
    if arm.dropout is not None:
        cmd += ["--dropout", str(arm.dropout)]
    if (run / "checkpoints" / "latest").is_file():
        cmd.append("--resume")
    say(f"pretrain {name}: {' '.join(cmd[2:])}")
    run_stage(cmd, name)
    if not probe:
        run_stage([cmd[0], "export", str(run), "--out", str(export_dir)], name)
    return export_dir


def peer_arm(arm: Arm, en: dict, out: Path, length: list[str]) -> Path:
    """transformers' own MLM pipeline, as run_mlm.py builds it, for the same budget (--budget-s or --steps; resumed
    if stopped)."""
    if (out / "run.json").is_file():  # written last
        return out
    run_stage([sys.executable, str(REPO / "benchmarks" / "lib" / "budget_peer.py"), "--corpus", str(en["corpus"]),
               "--tokenizer", str(en["tokenizer"]), "--out", str(out), *length,
               "--lr", str(arm.lr), "--micro-batch", str(arm.micro_batch), "--seq", str(arm.seq),
               "--warmup", str(arm.warmup), "--dropout", str(arm.dropout),
               *(["--family", "modernbert", "--preset", arm.preset] if arm.preset.startswith("modernbert") else [])],
              out.name)
    return out


def run_stage(cmd: list[str], arm: str):
    """One arm's stage in its own process; a stage stopped by a signal (SIGTERM saves and exits) ends the benchmark
    with a line saying how to resume, not a traceback."""
    code = subprocess.run(cmd).returncode
    stage = Path(cmd[1]).name if cmd[1].endswith(".py") else cmd[1]
    if code == 143:
        raise SystemExit(f"arm {arm}: {stage} stopped by a signal; run the same budget.py command again to resume")
    if code:
        raise SystemExit(f"arm {arm}: {stage} exited {code}; its output above says why")


def random_export(arm: Arm, en: dict, out: Path) -> Path:
    import torch

    from bertkit.models import save_pretrained
    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig
    from bertkit.tokenization import read_vocab

    if not (out / "model.safetensors").is_file():
        torch.manual_seed(0)
        cfg = BertConfig.preset(arm.preset, vocab_size=len(read_vocab(en["tokenizer"] / "vocab.txt")))
        save_pretrained(BertForPreTraining(cfg), out, tokenizer_dir=en["tokenizer"])
    return out


def load() -> float:
    return round(os.getloadavg()[0], 2)


def pace(name: str, arm: Arm, args, en: dict) -> dict:
    """--paced: the arm's optimizer steps per second alone on the machine, from a PACE_STEPS probe (kept in
    WORK/pace-NAME.json with the load average around it)."""
    path = args.work / f"pace-{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    say(f"pace probe: {PACE_STEPS} steps of {name} (keep the machine otherwise idle)")
    probe_dir, load_before = args.work / f"pace-{name}", os.getloadavg()
    shutil.rmtree(probe_dir, ignore_errors=True)  # a probe cut short is measured again from the start
    if name.startswith("peer"):
        peer_arm(arm, en, probe_dir, ["--steps", str(PACE_STEPS), "--eval-every-steps", "50"])
        elapsed_at = {}
        for p in json.loads((probe_dir / "curve.json").read_text()):
            elapsed_at.setdefault(p["step"], p["elapsed_s"])
        measured = transfer.steps_per_second(elapsed_at)
    else:
        pretrain_arm(name, arm, instances_for(args.work, en, arm), probe_dir, ["--max-steps", str(PACE_STEPS)],
                     probe=True)
        measured = transfer.run_pace(probe_dir)
    threads = os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))
    result = {**measured, "threads": threads,
              "load_average_before": [round(x, 2) for x in load_before],
              "load_average_after": [round(x, 2) for x in os.getloadavg()], "date": time.strftime("%Y-%m-%d %H:%M")}
    path.write_text(json.dumps(result, indent=1))
    return result


def run_arm(name: str, arm: Arm, args, en: dict) -> dict:
    tag = f"{name}-{args.budget_s:.0f}s" + ("-paced" if args.paced else "")
    arm_pace = pace(name, arm, args, en) if args.paced and name != "random" else None
    steps = arm_pace and round(args.budget_s * arm_pace["steps_per_s"])
    load_before, t0 = load(), time.time()
    if name == "random":  # BERT's initialisation, the same shape and tokenizer: what pretraining must beat
        model, points, info = random_export(arm, en, export_of(name, args.work, tag)), [], {"steps": 0, "sequences": 0}
    elif name.startswith("peer"):
        length = ["--steps", str(steps), "--eval-every-steps", str(steps_per_eval(arm))] if steps else \
            ["--budget-s", str(args.budget_s)]
        model = peer_arm(arm, en, export_of(name, args.work, tag), length)
        points = json.loads((model / "curve.json").read_text())
        info = json.loads((model / "run.json").read_text())
    else:
        run = args.work / tag
        length = ["--max-steps", str(steps)] if steps else ["--time-budget", f"{args.budget_s:.0f}s"]
        model = pretrain_arm(name, arm, instances_for(args.work, en, arm), run, length)
        points = transfer.timed_curve(run)
        config = json.loads((run / "config.json").read_text())
        if steps:
            info = {"steps": steps, "sequences": steps * config["resolved"]["global_batch"]}
        else:
            schedule = json.loads((run / "schedule.json").read_text())
            info = {"steps": schedule["steps"], "time_used_s": schedule["time_used_s"],
                    "sequences": schedule["steps"] * config["resolved"]["global_batch"]}
        if budget := config["pretrain"].get("token_budget"):  # rows a step vary: the step's size is its tokens
            info.update(sequences=None, tokens_per_step=budget)
    if arm_pace:  # the curve against the pace's clock; its wall clock ran beside other work
        points = [{**p, "paced_s": round(p["step"] / arm_pace["steps_per_s"], 1)} for p in points]
        info.update(clock="paced", pace=arm_pace)
    load_after_pretraining = load()
    yardstick = masked_only_accuracy(model / "generator" if arm.electra else model, en["dynamic"])
    return {"arm": name, "budget_s": 0 if name == "random" else args.budget_s, "settings": asdict(arm), **info,
            "curve": points,
            "yardstick": yardstick, "probe": probe(name, model, tag, args.work), "probe_lr": PROBE_LR,
            "probe_dropout": transfer.FINETUNE_DROPOUT, "probe_pooling": PROBE_POOLING,
            "load_before": load_before, "load_after_pretraining": load_after_pretraining,
            "wall_s": round(time.time() - t0), **{k: v for k, v in run_info("budget").items() if k == "commit"}}


def export_of(name: str, work: Path, tag: str) -> Path:
    """The model folder an arm's probe fine-tunes (pretrain_arm writes the run's export next to the run)."""
    return work / ("random-export" if name == "random" else f"{tag}-export")


def probe(name: str, model: Path, tag: str, work: Path, pooling: str = PROBE_POOLING) -> dict:
    """SST-2 and STS-B fine-tunes (one seed) at the probe's rate, with BERT's fine-tuning dropout and [CLS] pooling
    for every arm (an export of a run pretrained without dropout says 0 in its config, one without NSP mean);
    pooling "mean" is the second reading (--probe-mean), fair to arms whose [CLS] nothing trained."""
    scores = {}
    for task in PROBE_TASKS:
        out = work / "probe" / f"{tag}-{task}-dropout{transfer.FINETUNE_DROPOUT:g}{'' if pooling == 'cls' else '-mean'}"
        summary = finetune_one(task, model, out, 1, replace(BUDGETS["cpu"], finetune_lr=PROBE_LR), work, pooling)
        scores[task] = summary["best"][task_metric(task)]
        say(f"{name} probe ({pooling} pooling) {task}: {scores[task]:.4f}")
    return scores


def clock_s(point: dict) -> float:
    """Where a curve's point lies on its arm's clock: its pace's (--paced) or its wall clock's."""
    return point.get("paced_s", point["elapsed_s"])


def report(results: dict):
    rows = sorted(results["arms"].values(), key=lambda r: (r["budget_s"], r["yardstick"]["loss"]))
    print(f"\n{'arm':32} {'budget':>7} {'clock':>6} {'steps':>7} {'held-out MLM loss':>18} {'[MASK] acc':>10} "
          f"{'SST-2':>6} {'STS-B':>6} {'mean: SST-2':>12} {'STS-B':>6} {'load':>9}")
    for r in rows:
        mean = [f"{100 * r['probe_mean'][t]:.1f}" if "probe_mean" in r else "-" for t in PROBE_TASKS]
        print(f"{r['arm']:32} {r['budget_s'] / 60:6.0f}m {r.get('clock', 'wall'):>6} {r['steps']:7d} "
              f"{r['yardstick']['loss']:18.3f} "
              f"{100 * r['yardstick']['masked_only_acc']:9.1f}% {100 * r['probe']['sst2']:6.1f} "
              f"{100 * r['probe']['stsb']:6.1f} {mean[0]:>12} {mean[1]:>6} "
              f"{r['load_before']:4.1f}/{r['load_after_pretraining']:3.1f}")
    goal = yardstick_goal()
    for r in reaching(rows, goal):
        minutes = [f"{m:.0f} min" if m is not None else "not within its budget" for m in r["minutes"]]
        print(f"{r['arm']} ({r['budget_s'] / 60:.0f} min, {r.get('clock', 'wall')} clock) reaches --recipe budget's "
              f"2-hour end (held-out loss {goal['eval_mlm_loss']:.3f}, [MASK] {goal['eval_mlm_mask_acc']:.1%}): "
              f"loss after {minutes[0]}, [MASK] accuracy after {minutes[1]}")
    if rows:
        plot(rows, RESULTS / "budget.png")


def yardstick_goal() -> dict | None:
    """The last held-out evaluation of `pretrain_transfer.py --recipe budget --time-budget 2h` (BERT tiny, alone on
    the machine): issue 37's goal for the ModernBERT arms is to reach it sooner."""
    path = RESULTS / YARDSTICK_RUN
    if not path.is_file():
        return None
    curve = json.loads(path.read_text())["curves"]["en"]
    return {key: values[-1] for key, values in curve.items()}


def reaching(rows: list[dict], goal: dict | None) -> list[dict]:
    """For each arm evaluated on the goal's held-out rows (MLM only on 64-token instances, as --recipe budget), the
    minutes of its clock after which its held-out loss and [MASK] accuracy first reach the goal's (None: not yet)."""
    out = []
    for r in rows if goal else []:
        s = r["settings"]
        if r["arm"].startswith("peer") or (s["objective"], s["seq"], s["masked_lm_prob"]) != ("none", 64, 0.15):
            continue  # the peer evaluates on its own blocks, the others on other instances
        pts = [p for p in r["curve"] if p.get("eval_mlm_loss") is not None]
        loss = next((clock_s(p) / 60 for p in pts if p["eval_mlm_loss"] <= goal["eval_mlm_loss"]), None)
        acc = next((clock_s(p) / 60 for p in pts if p["eval_mlm_mask_acc"] >= goal["eval_mlm_mask_acc"]), None)
        out.append({**r, "minutes": (loss, acc)})
    return out


def plot(rows: list[dict], path: Path):
    fig, axes = transfer.pyplot().subplots(1, 2, figsize=(15, 4.5), width_ratios=(1.3, 1))
    for r in rows:
        pts = [p for p in r["curve"] if p.get("eval_mlm_loss") is not None]
        axes[0].plot([clock_s(p) / 60 for p in pts], [p["eval_mlm_loss"] for p in pts], marker=".",
                     label=f"{r['arm']} ({r['budget_s'] / 60:.0f} min{', paced' if r.get('clock') else ''})")
    axes[0].set(title="held-out MLM loss (each arm's own instances)", xlabel="minutes on 2 CPU cores",
                ylabel="loss (nats)")
    names = [f"{r['arm']}\n{r['budget_s'] / 60:.0f} min" for r in rows]
    for k, (reading, task) in enumerate((r, t) for r in ("probe", "probe_mean") for t in PROBE_TASKS):
        axes[1].bar([i + 0.2 * k for i in range(len(rows))], [100 * r.get(reading, {}).get(task, 0) for r in rows],
                    0.2, label=f"{task} ({task_metric(task)}), {'[CLS]' if reading == 'probe' else 'mean'}",
                    hatch=None if reading == "probe" else "//", color=f"C{k % 2}")
    axes[1].set_xticks([i + 0.3 for i in range(len(rows))], names, fontsize=7, rotation=30, ha="right")
    axes[1].set(title=f"probe: fine-tuned once (seed 1, lr {PROBE_LR:g})", ylabel="%",
                ylim=(0, 120))  # room for the legend above the bars
    transfer.finish(fig, axes, path, legend_size=7)
    print(f"wrote {path}")


def main(argv=None):
    from bertkit.pretrain.budget import parse_duration

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="30m", help="wall-clock pretraining time per arm (30m, 2h)")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bertkit-budget")
    ap.add_argument("--paced", action="store_true",
                    help="a step budget: as many steps as the budget buys at the arm's pace, probed alone (above)")
    ap.add_argument("--pace-only", action="store_true",
                    help="--paced: measure the arms' paces and stop (alone on the machine; the arms may then run "
                         "beside other work, with OMP_NUM_THREADS=1)")
    ap.add_argument("--report", action="store_true", help="only print the table and draw the plot")
    ap.add_argument("--probe-mean", action="store_true",
                    help="also probe each listed arm reading the mean over the tokens (kept as probe_mean)")
    args = ap.parse_args(argv)
    args.budget_s = parse_duration(args.budget)
    path = RESULTS / "budget.json"
    results = json.loads(path.read_text()) if path.is_file() else {"arms": {}}
    if not args.report:
        args.work.mkdir(parents=True, exist_ok=True)
        en = prepare(args.work, "en", BUDGETS["cpu"])
        if args.pace_only:
            for name in args.arms:
                say(f"{name}: {pace(name, ARMS[name], args, en)}")
            return
        for name in args.arms:
            suffix = "-paced" if args.paced else ""
            key = f"{name}@{args.budget_s:.0f}s{suffix}" if name != "random" else "random"
            done, tag = results["arms"].get(key), f"{name}-{args.budget_s:.0f}s{suffix}"
            reprobe = done and done.get("probe_dropout") != transfer.FINETUNE_DROPOUT
            probe_mean = args.probe_mean and not (done and "probe_mean" in done)
            if done and not (reprobe or probe_mean):
                continue
            if not done:
                results["arms"][key] = done = run_arm(name, ARMS[name], args, en)
            model = export_of(name, args.work, tag)
            if reprobe:  # probed before the probe fixed its dropout: probe the arm's export again, keep the first
                done["probe_model_dropout"] = done["probe"]
                done.update(probe=probe(name, model, tag, args.work), probe_dropout=transfer.FINETUNE_DROPOUT)
            if probe_mean:
                done["probe_mean"] = probe(name, model, tag, args.work, "mean")
            results.update({k: v for k, v in run_info("budget").items() if k != "commit"})
            path.write_text(json.dumps(results, indent=1) + "\n")
    report(results)


if __name__ == "__main__":
    main()
