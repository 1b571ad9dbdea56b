"""Benchmark the data stages' engines on the 20 MB English WikiExtractor sample, and project 1 TB on a cluster.

  python benchmarks/gates/scale_out.py [SHARED_DATA] [--vocab-size 30522] [--dupe 1] [--nodes 8 64] [--cores 32]

Four configurations, each a fresh child process running prepare-corpus (2 MB shards, so that the later stages have
several tasks), train-tokenizer and make-instances (seq 128, --dupe passes) in turn: --engine local with 1 and 2
processes, and --engine ray on a cluster of 1 and of 2 nodes (`ray start` processes on 127.0.0.1, one CPU each).
Reported: wall seconds and MB/s per stage (prepare-corpus: input MB; the others: corpus text MB, per pass), and
CPU seconds of every process involved (the driver, its pool, and every process of the Ray cluster: raylets, GCS,
workers), the stable figure on a shared machine; the driver's phases (dedup, merge; the tokenizer's alphabet pass
and trainer); Ray's overhead per task (a no-op task) and per stage (CPU seconds of the Ray run minus the local run
with as many CPUs, connection included). A dedup task's rate is measured apart, on 2 M synthetic ids.
From the one-process run's CPU seconds per phase (per-core rates) it projects 1 TB of input on --nodes nodes of
--cores cores, with the shared file system's bandwidth as given (--fs-gbs aggregate, --client-gbs for the one
driver), and names what bounds each stage. Writes benchmarks/results/scale_out.json.
"""
import argparse
import json
import math
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

from bertkit.testing import SessionCPU, start_ray_cluster, stop_ray_cluster

BIN = Path(sys.executable).parent
TB = 1e12


# ---------------------------------------------------------------- one configuration (a child process)

def child(data: str, out: str, engine: str, workers: int, address: str, vocab_size: int, dupe: int):
    import bertkit.pipelines.make_instances as mi
    import bertkit.pipelines.prepare_corpus as pc
    import bertkit.pipelines.train_tokenizer as tt
    from bertkit.pipelines.engine import Engine

    phases, phases_cpu = {}, {}
    sessions = SessionCPU({int(x) for x in os.environ.get("BENCH_RAY_SESSIONS", "").split()})

    def timed(owner, name, key):  # driver-side phases only (tasks run elsewhere); wall and this process's CPU
        real = getattr(owner, name)

        def wrapper(*args, **kwargs):
            t, c = time.perf_counter(), time.process_time()
            try:
                return real(*args, **kwargs)
            finally:
                phases[key] = phases.get(key, 0.0) + time.perf_counter() - t
                phases_cpu[key] = phases_cpu.get(key, 0.0) + time.process_time() - c
        setattr(owner, name, wrapper)

    timed(pc, "run_dedup", "corpus_dedup")
    timed(pc.Merger, "add_part", "corpus_merge")
    timed(pc.Merger, "close", "corpus_merge")
    real_per_shard = tt._per_shard

    def per_shard(*args, **kwargs):  # a generator: its time is from the first result to the last
        t, c = time.perf_counter(), time.process_time()
        try:
            yield from real_per_shard(*args, **kwargs)
        finally:
            phases["tokenizer_alphabet"] = phases.get("tokenizer_alphabet", 0.0) + time.perf_counter() - t
            phases_cpu["tokenizer_alphabet"] = phases_cpu.get("tokenizer_alphabet", 0.0) + time.process_time() - c
    tt._per_shard = per_shard
    timed(tt, "_train", "tokenizer_train")
    kw = dict(engine=engine, workers=workers, ray_address=address or None)
    files = sorted((Path(data) / "wikipedia_en_wikiextractor" / "text" / "AA").glob("wiki_*"))
    seconds, cpu = {}, {}
    t, c = time.perf_counter(), cpu_seconds(sessions)
    corpus = pc.prepare_corpus(files, f"{out}/corpus", pc.CorpusConfig(shard_size=2 << 20, progress=False, **kw))
    seconds["prepare-corpus"], cpu["prepare-corpus"] = time.perf_counter() - t, cpu_seconds(sessions) - c
    t, c = time.perf_counter(), cpu_seconds(sessions)
    tt.train_tokenizer(f"{out}/corpus", f"{out}/tok", tt.TokenizerConfig(vocab_size=vocab_size, progress=False, **kw))
    seconds["train-tokenizer"], cpu["train-tokenizer"] = time.perf_counter() - t, cpu_seconds(sessions) - c
    t, c = time.perf_counter(), cpu_seconds(sessions)
    inst = mi.make_instances(f"{out}/corpus", f"{out}/tok", f"{out}/inst",
                             mi.InstancesConfig(dupe=dupe, max_seq_length=128, **kw), progress=False)
    seconds["make-instances"], cpu["make-instances"] = time.perf_counter() - t, cpu_seconds(sessions) - c
    overhead = None
    if engine == "ray":  # a no-op task, many times: the engine's own cost per task; and one connection
        t = time.perf_counter()
        with Engine("ray", ray_address=address) as e:
            connect = time.perf_counter() - t
            for n in (20, 200):
                t = time.perf_counter()
                list(e.map(abs, [(0,)] * n))
                overhead = {"connect_s": connect, "tasks": n, "seconds": time.perf_counter() - t}
    instance_bytes = sum(s.bytes for s in inst.shards)
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "phases": phases, "phases_cpu": phases_cpu,
                      "overhead": overhead,
                      "input_bytes": corpus.totals["input_bytes"], "text_bytes": corpus.totals["text_bytes"],
                      "documents": corpus.totals["documents"], "part_rows": corpus.totals["documents"]
                      + corpus.dropped.get("duplicate", 0), "shards": len(corpus.shards),
                      "instance_bytes": instance_bytes, "instance_files": len(inst.shards)}))


def cpu_seconds(cluster: SessionCPU) -> float:
    """CPU time so far of this process, its reaped children (a local pool) and the Ray cluster's processes."""
    own = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in own) - cluster.own + cluster.total()


def dedup_rate(rows: int = 2_000_000, parts: int = 10) -> float:
    """Ids per second of one dedup task (prepare_corpus.find_duplicates, P = 1) over synthetic parts."""
    import numpy as np

    import bertkit.pipelines.prepare_corpus as pc

    folder = Path(tempfile.mkdtemp(prefix="bench_dedup_"))
    try:
        rng = np.random.default_rng(0)
        paths = []
        for k in range(parts):
            ids = [f"{x:016x}" for x in rng.integers(0, 2 ** 63, rows // parts // 2, dtype=np.int64)] * 2
            writer = pc._PartWriter(folder / f"part-{k:05d}.arrow")
            for doc_id in ids:
                writer.add(doc_id, "s", None, ["x"], 1)
            writer.close()
            paths.append(str(folder / f"part-{k:05d}.arrow"))
        t = time.process_time()
        pc.find_duplicates(paths, 0, 1, str(folder / "dedup.npy"))
        return rows / (time.process_time() - t)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run(data, engine, parallel, args):
    out = tempfile.mkdtemp(prefix="bench_scale_")
    temp = tempfile.mkdtemp(prefix="bkbench", dir="/tmp")
    address, procs = start_ray_cluster(parallel, temp, object_store_mb=200) if engine == "ray" else ("", [])
    try:
        workers = parallel if engine == "local" else 1
        env = {**os.environ, "BENCH_RAY_SESSIONS": " ".join(str(p.pid) for p in procs)}
        proc = subprocess.run([sys.executable, __file__, "--child", data, out, engine, str(workers), address,
                               str(args.vocab_size), str(args.dupe)], capture_output=True, text=True, env=env)
        if proc.returncode:
            sys.exit(proc.stderr[-5000:])
    finally:
        stop_ray_cluster(procs, temp)
        shutil.rmtree(out, ignore_errors=True)
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    r.update(engine=engine, processes=parallel, load_average_1min=round(os.getloadavg()[0], 1))
    return r


# ---------------------------------------------------------------- rates, overheads, the 1 TB projection

def stage_rows(results):
    rows = []
    for r in results:
        mb_in, mb_text = r["input_bytes"] / 1e6, r["text_bytes"] / 1e6
        s = r["seconds"]
        rows.append({
            "config": f"{r['engine']} {r['processes']} {'node(s)' if r['engine'] == 'ray' else 'process(es)'}",
            "engine": r["engine"], "processes": r["processes"],
            "cpu_s": {k: round(v, 2) for k, v in r["cpu_seconds"].items()},
            "prepare_corpus_s": round(s["prepare-corpus"], 2),
            "prepare_corpus_mb_s": round(mb_in / s["prepare-corpus"], 2),
            "train_tokenizer_s": round(s["train-tokenizer"], 2),
            "train_tokenizer_mb_s": round(mb_text / s["train-tokenizer"], 2),
            "make_instances_s": round(s["make-instances"], 2),
            "make_instances_mb_s": round(mb_text / s["make-instances"], 2),
            "phases_s": {k: round(v, 2) for k, v in r["phases"].items()},
            "load_average_1min": r["load_average_1min"]})
    return rows


def per_core_rates(one, dupe, dedup_ids_per_s, merge_cpu_s):
    """From the one-process local run's CPU seconds: what one core (or the driver) does per CPU-second."""
    c, p = one["cpu_seconds"], one["phases_cpu"]
    text = one["text_bytes"]
    files_s = c["prepare-corpus"] - p["corpus_dedup"] - p["corpus_merge"]
    trainer_s = p["tokenizer_train"] - p["tokenizer_alphabet"]
    return {
        "corpus_files_mb_per_core_s": one["input_bytes"] / 1e6 / files_s,   # clean, split, write parts
        "dedup_ids_per_s": dedup_ids_per_s,                                 # one dedup task scanning every id
        "merge_mb_per_s": text / 1e6 / merge_cpu_s,                         # the driver: read parts, write shards
        "alphabet_mb_per_core_s": text / 1e6 / p["tokenizer_alphabet"],     # the per-shard trainer pass
        "trainer_mb_per_s": text / 1e6 / trainer_s,                         # the driver's WordPiece trainer
        "instances_mb_per_core_s": text * dupe / 1e6 / c["make-instances"],  # text MB x passes
        "input_bytes_per_document": one["input_bytes"] / one["part_rows"],
        "text_per_input": text / one["input_bytes"],
        "instance_bytes_per_text_byte_per_pass": one["instance_bytes"] / text / dupe,
    }


def project(rates, overhead_s, nodes, cores, args):
    """Seconds per phase for 1 TB of input on nodes x cores; the phases of a stage run one after the other."""
    cpus = nodes * cores
    text = TB * rates["text_per_input"]
    docs = TB / rates["input_bytes_per_document"]
    fs, client = args.fs_gbs * 1e9, args.client_gbs * 1e9
    input_files, units = TB / (args.file_mb * 1e6), math.ceil(text / (16 << 20)) * args.dupe
    partitions = math.ceil(docs / 4_000_000)

    def parallel(cpu_s, io_bytes, tasks):  # spread over the cluster, or the file system's aggregate bandwidth
        return max(cpu_s / cpus + tasks * overhead_s / cpus, io_bytes / fs)

    phases = {
        "prepare-corpus": {
            "files (clean, split, write parts)": parallel(TB / 1e6 / rates["corpus_files_mb_per_core_s"],
                                                          TB + text, input_files),
            "dedup": math.ceil(partitions / cpus) * docs / rates["dedup_ids_per_s"],
            "driver merge": max(text / 1e6 / rates["merge_mb_per_s"], 2 * text / client),
        },
        "train-tokenizer (all text)": {
            "alphabet (per shard)": parallel(text / 1e6 / rates["alphabet_mb_per_core_s"], text,
                                             math.ceil(text / (64 << 20))),
            "driver trainer": text / 1e6 / rates["trainer_mb_per_s"],
        },
        f"train-tokenizer (--sample-bytes {args.sample_gb:g}GB)": {
            "alphabet (per shard)": parallel(text / 1e6 / rates["alphabet_mb_per_core_s"], text,
                                             math.ceil(text / (64 << 20))),
            "driver trainer": max(args.sample_gb * 1e9 / 1e6 / rates["trainer_mb_per_s"], text / client),
        },
        f"make-instances (dupe {args.dupe})": {
            "units": parallel(text * args.dupe / 1e6 / rates["instances_mb_per_core_s"],
                              text + text * args.dupe * rates["instance_bytes_per_text_byte_per_pass"], units),
        },
    }
    out = {}
    for stage, parts in phases.items():
        total = sum(parts.values())
        bound = max(parts, key=parts.get)
        out[stage] = {"hours": round(total / 3600, 2), "bound": bound,
                      "phases_hours": {k: round(v / 3600, 3) for k, v in parts.items()}}
    return {"nodes": nodes, "cores_per_node": cores, "dedup_partitions": partitions, "stages": out}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        data, out, engine, workers, address, vocab, dupe = sys.argv[2:9]
        return child(data, out, engine, int(workers), address, int(vocab), int(dupe))
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default=str(SHARED))
    ap.add_argument("--vocab-size", type=int, default=30522)
    ap.add_argument("--dupe", type=int, default=1, help="make-instances passes (MB/s is per pass)")
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--cores", type=int, default=32)
    ap.add_argument("--fs-gbs", type=float, default=20.0, help="shared file system, aggregate GB/s (assumed)")
    ap.add_argument("--client-gbs", type=float, default=1.0, help="one client's (the driver's) GB/s (assumed)")
    ap.add_argument("--file-mb", type=float, default=100.0, help="input file size for 1 TB (tasks), MB (assumed)")
    ap.add_argument("--sample-gb", type=float, default=10.0, help="--sample-bytes of the projection, GB")
    args = ap.parse_args()
    if len(list((Path(args.data) / "wikipedia_en_wikiextractor" / "text" / "AA").glob("wiki_*"))) != 20:
        sys.exit(f"expected the 20-file English sample under {args.data}")
    results = [run(args.data, engine, n, args) for engine, n in (("local", 1), ("local", 2), ("ray", 1),
                                                                  ("ray", 2))]
    rows = stage_rows(results)
    print(f"{'config':<22} {'prepare-corpus: s, MB/s, CPU s':>32} {'train-tokenizer':>28} "
          f"{'make-instances':>26} {'load':>5}")
    for r in rows:
        c = r["cpu_s"]
        print(f"{r['config']:<22} {r['prepare_corpus_s']:>8} {r['prepare_corpus_mb_s']:>8} "
              f"{c['prepare-corpus']:>8}      {r['train_tokenizer_s']:>8} {r['train_tokenizer_mb_s']:>8} "
              f"{c['train-tokenizer']:>8}  {r['make_instances_s']:>8} {r['make_instances_mb_s']:>8} "
              f"{c['make-instances']:>8} {r['load_average_1min']:>5}")
    ray1 = next(r for r in results if r["engine"] == "ray" and r["processes"] == 1)
    per_task = ray1["overhead"]["seconds"] / ray1["overhead"]["tasks"]
    by = {(r["engine"], r["processes"]): r for r in results}
    per_stage = {f"{n} CPU(s)": {stage: {key: round(by["ray", n][key][stage] - by["local", n][key][stage], 2)
                                         for key in ("seconds", "cpu_seconds")}
                                 for stage in by["ray", n]["seconds"]} for n in (1, 2)}
    overhead = {"per_task_ms": round(per_task * 1000, 2), "connect_s": round(ray1["overhead"]["connect_s"], 2),
                "per_stage (ray minus local, same CPUs: wall s, CPU s)": per_stage}
    print(f"Ray: {overhead['per_task_ms']} ms per task (a no-op task, one CPU), {overhead['connect_s']} s to connect;"
          f" per stage, Ray minus local (wall s, CPU s): {per_stage}")
    ids_per_s = dedup_rate()
    print(f"one dedup task: {ids_per_s / 1e6:.1f} M ids per CPU-second")
    # the merge is the same driver code in every configuration, and short: the median of the four runs
    merge_cpu_s = sorted(r["phases_cpu"]["corpus_merge"] for r in results)[len(results) // 2]
    rates = per_core_rates(by["local", 1], args.dupe, ids_per_s, merge_cpu_s)
    projections = [project(rates, per_task, n, args.cores, args) for n in args.nodes]
    print(f"\n1 TB of input, {args.cores} cores per node (per-core rates from 'local 1'; shared file system "
          f"{args.fs_gbs:g} GB/s aggregate, {args.client_gbs:g} GB/s per client):")
    for p in projections:
        for stage, v in p["stages"].items():
            print(f"  {p['nodes']:>3} nodes  {stage:<36} {v['hours']:>8} h   bound: {v['bound']}")
    write_result("scale_out", {
        **run_info("scale_out"),
        "input": "wikipedia_en_wikiextractor text/AA/wiki_00..19 (20.5 MB), prepare-corpus --shard-size 2MB, "
                 f"train-tokenizer --vocab-size {args.vocab_size}, make-instances --dupe {args.dupe} "
                 "--max-seq-length 128",
        "ray_cluster": "`ray start` processes on 127.0.0.1 of this machine, one CPU each",
        "results": rows, "raw": results, "ray_overhead": overhead,
        "per_core_rates": {k: round(v, 4) for k, v in rates.items()},
        "assumptions": {"fs_aggregate_gb_s": args.fs_gbs, "client_gb_s": args.client_gbs,
                        "input_file_mb": args.file_mb, "sample_gb": args.sample_gb,
                        "note": "trainer rate measured with tokenizers' threads on this 2-core machine"},
        "projection_1tb": projections})


if __name__ == "__main__":
    main()
