"""Where a Korean encoder made by bertkit stands as an embedding model (issue 71): KorSTS / KLUE-STS cosine
Spearman and KorQuAD 1.0 dev retrieval (every question against every paragraph: Recall@1/5/10, MRR@10, nDCG@10), each
beside its floors (character overlap; BM25 over words and over character bigrams) and a dense + BM25 hybrid
(reciprocal rank fusion), for each start before and after contrastive training:
- modernbert-random: modernbert-tiny at random (the transfer benchmark's random start, its Korean tokenizer);
- modernbert-2h: the transfer benchmark's 2-CPU-hour modernbert-tiny export (once `korean_transfer.py --family
  modernbert --hours 2 --only pretrain` has made it in the same --work);
- minilm: all-MiniLM-L6-v2, English (its vocabulary spells Hangul as jamo), a row from outside.
Contrastive training is KoSimCSE's supervised recipe on what we have: KLUE-NLI train, each premise with its
entailment as the positive and its contradiction as the hard negative (8,047 triplets), in-batch negatives,
`finetune embed`'s defaults but --max-seq-length 64 (`nli-3ep`: three epochs). From the corpus alone: `simcse` (its
sentences, each its own positive) and `ict` (the Inverse Cloze Task: 8,000 passages of 6 sentences, each against one
of its sentences, 128 tokens); `ict-nli`: `ict`, then KLUE-NLI from there; `ict32k`, `ict128k` (and their
`-nli`): the same from 4x and 16x the passages.
Scores are quality, not time: this may run beside other work. One results file keeps every cell as it finishes.

    python benchmarks/studies/korean_embeddings.py --work bench_scale/korean-transfer            # every start there is
    python benchmarks/studies/korean_embeddings.py --starts minilm --arms none nli               # one start
"""
import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import SHARED
from record import read_result, run_info, write_result

EVAL = {"sts": ("korsts-dev", "korsts-test", "klue-sts-dev"), "retrieval": ("korquad-dev",)}
MODEL_KEYS = ("model", "hybrid_rrf", "hybrid_weighted")   # a cell's own; the rest (the floors) kept once


def starts(work: Path) -> dict:
    from korean_arms import Arm, prepare, random_start

    found = {}
    arm = Arm("modernbert")
    found["modernbert-random"] = random_start(work, prepare(work, arm)["instances"], arm)
    export = work / "ko-modernbert-run-2h-export"
    if (export / "model.safetensors").is_file():
        found["modernbert-2h"] = export
    from bertkit.testing import minilm_dir

    found["minilm"] = minilm_dir()
    return found


@dataclass(frozen=True)
class Training:
    """One arm: its rows, their token length, epochs, and the arm whose model it starts from (None: the start)."""
    rows: str             # klue-nli (triplets), sentences (SimCSE) or passages (ICT), the latter two from the corpus
    max_length: int = 64
    epochs: int = 1
    after: str | None = None
    sample: int = 8_000   # sentences or passages drawn from the corpus


TRAINING = {"nli": Training("klue-nli"), "nli-3ep": Training("klue-nli", epochs=3),
            "simcse": Training("sentences"), "ict": Training("passages", max_length=128),
            "ict-nli": Training("klue-nli", after="ict"),
            # how far more of the corpus's own pairs go: 4x and 16x the passages
            "ict32k": Training("passages", max_length=128, sample=32_000),
            "ict32k-nli": Training("klue-nli", after="ict32k"),
            "ict128k": Training("passages", max_length=128, sample=128_000),
            "ict128k-nli": Training("klue-nli", after="ict128k")}
ARMS = ("none", *TRAINING)   # none: the start as it is (mean pooling)


def trained(start: Path, arm: str, out: Path, data: Path, work: Path, seed: int) -> Path:
    from bertkit.embeddings.data import NLI_SETS, corpus_passages, corpus_sentences, nli_triplets
    from bertkit.embeddings.encoder import EncoderConfig
    from bertkit.embeddings.train import EmbedConfig, train_embeddings

    if (out / "model" / "model.safetensors").is_file() and (out / "summary.json").is_file():
        return out / "model"
    t = TRAINING[arm]
    if t.after:
        start = trained(start, t.after, out.parent / out.name.replace(arm, t.after), data, work, seed)
    rows = {"klue-nli": lambda: nli_triplets(data / NLI_SETS["klue-nli"]),
            "passages": lambda: corpus_passages(work / "ko-corpus", t.sample, seed),
            "sentences": lambda: corpus_sentences(work / "ko-corpus", t.sample, seed)}[t.rows]()
    train_embeddings(start, rows, EmbedConfig(out_dir=str(out), encoder=EncoderConfig("mean", t.max_length),
                                              seed=seed, batch_size=256, mini_batch=64, progress=False,
                                              epochs=t.epochs))
    return out / "model"


def scores(model: Path, data: Path) -> dict:
    from bertkit.embeddings.encoder import EncoderConfig, SentenceEncoder
    from bertkit.embeddings.evaluate import score

    encoder = SentenceEncoder.from_folder(model, EncoderConfig("mean", 256))   # KorQuAD's paragraphs are long
    return score(encoder, EVAL["sts"], EVAL["retrieval"], data)


def table(cells: dict) -> list[str]:
    """The cells as a markdown table: STS Spearman, KorQuAD dense retrieval and the two hybrids' R@10."""
    lines = ["| start | training | KorSTS dev / test | KLUE-STS dev | KorQuAD R@1 | R@10 | MRR@10 | hybrid R@10: RRF / "
             "weighted (w) |", "|---|---|---|---|---|---|---|---|"]
    for c in cells.values():
        sts, q = {k: v["model"]["spearman"] for k, v in c["sts"].items()}, c["retrieval"]["korquad-dev"]
        weighted = q.get("hybrid_weighted")
        dense = q["model"]
        lines.append(f"| {c['start']} | {c['arm']} (seed {c['seed']}) | {sts['korsts-dev']:.3f} / "
                     f"{sts['korsts-test']:.3f} | {sts['klue-sts-dev']:.3f} | {dense['recall@1']:.3f} | "
                     f"{dense['recall@10']:.3f} | {dense['mrr@10']:.3f} | {q['hybrid_rrf']['recall@10']:.3f} / "
                     + (f"{weighted['fused']['recall@10']:.4f} ({weighted['weight']}) |" if weighted else "- |"))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bertkit-korean-transfer")
    ap.add_argument("--starts", nargs="+", help="only these starts (default: every one found)")
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=["none", "nli"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", type=Path, default=SHARED)
    ap.add_argument("--report", action="store_true", help="print the recorded cells as a table; run nothing")
    args = ap.parse_args(argv)
    name = "korean_embeddings"
    results = read_result(name)
    cells = results.setdefault("cells", {})
    if args.report:
        print("\n".join(table(cells)))
        return
    for start, folder in starts(args.work).items():
        if args.starts and start not in args.starts:
            continue
        for arm in args.arms:
            key = f"{start}/{arm}/seed{args.seed}"
            if key in cells:
                continue
            t0 = time.time()
            model = folder if arm == "none" else trained(folder, arm, args.work / f"embed-{start}-{arm}-{args.seed}",
                                                         args.data, args.work, args.seed)
            got = scores(model, args.data)
            if "floors" not in results:   # the same for every start: kept once
                results["floors"] = {kind: {s: {k: v for k, v in row.items() if k not in MODEL_KEYS}
                                            for s, row in rows.items()} for kind, rows in got.items()}
            cells[key] = {"start": start, "arm": arm, "seed": args.seed, "seconds": round(time.time() - t0),
                          "commit": run_info(name)["commit"],
                          "load_average": [round(x, 2) for x in os.getloadavg()],
                          **{kind: {s: {k: v for k, v in row.items() if k in MODEL_KEYS}
                                    for s, row in rows.items()} for kind, rows in got.items()}}
            write_result(name, {**results, **run_info(name), "cells": cells})
            print(key, json.dumps({s: r["model"] for kind in ("sts", "retrieval")
                                   for s, r in cells[key][kind].items()}))


if __name__ == "__main__":
    main()
