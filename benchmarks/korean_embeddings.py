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
`finetune embed`'s defaults but --max-seq-length 64; `--arm simcse` trains on the corpus' own sentences instead.
Scores are quality, not time: this may run beside other work. One results file keeps every cell as it finishes.

    python benchmarks/korean_embeddings.py --work bench_scale/korean-transfer            # every start there is
    python benchmarks/korean_embeddings.py --starts minilm --arms none nli               # one start
"""
import argparse
import json
import os
import time
from pathlib import Path

from record import read_result, run_info, write_result

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
EVAL = {"sts": ("korsts-dev", "korsts-test", "klue-sts-dev"), "retrieval": ("korquad-dev",)}
ARMS = ("none", "nli", "simcse")   # none: the start as it is (mean pooling)
MODEL_KEYS = ("model", "hybrid_rrf", "hybrid_weighted")   # a cell's own; the rest (the floors) kept once


def starts(work: Path) -> dict:
    from korean_transfer import Arm, prepare, random_start

    found = {}
    arm = Arm("modernbert")
    found["modernbert-random"] = random_start(work, prepare(work, arm)["instances"], arm)
    export = work / "ko-modernbert-run-2h-export"
    if (export / "model.safetensors").is_file():
        found["modernbert-2h"] = export
    from bertkit.testing import minilm_dir

    found["minilm"] = minilm_dir()
    return found


def trained(start: Path, arm: str, out: Path, data: Path, work: Path, seed: int) -> Path:
    from bertkit.embeddings.data import NLI_SETS, corpus_sentences, nli_triplets
    from bertkit.embeddings.encoder import EncoderConfig
    from bertkit.embeddings.train import EmbedConfig, train_embeddings

    if (out / "model" / "model.safetensors").is_file() and (out / "summary.json").is_file():
        return out / "model"
    if arm == "nli":
        rows = nli_triplets(data / NLI_SETS["klue-nli"])
    else:
        rows = corpus_sentences(work / "ko-corpus", 8_000, seed)
    train_embeddings(start, rows, EmbedConfig(out_dir=str(out), encoder=EncoderConfig("mean", 64), seed=seed,
                                              batch_size=256, mini_batch=64, progress=False))
    return out / "model"


def scores(model: Path, data: Path) -> dict:
    from bertkit.embeddings.encoder import EncoderConfig, SentenceEncoder
    from bertkit.embeddings.evaluate import score

    encoder = SentenceEncoder.from_folder(model, EncoderConfig("mean", 256))   # KorQuAD's paragraphs are long
    return score(encoder, EVAL["sts"], EVAL["retrieval"], data)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bertkit-korean-transfer")
    ap.add_argument("--starts", nargs="+", help="only these starts (default: every one found)")
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=["none", "nli"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", type=Path, default=SHARED)
    args = ap.parse_args(argv)
    name = "korean_embeddings"
    results = read_result(name)
    cells = results.setdefault("cells", {})
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
                          "load_average": [round(x, 2) for x in os.getloadavg()],
                          **{kind: {s: {k: v for k, v in row.items() if k in MODEL_KEYS}
                                    for s, row in rows.items()} for kind, rows in got.items()}}
            write_result(name, {**results, **run_info(name), "cells": cells})
            print(key, json.dumps({s: r["model"] for kind in ("sts", "retrieval")
                                   for s, r in cells[key][kind].items()}))


if __name__ == "__main__":
    main()
