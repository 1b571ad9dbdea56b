"""`bertkit finetune embed`: a model folder trained as a bi-encoder with in-batch negatives, in the pretraining
loop's shape (step -> log -> checkpoint), saved as a sentence-transformers folder, then scored when asked."""
import json
import logging
import math
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from bertkit.embeddings.encoder import EncoderConfig, SentenceEncoder
from bertkit.embeddings.loss import cached_step
from bertkit.errors import DataError
from bertkit.fileio import atomic_write_json, file_entry, folder_lock
from bertkit.finetune.train import pick_device, rate_for_width, set_seed
from bertkit.precision import autocast, resolve
from bertkit.progress import tqdm

log = logging.getLogger("bertkit.embeddings")
STAGE = "finetune-embed"
CHECKPOINT = "checkpoint"   # OUT/checkpoint/: weights, optimizer, step; removed when the run ends


@dataclass
class EmbedConfig:
    out_dir: str
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    batch_size: int = 256              # pairs a step: an anchor's negatives are the other 255 positives (+ negatives)
    mini_batch: int = 32               # rows embedded at once (gradient caching): memory follows it, not batch_size
    epochs: int = 1
    max_steps: int | None = None       # stop after this many steps (None: the epochs')
    learning_rate: float | None = None  # None: 5e-5 for 768-wide models, more for narrower (rate_for_width)
    warmup: float = 0.1                # share of the steps the rate rises over, then falls linearly to 0
    weight_decay: float = 0.01
    scale: float = 20.0                # 1 / temperature of the cosine similarities (20: temperature 0.05)
    symmetric: bool = False            # also each positive against every anchor
    max_grad_norm: float = 1.0
    seed: int = 0
    precision: str = "fp32"            # fp32 | bf16 (autocast) | auto
    device: str = "auto"
    save_every: int = 200              # steps between checkpoints (a killed run resumes from the last)
    log_every: int = 10
    progress: bool = True

    def check(self) -> None:
        if self.batch_size < 2 or self.mini_batch < 1:
            raise ValueError(f"--batch-size {self.batch_size} / --mini-batch {self.mini_batch}: in-batch negatives "
                             "need 2+ pairs a batch and 1+ rows a mini-batch")
        if not self.scale > 0:
            raise ValueError(f"--temperature gives scale {self.scale}; it must be positive")


def batches_without_duplicates(rows: list, batch_size: int, rng: np.random.Generator) -> list[list[int]]:
    """The rows shuffled into batches in which no text appears twice (a repeated text would be its own row's
    negative); a row that clashes waits for the next batch. Batches of one row are dropped (no negatives)."""
    batches, batch, texts, waiting = [], [], set(), deque()

    def fits(i):
        return not texts.intersection(rows[i])

    for i in rng.permutation(len(rows)).tolist():
        if not fits(i):
            waiting.append(i)
            continue
        batch.append(i)
        texts.update(rows[i])
        if len(batch) == batch_size:
            batches.append(batch)
            batch, texts = [], set()
            for _ in range(len(waiting)):   # waiting rows go first into the new batch
                j = waiting.popleft()
                if len(batch) < batch_size and fits(j):
                    batch.append(j)
                    texts.update(rows[j])
                else:
                    waiting.append(j)
    leftover = batch + list(waiting)
    while leftover:
        batch, texts, rest = [], set(), []
        for i in leftover:
            (batch if len(batch) < batch_size and fits(i) else rest).append(i)
            if batch and batch[-1] == i:
                texts.update(rows[i])
        batches.append(batch)
        leftover = rest
    return [b for b in batches if len(b) > 1]


def train_embeddings(model_path, rows: list, cfg: EmbedConfig, evaluate=None) -> dict:
    """Trains the model at `model_path` on `rows` ((anchor, positive[, negative]) texts); writes OUT (model/,
    metrics.jsonl, summary.json). evaluate: encoder -> {metric: value}, run on the trained model. A run killed
    midway resumes from OUT/checkpoint/ when given the same settings (the same model, data and flags)."""
    cfg.check()
    out = Path(cfg.out_dir)
    with folder_lock(out, STAGE):   # a new or empty folder, or this command's own: never a user's files
        atomic_write_json(out / "manifest.json", {"stage": STAGE, "model": str(model_path), "complete": False})
        summary = _train(model_path, rows, cfg, out, evaluate)
        # last: what `bertkit verify` checks (every file of the model, its size and checksum)
        files = {str(f.relative_to(out)): file_entry(f) for f in sorted((out / "model").rglob("*")) if f.is_file()}
        atomic_write_json(out / "manifest.json", {"stage": STAGE, "model": str(model_path), "complete": True,
                                                  "files": files})
        return summary


def _train(model_path, rows: list, cfg: EmbedConfig, out: Path, evaluate) -> dict:
    set_seed(cfg.seed)
    device = pick_device(cfg.device)
    encoder = SentenceEncoder.from_folder(model_path, cfg.encoder).to(device)
    if not encoder.family.fit_length(encoder.encoder.cfg, cfg.encoder.max_seq_length):
        raise ValueError(f"--max-seq-length {cfg.encoder.max_seq_length}: {model_path} has fewer positions")
    rng = np.random.default_rng(cfg.seed)
    batches = [b for _ in range(cfg.epochs) for b in batches_without_duplicates(rows, cfg.batch_size, rng)]
    batches = batches[:cfg.max_steps] if cfg.max_steps is not None else batches
    if not batches:
        raise DataError(f"{len(rows)} row(s) make no batch of 2+ distinct pairs")
    lr = cfg.learning_rate or rate_for_width(encoder.hidden_size, 5e-5)
    optimizer, scheduler = _optimizer(encoder, cfg, lr, len(batches))
    settings = {**asdict(cfg), "model": str(model_path), "rows": len(rows), "steps": len(batches), "lr": lr}
    done = _resume(out, settings, encoder, optimizer, scheduler)
    t0 = time.time()
    _steps(encoder, rows, batches, done, cfg, settings,
           (optimizer, scheduler), out, autocast(device, resolve(device, cfg.precision)))
    encoder.save(out / "model", model_path, extra_config={"bertkit_embedding": settings})
    summary = {"steps": len(batches), "lr": lr, "seconds": round(time.time() - t0, 1), "settings": settings,
               "scores": evaluate(encoder) if evaluate else {}}
    atomic_write_json(out / "summary.json", summary)
    _drop_checkpoint(out)
    return summary


def _steps(encoder, rows: list, batches: list, done: int, cfg: EmbedConfig, settings: dict, optim, out: Path,
           amp) -> None:
    """The loop: step -> log -> checkpoint, from step `done` + 1. Each batch is tokenized when it is trained (a
    step's texts cost microseconds; the whole file's token lists would cost memory growing with it)."""
    optimizer, scheduler = optim
    encoder.train()
    t0, losses = time.time(), []
    bar = tqdm(total=len(batches), initial=done, desc="embed", unit="step", disable=not cfg.progress)
    with open(out / "metrics.jsonl", "a") as metrics:
        for step, batch in enumerate(batches[done:], done + 1):
            columns = [encoder.features([rows[i][c] for i in batch]) for c in range(len(rows[0]))]
            losses.append(cached_step(encoder, columns, cfg.mini_batch, cfg.scale, cfg.symmetric, amp))
            torch.nn.utils.clip_grad_norm_(encoder.parameters(), cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            bar.update(1)
            if step % cfg.log_every == 0 or step == len(batches):
                metrics.write(json.dumps({"step": step, "loss": float(np.mean(losses)),
                                          "lr": scheduler.get_last_lr()[0], "seconds": round(time.time() - t0, 2)})
                              + "\n")
                metrics.flush()
                bar.set_postfix(loss=f"{np.mean(losses):.4f}")
                losses = []
            if step % cfg.save_every == 0 and step < len(batches):
                _save_checkpoint(out, settings, step, encoder, optimizer, scheduler)
    bar.close()


def _optimizer(encoder, cfg: EmbedConfig, lr: float, steps: int):
    decay = [p for n, p in encoder.named_parameters() if p.dim() > 1]
    no_decay = [p for n, p in encoder.named_parameters() if p.dim() <= 1]   # biases and norms, as transformers
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=lr)
    warm = math.ceil(cfg.warmup * steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: s / max(1, warm) if s < warm else max(0.0, (steps - s) / max(1, steps - warm)))
    return optimizer, scheduler


def _comparable(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k not in ("progress", "log_every", "save_every")}


def _save_checkpoint(out: Path, settings: dict, step: int, encoder, optimizer, scheduler) -> None:
    from safetensors.torch import save_file

    tmp, final = out / f".{CHECKPOINT}.tmp", out / CHECKPOINT
    tmp.mkdir(exist_ok=True)   # (a killed save's leftover is overwritten file by file)
    save_file({k: v.contiguous() for k, v in encoder.state_dict().items()}, tmp / "weights.safetensors")
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": torch.get_rng_state()}, tmp / "state.pt")
    atomic_write_json(tmp / "progress.json", {"step": step, "settings": _comparable(settings)})
    _drop_checkpoint(out)
    if final.exists():
        raise DataError(f"{final}: holds files finetune embed did not write; move them away so it can checkpoint")
    tmp.rename(final)


def _resume(out: Path, settings: dict, encoder, optimizer, scheduler) -> int:
    """The step a checkpoint in OUT resumes from (0: none); refused when its settings differ from these."""
    from safetensors.torch import load_file

    from bertkit.safe_load import safe_load

    folder = out / CHECKPOINT
    if not (folder / "progress.json").is_file():
        return 0
    saved = json.loads((folder / "progress.json").read_text())
    if saved["settings"] != _comparable(settings):
        changed = sorted(k for k in {**saved["settings"], **_comparable(settings)}
                         if saved["settings"].get(k) != _comparable(settings).get(k))
        raise DataError(f"{folder}: a run with other settings ({', '.join(changed)}); give another --out, or "
                        f"remove {folder} to start again")
    encoder.load_state_dict(load_file(folder / "weights.safetensors"))
    state = safe_load(folder / "state.pt")
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    log.info("resuming %s from step %d", out, saved["step"])
    return saved["step"]


CHECKPOINT_FILES = ("weights.safetensors", "state.pt", "progress.json")   # all _save_checkpoint writes


def _drop_checkpoint(out: Path) -> None:
    """The files _save_checkpoint wrote, one by one, then the folder if that left it empty; anything else stays."""
    folder = out / CHECKPOINT
    if folder.is_symlink() or not folder.is_dir():
        return
    # without our progress.json nothing is ours; with it, the mark goes last (a killed removal is finished next time)
    for name in CHECKPOINT_FILES if _is_our_checkpoint(folder) else ():
        if (folder / name).is_file() and not (folder / name).is_symlink():
            (folder / name).unlink()
    if not any(folder.iterdir()):
        folder.rmdir()


def _is_our_checkpoint(folder: Path) -> bool:
    """progress.json as _save_checkpoint writes it (written last, atomically): the mark that the folder is ours."""
    mark = folder / "progress.json"
    if not mark.is_file() or mark.is_symlink():
        return False
    try:
        return set(json.loads(mark.read_text())) == {"step", "settings"}
    except (ValueError, UnicodeDecodeError, TypeError):
        return False
