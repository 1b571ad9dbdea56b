"""The data stages at scale: prepare-corpus, train-tokenizer and make-instances on a made corpus of N GB, Korean
(the Korean default vocabulary: kiwi morpheme pre-splitting) and English (plain WordPiece).

  python benchmarks/studies/scale.py [--sizes 0.1 1 4] [--langs ko en] [--work DIR] [--report]

The corpus is MADE, not collected: real paragraphs of ../shared/data (Korean: the two Korean Wikipedia extracts
and boddari; English: the English Wikipedia sample and Gutenberg) resampled, with a seeded generator, into new
documents of 4 to 12 paragraphs, written as JSON Lines until the size is reached. Every document is a new
combination, so prepare-corpus's exact deduplication keeps them (the kept count is recorded); the vocabulary and
the text statistics are those of the source, repeated, so a larger size adds volume, not variety.

Each stage runs as its own process (`bertkit STAGE`, default flags; make-instances --mode dynamic, one pass) with
its process tree sampled every half second: wall and CPU seconds, the peak RSS of the largest process and of all
of them together, bytes written, and MB of text per second per core. A (language, size, stage) that finished is
never run again: results are appended to benchmarks/results/scale.json as each finishes, so a killed run resumes.
Run the large sizes alone on the machine: every row records the load average.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
import psutil
from benchlib import SHARED
from record import read_result, run_info, write_result

REPO = Path(__file__).resolve().parents[2]
DATA = SHARED
BIN = Path(sys.executable).parent
GB = 1e9
SOURCES = {"ko": ["wikipedia_ko_wikiextractor", "wikipedia_ko_wikiextractor_more", "boddari"],
           "en": ["wikipedia_en_wikiextractor", "gutenberg"]}
STAGES = ("prepare-corpus", "train-tokenizer", "make-instances")
CLEANED = "prepare-corpus, cleaned"   # --cleaned: with all four cleaning steps (issue 82)
OUTPUT = {"prepare-corpus": "corpus", "train-tokenizer": "tokenizer", "make-instances": "instances",
          CLEANED: "corpus-cleaned"}
EVALUATION = {"ko": DATA / "korquad_v1.0" / "KorQuAD_v1.0_dev.json", "en": DATA / "squad_v1.1" / "dev-v1.1.json"}


# ---------------------------------------------------------------- the made corpus

def paragraphs(lang: str) -> list[str]:
    """Every paragraph of at least 80 characters in the language's source folders (WikiExtractor markup and titles
    dropped), in a fixed order."""
    found = []
    for folder in SOURCES[lang]:
        for path in sorted(p for p in (DATA / folder).rglob("*") if p.is_file() and p.suffix in ("", ".txt")):
            if path.name in ("README.md", "SOURCE.md", "LICENSE"):
                continue
            text = path.read_text(encoding="utf-8", errors="ignore")
            blocks = text.split("\n") if "<doc " in text else text.split("\n\n")
            found += [b.strip().replace("\n", " ") for b in blocks
                      if len(b.strip()) >= 80 and not b.lstrip().startswith(("<doc", "</doc"))]
    return found


def make_corpus(lang: str, gb: float, folder: Path, seed: int = 0) -> dict:
    """JSON Lines files of new documents (4-12 random paragraphs each) until gb of text; kept when already made."""
    done = folder / "made.json"
    if done.is_file():
        return json.loads(done.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    pool, rng = paragraphs(lang), random.Random(seed)
    target, written, docs, part = gb * GB, 0, 0, 0
    while written < target:
        with open(folder / f"part-{part:05d}.jsonl", "w", encoding="utf-8") as f:
            start = written
            while written < target and written - start < 64e6:
                text = "\n".join(rng.choice(pool) for _ in range(rng.randint(4, 12)))
                f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
                written, docs = written + len(text.encode()), docs + 1
        part += 1
    made = {"language": lang, "gb": gb, "text_bytes": written, "documents": docs, "files": part,
            "source_paragraphs": len(pool), "seed": seed}
    done.write_text(json.dumps(made))
    return made


# ---------------------------------------------------------------- one stage, measured

class TreeSampler(threading.Thread):
    """Peak RSS of the largest process and of the whole tree under `pid`, every half second; and the same for the
    private part (RSS less file-backed pages: memory-mapped Arrow files count in RSS, but the kernel drops those
    pages under pressure, and every process mapping a shard counts it again)."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.root, self.stop = psutil.Process(pid), threading.Event()
        self.largest = self.total = self.private_largest = self.private_total = 0

    def run(self):
        while not self.stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
                mem = [p.memory_info() for p in procs if p.is_running()]
            except psutil.Error:
                mem = []
            if mem:
                rss, private = [m.rss for m in mem], [m.rss - m.shared for m in mem]
                self.largest, self.total = max(self.largest, max(rss)), max(self.total, sum(rss))
                self.private_largest = max(self.private_largest, max(private))
                self.private_total = max(self.private_total, sum(private))
            self.stop.wait(0.5)


def du(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def stage_command(stage: str, work: Path, engine: list[str] = ()) -> list[str]:
    bertkit = [str(BIN / "bertkit")]
    if stage == CLEANED:
        return bertkit + ["prepare-corpus", str(work / "input"), "--out", str(work / OUTPUT[stage]), "--no-progress",
                          "--near-dedup", "--filters", "fineweb2", "--pii", "redact", "--decontaminate",
                          str(EVALUATION[work.name.split("-")[0]]), *engine]
    if stage == "prepare-corpus":
        return bertkit + ["prepare-corpus", str(work / "input"), "--out", str(work / "corpus"), "--no-progress",
                          *engine]
    if stage == "train-tokenizer":
        return bertkit + ["train-tokenizer", str(work / "corpus"), "--out", str(work / "tokenizer"), "--no-progress",
                          *engine]
    return bertkit + ["make-instances", str(work / "corpus"), "--tokenizer", str(work / "tokenizer"), "--out",
                      str(work / "instances"), "--mode", "dynamic", "--no-progress", *engine]


def measure(stage: str, work: Path, text_bytes: int, engine: list[str] = (), cluster=None) -> dict:
    """One stage as its own process; `cluster` (bertkit.testing.SessionCPU) adds the CPU of a Ray cluster's
    processes."""
    out = work / OUTPUT[stage]
    resumed = out.exists()  # a killed run's partial output: this time is only the rest of the work
    parts_before = len(list((out / ".parts").glob("*.json"))) if resumed else 0
    log = open(work / f"{stage}.log", "a")
    before, cluster_before = os.times(), cluster.total() if cluster else 0.0
    t = time.perf_counter()
    proc = subprocess.Popen(stage_command(stage, work, engine), stdout=log, stderr=subprocess.STDOUT)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    code = proc.wait()
    seconds = time.perf_counter() - t
    sampler.stop.set()
    sampler.join()
    after = os.times()
    if code != 0:
        raise SystemExit(f"{stage} failed (exit {code}); see {work / f'{stage}.log'}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    if cluster:
        cpu += cluster.total() - cluster_before
    mb = text_bytes / 1e6
    return {"stage": stage, "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
            "peak_rss_largest_mb": round(sampler.largest / 2**20), "peak_rss_all_mb": round(sampler.total / 2**20),
            "peak_private_largest_mb": round(sampler.private_largest / 2**20),
            "peak_private_all_mb": round(sampler.private_total / 2**20),
            "bytes_written": du(out), "mb_per_s_per_core": round(mb / cpu, 2) if cpu else None,
            "load_average_1min": round(os.getloadavg()[0], 2), "resumed": resumed,
            **({"parts_done_before": parts_before, "parts": len(list((out / ".parts").glob("*.json")))}
               if resumed and stage == "make-instances" else {})}


# ---------------------------------------------------------------- the pretraining loader

# recorded GPU steps the loader must keep fed (sequences per second on one H200 at 128 tokens)
H200_SEQ_PER_S = {"bert-base": 4786}


def loader_child(instances: str, unpadded: bool, micro_batch: int, token_budget: int | None, seconds: float):
    """In its own process, on one thread: batches of pretrain's data path (dynamic masking, collate or pack) for
    `seconds`; prints sequences, tokens and CPU seconds as JSON."""
    import torch

    torch.set_num_threads(1)
    from bertkit.data import EpochBatches, InstanceDataset, TokenBudgetBatches, batch_loader

    train = InstanceDataset(instances, "train", 0)
    sampler = TokenBudgetBatches(train.lengths(), token_budget, 0, 0, 1) if token_budget else \
        EpochBatches(len(train), micro_batch, 0, 0, 1)
    batches = iter(batch_loader(train, sampler, 0, unpadded=unpadded))
    next(batches)  # warm: the first batch maps the files
    sequences = tokens = 0
    start, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        batch = next(batches)
        sequences += int(batch["cu_seqlens"].numel() - 1) if "cu_seqlens" in batch else batch["input_ids"].shape[0]
        tokens += int(batch["input_ids"].numel()) if "cu_seqlens" in batch else int(batch["attention_mask"].sum())
    print(json.dumps({"sequences": sequences, "tokens": tokens, "cpu_seconds": time.process_time() - cpu0}))


def measure_loader(work: Path, seq: int, rows: list) -> None:
    """Instances of `seq` tokens (MLM only, dynamic) from the corpus in `work`, then the loader's rate per core:
    padded and packed micro batches of sequences, and packed --token-budget batches."""
    inst = work / f"instances-{seq}"
    if not (inst / "manifest.json").is_file():
        subprocess.run([str(BIN / "bertkit"), "make-instances", str(work / "corpus"), "--tokenizer",
                        str(work / "tokenizer"), "--out", str(inst), "--max-seq-length", str(seq), "--objective",
                        "none", "--mode", "dynamic", "--no-progress"], check=True, capture_output=True)
    micro = max(1, 32768 // seq)
    for name, unpadded, budget in (("padded", False, None), ("packed", True, None), ("token-budget", True, 8 * seq)):
        out = subprocess.run([sys.executable, __file__, "--loader-child", str(inst), str(int(unpadded)), str(micro),
                              str(budget or 0), "20"], check=True, capture_output=True, text=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        row = {"seq": seq, "batches": name, "micro_batch": None if budget else micro, "token_budget": budget,
               "sequences_per_s_per_core": round(r["sequences"] / r["cpu_seconds"], 1),
               "tokens_per_s_per_core": round(r["tokens"] / r["cpu_seconds"]),
               "load_average_1min": round(os.getloadavg()[0], 2)}
        if seq == 128:
            row["cores_to_feed_h200_bert_base"] = round(H200_SEQ_PER_S["bert-base"] / row["sequences_per_s_per_core"],
                                                        2)
        print(row, flush=True)
        rows.append(row)


# ---------------------------------------------------------------- train-tokenizer's two parts

def measure_alphabet(work: Path, shards: int = 6) -> dict:
    """train-tokenizer's per-GB part alone: the alphabet pass over `shards` training shards of the corpus in `work`
    (one process, --sample-bytes bucket counts included), in CPU seconds per GB of text; the rest of the stage
    (the trainer on its sample) is a fixed cost once the corpus is larger than the sample."""
    from bertkit.formats import corpus_shards
    from bertkit.pipelines.train_tokenizer import TokenizerConfig, scan_shard
    from bertkit.testing import text_bytes

    corpus = work if (work / "manifest.json").is_file() else work / "corpus"   # a corpus, or a size's folder
    paths = corpus_shards(corpus, "train")[:shards]
    options = {**TokenizerConfig().__dict__, "sample_bytes": 1, "strip_accents": "latin"}  # as resolved
    text = text_bytes(corpus, "train", shards)
    before = time.process_time()
    for p in paths:
        scan_shard(str(p), options, None, True)
    cpu = time.process_time() - before
    return {"corpus": work.name, "shards": len(paths), "text_bytes": text, "cpu_seconds": round(cpu, 1),
            "cpu_s_per_gb": round(cpu / (text / GB), 1), "mb_per_s_per_core": round(text / 1e6 / cpu, 1),
            "load_average_1min": round(os.getloadavg()[0], 2), "date": time.strftime("%Y-%m-%d %H:%M"),
            "commit": run_info("scale")["commit"]}


# ---------------------------------------------------------------- the same size on a Ray cluster

def same_files(a: Path, b: Path) -> list[str]:
    """Names of the output files (manifest and hidden files aside) that differ between two stage folders."""
    from bertkit.testing import stage_outputs

    ours, theirs = stage_outputs(a), stage_outputs(b)
    return sorted(n for n in ours.keys() | theirs.keys() if ours.get(n) != theirs.get(n))


def measure_ray(work: Path, nodes: int, made: dict) -> list:
    """The three stages of `work`'s size again with --engine local (into work/local) and --engine ray on a cluster
    of `nodes` one-CPU `ray start` nodes on 127.0.0.1 (into work/ray-N), in turn; each Ray output compared with
    the local one byte for byte."""
    import tempfile

    from bertkit.testing import SessionCPU, start_ray_cluster, stop_ray_cluster

    rows = []
    for name in ("local", f"ray-{nodes}"):
        root = work / name
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        (root / "input").symlink_to(work / "input")
        temp = tempfile.mkdtemp(prefix="bkscale", dir="/tmp")  # Ray's socket paths must stay short
        address, procs = start_ray_cluster(nodes, temp, object_store_mb=200) if name != "local" else ("", [])
        try:
            cluster = SessionCPU({p.pid for p in procs}) if procs else None
            for stage in STAGES:
                print(f"{work.name} {name}: {stage} ...", flush=True)
                engine = ["--engine", "ray", "--ray-address", address] if procs else []
                row = {"config": name, **measure(stage, root, made["text_bytes"], engine, cluster),
                       "commit": run_info("scale")["commit"], "date": time.strftime("%Y-%m-%d %H:%M")}
                if procs:
                    row["differing_files"] = same_files(root / OUTPUT[stage], work / "local" / OUTPUT[stage])
                print(row, flush=True)
                rows.append(row)
        finally:
            stop_ray_cluster(procs, temp)
    return rows


# ---------------------------------------------------------------- the table

def rows_of(result: dict, lang: str, gb: float, stage: str) -> list:
    return [r for r in result["rows"] if r["language"] == lang and r["gb"] == gb and r["stage"] == stage]


def table(rows: list) -> None:
    base = {(r["language"], r["stage"]): r for r in rows if r["gb"] == 1}
    print(f"{'lang':>4} {'GB':>5} {'stage':>16} {'wall s':>8} {'CPU s':>8} {'MB/s/core':>9} {'CPU s/GB':>9} "
          f"{'vs 1GB':>6} {'RSS max MB':>10} {'RSS all MB':>10} {'private max':>11} {'written MB':>10} {'load':>5}")
    for r in sorted(rows, key=lambda r: (r["language"], r["gb"], (*STAGES, CLEANED).index(r["stage"]))):
        per_gb = r["cpu_seconds"] / (r["text_bytes"] / GB)
        one = base.get((r["language"], r["stage"]))
        ratio = f"{per_gb / (one['cpu_seconds'] / (one['text_bytes'] / GB)):.2f}" if one else "-"
        stage = r["stage"] + (" (resumed)" if r.get("resumed") else "")
        print(f"{r['language']:>4} {r['gb']:>5} {stage:>16} {r['seconds']:>8} {r['cpu_seconds']:>8} "
              f"{str(r['mb_per_s_per_core']):>9} {per_gb:>9.0f} {ratio:>6} {r['peak_rss_largest_mb']:>10} "
              f"{r['peak_rss_all_mb']:>10} {str(r.get('peak_private_largest_mb', '-')):>11} "
              f"{r['bytes_written'] / 1e6:>10.0f} {r['load_average_1min']:>5}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=float, nargs="+", default=[0.1, 1, 4])
    ap.add_argument("--langs", nargs="+", default=["en", "ko"], choices=list(SOURCES))
    ap.add_argument("--work", type=Path, default=REPO / "bench_scale", help="where the corpora and outputs go")
    ap.add_argument("--report", action="store_true", help="print the table of what has finished; run nothing")
    ap.add_argument("--cleaned", action="store_true", help="measure prepare-corpus with --near-dedup, --filters "
                    "fineweb2, --pii redact and --decontaminate (KorQuAD / SQuAD dev) beside it; nothing else")
    ap.add_argument("--redo", choices=(*STAGES, CLEANED), help="measure this stage again at --sizes/--langs from "
                    "scratch (its output removed; the earlier rows kept under earlier_rows)")
    ap.add_argument("--result", default="scale", help="results/NAME.json (another name for a trial run)")
    ap.add_argument("--alphabet", type=Path, nargs="+", help="measure train-tokenizer's alphabet pass alone on "
                                                               "these sizes' folders (bench_scale/ko-4gb) or corpora")
    ap.add_argument("--loader", type=Path, help="measure pretrain's loader on this finished size's folder (e.g. "
                                                "bench_scale/en-0.1gb) instead of the data stages")
    ap.add_argument("--ray", type=int, metavar="NODES", help="run one --sizes/--langs again locally and on a Ray "
                                                            "cluster of NODES one-CPU nodes here; compare the bytes")
    if len(sys.argv) > 1 and sys.argv[1] == "--loader-child":
        a = sys.argv[2:]
        return loader_child(a[0], a[1] == "1", int(a[2]), int(a[3]) or None, float(a[4]))
    args = ap.parse_args()
    result = read_result(args.result) or {**run_info("scale"), "rows": []}
    if args.alphabet:
        result["alphabet_pass"] = [measure_alphabet(work) for work in args.alphabet]
        print(result["alphabet_pass"])
        write_result(args.result, result)
        return
    if args.ray:
        (gb,), (lang,) = args.sizes, args.langs
        work = args.work / f"{lang}-{gb:g}gb"
        result[f"ray_{lang}_{gb:g}gb"] = measure_ray(work, args.ray, make_corpus(lang, gb, work / "input"))
        write_result(args.result, result)
        return
    if args.loader:
        result["loader"] = []
        for seq in (128, 1024, 8192):
            measure_loader(args.loader, seq, result["loader"])
        result["loader_corpus"] = str(args.loader.name)
        write_result(args.result, result)
        return
    if not args.report:
        for gb in args.sizes:
            for lang in args.langs:
                work = args.work / f"{lang}-{gb:g}gb"
                made = make_corpus(lang, gb, work / "input")
                for stage in ("prepare-corpus", CLEANED) if args.cleaned else STAGES:
                    commit = run_info("scale")["commit"]  # a redo is done once per commit (a killed one resumes)
                    if stage == args.redo and not any(r.get("redone") == commit
                                                       for r in rows_of(result, lang, gb, stage)):
                        result.setdefault("earlier_rows", []).extend(rows_of(result, lang, gb, stage))
                        result["rows"] = [r for r in result["rows"] if r not in rows_of(result, lang, gb, stage)]
                        shutil.rmtree(work / OUTPUT[stage], ignore_errors=True)
                    if any(r["language"] == lang and r["gb"] == gb and r["stage"] == stage for r in result["rows"]):
                        continue  # finished in an earlier run
                    print(f"{lang} {gb:g} GB: {stage} ...", flush=True)
                    row = {"language": lang, "gb": gb, "text_bytes": made["text_bytes"],
                           "documents_made": made["documents"], **measure(stage, work, made["text_bytes"]),
                           "commit": run_info("scale")["commit"], "date": time.strftime("%Y-%m-%d %H:%M")}
                    row["redone"] = commit if stage == args.redo else False
                    if stage in ("prepare-corpus", CLEANED):
                        manifest = json.loads((work / OUTPUT[stage] / "manifest.json").read_text())
                        row["documents_kept"] = manifest["totals"]["documents"]
                        row["dropped"] = manifest.get("dropped")
                    result["rows"].append(row)
                    write_result(args.result, result)
    table(result["rows"])


if __name__ == "__main__":
    main()
