"""What the studies share, written once (issue 84: a study imports this and record.py, never another study): where
the shared data is, a timestamped line, whether a stage's folder is finished, a stop where a pretraining run
returned short of its steps, and the masked-token score of an export on held-out rows, a step's median time, a
synthetic batch."""
import os
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("BERTKIT_SHARED_DATA", REPO.parent / "shared" / "data"))


def say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def done(path: Path) -> bool:
    return (path / "manifest.json").is_file() or (path / "metrics.json").is_file()


def trained_to_the_end(result: dict, steps: int, run: Path) -> None:
    """Stops the study where pretrain() returned before `steps` (a signal saves the run and returns): exporting then
    would score a model cut short."""
    if result["step"] < steps:
        raise SystemExit(f"{run.name} stopped at step {result['step']} of {steps}; run the study again to resume")


def masked_only_accuracy(model_dir: Path, instances: Path, rows: int = 400, seed: int = 0,
                         split: str = "holdout") -> dict:
    """The held-out MLM accuracy that training reports counts the 10% of chosen tokens left unchanged, which a model
    predicts by copying; here every chosen token is [MASK] (15% of each row), against the unigram baseline (always
    the most frequent token): the number that says whether pretraining has left the unigram plateau. "loss" is the
    mean cross-entropy there (nats), which moves before the accuracy does."""
    import numpy as np
    import torch

    from bertkit.fileio import read_arrow
    from bertkit.models import load_pretrained
    from bertkit.tokenization import load_tokenizer

    model = load_pretrained(model_dir, head="pretraining").eval()
    tok = load_tokenizer(model_dir)
    special = {tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]")}
    from bertkit.formats import read_instances_manifest

    table = read_arrow(instances / read_instances_manifest(instances).shard_files(split)[0])
    ids_rows = table.column("input_ids").to_pylist()[:rows]
    b_starts = table.column("b_start").to_pylist()[:rows] if "b_start" in table.column_names else [0] * rows
    counts = {}
    for ids in ids_rows:
        for i in ids:
            if i not in special:
                counts[i] = counts.get(i, 0) + 1
    top = max(counts, key=counts.get)
    rng = np.random.default_rng(seed)
    hit = top_hit = total = 0
    loss = 0.0
    with torch.no_grad():
        for ids, b in zip(ids_rows, b_starts):
            ids = torch.tensor(ids)
            candidates = [i for i, t in enumerate(ids.tolist()) if t not in special]
            pos = torch.tensor(sorted(rng.choice(candidates, max(1, round(0.15 * len(ids))), replace=False)))
            x = ids.clone()
            x[pos] = tok.token_to_id("[MASK]")
            types = (torch.arange(len(ids)) >= b).long() if b else torch.zeros_like(ids)
            logits = model(x[None], types[None], mlm_positions=pos[None]).mlm_logits[0]
            hit += (logits.argmax(-1) == ids[pos]).sum().item()
            loss += torch.nn.functional.cross_entropy(logits, ids[pos], reduction="sum").item()
            top_hit += (ids[pos] == top).sum().item()
            total += len(pos)
    return {"masked_only_acc": hit / total, "loss": loss / total, "unigram_acc": top_hit / total,
            "unigram_token": tok.id_to_token(top), "positions": total}


def time_steps(step, steps: int, device: str) -> float:
    """The median seconds of `steps` calls of step() after one warm-up call (a GPU synchronised around each)."""
    import statistics

    import torch

    step()  # warm-up (and Triton's compiles)
    times = []
    for _ in range(steps):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def make_batch(batch: int, seq: int, vocab: int, seed: int = 0):
    """A collated synthetic MLM+NSP batch: rows of seq-8..seq tokens (a tenth shorter), 15 % masked."""
    import numpy as np

    from bertkit.data import collate

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(batch):
        n = int(rng.integers(seq - 8, seq + 1)) if rng.random() < 0.9 else int(rng.integers(8, seq + 1))
        ids = rng.integers(5, vocab, size=n)
        ids[0], ids[-1], b = 2, 3, n // 2
        ids[b - 1] = 3
        k = min(max(1, round(n * 0.15)), max(1, seq * 20 // 128))
        pos = np.sort(rng.choice(np.arange(1, n - 1), size=k, replace=False))
        labels = ids[pos].copy()
        ids[pos] = 4
        tt = np.zeros(n, dtype=np.int64)
        tt[b:] = 1
        rows.append({"input_ids": ids, "token_type_ids": tt, "mlm_positions": pos, "mlm_labels": labels,
                     "next_sentence_label": int(rng.integers(0, 2))})
    return collate(rows)
