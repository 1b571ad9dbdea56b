"""Peak memory of `finetune`, padded against packed (a benchmark; issue 42).

The parity grid (finetune_parity.py) found packed fine-tuning of all-MiniLM-L6-v2 peaking at up to 1.9x the padded
run's memory (RTE 4.9 GB against 2.6). The cause was glibc's heap, not the model: a packed batch had a new token
count every step, so every activation had a new size, and freed blocks of one size rarely fitted the next. Since
then a packed batch is rounded up to one of a few sizes (bertkit.finetune.train.packed_size, at most a sixteenth
more tokens). This measures, each cell in its own process (ru_maxrss), on the parity grid's data and settings for a
part of an epoch, seed 42:

    padded        --padded: each batch padded to its longest row
    packed-exact  packed, the token count as it falls (packed_size switched off: the code before the rounding)
    packed        packed, rounded (finetune's default)

    python benchmarks/studies/finetune_memory.py                       # rte, mrpc, sst2, squad: every mode
    python benchmarks/studies/finetune_memory.py --tasks rte --epochs 3 --modes packed    # the parity grid's whole run

Seconds are recorded with the load average beside them; they are a timing only where the load stayed near 2 with
this benchmark alone.
"""
import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from record import RESULTS, cell_in_own_process, run_info, write_result

MODES = ("padded", "packed-exact", "packed")


def cell(task: str, mode: str, epochs: float, work: Path) -> dict:
    import finetune_tasks

    from bertkit.finetune import train

    if mode == "packed-exact":
        train.packed_size = lambda tokens: tokens
    finetune_tasks.TASKS[task] = {**finetune_tasks.TASKS[task], "epochs": epochs}
    t0 = time.perf_counter()
    scores = finetune_tasks.run_bertkit(task, 42, work, {"unpadded": mode != "padded"})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": time.perf_counter() - t0, "peak_rss_mb": peak, "scores": scores}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="rte,mrpc,sst2,squad")
    ap.add_argument("--epochs", type=float, default=0.5)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bertkit-finetune-parity")
    ap.add_argument("--cell", nargs=2, metavar=("TASK", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.cell:
        print("CELL " + json.dumps(cell(*args.cell, args.epochs, args.work)), flush=True)
        return
    path = RESULTS / "finetune_memory.json"  # cells of earlier runs are kept (task/mode/epochs)
    result = {**run_info("finetune_memory"), "cells": json.loads(path.read_text())["cells"] if path.is_file() else {}}
    print(f"{'task':<8} {'mode':<13} {'peak MB':>8} {'seconds':>8}  load")
    for task in args.tasks.split(","):
        for mode in args.modes.split(","):
            got = cell_in_own_process(__file__, [task, mode, "--epochs", args.epochs, "--work", args.work])
            info = run_info("finetune_memory")
            got.update({k: info[k] for k in ("date", "commit", "load_average_1_5_15min")})
            result["cells"][f"{task}/{mode}/{args.epochs:g}"] = got
            print(f"{task:<8} {mode:<13} {got['peak_rss_mb']:>8.0f} {got['seconds']:>8.0f}  "
                  f"{got['load_average_1_5_15min']}", flush=True)
            write_result("finetune_memory", result)


if __name__ == "__main__":
    main()
