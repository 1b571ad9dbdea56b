"""Korean sentence splitters against a hand-annotated gold set: boundary precision/recall/F1, errors by case, speed.

Gold set: benchmarks/data/ko_sentence_gold.jsonl, 336 paragraphs of the Korean Wikipedia sample with 887
sentence boundaries annotated by hand (rules, sources and case counts: benchmarks/data/README.md). Each line is
{"doc", "line", "text", "sentences", "cases"} with "".join(sentences) == text (the whitespace after a sentence stays
with it).

A boundary is the offset of a sentence start, counted in non-whitespace characters, so splitters that strip or
collapse spaces are compared fairly; a splitter that changes non-space characters is aligned by searching each of
its sentences in the paragraph (the count of sentences it could not place is reported as `unaligned`).
  precision/recall/F1  over all gold and predicted boundaries (inside a paragraph: its start and end never count)
  exact paragraphs     paragraphs whose predicted boundary set equals the gold set
  by case              for the paragraphs tagged with a case (quote, digit_after_da, ...): gold boundaries, missed
                       boundaries (false negatives), false splits (false positives), exact paragraphs
Speed: every paragraph of the 5-file Korean sample (stripped lines, no <doc> tags, over 40 characters: the same set as
benchmarks/gates/sentence_splitters.py), one paragraph per call, one process. MB/s is wall time; MB per CPU-second is
the stable figure on a shared machine (run_info records the load average). Splitters marked slow (kss with the
pure-Python pecab backend: ~0.002 MB/s) are timed on the first --slow-mb MB of paragraphs only.

Splitters (each is skipped with a note when not installed): sentencex through bertkit's own
`bertkit.pipelines.sentences.split_sentences(text, "ko")`, blingfire, kiwipiepy (`Kiwi().split_into_sents`), and
kss with each backend (`mecab` through python-mecab-ko, `pecab`, `fast`, `punct`).
Usage: python benchmarks/gates/korean_splitters.py [--data SHARED_DATA] [--gold PATH] [--splitters a,b] [--slow-mb 0.25]
       [--no-speed]      (writes benchmarks/results/korean_splitters.json)
"""
import argparse
import glob
import importlib.metadata
import json
import re
import time
import warnings
from collections import defaultdict
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import SHARED
from record import run_info, write_result

HERE = Path(__file__).resolve().parents[1]  # benchmarks/
SPACE = re.compile(r"\s+")
PACKAGES = ["sentencex", "blingfire", "kiwipiepy", "kiwipiepy_model", "kss", "python-mecab-ko",
            "python-mecab-ko-dic", "pecab"]


def version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def make_splitters():
    """name -> (split function or None, note, slow). Imports are lazy so one missing package skips one row."""
    out = {}
    try:
        from bertkit.pipelines.sentences import split_sentences
        out["sentencex"] = (lambda t: split_sentences(t, "ko"), f"sentencex {version('sentencex')} (bertkit)", False)
    except ImportError as e:
        out["sentencex"] = (None, f"not importable: {e}", False)
    try:
        import blingfire
        out["blingfire"] = (lambda t: blingfire.text_to_sentences(t).split("\n"),
                            f"blingfire {version('blingfire')}", False)
    except ImportError as e:
        out["blingfire"] = (None, f"not installed: {e}", False)
    try:
        from kiwipiepy import Kiwi
        kiwi = Kiwi()
        out["kiwipiepy"] = (lambda t: [s.text for s in kiwi.split_into_sents(t)],
                            f"kiwipiepy {version('kiwipiepy')} (model {version('kiwipiepy_model')}), "
                            "Kiwi().split_into_sents defaults", False)
    except ImportError as e:
        out["kiwipiepy"] = (None, f"not installed: {e}", False)
    try:
        with warnings.catch_warnings():  # kss imports bs4, which warns that soupsieve is missing (unused here)
            warnings.simplefilter("ignore")
            import kss
        # pecab's path costs overflow numpy scalars on some inputs; it warns (RuntimeWarning) and goes on
        warnings.filterwarnings("ignore", category=RuntimeWarning, module="pecab")
        notes = {"mecab": f"MeCab through python-mecab-ko {version('python-mecab-ko')} "
                          f"(dic {version('python-mecab-ko-dic')})",
                 "pecab": f"pecab {version('pecab')} (pure Python MeCab port)",
                 "fast": "kss's rule table without morpheme analysis (the kss < 3 algorithm)",
                 "punct": "kss's punctuation-only mode"}
        for backend, note in notes.items():
            split = (lambda b: lambda t: kss.split_sentences(t, backend=b))(backend)
            try:
                split("워밍업 문장이다. 두 번째 문장이다.")  # loads the analyser; fails here if the backend is missing
                out[f"kss-{backend}"] = (split, f"kss {version('kss')}, backend={backend}: {note}", backend == "pecab")
            except ImportError as e:
                out[f"kss-{backend}"] = (None, f"backend missing: {str(e).splitlines()[0]}", False)
    except ImportError as e:
        for backend in ("mecab", "pecab", "fast", "punct"):
            out[f"kss-{backend}"] = (None, f"not installed: {e}", False)
    return out


def boundaries(text, sentences):
    """Sentence-start offsets in non-space characters, strictly inside the paragraph; and how many sentences of the
    split could not be found in the text (a splitter that rewrites characters)."""
    flat = SPACE.sub("", text)
    cursor, starts, unaligned = 0, [], 0
    for s in sentences:
        s = SPACE.sub("", s)
        if not s:
            continue
        pos = flat.find(s, cursor)
        if pos < 0:
            unaligned += 1
            pos = cursor
        starts.append(pos)
        cursor = pos + len(s)
    return {b for b in starts if 0 < b < len(flat)}, unaligned


def load_gold(path):
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    for r in rows:
        assert "".join(r["sentences"]) == r["text"], f"{r['doc']} line {r['line']}: sentences do not rebuild the text"
        r["gold"], _ = boundaries(r["text"], r["sentences"])
        assert len(r["gold"]) == len(r["sentences"]) - 1, f"{r['doc']} line {r['line']}: empty sentence"
    return rows


def evaluate_gold(split, gold):
    tp = fp = fn = exact = unaligned = 0
    cases = defaultdict(lambda: {"paragraphs": 0, "gold_boundaries": 0, "missed": 0, "false_splits": 0, "exact": 0})
    errors = []
    for r in gold:
        pred, bad = boundaries(r["text"], split(r["text"]))
        unaligned += bad
        miss, false = r["gold"] - pred, pred - r["gold"]
        tp += len(r["gold"] & pred)
        fp += len(false)
        fn += len(miss)
        exact += not miss and not false
        for c in r["cases"]:
            k = cases[c]
            k["paragraphs"] += 1
            k["gold_boundaries"] += len(r["gold"])
            k["missed"] += len(miss)
            k["false_splits"] += len(false)
            k["exact"] += not miss and not false
        if miss or false:
            errors.append({"doc": r["doc"], "line": r["line"], "missed": len(miss), "false_splits": len(false)})
    p = tp / (tp + fp) if tp + fp else 0.0
    r_ = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * p * r_ / (p + r_) if p + r_ else 0.0
    return {"gold_boundaries": tp + fn, "predicted_boundaries": tp + fp, "true_positives": tp,
            "missed": fn, "false_splits": fp, "precision": round(p, 4), "recall": round(r_, 4), "f1": round(f1, 4),
            "exact_paragraphs": exact, "paragraphs": len(gold), "unaligned_sentences": unaligned,
            "by_case": dict(sorted(cases.items())), "paragraphs_with_errors": errors}


def sample_paragraphs(data):
    out = []
    for path in sorted(glob.glob(str(data / "wikipedia_ko_wikiextractor/text/AA/wiki_*"))):
        for line in open(path, encoding="utf-8"):
            line = line.strip()
            if line and not line.startswith("<") and len(line) > 40:
                out.append(line)
    return out


def measure_speed(split, paras, limit_mb=None):
    if limit_mb is not None:
        kept, size = [], 0
        for p in paras:
            if size >= limit_mb * 1e6:
                break
            kept.append(p)
            size += len(p.encode())
        paras = kept
    mb = sum(len(p.encode()) for p in paras) / 1e6
    wall, cpu = time.perf_counter(), time.process_time()
    sentences = sum(len([s for s in split(p) if s.strip()]) for p in paras)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"paragraphs": len(paras), "mb": round(mb, 3), "whole_sample": limit_mb is None,
            "seconds": round(wall, 2), "cpu_seconds": round(cpu, 2), "mb_per_s": round(mb / wall, 3),
            "mb_per_cpu_s": round(mb / cpu, 3) if cpu else None, "sentences": sentences}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=SHARED,
                    help="shared data folder holding wikipedia_ko_wikiextractor/ (default ../shared/data)")
    ap.add_argument("--gold", type=Path, default=HERE / "data" / "ko_sentence_gold.jsonl")
    ap.add_argument("--splitters", default=None, help="comma-separated subset of the names in the table")
    ap.add_argument("--slow-mb", type=float, default=0.25, help="MB of sample paragraphs for the slow splitters")
    ap.add_argument("--no-speed", action="store_true", help="gold-set quality only")
    args = ap.parse_args()

    gold = load_gold(args.gold)
    paras = [] if args.no_speed else sample_paragraphs(args.data)
    if not args.no_speed and not paras:
        ap.error(f"no Korean sample under {args.data}/wikipedia_ko_wikiextractor (pass --data or --no-speed)")
    splitters = make_splitters()
    if args.splitters:
        wanted = args.splitters.split(",")
        splitters = {k: v for k, v in splitters.items() if k in wanted}
    print(f"gold: {len(gold)} paragraphs, {sum(len(r['gold']) for r in gold)} boundaries; speed sample: "
          f"{len(paras)} paragraphs, {sum(len(p.encode()) for p in paras) / 1e6:.2f} MB")

    rows, skipped = [], {}
    for name, (split, note, slow) in splitters.items():
        if split is None:
            skipped[name] = note
            print(f"{name:12s} skipped: {note}")
            continue
        row = {"splitter": name, "setup": note, **evaluate_gold(split, gold)}
        if not args.no_speed:
            row["speed"] = measure_speed(split, paras, args.slow_mb if slow else None)
        rows.append(row)
        speed = ""
        if "speed" in row:
            s = row["speed"]
            speed = f"  {s['mb_per_s']:8.3f} MB/s {s['mb_per_cpu_s']:8.3f} MB/CPU-s"
            if not s["whole_sample"]:
                speed += f" (first {s['mb']} MB)"
        print(f"{name:12s} P {row['precision']:.3f} R {row['recall']:.3f} F1 {row['f1']:.3f}  exact "
              f"{row['exact_paragraphs']:3d}/{row['paragraphs']}  missed {row['missed']:3d} "
              f"false {row['false_splits']:3d}{speed}", flush=True)

    cases = sorted({c for r in gold for c in r["cases"]})
    print("\nmissed / false splits by case (paragraphs tagged with the case)")
    print(f"{'case':22s} {'paras':>5s} {'gold':>5s}  " + "  ".join(f"{r['splitter']:>11s}" for r in rows))
    for c in cases:
        k0 = rows[0]["by_case"][c] if rows else {"paragraphs": 0, "gold_boundaries": 0}
        print(f"{c:22s} {k0['paragraphs']:5d} {k0['gold_boundaries']:5d}  " + "  ".join(
            f"{r['by_case'][c]['missed']:>5d}/{r['by_case'][c]['false_splits']:<5d}" for r in rows))

    write_result("korean_splitters", {
        **run_info("korean_splitters"),
        "note": "shared 2-core machine under load from other jobs: wall MB/s varies with the load, MB per CPU-second "
                "is the stable figure",
        "gold": {"path": str(args.gold.relative_to(HERE.parent)) if args.gold.is_relative_to(HERE.parent)
                 else str(args.gold), "paragraphs": len(gold), "boundaries": sum(len(r["gold"]) for r in gold)},
        "speed_sample": {"paragraphs": len(paras), "mb": round(sum(len(p.encode()) for p in paras) / 1e6, 2)},
        "versions": {p: version(p) for p in PACKAGES},
        "skipped": skipped, "results": rows})


if __name__ == "__main__":
    main()
