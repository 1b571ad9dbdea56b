"""Does a Korean encoder pretrained by bertkit from raw Korean text beat random weights on Korean tasks? (a benchmark)

Raw Korean text (both Korean Wikipedia folders, KoCoNovel and boddari's prose in `../shared/data`) goes through
bertkit's own stages from Python: prepare-corpus -> train-tokenizer -> make-instances --recipe budget -> pretrain
--recipe budget -> export. Then every task is fine-tuned from the export and from the same architecture with random
weights, 3 seeds at each of 3 rates, each start scored at its best rate (every rate kept in the results):
NSMC, KLUE-NLI, KorSTS, KLUE-NER and KorQuAD 1.0 (`bertkit finetune korean --task ...`).

    python benchmarks/korean_transfer.py --hours 2               # pace probe, pretraining, then the fine-tunes
    python benchmarks/korean_transfer.py --hours 2 --only pretrain
    python benchmarks/korean_transfer.py --hours 2 --only finetune    # the sweep, from the finished export
    python benchmarks/korean_transfer.py --hours 2 --only report

"2 CPU-hours" is a step count, not a clock: a short probe alone on the machine measures this run's steps per
second (its load average recorded beside it), and the run takes as many steps as 2 hours of that pace buy, on the
recipe's schedule over those steps. So the pretraining is a quality-against-steps run: it may go on beside other
work, and a killed run resumes where its last checkpoint left it (run the same command again).
Results: benchmarks/results/korean_transfer_<hours>h.json.
"""
import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from pretrain_transfer import (  # noqa: E402
    FINETUNE_DROPOUT,
    SHARED,
    best_rate,
    done,
    masked_only_accuracy,
    random_init,
    say,
    timed_curve,
)
from record import RESULTS, run_info, write_result  # noqa: E402

PRESET = "tiny"
VOCAB_SIZE = 16000
PROBE_STEPS = 300        # the pace is measured over steps 100-300 (the first ones warm up the allocator and loader)
KO_TEXT = ["wikipedia_ko_wikiextractor", "wikipedia_ko_wikiextractor_more", "koconovel/data/jsonl",
           "boddari/unesco_report/in_txt"]
KO_FILL_MASK = ["대한민국의 수도는 [MASK]이다.", "세종대왕은 [MASK]을 창제하였다.", "한국어는 [MASK] 언어이다."]
# task: (metric, first training rows kept or None for all). The splits are `bertkit finetune korean`'s own (NSMC:
# rows 0-39,999 train, the last 10,000 score; KLUE-NER: sentences 0-3,999 / 4,000-4,999; KorQuAD: articles 0-99 /
# 100-139); NSMC keeps its first 10,000 training rows so that one fine-tune stays within minutes on 2 cores.
TASKS = {"nsmc": ("accuracy", 10_000), "klue-nli": ("accuracy", None), "korsts": ("pearson", None),
         "klue-ner": ("entity_macro_f1", None), "korquad": ("f1", None)}
RATES = (1e-4, 3e-4, 1e-3)
SEEDS = (0, 1, 2)


def prepare(work: Path) -> dict:
    """Corpus, tokenizer and the budget recipe's instances; each skipped when already made."""
    from bertkit.pipelines.make_instances import InstancesConfig, make_instances
    from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus
    from bertkit.pipelines.train_tokenizer import TokenizerConfig, train_tokenizer
    from bertkit.recipes import RECIPES

    d = {name: work / f"ko-{name}" for name in ("corpus", "tokenizer", "instances")}
    if not done(d["corpus"]):
        say("prepare-corpus")
        prepare_corpus([SHARED / p for p in KO_TEXT], d["corpus"], CorpusConfig(workers=2, holdout=0.01,
                                                                                  progress=False))
    if not done(d["tokenizer"]):
        say("train-tokenizer")
        train_tokenizer(d["corpus"], d["tokenizer"], TokenizerConfig(vocab_size=VOCAB_SIZE, progress=False))
    if not done(d["instances"]):
        say("make-instances --recipe budget")
        make_instances(d["corpus"], d["tokenizer"], d["instances"],
                       InstancesConfig(**{**RECIPES["budget"]["make-instances"], "dupe": 1, "workers": 2}),
                       progress=False)
    return d


def pretrain_config(instances: Path, out: Path, steps: int, **extra):
    from bertkit.pretrain import PretrainConfig

    return PretrainConfig(instances=str(instances), out=str(out), model=PRESET, recipe="budget", max_steps=steps,
                          num_workers=1, progress=False, log_every=50, **extra)


def pace(work: Path, instances: Path) -> dict:
    """This run's optimizer steps per second, alone on the machine (kept in WORK/ko-pace.json: measured once)."""
    from bertkit.pretrain import pretrain

    path = work / "ko-pace.json"
    if path.is_file():
        return json.loads(path.read_text())
    say(f"pace probe: {PROBE_STEPS} steps (keep the machine otherwise idle)")
    load_before = os.getloadavg()
    probe = work / "ko-pace-run"
    shutil.rmtree(probe, ignore_errors=True)  # a probe cut short is measured again from the start
    pretrain(pretrain_config(instances, probe, PROBE_STEPS, eval_every=10 ** 9, save_every=10 ** 9))
    rows = [json.loads(line) for line in (probe / "metrics.jsonl").read_text().splitlines()]
    timed = {r["step"]: r["elapsed_s"] for r in rows if "loss" in r and "elapsed_s" in r}
    a, b = min(s for s in timed if s >= 100), max(timed)
    result = {"steps_per_s": (b - a) / (timed[b] - timed[a]), "over_steps": [a, b],
              "load_average_before": [round(x, 2) for x in load_before],
              "load_average_after": [round(x, 2) for x in os.getloadavg()],
              "date": time.strftime("%Y-%m-%d %H:%M")}
    path.write_text(json.dumps(result, indent=1))
    return result


def pretrain_hours(work: Path, instances: Path, hours: float, steps_per_s: float) -> Path:
    """The budget recipe for as many steps as `hours` of the measured pace buy; resumes a killed run; exports."""
    from bertkit.pretrain import export, pretrain

    run = work / f"ko-run-{hours:g}h"
    export_dir = work / f"ko-run-{hours:g}h-export"
    if (export_dir / "model.safetensors").is_file():
        return export_dir
    steps = round(hours * 3600 * steps_per_s)
    resume = (run / "checkpoints" / "latest").is_file()
    say(f"pretrain {run.name}: {steps} steps" + (" (resumed)" if resume else ""))
    result = pretrain(pretrain_config(instances, run, steps, eval_every=max(250, steps // 20), eval_batches=20,
                                      save_every=1000, keep_last=1, resume=resume, report_to="tensorboard"))
    if result.get("stopped_by_signal"):
        raise SystemExit(f"{run.name} stopped at step {result['step']}; run the benchmark again to resume")
    export(run, export_dir)
    return export_dir


def finetune(task: str, model: Path, out: Path, lr: float, seed: int) -> float:
    """One fine-tune's best dev score; its metrics.json is the cache (a killed sweep resumes where it stopped)."""
    from bertkit.finetune.korean import finetune_klue_ner, finetune_korean, finetune_korquad
    from bertkit.finetune.train import TrainConfig

    metric, rows = TASKS[task]
    summary = json.loads((out / "metrics.json").read_text()) if (out / "metrics.json").is_file() else {}
    if "train_seconds" not in summary:
        t0 = time.time()
        cfg = TrainConfig(out_dir=str(out), epochs=3, batch_size=32, learning_rate=lr, seed=seed, save_model=False,
                          dropout=FINETUNE_DROPOUT, report_to="none", overwrite=True)
        if task == "korquad":
            summary = finetune_korquad(SHARED, model, cfg)
        elif task == "klue-ner":
            summary = finetune_klue_ner(SHARED, model, cfg)
        else:
            summary = finetune_korean(task, SHARED, model, cfg, max_train_rows=rows)
        say(f"{out.name}: {metric} {summary['best'][metric]:.4f} ({time.time() - t0:.0f} s)")
    return summary["best"][metric]


def sweep(work: Path, export_dir: Path, hours: float, results: dict, save) -> None:
    """Every task from the export and from random weights, each rate, each seed."""
    models = {"pretrained": export_dir, "random": random_init(export_dir, work / "ko-random")}
    for task in TASKS:
        for lr in RATES:
            for init, model in models.items():
                for seed in SEEDS:
                    tag = f"{hours:g}h-" if init == "pretrained" else ""
                    score = finetune(task, model, work / "finetune" / f"{task}-{init}-{tag}lr{lr:g}-{seed}", lr, seed)
                    results["sweep"].setdefault(task, {}).setdefault(init, {}).setdefault(f"{lr:g}", {})[
                        str(seed)] = score
                    save()


def table(sweep_results: dict) -> list[dict]:
    """Per task: each start at its best rate (every rate kept), the difference, whether the seeds' ranges part."""
    rows = []
    for task, by_init in sweep_results.items():
        row = {"task": task, "metric": TASKS[task][0], **{init: best_rate(r) for init, r in by_init.items()}}
        if "pretrained" in row and "random" in row:
            row["difference"] = row["pretrained"]["mean"] - row["random"]["mean"]
            row["apart"] = min(row["pretrained"]["seeds"]) > max(row["random"]["seeds"])
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"\n{'task':9} {'metric':16} {'random (best lr)':>22} {'pretrained (best lr)':>22} {'diff':>7} apart")
    for r in rows:
        cells = [f"{r[i]['mean']:7.3f} ± {r[i]['sd']:5.3f} ({r[i]['lr']:g})" if i in r else "-"
                 for i in ("random", "pretrained")]
        print(f"{r['task']:9} {r['metric']:16} {cells[0]:>22} {cells[1]:>22} {r.get('difference', 0):7.3f} "
              f"{r.get('apart', '-')}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=2.0, help="pretraining: this many hours of the measured pace")
    ap.add_argument("--only", choices=["pretrain", "finetune", "report"])
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bertkit-korean-transfer")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    name = f"korean_transfer_{args.hours:g}h"
    path = RESULTS / f"{name}.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    if args.only in (None, "pretrain"):
        d = prepare(args.work)
        results["pace"] = pace(args.work, d["instances"])
        export_dir = pretrain_hours(args.work, d["instances"], args.hours, results["pace"]["steps_per_s"])
        run = args.work / f"ko-run-{args.hours:g}h"
        corpus = json.loads((d["corpus"] / "manifest.json").read_text())
        results.update(corpus={k: v for k, v in corpus.items() if isinstance(v, (int, float))},
                       steps=round(args.hours * 3600 * results["pace"]["steps_per_s"]), curve=timed_curve(run),
                       masked_only=masked_only_accuracy(export_dir, d["instances"]))
        write_result(name, {**run_info(name), **results})
    if args.only in (None, "finetune"):
        export_dir = args.work / f"ko-run-{args.hours:g}h-export"
        if not (export_dir / "model.safetensors").is_file():
            raise SystemExit(f"{export_dir}: no export yet; run --only pretrain first")
        results.setdefault("sweep", {})
        sweep(args.work, export_dir, args.hours, results,
              lambda: write_result(name, {**run_info(name), **results, "table": table(results["sweep"])}))
    say(json.dumps({k: results.get(k) for k in ("pace", "steps", "corpus", "masked_only")}, indent=1))
    if results.get("sweep"):
        print_table(table(results["sweep"]))


if __name__ == "__main__":
    main()
