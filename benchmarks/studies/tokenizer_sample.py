"""A vocabulary learnt on a sample against one learnt on all the text (issue 70: the `--sample-bytes` default).

  python benchmarks/studies/tokenizer_sample.py [--langs ko en] [--work DIR]

Real text, not made: Korean is both Korean Wikipedia extracts, KoCoNovel and boddari (the Korean transfer
benchmark's corpus, the Korean default vocabulary: kiwi cuts); English the English Wikipedia sample and Gutenberg
(plain WordPiece). For each language: one corpus (2 % held out), then `bertkit train-tokenizer` at the default
30,522 entries on all the training text and on samples of 1/16, 1/8, 1/4 and 1/2 of it (`--sample-bytes`), each
in its own process. Recorded: held-out [UNK] rate (per word) and pieces per word (train-tokenizer's own statistics),
each against the whole-text vocabulary's, and the stage's CPU seconds. Results go to
benchmarks/results/tokenizer_sample.json as each vocabulary finishes; a finished one is never trained again.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import SHARED
from record import read_result, run_info, write_result

from bertkit.testing import text_bytes

REPO = Path(__file__).resolve().parents[2]
DATA = SHARED
BIN = Path(sys.executable).parent
SOURCES = {"ko": ["wikipedia_ko_wikiextractor", "wikipedia_ko_wikiextractor_more", "koconovel/data/jsonl",
                  "boddari/unesco_report/in_txt"],
           "en": ["wikipedia_en_wikiextractor", "gutenberg"]}
FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, None)   # None: all the training text


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def bertkit(*args) -> float:
    """Run a bertkit command in its own process; its CPU seconds (every process it waited for)."""
    before = cpu_seconds()
    subprocess.run([str(BIN / "bertkit"), *map(str, args)], check=True, stdout=subprocess.DEVNULL)
    return cpu_seconds() - before


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--langs", nargs="+", default=["ko", "en"], choices=sorted(SOURCES))
    ap.add_argument("--work", type=Path, default=REPO / "bench_scale" / "sample")
    args = ap.parse_args()
    result = read_result("tokenizer_sample") or {"runs": []}
    for lang in args.langs:
        corpus = args.work / f"{lang}-corpus"
        if not (corpus / "manifest.json").is_file():
            bertkit("prepare-corpus", *[DATA / s for s in SOURCES[lang]], "--out", corpus, "--holdout", "0.02")
        text = text_bytes(corpus)
        for fraction in FRACTIONS:
            name = f"{lang}-{'all' if fraction is None else f'1/{round(1 / fraction)}'}"
            if any(r["name"] == name for r in result["runs"]):
                continue
            out = args.work / name.replace("/", "of")
            sample = [] if fraction is None else ["--sample-bytes", int(text * fraction)]
            t = time.perf_counter()
            cpu = bertkit("train-tokenizer", corpus, "--out", out, *sample)
            stats = json.loads((out / "manifest.json").read_text())["stats"]
            result["runs"].append({**run_info("tokenizer_sample"), "name": name, "language": lang,
                                   "training_text_bytes": text, "sample_bytes": None if fraction is None else
                                   int(text * fraction), "wall_s": round(time.perf_counter() - t, 1),
                                   "cpu_s": round(cpu, 1), "load_after": [round(x, 2) for x in os.getloadavg()],
                                   "stats": stats})
            write_result("tokenizer_sample", result)
    table(result["runs"])


def table(runs: list) -> None:
    whole = {r["language"]: r["stats"] for r in runs if r["sample_bytes"] is None}
    print(f"{'run':<10} {'sample MB':>10} {'CPU s':>8} {'[UNK]/word %':>13} {'vs all':>7} {'pieces/word':>12} "
          f"{'vs all':>7}")
    for r in runs:
        s, w = r["stats"], whole.get(r["language"])
        mb = r["sample_bytes"] / 1e6 if r["sample_bytes"] else r["training_text_bytes"] / 1e6
        unk_vs = f"{s['unk_word_rate'] / w['unk_word_rate']:.3f}" if w and w["unk_word_rate"] else "-"
        ppw_vs = f"{s['pieces_per_word'] / w['pieces_per_word']:.4f}" if w else "-"
        print(f"{r['name']:<10} {mb:>10.1f} {r['cpu_s']:>8.0f} {100 * s['unk_word_rate']:>13.4f} {unk_vs:>7} "
              f"{s['pieces_per_word']:>12.4f} {ppw_vs:>7}")


if __name__ == "__main__":
    main()
