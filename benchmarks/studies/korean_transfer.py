"""Does a Korean encoder pretrained by bertkit from raw Korean text beat random weights on Korean tasks? (a benchmark)

Raw Korean text (both Korean Wikipedia folders, KoCoNovel and boddari's prose in `../shared/data`) goes through
bertkit's own stages from Python: prepare-corpus -> train-tokenizer -> make-instances --recipe budget -> pretrain
--recipe budget -> export. Then every task is fine-tuned from the export and from the same architecture with random
weights, 3 seeds at each of 3 rates, each start scored at its best rate (every rate kept in the results):
NSMC, KLUE-NLI, KorSTS, KLUE-NER and KorQuAD 1.0 (`bertkit finetune korean --task ...`). `--family modernbert`
runs a second arm on the same instances and recipe: modernbert-tiny (4 x 128, GeGLU, RoPE, local/global attention),
its own pace, its own random start (starts named modernbert-random, modernbert-2h). Fine-tunes are packed
(`finetune`'s default: the same losses as padded batches, a third of NSMC's compute) but for BERT's first arm's,
padded as its first scores were made. `--only reference` adds a row from outside the project: all-MiniLM-L6-v2, an
English model, as a floor for cross-lingual transfer.

    python benchmarks/studies/korean_transfer.py --only random           # the random side of the sweep (no pretraining)
    python benchmarks/studies/korean_transfer.py --hours 2                # pace probe, pretraining, then its fine-tunes
    python benchmarks/studies/korean_transfer.py --hours 2 --only pretrain
    python benchmarks/studies/korean_transfer.py --hours 2 --only finetune    # the sweep, from the finished export
    python benchmarks/studies/korean_transfer.py --only reference         # all-MiniLM-L6-v2: a row from outside
    python benchmarks/studies/korean_transfer.py --only reference --tasks klue-nli korquad --seeds 0  # one seed
    python benchmarks/studies/korean_transfer.py --family modernbert --only random  # the ModernBERT arm: the same, with
    python benchmarks/studies/korean_transfer.py --family modernbert --hours 2        # modernbert-tiny (its own pace)
    python benchmarks/studies/korean_transfer.py --pretokenize mecab --only prepare   # the vocabularies compared: each
    python benchmarks/studies/korean_transfer.py --pretokenize mecab --hours 2        # its own tokenizer and instances,
                                                                              # its family's pace (the same shape)
    python benchmarks/studies/korean_transfer.py --only report             # tables; runs still under way: their curve

"2 CPU-hours" is a step count, not a clock: a short probe alone on the machine measures this run's steps per
second (its load average recorded beside it), and the run takes as many steps as 2 hours of that pace buy, on the
recipe's schedule over those steps. So the pretraining is a quality-against-steps run: it may go on beside other
work, and a killed run resumes where its last checkpoint left it (run the same command again).
The random start is the same architecture and tokenizer with BERT's initialisation (seed 0), so it needs no
pretraining: `--only random` fine-tunes it alone, and a later session adds each pretrained start. One results file,
benchmarks/results/korean_transfer.json, keeps every fine-tune's score as it finishes (a sweep skips what it holds)
and the tokenizer's checksum: a start whose tokenizer differs from the recorded one is refused, not mixed in.
A pretraining that spans sessions is recorded by `--only report` under `partial_runs` (its held-out curve so far),
until its finished run takes its place in `runs`; a second run of a recorded name (a fresh --work) goes under
`reruns`, never over the run that made the scores.
"""
import argparse
import json
import os
import shutil
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import SHARED, masked_only_accuracy, say
from korean_arms import PRESETS, Arm, prepare, pretrain_config, random_start
from korean_tables import (
    BUDGET_STARTS,
    RATES,
    REFERENCE,
    REFERENCE_RATES,
    SEEDS,
    TASKS,
    by_hours,
    input_lengths,
    overlap_floor,
    print_table,
    print_vocab_tables,
    print_yardstick,
    table,
    vocab_tables,
    yardstick,
)
from record import RESULTS, read_result, run_info, write_result
from transfer import FINETUNE_DROPOUT, plot_by_hours, run_pace, timed_curve

PROBE_STEPS = 300        # the pace is measured over steps 100-300 (run_pace)
KO_FILL_MASK = ["대한민국의 수도는 [MASK]이다.", "세종대왕은 [MASK]을 창제하였다.", "한국어는 [MASK] 언어이다."]


def pace(work: Path, instances: Path, arm: Arm) -> dict:
    """This arm's optimizer steps per second, alone on the machine (kept in WORK/ko-[prefix]pace.json). A vocabulary
    arm has its family's shape (the same vocabulary size and 64-token instances), so it takes its family's pace:
    the same steps, an equal budget by construction, and no second probe needing the machine to itself."""
    from bertkit.pretrain import pretrain

    if arm.pretokenize != "none":
        return {**pace(work, instances, Arm(arm.family)), "pace_of": Arm(arm.family).preset}
    prefix = arm.prefix
    path = work / f"ko-{prefix}pace.json"
    if path.is_file():
        return json.loads(path.read_text())
    say(f"pace probe: {PROBE_STEPS} steps of {arm.preset} (keep the machine otherwise idle)")
    load_before = os.getloadavg()
    probe = work / f"ko-{prefix}pace-run"
    shutil.rmtree(probe, ignore_errors=True)  # a probe cut short is measured again from the start
    pretrain(pretrain_config(instances, probe, PROBE_STEPS, arm, eval_every=10 ** 9, save_every=10 ** 9))
    result = {**run_pace(probe),
              "load_average_before": [round(x, 2) for x in load_before],
              "load_average_after": [round(x, 2) for x in os.getloadavg()],
              "date": time.strftime("%Y-%m-%d %H:%M")}
    path.write_text(json.dumps(result, indent=1))
    return result


def pretrain_hours(work: Path, instances: Path, hours: float, steps_per_s: float, arm: Arm) -> Path:
    """The budget recipe for as many steps as `hours` of the measured pace buy; resumes a killed run; exports."""
    from bertkit.pretrain import export, pretrain

    run = work / f"ko-{arm.prefix}run-{hours:g}h"
    export_dir = work / f"{run.name}-export"
    if (export_dir / "model.safetensors").is_file():
        return export_dir
    steps = round(hours * 3600 * steps_per_s)
    resume = (run / "checkpoints" / "latest").is_file()
    say(f"pretrain {run.name}: {steps} steps" + (" (resumed)" if resume else ""))
    result = pretrain(pretrain_config(instances, run, steps, arm, eval_every=max(250, steps // 20),
                                      eval_batches=20, save_every=1000, keep_last=1, resume=resume,
                                      report_to="tensorboard"))
    if result.get("stopped_by_signal"):
        raise SystemExit(f"{run.name} stopped at step {result['step']}; run the benchmark again to resume")
    export(run, export_dir)
    return export_dir


def runs_under_way(work: Path, runs: dict) -> dict:
    """The held-out curves so far of the pretraining runs in `work` that have no export yet and no entry in `runs`
    (a run spans sessions): progress for the record, not a result. A run leaves this once it is in `runs`."""
    under_way = {}
    for run in sorted(work.glob("ko-*run-*h")):
        key = run.name.removeprefix("ko-").replace("run-", "")  # ko-modernbert-run-4h -> modernbert-4h
        if key in runs or (work / f"{run.name}-export" / "model.safetensors").is_file() or not (
                run / "metrics.jsonl").is_file():
            continue
        logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        under_way[key] = {"recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                          "step": max((r.get("step", 0) for r in logged), default=0),
                          "of_steps": json.loads((run / "config.json").read_text())["pretrain"]["max_steps"],
                          "curve": timed_curve(run)}
    return under_way


def record_run(results: dict, key: str, run: dict) -> None:
    """A finished run into `runs`, unless `runs` holds another one of that name: the recorded run made the recorded
    scores, so a rerun (a fresh --work, a deleted export) goes beside it in `reruns`, dated, and says so."""
    recorded = results["runs"].get(key)
    if recorded is None or recorded == run:
        results["runs"][key] = run
        return
    say(f"{key}: a run of this name is recorded already (its scores are that run's); this one goes under reruns")
    reruns = results.setdefault("reruns", {}).setdefault(key, [])
    if run not in [{k: v for k, v in r.items() if k != "recorded"} for r in reruns]:
        reruns.append({**run, "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})


def drop_finished_runs(results: dict) -> None:
    """A finished run is in `runs` only: its curve so far leaves `partial_runs` (the key goes with the last)."""
    partial = {k: v for k, v in results.pop("partial_runs", {}).items() if k not in results["runs"]}
    results.update({"partial_runs": partial} if partial else {})


def finetune(task: str, model: Path, out: Path, lr: float, seed: int, unpadded: bool = False) -> float:
    """One fine-tune's best dev score; its metrics.json is the cache (a killed sweep resumes where it stopped)."""
    from bertkit.finetune.korean import finetune_klue_ner, finetune_korean, finetune_korquad
    from bertkit.finetune.train import TrainConfig, finished_fine_tuning

    metric, rows = TASKS[task]
    summary = finished_fine_tuning(out)
    if summary is None:  # a fine-tune killed part-way continues from its OUT/resume/
        t0 = time.time()
        cfg = TrainConfig(out_dir=str(out), epochs=3, batch_size=32, learning_rate=lr, seed=seed, save_model=False,
                          dropout=FINETUNE_DROPOUT, report_to="none", unpadded=unpadded,
                          precision="fp32")  # every recorded score is fp32's
        if task == "korquad":
            summary = finetune_korquad(SHARED, model, cfg)
        elif task == "klue-ner":
            summary = finetune_klue_ner(SHARED, model, cfg)
        else:
            summary = finetune_korean(task, SHARED, model, cfg, max_train_rows=rows)
        say(f"{out.name}: {metric} {summary['best'][metric]:.4f} ({time.time() - t0:.0f} s)")
    return summary["best"][metric]


def vocab_checksum(model: Path) -> str:
    import hashlib

    return hashlib.sha256((model / "vocab.txt").read_bytes()).hexdigest()


def sweep(work: Path, start: str, model: Path, results: dict, save, rates=RATES, tasks=tuple(TASKS),
          vocab: str = "", unpadded: bool = False, seeds=SEEDS) -> None:
    """Every task from one start (`[prefix]random`, `[prefix]<hours>h` or the outside reference), each rate, each
    seed; scores already held are kept. The starts of one vocabulary must share its tokenizer (recorded as
    `[vocab-]vocab_sha256`); the reference brings its own."""
    sha, key = vocab_checksum(model), f"{vocab}vocab_sha256"
    if start != REFERENCE and results.setdefault(key, sha) != sha:
        raise SystemExit(f"{model}: its vocab.txt differs from the one the recorded scores used "
                         f"({results[key][:12]}...); the starts would not be comparable")
    for task in tasks:
        for lr in rates:
            for seed in seeds:
                held = results["sweep"].setdefault(task, {}).setdefault(start, {}).setdefault(f"{lr:g}", {})
                if str(seed) not in held:
                    held[str(seed)] = finetune(task, model, work / "finetune" / f"{task}-{start}-lr{lr:g}-{seed}",
                                               lr, seed, unpadded)
                    save()


def keep_scores(ours: dict, theirs: dict) -> None:
    """Adds to ours every entry theirs holds and ours lacks, at any depth (task -> start -> rate -> seed -> score)."""
    for key, value in theirs.items():
        if isinstance(value, dict):
            keep_scores(ours.setdefault(key, {}), value)
        else:
            ours.setdefault(key, value)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=2.0, help="pretraining: this many hours of the measured pace")
    ap.add_argument("--only", choices=["prepare", "random", "pretrain", "finetune", "reference", "report"])
    ap.add_argument("--family", choices=sorted(PRESETS), default="bert",
                    help="the arm: BERT tiny, or ModernBERT tiny on the same instances and recipe")
    ap.add_argument("--pretokenize", choices=["none", "mecab", "kiwi"], default="none",
                    help="the arm's vocabulary: plain WordPiece, or morpheme-aware (train-tokenizer --pretokenize)")
    ap.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS),
                    help="fine-tune these tasks only (two processes on two task lists share the results file)")
    ap.add_argument("--rates", nargs="+", type=float, choices=sorted({*RATES, *REFERENCE_RATES}),
                    help="fine-tune at these rates only (a vocabulary arm at the plain arm's best, say); "
                         f"default: the start's grid ({', '.join(f'{r:g}' for r in RATES)}; the reference: "
                         f"{', '.join(f'{r:g}' for r in REFERENCE_RATES)})")
    ap.add_argument("--seeds", nargs="+", type=int, choices=SEEDS, default=list(SEEDS),
                    help="fine-tune these seeds only (two processes on two seed lists share the results file)")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bertkit-korean-transfer")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    name = "korean_transfer"
    results = read_result(name)
    results.setdefault("sweep", {})
    results.setdefault("runs", {})

    def save():
        # what another process wrote meanwhile (scores, a run, a pace) stays
        keep_scores(results, {k: v for k, v in read_result(name).items() if k != "table"})
        drop_finished_runs(results)
        # the header is this save's; each commit that added scores keeps its date and load in `saves`
        header = run_info(name)
        results.setdefault("saves", {})[header["commit"]] = {k: header[k] for k in ("date", "load_average_1_5_15min")}
        derived = ("table", "yardstick", "vocabularies", "budgets")
        write_result(name, {**{k: v for k, v in results.items() if k not in derived}, **header,
                            "table": table(results["sweep"]), "yardstick": yardstick(results),
                            "vocabularies": vocab_tables(results["sweep"]),
                            "budgets": vocab_tables(results["sweep"], BUDGET_STARTS)})

    arm, hours = Arm(args.family, args.pretokenize), f"{args.hours:g}h"
    prefix = arm.prefix
    if args.only in ("prepare", "random", "pretrain", None):
        d = prepare(args.work, arm)
        corpus = json.loads((d["corpus"] / "manifest.json").read_text())
        results["corpus"] = corpus["totals"]   # files, bytes, documents, sentences: how much Korean text
        recorded = results.get(f"{arm.vocab}vocab_sha256")
        if recorded and vocab_checksum(d["tokenizer"]) != recorded:  # say so now, not after hours of pretraining
            raise SystemExit(f"{d['tokenizer']}: this tokenizer differs from the one the recorded scores used "
                             f"({recorded[:12]}...); its starts would not be comparable")
    if args.only == "random":
        random = random_start(args.work, d["instances"], arm)
        sweep(args.work, f"{prefix}random", random, results, save, rates=args.rates or RATES, tasks=args.tasks,
              vocab=arm.vocab, unpadded=arm.unpadded, seeds=args.seeds)
    if args.only == "reference":
        from bertkit.testing import minilm_dir as model_dir

        sweep(args.work, REFERENCE, model_dir(), results, save, rates=args.rates or REFERENCE_RATES,
              tasks=args.tasks, unpadded=True, seeds=args.seeds)
    if args.only in (None, "pretrain"):
        # the recorded pace, where there is one: a fresh --work must not re-measure it (another step count)
        arm_pace = results[f"{prefix}pace"] = results.get(f"{prefix}pace") or pace(args.work, d["instances"], arm)
        export_dir = pretrain_hours(args.work, d["instances"], args.hours, arm_pace["steps_per_s"], arm)
        record_run(results, prefix + hours, {"steps": round(args.hours * 3600 * arm_pace["steps_per_s"]),
                                             "curve": timed_curve(args.work / f"ko-{prefix}run-{hours}"),
                                             "masked_only": masked_only_accuracy(export_dir, d["instances"])})
        save()
    if args.only in (None, "finetune"):
        export_dir = args.work / f"ko-{prefix}run-{hours}-export"
        if not (export_dir / "model.safetensors").is_file():
            raise SystemExit(f"{export_dir}: no export yet; run --only pretrain first")
        sweep(args.work, prefix + hours, export_dir, results, save, rates=args.rates or RATES, tasks=args.tasks,
              vocab=arm.vocab, unpadded=arm.unpadded, seeds=args.seeds)
    if args.only == "report":
        results["korsts_overlap_floor"] = overlap_floor()
        results["input_lengths"] = input_lengths(args.work)
        results["partial_runs"] = runs_under_way(args.work, results["runs"])
        save()
    shown = ("corpus", "korsts_overlap_floor", "input_lengths")
    say(json.dumps({k: v for k, v in results.items() if k.endswith("pace") or k in shown}, indent=1))
    if results["sweep"]:
        rows = table(results["sweep"])
        print_table(rows)
        for family in PRESETS:
            if len(hours := by_hours(rows, family)) > 1:
                plot_by_hours(hours, RESULTS / f"korean_transfer_{family}_by_hours.png")
    print_yardstick(yardstick(results))
    print_vocab_tables(vocab_tables(results["sweep"]))
    print_vocab_tables(vocab_tables(results["sweep"], BUDGET_STARTS), "2 hours against 4 ({}, plain vocabulary)",
                       "the 2 hours'")


if __name__ == "__main__":
    main()
