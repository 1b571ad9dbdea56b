"""Benchmark `prepare-corpus` on the English WikiExtractor sample: input MB/s, documents/s, peak memory.

  python benchmarks/gates/prepare_corpus.py [SHARED_DATA] [--workers 1 2]

Each configuration runs in a fresh child process (so imports, process start-up and memory are counted honestly);
CPU seconds (main + workers, user + system) are reported too: on a shared machine they are the stable number.
peak memory is the child's max RSS (main process) and the largest worker's max RSS. Running the same run on the
first 5 and on all 20 files shows that memory does not grow with the input.
Writes benchmarks/results/prepare_corpus.json.
"""
import argparse
import json
import os
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


def child(files: list[str], out: str, workers: int):
    from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus

    t = time.perf_counter()
    m = prepare_corpus(files, out, CorpusConfig(workers=workers, progress=False))
    seconds = time.perf_counter() - t
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    print(json.dumps({"seconds": seconds, "cpu_seconds": sum(u.ru_utime + u.ru_stime for u in usage),
                      "documents": m.totals["documents"],
                      "documents_read": m.totals["documents_read"], "input_bytes": m.totals["input_bytes"],
                      "main_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "worker_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))


def run(files, workers, repeats):
    best = None
    for _ in range(repeats):
        out = tempfile.mkdtemp(prefix="bench_corpus_")
        try:
            proc = subprocess.run([sys.executable, __file__, "--child", str(workers), out, *map(str, files)],
                                  capture_output=True, text=True, check=True)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        best = r if best is None or r["seconds"] < best["seconds"] else best
    mb = best["input_bytes"] / 1e6
    return {"files": len(files), "workers": workers, "input_mb": round(mb, 2), "seconds": round(best["seconds"], 2),
            "mb_per_s": round(mb / best["seconds"], 2),
            "docs_per_s": round(best["documents_read"] / best["seconds"], 1),
            "cpu_seconds": round(best["cpu_seconds"], 2), "mb_per_cpu_s": round(mb / best["cpu_seconds"], 2),
            "load_average_1min": round(os.getloadavg()[0], 1),
            "documents_kept": best["documents"], "peak_rss_main_mb": round(best["main_rss_mb"], 1),
            "peak_rss_worker_mb": round(best["worker_rss_mb"], 1) if workers > 1 else None}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[4:], sys.argv[3], int(sys.argv[2]))
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default=str(SHARED))
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=2, help="best of N (the machine is shared)")
    args = ap.parse_args()
    files = sorted((Path(args.data) / "wikipedia_en_wikiextractor" / "text" / "AA").glob("wiki_*"))
    if len(files) != 20:
        sys.exit(f"expected the 20-file English sample under {args.data}; found {len(files)} files")
    rows = [run(files[:5], 1, args.repeats)] + [run(files, w, args.repeats) for w in args.workers]
    print(f"{'files':>5} {'workers':>7} {'MB':>6} {'s':>6} {'MB/s':>6} {'docs/s':>7} {'CPU s':>6} {'MB/CPU-s':>8} "
          f"{'main MB':>8} {'worker MB':>9} {'load':>5}")
    for r in rows:
        print(f"{r['files']:>5} {r['workers']:>7} {r['input_mb']:>6} {r['seconds']:>6} {r['mb_per_s']:>6} "
              f"{r['docs_per_s']:>7} {r['cpu_seconds']:>6} {r['mb_per_cpu_s']:>8} {r['peak_rss_main_mb']:>8} "
              f"{str(r['peak_rss_worker_mb'] or '-'):>9} {r['load_average_1min']:>5}")
    write_result("prepare_corpus", {**run_info("prepare_corpus"),
                                    "input": "wikipedia_en_wikiextractor text/AA/wiki_00..19", "results": rows})


if __name__ == "__main__":
    main()
