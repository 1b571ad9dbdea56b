"""Sentence-embedding training, bertkit against sentence-transformers' own trainer (issue 71): the same model
(all-MiniLM-L6-v2), data (MRPC's training paraphrases as (anchor, positive) pairs), loss (in-batch negatives with
gradient caching: CachedMultipleNegativesRankingLoss, scale 20, the same mini-batch), batch sampler (no text twice in
a batch), optimizer and schedule (AdamW, weight decay 0.01 but biases and norms, linear warmup 10 % then decay,
clipping at 1.0), one epoch, fp32, 3 seeds each. Each cell trains in its own process (its peak memory its own); its
model is then scored here by one code path for both (bertkit.embeddings.evaluate, equal to sentence-transformers'
evaluators, tested): STS-B dev cosine Spearman, and SQuAD v1.1 dev retrieval on its first 1,000 questions against
every paragraph. Run alone on the machine: the times are the point. `--task klue-nli --model KOREAN_EXPORT` runs
the Korean side: KLUE-NLI's (premise, entailment, contradiction) triplets (hard negatives), scored on KorSTS dev and
KorQuAD 1.0 dev retrieval (results/embedding_parity_klue-nli.json).

    python benchmarks/studies/embedding_parity.py                   # 2 systems x 3 seeds, then the table
    python benchmarks/studies/embedding_parity.py --seeds 0 --max-pairs 256 --questions 50 --work /tmp/p  # a smoke test
"""
import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import SHARED
from record import cell_in_own_process, read_result, run_info, write_result

from bertkit.testing import minilm_dir

SYSTEMS = ("sentence-transformers", "bertkit")




def mrpc_pairs(data: Path) -> list[tuple[str, str]]:
    from bertkit.finetune.classify import read_table

    rows = read_table(data / "glue" / "MRPC" / "train.tsv", "#1 String", "#2 String", "Quality", fmt="tsv")
    return [(r.text_a, r.text_b) for r in rows if r.label == "1"]


def training_rows(flags: dict) -> list[tuple]:
    from bertkit.embeddings.data import NLI_SETS, nli_triplets

    data = Path(flags["data"])
    rows = mrpc_pairs(data) if flags.get("task", "mrpc") == "mrpc" else nli_triplets(data / NLI_SETS["klue-nli"])
    return rows[:flags["max_pairs"]]


def start_model(flags: dict) -> Path:
    return Path(flags["model"]) if flags.get("model") else minilm_dir()


def train_bertkit(pairs, out: Path, seed: int, flags: dict) -> None:
    from bertkit.embeddings.encoder import EncoderConfig
    from bertkit.embeddings.train import EmbedConfig, train_embeddings

    train_embeddings(start_model(flags), pairs, EmbedConfig(
        out_dir=str(out), encoder=EncoderConfig("mean", flags["max_seq_length"], normalize=True),
        batch_size=flags["batch_size"], mini_batch=flags["mini_batch"], learning_rate=flags["lr"], seed=seed,
        progress=False, save_every=10 ** 9))


def train_peer(pairs, out: Path, seed: int, flags: dict) -> None:
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import CachedMultipleNegativesRankingLoss

    model = SentenceTransformer(str(start_model(flags)), device="cpu")
    model.max_seq_length = flags["max_seq_length"]
    args = SentenceTransformerTrainingArguments(
        output_dir=str(out / "trainer"), num_train_epochs=1, per_device_train_batch_size=flags["batch_size"],
        learning_rate=flags["lr"], warmup_ratio=0.1, weight_decay=0.01, seed=seed, use_cpu=True,
        batch_sampler=BatchSamplers.NO_DUPLICATES, save_strategy="no", report_to="none", logging_steps=10,
        disable_tqdm=True)
    dataset = Dataset.from_dict(dict(zip(("anchor", "positive", "negative"), map(list, zip(*pairs)))))
    loss = CachedMultipleNegativesRankingLoss(model, scale=20.0, mini_batch_size=flags["mini_batch"])
    SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, loss=loss).train()
    model.save(str(out / "model"))


def cell(system: str, seed: int, work: Path, flags: dict) -> dict:
    import torch

    torch.set_num_threads(flags["threads"])
    pairs = training_rows(flags)
    out = work / f"{flags.get('task', 'mrpc')}-{system}-{seed}"
    t0 = time.perf_counter()
    (train_bertkit if system == "bertkit" else train_peer)(pairs, out, seed, flags)
    return {"system": system, "seed": seed, "seconds": round(time.perf_counter() - t0, 1), "pairs": len(pairs),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "model": str(out / "model")}


def scores(model: Path, data: Path, questions: int, task: str) -> dict:
    from bertkit.embeddings.encoder import SentenceEncoder
    from bertkit.embeddings.evaluate import Retrieval, evaluate_retrieval, evaluate_sts, read_retrieval, read_sts

    sts, retrieval = (("stsb", "glue/STS-B/dev.tsv"), ("squad", "squad_v1.1/dev-v1.1.json")) if task == "mrpc" else \
        (("korsts", "kornlu/KorSTS/sts-dev.tsv"), ("korquad", "korquad_v1.0/KorQuAD_v1.0_dev.json"))
    encoder = SentenceEncoder.from_folder(model)
    found = read_retrieval(data / retrieval[1])
    found = Retrieval(found.queries[:questions], found.corpus, found.relevant[:questions])
    return {f"{sts[0]}_spearman": evaluate_sts(encoder, read_sts(data / sts[1]))["spearman"],
            **{f"{retrieval[0]}_{k}": v for k, v in evaluate_retrieval(encoder, found).items()}}


def table(cells: list, echo: bool = True) -> list:
    rows = []
    for system in SYSTEMS:
        mine = [c for c in cells if c["system"] == system]
        if not mine:
            continue
        row = {"system": system, "seeds": [c["seed"] for c in mine]}
        keys = [k for k in mine[0] if k.endswith(("_spearman", "recall@1", "recall@10", "mrr@10"))]
        for key in ["seconds", "peak_rss_mb", *keys]:
            values = [c[key] for c in mine]
            row[key] = {"mean": statistics.mean(values), "min": min(values), "max": max(values)}
        rows.append(row)
    for row in rows if echo else []:
        print(f"{row['system']:22} seeds {row['seeds']}  " + "  ".join(
            f"{k} {v['mean']:.4g} ({v['min']:.4g}-{v['max']:.4g})" for k, v in row.items() if isinstance(v, dict)))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--mini-batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--max-seq-length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--task", choices=["mrpc", "klue-nli"], default="mrpc")
    ap.add_argument("--model", type=Path, help="the start (default: all-MiniLM-L6-v2; klue-nli: a Korean export)")
    ap.add_argument("--max-pairs", type=int, help="train on the first N pairs only (a smoke test)")
    ap.add_argument("--questions", type=int, default=1000, help="SQuAD dev questions scored (all paragraphs)")
    ap.add_argument("--data", type=Path, default=SHARED)
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bertkit-embedding-parity")
    ap.add_argument("--rescore", action="store_true",
                    help="score the recorded cells' models in --work again (their times stay); train nothing")
    ap.add_argument("--cell", nargs=2, metavar=("SYSTEM", "SEED"), help=argparse.SUPPRESS)
    ap.add_argument("--flags", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    flags = {"batch_size": args.batch_size, "mini_batch": args.mini_batch, "lr": args.lr, "threads": args.threads,
             "max_seq_length": args.max_seq_length, "data": str(args.data), "max_pairs": args.max_pairs}
    if args.task != "mrpc":   # (the English cells were recorded before these keys)
        if args.model is None:
            ap.error("--task klue-nli needs --model: a Korean model folder")
        flags.update(task=args.task, model=str(args.model.resolve()))
    if args.cell:
        print("CELL " + json.dumps(cell(args.cell[0], int(args.cell[1]), args.work, json.loads(args.flags))))
        return
    name = "embedding_parity" if args.task == "mrpc" else f"embedding_parity_{args.task}"
    results = read_result(name)
    cells = [c for c in results.get("cells", []) if c.get("flags") == flags]   # a finished cell is kept
    others = [c for c in results.get("cells", []) if c.get("flags") != flags]  # other settings' cells: kept too

    def record(**extra):   # every cell; "table": these settings'; "tables": each start model's
        starts = {Path(c["flags"].get("model", "all-MiniLM-L6-v2")).name: c["flags"] for c in others + cells}
        write_result(name, {**extra, "cells": others + cells, "table": table(cells), "tables": {
            start: table([c for c in others + cells if c["flags"] == f], echo=False) for start, f in starts.items()}})
    if args.rescore:
        for c in cells:
            c.update(scores(args.work / f"{flags.get('task', 'mrpc')}-{c['system']}-{c['seed']}" / "model",
                            args.data, args.questions, args.task))
        record(**{**results, "rescored": run_info(name)})
        return
    for seed in args.seeds:
        for system in args.systems:
            if any(c["system"] == system and c["seed"] == seed for c in cells):
                continue
            print(f"{system} seed {seed}", flush=True)
            load = [round(x, 2) for x in os.getloadavg()]
            got = cell_in_own_process(__file__, [system, seed, "--work", args.work, "--flags", json.dumps(flags)])
            got.update(scores(Path(got.pop("model")), args.data, args.questions, args.task), flags=flags,
                       load_before=load, commit=run_info(name)["commit"])   # the header's commit is the last cell's
            cells.append(got)
            record(**run_info(name))
    record(**run_info(name))


if __name__ == "__main__":
    main()
