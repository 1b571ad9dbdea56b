"""How well does `prepare-corpus --languages ko,en` tell Korean from English here? (issue 82's language step; a
study, run by hand)

Asks: py3langid (in its wheel, nothing downloaded), on what `--languages` gives it (a document's cleaned sentences
joined, its first 2,000 characters), keeps how many of each source's documents at `--language-score` 0.5 (the
default) and 0.8, and what does it call the rest? By length, since short informal text is where identifiers fail.

Arms (each a source whose language is known, through `prepare-corpus` without the language step and with
--min-chars 0, so short documents are measured too): Korean and English Wikipedia (the first WikiExtractor folder of
each), KoCoNovel's novels (Korean fiction), Gutenberg's two books (English fiction, a paragraph a document), KLUE-NLI
dev premises (one Korean sentence each) and NSMC test reviews (informal Korean, most under 50 characters,
prepare-corpus's default --min-chars).

    python benchmarks/studies/language_id.py [--work /tmp/language-id] [--per-source 2000]

Results: results/language_id.json (date, machine, commit); the reading is in
docs/studies/2026-12-02-near-duplicates.md. Seconds only as a rate (documents a second on one core).
"""
import argparse
import collections
import csv
import json
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import SHARED, done, say
from record import run_info, write_result

SOURCES = {   # name: (truth, input under the shared data: a file or a folder of them)
    "ko-wikipedia": ("ko", "wikipedia_ko_wikiextractor/text/AA"),
    "en-wikipedia": ("en", "wikipedia_en_wikiextractor/text/AA"),
    "ko-novels": ("ko", "koconovel/data/jsonl"),
    "en-gutenberg": ("en", "gutenberg"),
    "ko-klue-nli": ("ko", "klue/klue-nli-v1.1/klue-nli-v1.1_dev.json"),
    "ko-nsmc": ("ko", "nsmc/ratings_test.txt"),
}
LENGTHS = ((0, 20), (20, 50), (50, 200), (200, None))   # characters of the joined sentences
SCORES = (0.5, 0.8)


def as_lines(name: str, path: Path, out: Path) -> Path:
    """KLUE-NLI's premises and NSMC's reviews as JSON lines, a document each; the other sources as they are."""
    if name == "ko-klue-nli":
        texts = sorted({row["premise"] for row in json.loads(path.read_text(encoding="utf-8"))})
    elif name == "ko-nsmc":
        with path.open(encoding="utf-8") as f:
            texts = [row["document"] for row in csv.DictReader(f, delimiter="\t") if row["document"]]
    else:
        return path
    out.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    return out


def documents(work: Path, name: str, limit: int) -> list[str]:
    """The source's first `limit` documents as --languages sees them: cleaned sentences, joined."""
    from bertkit.fileio import read_arrow
    from bertkit.formats import corpus_shards
    from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus

    folder = work / name
    if not done(folder):
        source = as_lines(name, SHARED / SOURCES[name][1], work / f"{name}.jsonl")
        prepare_corpus([source], folder, CorpusConfig(workers=1, holdout=0.0, min_chars=0, progress=False))
    texts = [" ".join(s) for p in corpus_shards(folder, "train") for s in read_arrow(p).column("sentences").to_pylist()]
    return texts[:limit]


def measure(texts: list[str], truth: str) -> dict:
    from bertkit.pipelines.language import identify

    t0 = time.process_time()
    found = [identify(t) for t in texts]
    seconds = time.process_time() - t0
    by_length = {}
    for lo, hi in LENGTHS:
        picked = [(f, t) for f, t in zip(found, texts) if len(t) >= lo and (hi is None or len(t) < hi)]
        if picked:
            by_length[f"{lo}-{hi or ''}"] = {"documents": len(picked), "kept_at_0.5": round(
                sum(f[0] == truth and f[1] >= 0.5 for f, _ in picked) / len(picked), 4)}
    wrong = collections.Counter(f[0] for f in found if f[0] != truth)
    return {"documents": len(texts), "identified": round(sum(f[0] == truth for f in found) / len(texts), 4),
            **{f"kept_at_{s}": round(sum(f[0] == truth and f[1] >= s for f in found) / len(texts), 4)
               for s in SCORES},
            "called_otherwise": dict(wrong.most_common(5)), "by_length": by_length,
            "documents_per_cpu_second": round(len(texts) / seconds) if seconds else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/language-id"))
    ap.add_argument("--per-source", type=int, default=2000)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    result = {**run_info("language_id"), "per_source": args.per_source, "sources": {}}
    for name, (truth, _) in SOURCES.items():
        say(f"{name}: identifying")
        result["sources"][name] = {"truth": truth, **measure(documents(args.work, name, args.per_source), truth)}
    write_result("language_id", result)
    print(f"{'source':14} {'docs':>6} {'identified':>10} {'kept@0.5':>9} {'kept@0.8':>9}  otherwise")
    for name, r in result["sources"].items():
        print(f"{name:14} {r['documents']:>6} {r['identified']:>10.1%} {r['kept_at_0.5']:>9.1%} "
              f"{r['kept_at_0.8']:>9.1%}  {r['called_otherwise']}")
        print("    by length:", {k: f"{v['kept_at_0.5']:.1%} of {v['documents']}" for k, v in r["by_length"].items()})


if __name__ == "__main__":
    main()
