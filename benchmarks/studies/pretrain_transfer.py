"""Does a BERT pretrained by bertkit from raw text beat the same architecture randomly initialised? (a benchmark)

Everything goes through bertkit's own stages, called from Python: prepare-corpus on the English WikiExtractor
sample and the Gutenberg books -> train-tokenizer -> make-instances (static and dynamic) -> pretrain -> export; then
every fine-tune twice, from the export and from the same architecture with random weights, with the same seeds:
GLUE SST-2 (train subsampled), MRPC, RTE, CoLA, STS-B and CoNLL-2003 NER (train subsampled). A Korean arm pretrains
on the Korean WikiExtractor sample with its own vocabulary and reports held-out MLM accuracy and fill-mask examples.

    python benchmarks/studies/pretrain_transfer.py                    # CPU: preset tiny, about an hour on 2 cores
    python benchmarks/studies/pretrain_transfer.py --device cuda   # GPU: preset small, a bigger budget (see CUDA below)
    python benchmarks/studies/pretrain_transfer.py --only report      # tables and plot from the results so far
    python benchmarks/studies/pretrain_transfer.py --only long --long-steps 16000         # a longer run, its fine-tunes
    python benchmarks/studies/pretrain_transfer.py --only finetune --inits random --tasks sst2 --finetune-lr 5e-4
    python benchmarks/studies/pretrain_transfer.py --recipe budget --time-budget 2h  # pretrain --recipe budget, 2 hours
    python benchmarks/studies/pretrain_transfer.py --recipe budget --time-budget 2h --then-128 12m --only finetune
    python benchmarks/studies/pretrain_transfer.py --recipe budget --time-budget 2h --pooling mean --only finetune
    python benchmarks/studies/pretrain_transfer.py --recipe budget --model modernbert-tiny --time-budget 2h \
        --only finetune

With --recipe the English side is one run of `pretrain --recipe NAME --time-budget T` (dynamic masking), then
every task fine-tuned from it and from random weights at each rate of --finetune-lrs with every seed; each start
is scored at its best rate (all rates reported), and the Korean arm pretrains with the same recipe for
--ko-time-budget. Results: benchmarks/results/pretrain_transfer_NAME_T.json and .png, with the transfer of every
budget of NAME run so far (`--time-budget 4h --only finetune`: a longer English run, no Korean arm; the random
start's fine-tunes are shared by every budget; --then-128 adds BERT's second phase, longer sequences from the first
phase's weights: make-instances --recipe NAME --max-seq-length 128, pretrain --recipe NAME --init-from RUN;
--pooling mean fine-tunes the GLUE classifiers on the mean over the tokens instead of [CLS], for both starts).

Every step is skipped when its output exists, so a killed run is resumed by running it again (--work keeps the
stages' folders; it defaults outside the repository, since CoNLL-2003 may not be copied into it). Prints tables,
writes benchmarks/results/pretrain_transfer.json and pretrain_transfer.png.
"""
import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import SHARED, done, masked_only_accuracy, say
from record import RESULTS, run_info, write_result
from transfer import (
    BUDGETS,
    CURVE_KEYS,
    FINETUNE_DROPOUT,
    KO_FILL_MASK,
    Budget,
    best_rate,
    curves,
    fill_mask,
    finetune_one,
    finetune_rate,
    finish,
    plot_by_hours,
    prepare,
    pretrain_run,
    pyplot,
    random_init,
    seed_verdict,
    task_metric,
    timed_curve,
)

LONG_TASKS = ["sst2", "mrpc", "stsb"]
EN_FILL_MASK = ["The capital of France is [MASK].", "He was born in [MASK] and died in 1950.",
                "The river flows into the [MASK] sea."]


def finetune_score(task: str, model: Path, out: Path, seed: int, budget: Budget, work: Path, label: str,
                   pooling: str | None = None) -> float:
    """One fine-tune's best dev score, said with its label and time as it lands."""
    t0 = time.time()
    score = finetune_one(task, model, out, seed, budget, work, pooling)["best"][task_metric(task)]
    say(f"{label}: {task_metric(task)} {score:.4f} ({time.time() - t0:.0f} s)")
    return score


# ---------------------------------------------------------------- report

def inits(rows: list[dict]) -> list[str]:
    """The starting points in the table: random, the main run, then the longer runs by length."""
    longer = sorted({k for r in rows for k in r if k.startswith("pretrained-")}, key=lambda k: int(k.split("-")[1]))
    return ["random", "pretrained", *longer]


def summarize(results: dict) -> list[dict]:
    rows = []
    for task, by_init in results["finetune"].items():
        row = {"task": task, "metric": task_metric(task)}
        for init, scores in by_init.items():
            row[init] = {"mean": statistics.mean(scores), "sd": statistics.stdev(scores) if len(scores) > 1 else 0.0,
                         "seeds": scores}
        if "random" in row:
            for init in [k for k in list(row) if k.startswith("pretrained")]:
                row["difference" + init[len("pretrained"):]] = row[init]["mean"] - row["random"]["mean"]
        rows.append(row)
    return rows


def print_table(rows: list[dict]):
    columns = inits(rows)
    print(f"\n{'task':14} {'metric':9} " + " ".join(f"{c:>16}" + ("" if c == "random" else f" {'diff':>6}")
                                                  for c in columns))
    for r in rows:
        cells = []
        for c in columns:
            cells.append(f"{100 * r[c]['mean']:6.1f} ± {100 * r[c]['sd']:4.1f}" if c in r else "-")
            if c != "random":
                d = "difference" + c[len("pretrained"):]
                cells[-1] = f"{cells[-1]:>16} {100 * r[d]:+6.1f}" if d in r else f"{cells[-1]:>16} {'-':>6}"
        print(f"{r['task']:14} {r['metric']:9} " + " ".join(f"{c:>16}" for c in cells))


def plot(results: dict, path: Path):
    fig, axes = pyplot().subplots(1, 3, figsize=(18, 4), width_ratios=(1, 1, 1.6))
    for name, c in results["curves"].items():
        axes[0].plot(c["steps"], [100 * a for a in c["eval_mlm_acc"]], marker="o", label=name)
        if name.startswith("en"):
            axes[1].plot(c["steps"], [100 * a for a in c["eval_nsp_acc"]], marker="o", label=name)
    axes[0].set(title="held-out MLM accuracy", xlabel="pretraining step", ylabel="%")
    axes[1].set(title="held-out NSP accuracy (English)", xlabel="pretraining step", ylabel="%")
    rows = summarize(results)
    x = range(len(rows))
    columns = inits(rows)
    width = 0.8 / len(columns)
    for k, init in enumerate(columns):
        means = [100 * r[init]["mean"] if init in r else 0 for r in rows]
        sds = [100 * r[init]["sd"] if init in r else 0 for r in rows]
        axes[2].bar([i + width * k for i in x], means, width, yerr=sds, label=init)
    # a row fine-tuned at another rate ("sst2 lr 0.0005") on two short lines, as the others are
    labels = [r["task"].replace(" lr ", "\nlr ") if " lr " in r["task"] else f"{r['task']}\n{r['metric']}"
              for r in rows]
    axes[2].set_xticks([i + 0.4 - width / 2 for i in x], labels)
    axes[2].set(title="fine-tuned (dev), mean ± sd over seeds", ylabel="%")
    finish(fig, axes, path)


# ---------------------------------------------------------------- with a named recipe on a time budget

def recipe_instances(corpus: Path, tokenizer: Path, out: Path, recipe: str, **flags) -> Path:
    """make-instances --recipe NAME (the instances the recipe was measured on), flags beside it winning."""
    from bertkit.pipelines.make_instances import InstancesConfig, make_instances
    from bertkit.recipes import RECIPES

    if not done(out):
        say(f"make-instances {out.name}")
        settings = {**RECIPES[recipe]["make-instances"], "dupe": 1, "workers": 2, **flags}
        make_instances(corpus, tokenizer, out, InstancesConfig(**settings), progress=False)
    return out


def recipe_pretrain(instances: Path, run: Path, recipe: str, budget_s: float, budget: Budget, device: str,
                    **flags) -> Path:
    """`pretrain --recipe NAME --time-budget T` (resuming a killed run) and export; returns the export folder.
    `flags` are PretrainConfig fields given beside the recipe (init_from, micro_batch for a second phase)."""
    from bertkit.pretrain import PretrainConfig, export, pretrain

    export_dir = run.parent / f"{run.name}-export"
    if (export_dir / "model.safetensors").is_file():
        return export_dir
    resume = (run / "checkpoints" / "latest").is_file()
    say(f"pretrain {run.name}: {budget.preset}, recipe {recipe}, {budget_s / 60:.0f} min" +
        (" (resumed)" if resume else ""))
    cfg = PretrainConfig(instances=str(instances), out=str(run), model=budget.preset, recipe=recipe,
                         time_budget=budget_s, eval_every=budget.eval_every,
                         eval_batches=20, save_every=4 * budget.eval_every, keep_last=1, log_every=50,
                         resume=resume, num_workers=1, progress=False, report_to="tensorboard",
                         precision="bf16" if device == "cuda" else "fp32", **flags)
    result = pretrain(cfg)
    if result.get("stopped_by_signal"):
        write_so_far(run)
        raise SystemExit(f"{run.name} stopped at step {result['step']}; run the benchmark again to resume")
    export(run, export_dir)
    return export_dir


def given_run(run: Path, export_dir: Path, tokenizer: Path) -> tuple[Path, Path, dict]:
    """--pretrained RUN: a run made elsewhere on this benchmark's corpus and tokenizer (budget.py's paced arm, say)
    -> (the run, its export made once, {steps})."""
    from bertkit.pretrain import export

    if (run / "tokenizer" / "vocab.txt").read_bytes() != (tokenizer / "vocab.txt").read_bytes():
        raise SystemExit(f"{run}: its vocabulary is not this benchmark's ({tokenizer}); pretrain it on the "
                         "benchmark's corpus and tokenizer (budget.py does)")
    if not (export_dir / "model.safetensors").is_file():
        export(run, export_dir)
    return run, export_dir, {"steps": timed_curve(run)[-1]["step"]}


def write_so_far(run: Path) -> Path:
    """A paused run's curve so far under results/, so partial results never wait on the run's end; the finished
    benchmark's own result replaces it (delete this file then)."""
    schedule = json.loads((run / "schedule.json").read_text())
    name = f"pretrain_transfer_{run.name.replace('-run-', '_').replace('-', '_')}_so_far"
    return write_result(name, {**run_info(name), "status": "pretraining paused (resumable): no fine-tunes yet",
                               "resume": "python benchmarks/studies/pretrain_transfer.py " + " ".join(sys.argv[1:]),
                               **{k: schedule[k] for k in ("time_budget_s", "time_used_s", "steps")},
                               "curves": {run.name.split("-")[0]: columns(timed_curve(run))}})


def sweep_table(sweep: dict) -> list[dict]:
    """One row per task: each start at its best rate, the difference, and the seed-paired verdict on it."""
    rows = []
    for task, by_init in sweep.items():
        row = {"task": task, "metric": task_metric(task),
               **{init: best_rate(by_lr) for init, by_lr in by_init.items()}}
        if "pretrained" in row and "random" in row:
            row["difference"] = row["pretrained"]["mean"] - row["random"]["mean"]
            row["shown"] = seed_verdict(row["random"], row["pretrained"])["shown"]
        rows.append(row)
    return rows


def print_sweep(rows: list[dict]):
    print(f"\n{'task':6} {'metric':9} {'random (best lr)':>24} {'pretrained (best lr)':>24} {'diff':>6} shown"
          "   every rate: random | pretrained")
    for r in rows:
        cells = [f"{100 * r[i]['mean']:5.1f} ± {100 * r[i]['sd']:4.1f} ({r[i]['lr']:g})" if i in r else "-"
                 for i in ("random", "pretrained")]
        rates = " | ".join(" ".join(f"{float(lr):g}:{100 * v['mean']:.1f}" for lr, v in r[i]["rates"].items())
                           for i in ("random", "pretrained") if i in r)
        diff = f"{100 * r['difference']:+6.1f}" if "difference" in r else f"{'-':>6}"
        shown = "yes" if r.get("shown") else "no"
        print(f"{r['task']:6} {r['metric']:9} {cells[0]:>24} {cells[1]:>24} {diff} {shown:5}   {rates}")
    won = [r["task"] for r in rows if r.get("difference", 0) > 0]
    shown = [r["task"] for r in rows if r.get("shown")]
    print(f"pretrained beats random on {len(won)} of {len(rows)} tasks ({', '.join(won) or 'none'}); a difference "
          f"shown (seed-paired 95 % interval, 3+ seeds) on {len(shown)} ({', '.join(shown) or 'none'})")


def transfer_by_hours(work: Path, recipe: str, pooling: str) -> list[dict]:
    """Every budget of a recipe run in --work (results-RECIPE-T*.json) without a second phase and fine-tuned with this
    pooling, shortest first: its pretraining and each task's pretrained-minus-random difference at the best rates,
    i.e. how transfer grows with CPU-hours."""
    from bertkit.pretrain.budget import parse_duration

    rows = []
    for path in work.glob(f"results-{recipe}-*.json"):
        r = json.loads(path.read_text())
        if "time_used_s" in r and r.get("variant") == {"then_128": None, "pooling": pooling}:
            used_s = r["time_used_s"] or parse_duration(r["time_budget"])  # --pretrained: the budget it names
            rows.append({"time_budget": r["time_budget"], "hours": used_s / 3600,
                         "steps": r["steps"], "masked_only_acc": r["masked_only"]["masked_only_acc"],
                         "tasks": {t["task"]: {k: t[k] for k in ("difference", "shown")}
                                   for t in sweep_table(r["sweep"]) if "difference" in t}})
    return sorted(rows, key=lambda row: row["hours"])


def print_by_hours(rows: list[dict]):
    tasks = list(dict.fromkeys(t for r in rows for t in r["tasks"]))
    print("\npretrained minus random at each start's best rate (* a difference the seed-paired interval shows)")
    print(f"{'hours':>5} {'steps':>7} {'[MASK]':>6} " + " ".join(f"{t:>7}" for t in tasks))
    for r in rows:
        cells = [f"{100 * r['tasks'][t]['difference']:+6.1f}{'*' if r['tasks'][t]['shown'] else ' '}"
                 if t in r["tasks"] else f"{'-':>7}" for t in tasks]
        print(f"{r['hours']:5.1f} {r['steps']:7d} {100 * r['masked_only_acc']:5.1f}% " + " ".join(cells))


def plot_sweep(results: dict, rows: list[dict], path: Path):
    fig, axes = pyplot().subplots(1, 2, figsize=(15, 4.5), width_ratios=(1, 1.4))
    for name, c in results["curves"].items():
        minutes = [t / 60 for t in c["elapsed_s"]]
        axes[0].plot(minutes, [100 * a for a in c["eval_mlm_mask_acc"]], marker=".", label=name)
    axes[0].set(title="held-out [MASK] accuracy", xlabel="pretraining minutes (a paced run: step / pace)", ylabel="%")
    for k, init in enumerate(("random", "pretrained")):
        xs = [i + 0.4 * k for i in range(len(rows))]
        axes[1].bar(xs, [100 * r[init]["mean"] if init in r else 0 for r in rows], 0.4,
                    yerr=[100 * r[init]["sd"] if init in r else 0 for r in rows], label=f"{init} (best lr)")
    axes[1].set_xticks([i + 0.2 for i in range(len(rows))], [f"{r['task']}\n{r['metric']}" for r in rows])
    axes[1].set(title="fine-tuned (dev), mean ± sd over seeds, each start at its best rate", ylabel="%")
    finish(fig, axes, path)


def columns(points: list[dict]) -> dict:
    """A curve as the results file keeps it: one list per MLM measure."""
    return {key: [p.get(key) for p in points] for key in CURVE_KEYS[:4]}


def recipe_main(args, budget: Budget):
    from bertkit.pretrain.budget import parse_duration

    budget_s, ko_budget_s = parse_duration(args.time_budget), parse_duration(args.ko_time_budget)
    pretraining = args.time_budget + (f"-then128-{args.then_128}" if args.then_128 else "")
    pooled = "" if args.pooling == "cls" else f"-{args.pooling}"  # GLUE heads only: NER shares [CLS]'s fine-tunes
    label = pretraining + pooled
    other_model = args.model and args.model != BUDGETS[args.device].preset
    recipe = f"{args.model}-{args.recipe}" if other_model else args.recipe  # another model's runs are named apart
    tag = f"{recipe}-{label}"
    state_file = args.work / f"results-{tag}.json"
    results = json.loads(state_file.read_text()) if state_file.is_file() else {"curves": {}, "sweep": {}}
    results.update(time_budget=args.time_budget, variant={"then_128": args.then_128, "pooling": args.pooling})

    def save():
        state_file.write_text(json.dumps(results, indent=1, ensure_ascii=False))

    if args.only in (None, "en", "finetune"):
        en = prepare(args.work, "en", budget)
        run = args.work / f"en-run-{recipe}-{args.time_budget}"
        if args.pretrained:
            run, pretrained, schedule = given_run(args.pretrained, run.parent / f"{run.name}-export", en["tokenizer"])
        else:
            instances = recipe_instances(en["corpus"], en["tokenizer"], args.work / f"en-{args.recipe}", args.recipe)
            pretrained = recipe_pretrain(instances, run, args.recipe, budget_s, budget, args.device)
            schedule = json.loads((run / "schedule.json").read_text())
        phases = [schedule]
        if args.then_128:  # BERT's second phase at longer sequences: positions 65-128 are never trained at 64
            phase1, run = run, args.work / f"en-run-{recipe}-{pretraining}"
            instances = recipe_instances(en["corpus"], en["tokenizer"], args.work / f"en-{args.recipe}-128",
                                         args.recipe, max_seq_length=128)
            pretrained = recipe_pretrain(instances, run, args.recipe, parse_duration(args.then_128), budget,
                                         args.device, init_from=str(phase1), micro_batch=32)  # 4,096 tokens a step
            phases.append(json.loads((run / "schedule.json").read_text()))
        if args.pretrained:  # its time is its own benchmark's to say (a paced arm's wall clock ran beside other work)
            results.update(steps=schedule["steps"], time_used_s=None, pretrained_run=str(args.pretrained))
        else:
            results.update(steps=sum(p["steps"] for p in phases), time_used_s=sum(p["time_used_s"] for p in phases))
        if "masked_only" not in results:  # the export never changes once written: measured once
            results.update(masked_only=masked_only_accuracy(pretrained, en["dynamic"]),
                           en_fill_mask=fill_mask(pretrained, EN_FILL_MASK))
        curve = timed_curve(phase1 if args.then_128 else run)
        if args.pretrained:  # a paced arm's clock: its steps spread evenly over --time-budget (its wall clock is not)
            curve = [{**p, "elapsed_s": p["step"] * budget_s / schedule["steps"]} for p in curve]
        results["curves"]["en"] = columns(curve)
        if args.then_128:  # its own held-out rows (128 tokens), on the same clock
            results["curves"]["en, then 128"] = columns([{**p, "elapsed_s": p["elapsed_s"] + schedule["time_used_s"]}
                                                        for p in timed_curve(run)])
        save()
        # the random start is one per recipe (same architecture, seed 0): every budget shares its fine-tunes
        models = {"pretrained": pretrained, "random": random_init(pretrained, args.work / f"en-random-{recipe}")}
        for task in args.tasks if args.only != "en" else []:
            for lr in args.finetune_lrs:
                for init in args.inits:
                    for seed in args.seeds:
                        start = f"{recipe}-{pretraining}" if init == "pretrained" else recipe
                        out = args.work / "finetune" / (f"{start}{pooled if task != 'ner' else ''}-{task}-"
                                                        f"{init}-lr{lr:g}-{seed}")
                        score = finetune_score(task, models[init], out, seed, replace(budget, finetune_lr=lr),
                                               args.work, f"{task} {init} lr {lr:g} seed {seed}", args.pooling)
                        results["sweep"].setdefault(task, {}).setdefault(init, {}).setdefault(f"{lr:g}", {})[
                            str(seed)] = score
                        save()
    if args.only in (None, "ko"):
        ko = prepare(args.work, "ko", budget)
        run = args.work / f"ko-run-{recipe}-{args.ko_time_budget}"
        instances = recipe_instances(ko["corpus"], ko["tokenizer"], args.work / f"ko-{args.recipe}", args.recipe)
        export_dir = recipe_pretrain(instances, run, args.recipe, ko_budget_s, budget, args.device)
        results["curves"]["ko"] = columns(timed_curve(run))
        if "masked_only_ko" not in results:  # measured once, as the English side's
            results.update(ko_fill_mask=fill_mask(export_dir, KO_FILL_MASK),
                           masked_only_ko=masked_only_accuracy(export_dir, ko["dynamic"]))
        save()

    rows = sweep_table(results["sweep"])
    print_sweep(rows)
    for key in [k for k in results if "fill_mask" in k]:
        for ex in results[key]:
            print(f"{ex['text']}  ->  {ex['top5']}")
    by_hours = transfer_by_hours(args.work, recipe, args.pooling)
    print_by_hours(by_hours)
    name = f"pretrain_transfer_{recipe.replace('-', '_')}_{label}"
    write_result(name, {**run_info(name), "device": args.device, "recipe": args.recipe, "model": budget.preset,
                        "by_hours": by_hours,
                        "ko_time_budget": args.ko_time_budget,
                        "finetune_lrs": args.finetune_lrs, "seeds": args.seeds, "finetune_dropout": FINETUNE_DROPOUT,
                        "budget": budget.__dict__, "table": rows, **results})
    if rows and results["curves"]:
        plot_sweep(results, rows, RESULTS / f"{name}.png")
    if len(by_hours) > 1:
        plot_by_hours(by_hours, RESULTS / f"pretrain_transfer_{recipe.replace('-', '_')}{pooled}_by_hours.png")


# ---------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bertkit-transfer")
    ap.add_argument("--tasks", nargs="+", default=["sst2", "mrpc", "rte", "cola", "stsb", "ner"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--only", choices=["en", "ko", "finetune", "long", "report"], default=None)
    ap.add_argument("--inits", nargs="+", choices=["pretrained", "random"], default=["pretrained", "random"],
                    help="which starting points the main fine-tunes use")
    ap.add_argument("--finetune-lr", type=float, default=None,
                    help="fine-tuning learning rate (default: the budget's); another rate gets its own table rows")
    ap.add_argument("--long-steps", type=int, default=None,
                    help="steps of the longer dynamic run (default: the budget's); each length keeps its own folder")
    ap.add_argument("--recipe", default=None, help="pretrain with this named recipe (bertkit/recipes.py) for "
                    "--time-budget instead of the budget's steps")
    ap.add_argument("--model", default=None, help="with --recipe: pretrain this preset (e.g. modernbert-tiny) instead "
                    "of the budget's; its runs, fine-tunes and results are named apart")
    ap.add_argument("--time-budget", default="2h", help="with --recipe: the English pretraining's wall-clock")
    ap.add_argument("--pretrained", type=Path, default=None, metavar="RUN",
                    help="with --recipe: fine-tune this run folder (made on this benchmark's corpus and tokenizer, "
                    "e.g. budget.py's paced arm) instead of pretraining; --time-budget names its budget")
    ap.add_argument("--then-128", default=None, metavar="DURATION",
                    help="with --recipe: a second pretraining phase at 128 tokens from the first's weights, this long")
    ap.add_argument("--pooling", choices=["cls", "mean"], default="cls",
                    help="with --recipe: what the GLUE classifiers read (finetune --pooling); mean: results of its own")
    ap.add_argument("--ko-time-budget", default="30m", help="with --recipe: the Korean pretraining's wall-clock")
    ap.add_argument("--finetune-lrs", type=float, nargs="+", default=[1e-4, 3e-4, 1e-3],
                    help="with --recipe: every start is fine-tuned at each, and scored at its best")
    args = ap.parse_args(argv)
    if not SHARED.is_dir():
        raise SystemExit(f"needs the shared data ({SHARED}; set BERTKIT_SHARED_DATA)")
    budget = BUDGETS[args.device]
    if args.model:
        if not args.recipe:
            raise SystemExit("--model goes with --recipe")
        budget = replace(budget, preset=args.model)
    if args.pretrained and (not args.recipe or args.then_128):
        raise SystemExit("--pretrained goes with --recipe (and --model), without --then-128")
    if args.recipe:
        args.work.mkdir(parents=True, exist_ok=True)
        return recipe_main(args, budget)
    finetune_budget, lr_tag, folder_tag = finetune_rate(budget, args.finetune_lr)
    args.work.mkdir(parents=True, exist_ok=True)
    state_file = args.work / "results.json"
    results = json.loads(state_file.read_text()) if state_file.is_file() else {"curves": {}, "finetune": {}}

    def save():
        state_file.write_text(json.dumps(results, indent=1))

    if args.only in (None, "en", "finetune"):
        en = prepare(args.work, "en", budget)
        exports = {}
        for mode in ("dynamic", "static"):
            run = args.work / f"en-run-{mode}"
            exports[mode] = pretrain_run(en[mode], run, budget, budget.steps, args.device)
            results["curves"][f"en-{mode}"] = curves(run)
        save()
        # fine-tune from the masking mode with the better final held-out MLM accuracy
        best = max(("dynamic", "static"), key=lambda m: results["curves"][f"en-{m}"]["eval_mlm_acc"][-1])
        results["finetuned_from"] = best
        results["masked_only"] = {mode: masked_only_accuracy(exports[mode], en["dynamic"]) for mode in exports}
        results["en_fill_mask"] = fill_mask(exports[best], EN_FILL_MASK)
        models = {"pretrained": exports[best], "random": random_init(exports[best], args.work / "en-random")}
        if args.only != "en":
            for task in args.tasks:
                for init, model in [(i, models[i]) for i in args.inits]:
                    for seed in args.seeds:
                        out = args.work / "finetune" / f"{task}-{init}-{seed}{folder_tag}"
                        score = finetune_score(task, model, out, seed, finetune_budget, args.work,
                                               f"{task} {init} seed {seed}")
                        results["finetune"].setdefault(task + lr_tag, {}).setdefault(init, {})[str(seed)] = score
                        save()
    long_steps = args.long_steps or budget.long_steps
    if args.only in (None, "long") and long_steps:
        en = prepare(args.work, "en", budget)
        run = args.work / f"en-run-dynamic-{long_steps}"
        export_dir = pretrain_run(en["dynamic"], run, budget, long_steps, args.device)
        results["curves"][f"en-dynamic-{long_steps}"] = curves(run)
        results.setdefault("masked_only", {})[f"dynamic-{long_steps}"] = masked_only_accuracy(export_dir,
                                                                                              en["dynamic"])
        results[f"en_fill_mask_{long_steps}"] = fill_mask(export_dir, EN_FILL_MASK)
        save()
        for task in [t for t in args.tasks if t in LONG_TASKS]:
            for seed in args.seeds:
                out = args.work / "finetune" / f"{task}-{long_steps}-{seed}{folder_tag}"
                score = finetune_score(task, export_dir, out, seed, finetune_budget, args.work,
                                       f"{task} pretrained-{long_steps} seed {seed}")
                by_init = results["finetune"].setdefault(task + lr_tag, {})
                by_init.setdefault(f"pretrained-{long_steps}", {})[str(seed)] = score
                save()
    if args.only in (None, "ko"):
        ko = prepare(args.work, "ko", budget)
        run = args.work / "ko-run-dynamic"
        export_dir = pretrain_run(ko["dynamic"], run, budget, budget.ko_steps, args.device)
        results["curves"]["ko-dynamic"] = curves(run)
        results["ko_fill_mask"] = fill_mask(export_dir, KO_FILL_MASK)
        results.setdefault("masked_only", {})["ko-dynamic"] = masked_only_accuracy(export_dir, ko["dynamic"])
        save()

    # seeds as lists for the report
    results["finetune"] = {t: {i: list(s.values()) if isinstance(s, dict) else s for i, s in by.items()}
                           for t, by in results["finetune"].items()}
    rows = summarize(results)
    print_table(rows)
    for key in [k for k in results if "fill_mask" in k]:
        for ex in results.get(key, []):
            print(f"{ex['text']}  ->  {ex['top5']}")
    record = {**run_info("pretrain_transfer"), "device": args.device, "budget": budget.__dict__,
              "table": rows, **results}
    write_result("pretrain_transfer", record)
    if results["curves"] and rows:
        plot(results, RESULTS / "pretrain_transfer.png")
        print(f"wrote {RESULTS / 'pretrain_transfer.png'}")


if __name__ == "__main__":
    main()
