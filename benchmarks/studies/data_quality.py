"""prepare-corpus's data-quality steps on a planted corpus, beside datatrove (a study, run by hand).

Asks, of real Korean and English Wikipedia documents with things planted among them (bertkit.planted): of the
near-duplicates (edits, boilerplate headers, punctuation and case changes, cuts; their Jaccard computed
independently), how many at Jaccard >= 0.8 leave one document, how many below stay two, how many distinct documents
are lost; of the made-up personal data, how many are left, and of the benign numbers (dates, ISBNs, prices,
versions), how many are kept; of the KorQuAD contexts planted (read in place, never copied), how many are left;
and at what cost against plain prepare-corpus. Arms: prepare-corpus without the steps, with each, with all; and
datatrove 0.10.1's MinHash (5-grams, 14x8, its Korean words through Kiwi as FineWeb2 runs it), PII formatter and
13-gram decontamination (KorQuAD's questions in lighteval's shape: the answer the gold, the context and question the
query; with and without the query's own n-grams) from its own environment (--datatrove-python; made with
`pip install datatrove==0.10.1 kiwipiepy regex orjson pyyaml "xxhash<4"`: xxhash 4 refuses the strings datatrove's
decontamination hashes). One process each, one core; the load average is recorded.

    python benchmarks/studies/data_quality.py --work /tmp/dq [--per-language 1500] \
        [--datatrove-python /tmp/dtvenv/bin/python]

Results: results/data_quality.json; the study: docs/studies/2026-12-02-near-duplicates.md.
"""
import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import SHARED
from record import run_info, write_result

from bertkit.fileio import atomic_write_json
from bertkit.planted import junk_scores, near_dedup_scores, plant_scores, planted_corpus

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

DATATROVE_PII = '''
import sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.formatters import PIIFormatter
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter

src, work = sys.argv[1], sys.argv[2]
LocalPipelineExecutor(pipeline=[JsonlReader(src, text_key="text", id_key="title", glob_pattern="corpus.jsonl"),
                                PIIFormatter(), JsonlWriter(f"{work}/kept", compression=None)],
                      tasks=1, workers=1, logging_dir=f"{work}/logs").run()
'''
DATATROVE_FILTERS = '''
import json, os, re, sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.filters import FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
from datatrove.utils.word_tokenizers import KiwiTokenizer
import yaml

src, work, config = sys.argv[1], sys.argv[2], sys.argv[3]   # config: FineWeb2's configs/kor_Hang.yml
korean = yaml.safe_load(open(config))
os.makedirs(work, exist_ok=True)
hangul, latin = re.compile(r"[\\uac00-\\ud7a3]"), re.compile(r"[A-Za-z]")
files = {"ko": open(f"{work}/ko.jsonl", "w"), "en": open(f"{work}/en.jsonl", "w")}
for line in open(f"{src}/corpus.jsonl"):   # as FineWeb2 runs it: each language with its own settings
    text = json.loads(line)["text"][:4000]
    files["ko" if len(hangul.findall(text)) > len(latin.findall(text)) else "en"].write(line)
for f in files.values():
    f.close()
kiwi = KiwiTokenizer(model_type="cong")   # kiwipiepy >= 0.22 no longer ships the "sbg" model datatrove names
steps = {"ko": [GopherRepetitionFilter(dup_para_frac=0, dup_line_char_frac=0, dup_para_char_frac=0,
                                       dup_line_frac=korean["dup_line_frac"], top_n_grams=korean["top_n_grams"],
                                       dup_n_grams=korean["dup_n_grams"], language=kiwi),
                FineWebQualityFilter(short_line_thr=999, char_duplicates_ratio=0.1,
                                     line_punct_thr=korean["line_punct_thr"], new_line_ratio=korean["new_line_ratio"],
                                     language=kiwi),
                GopherQualityFilter(max_avg_word_length=korean["max_avg_word_length"],
                                    min_avg_word_length=korean["min_avg_word_length"], stop_words=korean["stopwords"],
                                    max_non_alpha_words_ratio=korean["max_non_alpha_words_ratio"], min_stop_words=2,
                                    language=kiwi)],
         "en": [GopherRepetitionFilter(), FineWebQualityFilter(), GopherQualityFilter()]}
for lang, filters in steps.items():
    LocalPipelineExecutor(pipeline=[JsonlReader(work, text_key="text", id_key="title", glob_pattern=f"{lang}.jsonl"),
                                    *filters, JsonlWriter(f"{work}/kept", output_filename=f"{lang}.jsonl",
                                                          compression=None)],
                          tasks=1, workers=1, logging_dir=f"{work}/logs-{lang}").run()
'''
DATATROVE_DECONT = '''
import json, os, sys

src, work, query_ngrams = sys.argv[1], sys.argv[2], sys.argv[3] == "query"
# its indexer reads lighteval's task table after the documents it is given; none is asked for here (no Hub), so an
# empty stand-in for lighteval's two classes lets it index the evaluation file's own questions, contexts and answers
stub = f"{work}/stub/lighteval/tasks"
os.makedirs(stub, exist_ok=True)
for name in ("__init__.py", "../__init__.py"):
    open(f"{stub}/{name}", "w").close()
open(f"{stub}/registry.py", "w").write("class Registry:\\n    def __init__(self, **kw): pass\\n"
                                       "    def get_task_dict(self, tasks): return {}\\n")
open(f"{stub}/lighteval_task.py", "w").write("class LightevalTask:\\n    @staticmethod\\n"
                                             "    def load_datasets(tasks): pass\\n")
os.makedirs(f"{work}/stub/lighteval-0.dist-info", exist_ok=True)   # datatrove asks for the distribution too
open(f"{work}/stub/lighteval-0.dist-info/METADATA", "w").write(
    "Metadata-Version: 2.1\\nName: lighteval\\nVersion: 0\\n")
sys.path.insert(0, f"{work}/stub")   # before datatrove looks for it
from datatrove.data import Document
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.decont import NGramsDecontConfig, NGramsDecontFilter, NGramsDecontIndexer
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
from datatrove.utils.word_tokenizers import KiwiTokenizer
kiwi = KiwiTokenizer(model_type="cong")   # FineWeb2's Korean words (kiwipiepy >= 0.22 has no "sbg" model)
config = NGramsDecontConfig(n_grams=13, find_query_ngrams=query_ngrams)
# lighteval's KorQuAD shape: the gold is the answer, the query the context and the question
docs = [Document(text=answer, id=f"q{i}", metadata={"query": query, "task": "korquad"})
        for i, (query, answer) in enumerate(json.load(open(f"{src}/evaluation.json")))]
NGramsDecontIndexer(f"{work}/index", config=config, language=kiwi).run(iter(docs))
LocalPipelineExecutor(pipeline=[JsonlReader(src, text_key="text", id_key="title", glob_pattern="corpus.jsonl"),
                                NGramsDecontFilter(f"{work}/index", config=config, language=kiwi),
                                JsonlWriter(f"{work}/kept", compression=None)],
                      tasks=1, workers=1, logging_dir=f"{work}/logs").run()
'''
KORQUAD = SHARED / "korquad_v1.0" / "KorQuAD_v1.0_dev.json"


def timed(command: list, env=None) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    return time.perf_counter() - start


def bertkit_arm(work: Path, name: str, flags: list) -> dict:
    import pyarrow as pa

    from bertkit.formats import corpus_shards, read_corpus_manifest

    out = work / name
    seconds = timed([str(BIN / "bertkit"), "prepare-corpus", str(work / "corpus.jsonl"), "--out", str(out),
                     "--holdout", "0", "-j", "1", "--no-progress", "--overwrite", *flags])
    kept = {}
    for path in corpus_shards(out):
        table = pa.ipc.open_file(str(path)).read_all()
        kept.update((t, " ".join(s)) for t, s in zip(table.column("title").to_pylist(),
                                                     table.column("sentences").to_pylist()))
    manifest = read_corpus_manifest(out)
    return {"seconds": round(seconds, 2), "kept": kept, "dropped": manifest.dropped,
            **{k: manifest.totals[k] for k in ("near_dedup", "pii_found", "decontamination") if k in manifest.totals}}


def datatrove_arm(work: Path, python: str, name: str, script: str, *extra) -> dict:
    out = work / name
    subprocess.run(["rm", "-rf", str(out)], check=True)
    seconds = timed([python, "-c", script, str(work), str(out), *extra], env={**os.environ, "OMP_NUM_THREADS": "1"})
    rows = [json.loads(line) for f in (out / "kept").glob("*.jsonl") for line in f.open()]
    kept = {row["id"]: row["text"] for row in rows}
    return {"seconds": round(seconds, 2), "kept": kept}


def passages(count: int) -> list[str]:
    """The first `count` KorQuAD 1.0 dev contexts, read in place (never written anywhere but the run's own folder)."""
    data = json.loads(KORQUAD.read_text(encoding="utf-8"))["data"]
    return [p["context"] for article in data for p in article["paragraphs"]][:count]


def datatrove_decontamination_arm(work: Path, python: str, query: str) -> dict:
    """datatrove's n-gram decontamination, given KorQuAD dev in lighteval's shape: [query, gold] per question, in
    the run's own folder only."""
    data = json.loads(KORQUAD.read_text(encoding="utf-8"))["data"]
    atomic_write_json(work / "evaluation.json", [[f"{p['context']} {q['question']}", a["text"]] for article in data
                                                 for p in article["paragraphs"] for q in p["qas"]
                                                 for a in q["answers"][:1]])
    return datatrove_arm(work, python, f"dt-decont-{query}", DATATROVE_DECONT, query)


def arms(work: Path, dt_python: str | None) -> dict:
    evaluation = ["--decontaminate", str(KORQUAD)]
    found = {"prepare-corpus (exact duplicates only)": lambda: bertkit_arm(work, "plain", []),
             "--near-dedup (18x6 for 0.8)": lambda: bertkit_arm(work, "near", ["--near-dedup"]),
             "--near-dedup-bands 14x8": lambda: bertkit_arm(work, "near14x8", ["--near-dedup", "--near-dedup-bands",
                                                                                "14x8"]),
             "--pii redact": lambda: bertkit_arm(work, "pii", ["--pii", "redact"]),
             "--decontaminate KorQuAD dev": lambda: bertkit_arm(work, "decon", evaluation),
             "--decontaminate KorQuAD dev, documents": lambda: bertkit_arm(work, "decon-docs", [
                 *evaluation, "--decontaminate-mode", "documents"]),
             "--filters fineweb2": lambda: bertkit_arm(work, "filters", ["--filters", "fineweb2"]),
             "all four": lambda: bertkit_arm(work, "all", ["--near-dedup", "--pii", "redact", "--filters",
                                                           "fineweb2", *evaluation])}
    if dt_python:
        found["datatrove MinHash 14x8 (Kiwi words)"] = lambda: datatrove_arm(work, dt_python, "dt-minhash",
                                                                             DATATROVE_ARM, "kor_Hang")
        found["datatrove PIIFormatter"] = lambda: datatrove_arm(work, dt_python, "dt-pii", DATATROVE_PII)
        for query in ("answer", "query"):
            found[f"datatrove n-gram decontamination, {query} n-grams"] = functools.partial(
                datatrove_decontamination_arm, work, dt_python, query)
        if (work / "kor_Hang.yml").is_file():   # --fineweb2-config
            found["datatrove FineWeb2 filters (Korean: kor_Hang)"] = lambda: datatrove_arm(
                work, dt_python, "dt-filters", DATATROVE_FILTERS, str(work / "kor_Hang.yml"))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--per-language", type=int, default=1500)
    ap.add_argument("--datatrove-python")
    ap.add_argument("--fineweb2-config", type=Path, help="FineWeb2's configs/kor_Hang.yml (its datatrove arm)")
    ap.add_argument("--arms", help="only the arms whose name holds this text")
    ap.add_argument("--name", default="data_quality", help="results/NAME.json")
    args = ap.parse_args()
    truth = planted_corpus(args.work, {"ko": SHARED / "wikipedia_ko_wikiextractor_more",
                                       "en": SHARED / "wikipedia_en_wikiextractor"}, args.per_language,
                           personal=240, benign=240, passages=passages(40), junk_documents=300)
    plants = json.loads((args.work / "plants.json").read_text(encoding="utf-8"))
    result = {**run_info(args.name), "corpus_mb": round((args.work / "corpus.jsonl").stat().st_size / 1e6, 1),
              "documents": len(truth), "arms": {}}
    if args.fineweb2_config:
        (args.work / "kor_Hang.yml").write_bytes(args.fineweb2_config.read_bytes())
    print(f"{'arm':40} {'s':>6} {'near>=0.8':>9} {'below kept':>10} {'lost':>7} {'PII left':>8} {'benign':>7} "
          f"{'passages left':>13} {'junk gone':>9} {'real kept':>10}")
    for name, arm in arms(args.work, args.datatrove_python).items():
        if args.arms and args.arms not in name:
            continue
        outcome = arm()
        kept = outcome.pop("kept")
        near, planted, junk = near_dedup_scores(truth, set(kept)), plant_scores(plants, kept), \
            junk_scores(truth, set(kept))
        result["arms"][name] = {**outcome, **near, **planted, **junk,
                                "load_average": [round(x, 2) for x in os.getloadavg()]}
        print(f"{name:40} {outcome['seconds']:6.1f} {near['recall']:9.4f} "
              f"{near['below_both_kept']:>4}/{near['pairs_below']:<5} {near['distinct_lost']:>7} "
              f"{planted['personal_left']:>4}/{planted['personal']:<3} "
              f"{planted['benign_kept']:>3}/{planted['benign']:<3} "
              f"{planted['passages_left']:>6}/{planted['passages']:<6} {junk['junk_gone']:>5}/{junk['junk']:<3} "
              f"{junk['real_kept']:>5}/{junk['real']}")
        write_result(args.name, result)


if __name__ == "__main__":
    main()
