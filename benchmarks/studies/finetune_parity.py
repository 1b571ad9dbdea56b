"""Fine-tuning at parity (issue 42): bertkit's `finetune` against transformers' own recipe
(benchmarks/lib/finetune_peer.py) on the same model (all-MiniLM-L6-v2), data and settings, several seeds, with time and
peak memory beside each score.

    python benchmarks/studies/finetune_parity.py                              # every task, seeds 42 43 44, both systems
    python benchmarks/studies/finetune_parity.py --tasks squad --seeds 42     # one cell row
    python benchmarks/studies/finetune_parity.py --bertkit-flags unpadded=1   # a bertkit variant (its own rows)
    python benchmarks/studies/finetune_parity.py --tasks mrpc --systems bertkit \
        --bertkit-flags unpadded=1,precision=bf16
    python benchmarks/studies/finetune_parity.py --only report                # the table from the results so far

Each cell (task, system, seed) runs in its own process (so its peak memory is its own) and is appended to
benchmarks/results/finetune_parity.json as it finishes: a killed run resumes by running it again. Both systems are
scored on their last epoch (bertkit's `best` picks an epoch by the dev score, which the peer cannot). Subsets of
SST-2 and CoNLL-2003 are written to --work, outside the repository (CoNLL-2003 may not be copied into it).
"""
import argparse
import json
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from finetune_tasks import METRIC, TASKS, data, model_dir, run_bertkit
from record import cell_in_own_process, read_result, run_info, write_result

RESULT = "finetune_parity"


def run_transformers(task: str, seed: int, work: Path, out: Path) -> dict:
    """The peer's scores; a SQuAD cell saves its training state in `out` and continues from it when run again
    (scores["resumed_after_s"]: what its killed run had trained)."""
    import finetune_peer as peer

    from bertkit.finetune.metrics import entity_scores, squad_evaluate
    from bertkit.finetune.squad import tuned_threshold_scores

    t = TASKS[task]
    settings = {**t, "seed": seed}
    train, dev, extra = data(task, work)
    if t["kind"] == "squad":
        out.mkdir(parents=True, exist_ok=True)
        preds, odds, spans, earlier = peer.squad(model_dir(), train, dev, settings, t.get("version_2", False),
                                                 state_path=out / "peer_state.pt")
        scores = squad_evaluate(extra, preds, odds if t.get("version_2") else None)
        if t.get("version_2"):  # bertkit's tuned_* (finetune.squad.tuned_threshold_scores), from the same spans
            scores.update(tuned_threshold_scores(extra, {q: [{"text": text}] for q, text in spans.items()}, odds))
        return {**scores, "resumed_after_s": earlier} if earlier else scores
    if t["kind"] == "glue":
        from bertkit.finetune.glue import glue_metrics

        preds = peer.classify(model_dir(), train, dev, extra, settings)
        return glue_metrics(task, preds, [extra.index(ex.label) for ex in dev], extra)
    predicted = peer.ner(model_dir(), train, dev, extra, settings)
    return entity_scores([s.tags for s in dev], predicted)


def cell(system: str, task: str, seed: int, work: Path, flags: dict) -> dict:
    """One cell, in a folder of its own under `work` that a killed cell continues from (bertkit's finetune resumes
    from OUT/resume/, the peer's SQuAD loop from its state): `seconds` then adds what the killed run had trained."""
    out = work / "cells" / "-".join([system, task, str(seed), *(f"{k}={v}" for k, v in sorted(flags.items()))])
    t0 = time.perf_counter()
    if system == "bertkit":
        earlier = fine_tuning_seconds_so_far(out)
        scores = run_bertkit(task, seed, work, out, flags)
    else:
        scores = run_transformers(task, seed, work, out)
        earlier = scores.get("resumed_after_s", 0.0)
    shutil.rmtree(out, ignore_errors=True)  # the scores are all a cell keeps
    return {"scores": scores, "seconds": time.perf_counter() - t0 + earlier,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def fine_tuning_seconds_so_far(out: Path) -> float:
    """The training seconds a killed `finetune` in `out` had saved in OUT/resume/ (0 when there is none)."""
    from bertkit.finetune.train import RESUME, STATE
    from bertkit.safe_load import safe_load

    state = out / RESUME / STATE
    return float(safe_load(state)["elapsed_s"]) if state.is_file() else 0.0


# ---------------------------------------------------------------- the grid and the table

def load() -> dict:
    return read_result(RESULT) or {"cells": {}}


def report(result: dict) -> None:
    rows = collections_by(result["cells"])
    print(f"\n{'task':<12} {'system':<22} {'metric':<9} {'mean':>7} {'min..max':>15} {'seconds':>8} {'peak MB':>8}  n")
    for (task, system), cells in sorted(rows.items()):
        metric = METRIC[task]
        vals = [v * 100 if v <= 1 else v for v in (c["scores"][metric] for c in cells)]  # all in percent
        secs = statistics.mean(c["seconds"] for c in cells)
        mem = max(c["peak_rss_mb"] for c in cells)
        print(f"{task:<12} {system:<22} {metric:<9} {statistics.mean(vals):>7.2f} "
              f"{min(vals):>7.2f}..{max(vals):<7.2f} {secs:>8.0f} {mem:>8.0f}  {len(cells)}")


def collections_by(cells: dict) -> dict:
    rows = {}
    for key, c in cells.items():
        task, system, _ = key.split("/")
        rows.setdefault((task, system), []).append(c)
    return rows


# the AdamW eps every bertkit cell keyed without `adam_eps` ran with (fine-tuning's default until 6889a27)
KEYED_EPS = "1e-6"


def key_flags(flags: dict) -> dict:
    """The flags a bertkit cell's key names: the given ones, plus the eps where bertkit's default is no longer the
    one the unmarked cells ran with, and `predict=fp32` on bf16 cells, so a cached cell is never taken for a run
    with other settings."""
    from bertkit.finetune.train import TrainConfig

    eps = flags.get("adam_eps", f"{TrainConfig.adam_eps:.0e}".replace("e-0", "e-"))
    keyed = {**flags, "adam_eps": eps}
    if flags.get("precision") == "bf16":  # bf16 cells predict in fp32 since 5187baa; the earlier ones in bf16
        keyed["predict"] = "fp32"
    return {k: v for k, v in keyed.items() if (k, v) != ("adam_eps", KEYED_EPS)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--seeds", default="42,43,44")
    ap.add_argument("--systems", default="bertkit,transformers")
    ap.add_argument("--bertkit-flags", default="",
                    help="k=v,... a bertkit variant (unpadded=1, window_step=238, window_overlap=128, adam_eps=1e-8)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bertkit-finetune-parity")
    ap.add_argument("--only", choices=["report"])
    ap.add_argument("--cell", nargs=3, metavar=("SYSTEM", "TASK", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    flags = dict(kv.split("=") for kv in args.bertkit_flags.split(",") if kv)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.cell:
        system, task, seed = args.cell
        print("CELL " + json.dumps(cell(system, task, int(seed), args.work, flags)), flush=True)
        return
    result = load()
    if args.only != "report":
        variant = "+".join(f"{k}={v}" for k, v in sorted(key_flags(flags).items()))
        for task in args.tasks.split(","):
            for seed in map(int, args.seeds.split(",")):
                for system in args.systems.split(","):
                    name = system + (f"[{variant}]" if system == "bertkit" and variant else "")
                    key = f"{task}/{name}/{seed}"
                    if key in result["cells"]:
                        continue
                    print(f"{key} ...", flush=True)
                    got = cell_in_own_process(__file__, [system, task, seed, "--work", args.work,
                                                         "--bertkit-flags", args.bertkit_flags])
                    result = load()  # what another sweep wrote into the same file meanwhile stays
                    result["cells"][key] = {**got, **run_info(RESULT)}
                    write_result(RESULT, result)
                    report(result)
    report(result)


if __name__ == "__main__":
    main()
