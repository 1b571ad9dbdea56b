"""Fine-tuning at parity (issue 42): bertkit's `finetune` against transformers' own recipe (benchmarks/finetune_peer.py)
on the same model (all-MiniLM-L6-v2), data and settings, several seeds, with time and peak memory beside each score.

    python benchmarks/finetune_parity.py                              # every task, seeds 42 43 44, both systems
    python benchmarks/finetune_parity.py --tasks squad --seeds 42     # one cell row
    python benchmarks/finetune_parity.py --bertkit-flags unpadded=1   # a bertkit variant (its own rows)
    python benchmarks/finetune_parity.py --tasks mrpc --systems bertkit --bertkit-flags unpadded=1,precision=bf16
    python benchmarks/finetune_parity.py --only report                # the table from the results so far

Each cell (task, system, seed) runs in its own process (so its peak memory is its own) and is appended to
benchmarks/results/finetune_parity.json as it finishes: a killed run resumes by running it again. Both systems are
scored on their last epoch (bertkit's `best` picks an epoch by the dev score, which the peer cannot). Subsets of
SST-2 and CoNLL-2003 are written to --work, outside the repository (CoNLL-2003 may not be copied into it).
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from record import cell_in_own_process, read_result, run_info, write_result

from bertkit.testing import minilm_dir

REPO = Path(__file__).resolve().parents[1]

SHARED = Path(os.environ.get("BERTKIT_SHARED_DATA", REPO.parent / "shared" / "data"))
RESULT = "finetune_parity"

# the settings: bertkit's defaults for each command, given to both systems
SQUAD = dict(max_seq_length=384, doc_stride=128, max_query_length=64, batch_size=32, lr=5e-5, weight_decay=0.01,
             warmup_ratio=0.1, epochs=2, max_grad_norm=1.0, n_best_size=20, max_answer_length=30)
GLUE = dict(max_seq_length=128, batch_size=32, lr=2e-5, weight_decay=0.01, warmup_ratio=0.1, epochs=3,
            max_grad_norm=1.0)
TASKS = {
    "squad": dict(kind="squad", file="squad_v1.1/dev-v1.1.json", train=(0, 6), predict=(40, 42), **SQUAD),
    "squad-large": dict(kind="squad", file="squad_v1.1/dev-v1.1.json", train=(0, 24), predict=(24, 30), **SQUAD),
    "squad2": dict(kind="squad", file="squad_v2.0_partial/dev-v2.0.cs224n-dev-half.json", train=(0, 8),
                   predict=(8, 12), version_2=True, **SQUAD),
    "mrpc": dict(kind="glue", **GLUE),
    "rte": dict(kind="glue", **GLUE),
    "sst2": dict(kind="glue", train_rows=4000, **GLUE),
    "conll": dict(kind="ner", train_rows=3000, **{**GLUE, "lr": 5e-5}),
}
METRIC = {"squad": "f1", "squad-large": "f1", "squad2": "f1", "mrpc": "f1", "rte": "accuracy", "sst2": "accuracy",
          "conll": "f1"}


model_dir = minilm_dir   # the model both systems fine-tune


def data(task: str, work: Path):
    """Training and dev data for a task, read with bertkit's readers (the same examples for both systems)."""
    t = TASKS[task]
    if t["kind"] == "squad":
        from bertkit.finetune.squad import read_squad

        path = SHARED / t["file"]
        v2 = t.get("version_2", False)
        train, _ = read_squad(path, True, v2, slice(*t["train"]))
        dev, dataset = read_squad(path, False, v2, slice(*t["predict"]))
        return train, dev, dataset
    if t["kind"] == "glue":
        from bertkit.finetune.glue import GLUE_TASKS, read_glue

        folder = glue_folder(task, work)
        train, _ = read_glue(task, folder, "train")
        dev, _ = read_glue(task, folder, "dev")
        return train, dev, list(GLUE_TASKS[task].labels)
    from bertkit.finetune.ner import read_conll, tag_list

    train = read_conll(conll_file(work))
    return train, read_conll(SHARED / "conll2003" / "valid.txt"), tag_list(train)


def glue_folder(task: str, work: Path) -> Path:
    """The GLUE folder, or for a subsetted task (SST-2) a copy of it with the first train_rows training rows."""
    from bertkit.finetune.glue import GLUE_TASKS

    n = TASKS[task].get("train_rows")
    if not n:
        return SHARED / "glue"
    folder = work / "glue" / GLUE_TASKS[task].folder
    if not (folder / "dev.tsv").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        src = SHARED / "glue" / GLUE_TASKS[task].folder
        lines = (src / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
        (folder / "train.tsv").write_text("".join(lines[:n + 1]), encoding="utf-8")
        (folder / "dev.tsv").write_text((src / "dev.tsv").read_text(encoding="utf-8"), encoding="utf-8")
    return work / "glue"


def conll_file(work: Path) -> Path:
    """The first train_rows sentences of CoNLL-2003's train.txt, in --work (outside the repository)."""
    out = work / "conll_train_subset.txt"
    if not out.is_file():
        n, kept, blocks = TASKS["conll"]["train_rows"], [], 0
        for line in (SHARED / "conll2003" / "train.txt").read_text(encoding="utf-8").splitlines(keepends=True):
            if not line.strip():
                blocks += 1
                if blocks > n:
                    break
            kept.append(line)
        out.write_text("".join(kept), encoding="utf-8")
    return out


# ---------------------------------------------------------------- one cell, in its own process

def run_bertkit(task: str, seed: int, work: Path, out: Path, flags: dict) -> dict:
    from bertkit.finetune.train import TrainConfig

    t, model = TASKS[task], model_dir()
    cfg = TrainConfig(out_dir=str(out), epochs=t["epochs"], batch_size=t["batch_size"], learning_rate=t["lr"],
                      weight_decay=t["weight_decay"], warmup_ratio=t["warmup_ratio"], max_grad_norm=t["max_grad_norm"],
                      seed=seed, save_model=False, report_to="none", unpadded=bool(flags.get("unpadded")),
                      adam_eps=float(flags.get("adam_eps", TrainConfig.adam_eps)),
                      precision=flags.get("precision", "fp32"))
    if t["kind"] == "squad":
        from bertkit.finetune.squad import finetune_squad

        path = SHARED / t["file"]
        overlap = int(flags["window_overlap"]) if "window_overlap" in flags else None  # instead of the step
        step = None if overlap is not None else int(flags.get("window_step", t["doc_stride"]))
        summary = finetune_squad(model, path, path, cfg, version_2=t.get("version_2", False),
                                 max_seq_length=t["max_seq_length"],
                                 window_step=step,
                                 window_overlap=overlap,
                                 max_query_length=t["max_query_length"], n_best_size=t["n_best_size"],
                                 max_answer_length=t["max_answer_length"], train_articles=slice(*t["train"]),
                                 predict_articles=slice(*t["predict"]))
    elif t["kind"] == "glue":
        from bertkit.finetune.glue import finetune_glue

        summary = finetune_glue(task, glue_folder(task, work), model, cfg, max_seq_length=t["max_seq_length"])
    else:
        from bertkit.finetune.ner import finetune_ner

        summary = finetune_ner(model, conll_file(work), SHARED / "conll2003" / "valid.txt", cfg,
                               max_seq_length=t["max_seq_length"])
    last = summary["epochs"][-1]
    return {k: v for k, v in last.items() if isinstance(v, (int, float)) and k != "epoch"}


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
