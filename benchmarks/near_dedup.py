"""prepare-corpus --near-dedup on a planted corpus, beside datatrove's MinHash (a study, run by hand).

Asks: of the near-duplicates planted among real Korean and English Wikipedia documents (bertkit.planted: edits,
boilerplate headers, punctuation and case changes, cuts; their Jaccard computed independently), how many at
Jaccard >= 0.8 leave one document, how many below stay two, and how many distinct documents are lost; and at what
cost against plain prepare-corpus. Arms: prepare-corpus without and with --near-dedup (the bands chosen for 0.8,
and datatrove's 14x8), and datatrove 0.10.1's MinHash (5-grams, 14x8, its Korean words through Kiwi as FineWeb2 runs
it) from its own environment (--datatrove-python). One process each, one core; the load average is recorded.

    python benchmarks/near_dedup.py --work /tmp/nd [--per-language 1500] [--datatrove-python /tmp/dtvenv/bin/python]

Results: results/near_dedup.json; the study: docs/studies/2026-12-02-near-duplicates.md.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from record import run_info, write_result

from bertkit.planted import near_dedup_scores, planted_corpus

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
BIN = Path(sys.executable).parent

DATATROVE_ARM = '''
import json, sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                              MinhashDedupFilter, MinhashDedupSignature)
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
from datatrove.utils.hashing import HashConfig

src, work, language = sys.argv[1], sys.argv[2], sys.argv[3]
if language == "kor_Hang":   # its Kiwi words; kiwipiepy >= 0.22 no longer ships the "sbg" model it asks for
    from datatrove.utils.word_tokenizers import KiwiTokenizer
    language = KiwiTokenizer(model_type="cong")
config = MinhashConfig(hash_config=HashConfig(precision=64), num_buckets=14, hashes_per_bucket=8, n_grams=5)
read = lambda: JsonlReader(src, text_key="text", id_key="title", glob_pattern="corpus.jsonl")
steps = [[read(), MinhashDedupSignature(output_folder=f"{work}/sigs", config=config, language=language)],
         [MinhashDedupBuckets(input_folder=f"{work}/sigs", output_folder=f"{work}/buckets", config=config)],
         [MinhashDedupCluster(input_folder=f"{work}/buckets", output_folder=f"{work}/remove", config=config)],
         [read(), MinhashDedupFilter(input_folder=f"{work}/remove"),
          JsonlWriter(f"{work}/kept", compression=None)]]
for i, pipeline in enumerate(steps):
    tasks = config.num_buckets if i == 1 else 1
    LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1, logging_dir=f"{work}/logs{i}").run()
'''


def timed(command: list, env=None) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    return time.perf_counter() - start


def bertkit_arm(work: Path, name: str, flags: list) -> dict:
    out = work / name
    seconds = timed([str(BIN / "bertkit"), "prepare-corpus", str(work / "corpus.jsonl"), "--out", str(out),
                     "--holdout", "0", "-j", "1", "--no-progress", "--overwrite", *flags])
    kept = set()
    import pyarrow as pa

    from bertkit.formats import corpus_shards, read_corpus_manifest

    for path in corpus_shards(out):
        kept |= set(pa.ipc.open_file(str(path)).read_all().column("title").to_pylist())
    return {"seconds": round(seconds, 2), "kept": kept,
            "near_dedup": read_corpus_manifest(out).totals.get("near_dedup")}


def datatrove_arm(work: Path, python: str, language: str) -> dict:
    out = work / f"datatrove-{language}"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    seconds = timed([python, "-c", DATATROVE_ARM, str(work), str(out), language],
                    env={**os.environ, "OMP_NUM_THREADS": "1"})
    kept = {json.loads(line)["id"] for f in (out / "kept").glob("*.jsonl") for line in f.open()}
    return {"seconds": round(seconds, 2), "kept": kept}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--per-language", type=int, default=1500)
    ap.add_argument("--datatrove-python")
    args = ap.parse_args()
    truth = planted_corpus(args.work, {"ko": SHARED / "wikipedia_ko_wikiextractor_more",
                                       "en": SHARED / "wikipedia_en_wikiextractor"}, args.per_language)
    result = {**run_info("near_dedup"), "corpus_mb": round((args.work / "corpus.jsonl").stat().st_size / 1e6, 1),
              "documents": len(truth), "arms": {}}
    arms = {"prepare-corpus (no near-dedup)": lambda: bertkit_arm(args.work, "plain", []),
            "--near-dedup (18x6 for 0.8)": lambda: bertkit_arm(args.work, "near", ["--near-dedup"]),
            "--near-dedup-bands 14x8": lambda: bertkit_arm(args.work, "near14x8",
                                                           ["--near-dedup", "--near-dedup-bands", "14x8"])}
    if args.datatrove_python:
        arms["datatrove 0.10.1 MinHash 14x8 (ko: Kiwi words)"] = lambda: datatrove_arm(
            args.work, args.datatrove_python, "kor_Hang")
    print(f"{'arm':48} {'seconds':>8} {'recall>=0.8':>11} {'below kept':>10} {'distinct lost':>13}")
    for name, arm in arms.items():
        outcome = arm()
        scores = near_dedup_scores(truth, outcome.pop("kept"))
        result["arms"][name] = {**outcome, **scores, "load_average": [round(x, 2) for x in os.getloadavg()]}
        recall = "-" if scores["recall"] is None else f"{scores['recall']:.4f}"
        below, lost = (f"{scores['below_both_kept']}/{scores['pairs_below']}",
                       f"{scores['distinct_lost']}/{scores['distinct']}")
        print(f"{name:48} {outcome['seconds']:8.1f} {recall:>11} {below:>10} {lost:>13}")
        write_result("near_dedup", result)


if __name__ == "__main__":
    main()
