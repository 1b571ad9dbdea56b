"""Does the loader keep a GPU fed? Rows a second that one core of bertkit's pretraining loader gives (reading the
Arrow rows, masking them dynamically at 30 %, collating padded or packed micro batches of 32), from one instance
folder and from a 0.7 / 0.3 mixture of two, against the fastest BERT-base step rates recorded on a lent H200
(benchmarks/results/h200-*/pretrain_step-cuda-*.json): the cores of loader workers (--num-workers) that step needs.

    python benchmarks/gates/mixture_loader.py [--batches 300]   # prints the table, writes results/mixture_loader.json

Synthetic folders (bertkit.testing.make_instances_dir: rows of 12 tokens to the length, uniformly, so about half full;
tokens a second is the figure that carries to real rows); one process, so the rate is one core's. Time it alone on
the machine.
"""
import argparse
import glob
import json
import tempfile
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from record import run_info, write_result

REPO = Path(__file__).resolve().parents[2]


def recorded_step_rates() -> dict:
    """{length: (sequences a second, which run)}: the fastest BERT-base step recorded on an H200, any backend."""
    best = {}
    for path in sorted(glob.glob(str(REPO / "benchmarks/results/h200-*/pretrain_step-cuda-*.json"))):
        for row in json.loads(Path(path).read_text()).get("results", []):
            if row.get("config") == "base" and row.get("seq_per_s", 0) > best.get(row["seq"], (0,))[0]:
                best[row["seq"]] = (row["seq_per_s"], f"{row['impl']}, {Path(path).parent.name}")
    return best


def rows_per_s(train, batches: int, unpadded: bool) -> tuple[float, float]:
    """(rows, tokens) a second over `batches` micro batches of 32 after 20 unmeasured."""
    from bertkit.data import EpochBatches, batch_loader

    loader = iter(batch_loader(train, EpochBatches(len(train), 32, 0, 0, 1), 0, unpadded=unpadded))
    for _ in range(20):
        next(loader)
    rows = tokens = 0
    start = time.perf_counter()
    for _ in range(batches):
        batch = next(loader)
        rows += 32
        tokens += int(batch["attention_mask"].sum()) if "attention_mask" in batch else int(batch["input_ids"].numel())
    elapsed = time.perf_counter() - start
    return rows / elapsed, tokens / elapsed


def data(root: Path, length: int, mixed: bool):
    from bertkit.data import InstanceDataset
    from bertkit.mixture import open_mixture, parse_mixture
    from bertkit.testing import make_instances_dir

    folders = [root / f"a{length}", root / f"b{length}"]
    for seed, folder in enumerate(folders):
        if not folder.is_dir():
            make_instances_dir(folder, n=4000, holdout=8, max_len=length, seed=seed, rows_per_shard=1000,
                               max_predictions=round(0.3 * length) + 2)
    train = open_mixture(parse_mixture([f"{folders[0]}=0.7", f"{folders[1]}=0.3"]), None, 0)[0] if mixed else \
        InstanceDataset(folders[0], "train", 0)
    for dataset in getattr(train, "datasets", [train]):
        dataset.masked_at(0.3)
    return train


def main(argv=None):
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=300)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    header, steps, rows = run_info("mixture_loader"), recorded_step_rates(), []
    print(f"{'length':>6} {'data':>12} {'layout':>7} {'rows/s':>8} {'tokens/s':>9} {'H200 step seq/s':>16} "
          f"{'cores':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for length in (128, 512):
            for mixed in (False, True):
                train = data(Path(tmp), length, mixed)
                for unpadded in (False, True):
                    rate, tokens = rows_per_s(train, args.batches, unpadded)
                    step, which = steps.get(length, (None, None))
                    row = {"length": length, "data": "mixture 0.7/0.3" if mixed else "one folder",
                           "layout": "packed" if unpadded else "padded", "rows_per_s": round(rate, 1),
                           "tokens_per_s": round(tokens), "h200_step_seq_per_s": step and round(step),
                           "h200_step": which, "cores_for_h200": step and round(step / rate, 2)}
                    rows.append(row)
                    print(f"{length:>6} {row['data']:>12} {row['layout']:>7} {rate:>8.0f} {tokens:>9.0f} "
                          f"{row['h200_step_seq_per_s'] or '-':>16} {row['cores_for_h200'] or '-':>6}")
    print(write_result("mixture_loader", {**header, "batches": args.batches, "micro_batch": 32,
                                          "masked_lm_prob": 0.3, "results": rows}))


if __name__ == "__main__":
    main()
