"""Benchmark `make-instances` on the 20 MB English WikiExtractor sample at dupe 10, seq 128.

  python benchmarks/gates/make_instances.py [SHARED_DATA] [--workers 1 2] [--no-compat] [--repeats N]

The corpus is made once with prepare-corpus (not timed). Each configuration then runs in a fresh child process, so
imports, process start-up and memory are counted honestly: `--compat google` (the reference's exact random calls,
single process) and the default mode with 1 and 2 workers. Reported per configuration:
  wall seconds, instances/s and input MB/s on the wall clock;
  CPU seconds (user + sys of the child and its workers) and instances per CPU second = the per-core rate, which
  stays meaningful on a shared, contended machine where wall time is not;
  peak RSS of the main process and of the largest worker.
Writes benchmarks/results/make_instances.json.
"""
import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import SHARED
from record import run_info, write_result

GOOGLE_REFERENCE = {"instances_per_s": 4300, "peak_rss_mb": 1500, "note": "google-research/bert "
                    "create_pretraining_data.py on this sample, one core: 471k instances in 109 s (issue 3)"}


def child(corpus: str, tokenizer: str, out: str, workers: int, compat: str):
    from bertkit.pipelines.make_instances import InstancesConfig, make_instances

    t = time.perf_counter()
    m = make_instances(corpus, tokenizer, out, InstancesConfig(workers=workers, compat=compat or None, dupe=10,
                                                               max_seq_length=128), progress=False)
    seconds = time.perf_counter() - t
    self_ru, kids_ru = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"seconds": seconds, "instances": m.stats["instances"]["train"],
                      "cpu_seconds": self_ru.ru_utime + self_ru.ru_stime + kids_ru.ru_utime + kids_ru.ru_stime,
                      "main_rss_mb": self_ru.ru_maxrss / 1024, "worker_rss_mb": kids_ru.ru_maxrss / 1024,
                      "not_next_share": m.stats["not_next_share"],
                      "selected_fraction": m.stats["selected_fraction"], "files": len(m.shards)}))


def run(corpus, tokenizer, text_mb, workers, compat, repeats):
    best = None
    for _ in range(repeats):
        out = tempfile.mkdtemp(prefix="bench_instances_")
        shutil.rmtree(out)
        try:
            proc = subprocess.run([sys.executable, __file__, "--child", str(corpus), str(tokenizer), out,
                                   str(workers), compat], capture_output=True, text=True)
            if proc.returncode:
                sys.exit(proc.stderr)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        best = r if best is None or r["seconds"] < best["seconds"] else best
    b = best
    return {"mode": "compat google" if compat else "default", "workers": workers, "instances": b["instances"],
            "seconds": round(b["seconds"], 2), "instances_per_s": round(b["instances"] / b["seconds"]),
            "input_mb_per_s": round(text_mb / b["seconds"], 2), "cpu_seconds": round(b["cpu_seconds"], 2),
            "instances_per_cpu_s": round(b["instances"] / b["cpu_seconds"]),
            "x_google_per_core": round(b["instances"] / b["cpu_seconds"] / GOOGLE_REFERENCE["instances_per_s"], 1),
            "peak_rss_main_mb": round(b["main_rss_mb"], 1),
            "peak_rss_worker_mb": round(b["worker_rss_mb"], 1) if workers > 1 and not compat else None,
            "not_next_share": round(b["not_next_share"], 4), "selected_fraction": round(b["selected_fraction"], 4),
            "files": b["files"]}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(*sys.argv[2:5], int(sys.argv[5]), sys.argv[6])
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default=str(SHARED))
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--no-compat", action="store_true", help="skip --compat google (slowest)")
    ap.add_argument("--repeats", type=int, default=1, help="best of N (the machine is shared)")
    args = ap.parse_args()
    from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus

    data = Path(args.data)
    files = sorted((data / "wikipedia_en_wikiextractor" / "text" / "AA").glob("wiki_*"))
    if len(files) != 20:
        sys.exit(f"expected the 20-file English sample under {data}; found {len(files)} files")
    tokenizer = data / "vocab" / "bert-base-uncased" / "vocab.txt"
    work = Path(tempfile.mkdtemp(prefix="bench_instances_corpus_"))
    try:
        m = prepare_corpus([str(f) for f in files], work / "corpus", CorpusConfig(progress=False))
        text_mb = m.totals["input_bytes"] / 1e6
        rows = [] if args.no_compat else [run(work / "corpus", tokenizer, text_mb, 1, "google", args.repeats)]
        rows += [run(work / "corpus", tokenizer, text_mb, w, "", args.repeats) for w in args.workers]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'mode':>14} {'workers':>7} {'instances':>9} {'s':>7} {'inst/s':>7} {'MB/s':>5} {'CPU s':>6} "
          f"{'inst/CPU s':>10} {'x google/core':>13} {'main MB':>8} {'worker MB':>9}")
    for r in rows:
        print(f"{r['mode']:>14} {r['workers']:>7} {r['instances']:>9} {r['seconds']:>7} {r['instances_per_s']:>7} "
              f"{r['input_mb_per_s']:>5} {r['cpu_seconds']:>6} {r['instances_per_cpu_s']:>10} "
              f"{r['x_google_per_core']:>13} {r['peak_rss_main_mb']:>8} {str(r['peak_rss_worker_mb'] or '-'):>9}")
    write_result("make_instances", {
        **run_info("make_instances"), "input": "wikipedia_en_wikiextractor text/AA/wiki_00..19 via prepare-corpus",
        "settings": {"dupe": 10, "max_seq_length": 128, "max_predictions": 20, "masked_lm_prob": 0.15,
                     "tokenizer": "bert-base-uncased vocab.txt"},
        "google_reference": GOOGLE_REFERENCE, "results": rows})


if __name__ == "__main__":
    main()
