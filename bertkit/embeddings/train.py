"""`bertkit finetune embed`: a model folder trained as a bi-encoder with in-batch negatives, in the pretraining
loop's shape (step -> log -> checkpoint), saved as a sentence-transformers folder, then scored when asked."""
import contextlib
import io
import json
import logging
import math
import os
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from bertkit.embeddings import LEARNING_RATE, SEED, TEMPERATURE, WEIGHT_DECAY
from bertkit.embeddings.encoder import EncoderConfig, SentenceEncoder
from bertkit.embeddings.loss import cached_step
from bertkit.errors import DataError, regular_file
from bertkit.fileio import (
    atomic_write_bytes,
    atomic_write_json,
    disk_errors,
    file_entry,
    folder_lock,
    note_written,
    open_append,
    read_json_or_none,
)
from bertkit.finetune.train import pick_device, rate_for_width, set_seed
from bertkit.outputs import Output, drop_staging, staging_folder, without_local_paths
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
        """Ranges outside which training only makes NaN (a temperature of 1e-300, a weight decay of 1e300)."""
        if self.batch_size < 2 or self.mini_batch < 1:
            raise ValueError(f"--batch-size {self.batch_size} / --mini-batch {self.mini_batch}: in-batch negatives "
                             "need 2+ pairs a batch and 1+ rows a mini-batch")
        for name, value, low, high in (("--temperature", 1 / self.scale if self.scale else math.inf, *TEMPERATURE),
                                       ("--weight-decay", self.weight_decay, *WEIGHT_DECAY),
                                       ("--lr", self.learning_rate or LEARNING_RATE[0], *LEARNING_RATE),
                                       ("--seed", self.seed, *SEED), ("--warmup-ratio", self.warmup, 0.0, 1.0),
                                       ("--max-grad-norm", self.max_grad_norm, 1e-6, 1e6)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and low <= value <= high):
                raise ValueError(f"{name} {value}: give a value from {low:g} to {high:g}")



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


def epochs_of_batches(rows: list, batch_size: int, seed: int):
    """Each epoch's batches in turn, from one generator seeded once, one epoch in memory at a time."""
    rng = np.random.default_rng(seed)
    while True:
        yield batches_without_duplicates(rows, batch_size, rng)


def count_steps(rows: list, cfg: EmbedConfig) -> int:
    """The steps `cfg.epochs` epochs make, at most `cfg.max_steps`, without building the epochs: when no text is in
    two rows every epoch is n // batch batches (+1 for a tail of 2+ rows); otherwise epochs are drawn and counted
    (none kept) until the steps or epochs run out."""
    limit = cfg.max_steps if cfg.max_steps is not None else math.inf
    if max(Counter(t for row in rows for t in set(row)).values(), default=0) <= 1:
        per_epoch = len(rows) // cfg.batch_size + (len(rows) % cfg.batch_size > 1)
        return int(min(limit, per_epoch * cfg.epochs))
    steps = 0
    for _, epoch in zip(range(cfg.epochs), epochs_of_batches(rows, cfg.batch_size, cfg.seed)):
        steps += len(epoch)
        if steps >= limit or not epoch:
            break
    return int(min(limit, steps))


def training_batches(rows: list, cfg: EmbedConfig, steps: int, done: int):
    """(step, batch) for steps done + 1 .. steps, in the order every run of these settings trains in."""
    step = 0
    for epoch in epochs_of_batches(rows, cfg.batch_size, cfg.seed):
        if not epoch:
            return
        for batch in epoch:
            step += 1
            if step > steps:
                return
            if step > done:
                yield step, batch


def train_embeddings(model_path, rows: list, cfg: EmbedConfig, evaluate=None) -> dict:
    """Trains the model at `model_path` on `rows` ((anchor, positive[, negative]) texts); writes OUT (model/,
    metrics.jsonl, summary.json). evaluate: encoder -> {metric: value}, run on the trained model. A run killed
    midway resumes from OUT/checkpoint/ when given the same settings (the same model, data and flags). Every file
    goes through fileio's writers (never through a link), and OUT/.bertkit-written.json records the names written."""
    cfg.check()
    out = Path(cfg.out_dir)
    retry = "free space, then run the same command again (it goes on from its last checkpoint)"
    with folder_lock(out, STAGE), disk_errors(out, retry):   # a new or empty folder, or this command's own
        output = Output(out, "finetune embed", manifest_files=True)
        try:
            summary = _train(model_path, rows, cfg, out, evaluate, output)
            # last: what `bertkit verify` checks (every file of the model, its size and checksum)
            files = {str(f.relative_to(out)): file_entry(f) for f in sorted((out / MODEL).rglob("*"))
                     if f.is_file() and not f.name.startswith(".")}
            atomic_write_json(out / "manifest.json", {"stage": STAGE, "model": str(model_path), "complete": True,
                                                      "files": files})
            return summary
        finally:   # the record of what it wrote, however the run ends (a folder it made and left empty goes)
            if out.is_dir() and any(not p.name.startswith(".") for p in out.iterdir()):
                with contextlib.suppress(OSError):   # a full disk: its own message is the one to say
                    if note := output.finish():
                        log.warning(note)


MODEL = "model"


def _train(model_path, rows: list, cfg: EmbedConfig, out: Path, evaluate, output: Output) -> dict:
    set_seed(cfg.seed)
    device = pick_device(cfg.device)
    encoder = SentenceEncoder.from_folder(model_path, cfg.encoder, training=True).to(device)
    if not encoder.family.fit_length(encoder.encoder.cfg, cfg.encoder.max_seq_length):
        raise ValueError(f"--max-seq-length {cfg.encoder.max_seq_length}: {model_path} has fewer positions")
    steps = count_steps(rows, cfg)
    if not steps:
        raise DataError(f"{len(rows)} row(s) make no batch of 2+ distinct pairs")
    lr = cfg.learning_rate or rate_for_width(encoder.hidden_size, 5e-5)
    optimizer, scheduler = _optimizer(encoder, cfg, lr, steps)
    settings = {**asdict(cfg), "model": str(model_path), "rows": len(rows), "steps": steps, "lr": lr}
    _check_places(out, output)
    done = _resume(out, settings, encoder, optimizer, scheduler)
    if not done:   # a fresh start: bertkit's earlier files here go (nothing stale survives), the user's stay
        output.remove_earlier()
    atomic_write_json(out / "manifest.json", {"stage": STAGE, "model": str(model_path), "complete": False})
    t0 = time.time()
    _steps(encoder, rows, training_batches(rows, cfg, steps, done), (done, steps), cfg, settings,
           (optimizer, scheduler), output, autocast(device, resolve(device, cfg.precision)))
    _save_model(encoder, out, model_path, settings, output)
    summary = {"steps": steps, "lr": lr, "seconds": round(time.time() - t0, 1), "settings": settings,
               "scores": evaluate(encoder) if evaluate else {}}
    atomic_write_json(out / "summary.json", summary)
    _drop_checkpoint(out)
    return summary


def _check_places(out: Path, output: Output) -> None:
    """Where finetune embed writes must be free or its own: a link there (OUT/model to another model folder) or a
    user's file (a summary.json of their own, once the folder has a record of what bertkit wrote) would be written
    through, mixed with the new model or replaced. Said before the first step, not after hours of training."""
    ours = output.ours() | {Path(os.path.relpath(p, output.root)).as_posix() for p in output.written}
    for name in (MODEL, "summary.json", "metrics.jsonl"):
        place = out / name
        if not place.exists() and not place.is_symlink() or (name != MODEL and output.earlier is None):
            continue   # a log or summary in a folder with no record: a killed run's, overwritten by name as before
        files = [p.relative_to(out).as_posix() for p in place.rglob("*") if p.is_file() or p.is_symlink()] \
            if place.is_dir() and not place.is_symlink() else [name]
        theirs = [f for f in files if f not in ours]
        if theirs:
            raise DataError(f"{out / theirs[0]}: finetune embed did not write this (or it is a link), and it writes "
                            f"{name} there{f' (and {len(theirs) - 1} more)' if len(theirs) > 1 else ''}. Move it "
                            "away, or give another --out")


def _save_model(encoder, out: Path, model_path, settings: dict, output: Output) -> None:
    """The model written whole in a staging folder, then renamed to OUT/model (bertkit's earlier one removed file by
    file first): a link found there is never written through, no file of another model survives beside it, and a
    failed save (a full disk) leaves no half-written folder."""
    for value in encoder.state_dict().values():
        if not torch.isfinite(value).all():
            raise DataError("the trained weights are not finite (NaN or infinity); nothing was saved. Lower --lr or "
                            "raise --temperature, then run again in a new --out")
    staging = staging_folder(out)
    try:
        encoder.save(staging / MODEL, model_path, extra_config={"bertkit_embedding": without_local_paths(settings)})
        output.remove_earlier(under=MODEL + "/")   # each checked again as bertkit's; the emptied folders go too
        _check_places(out, output)   # a file left in OUT/model is not bertkit's: refused, kept
        _drop_empty_folders(out / MODEL)   # (2_Normalize/ holds no file, so no removal empties it)
        os.rename(staging / MODEL, out / MODEL)
        for path in (out / MODEL).rglob("*"):
            note_written(path)
    finally:
        drop_staging(staging)


def _drop_empty_folders(folder: Path) -> None:
    """The empty folders under `folder` (a real folder, no link followed), deepest first, then it if empty."""
    if folder.is_symlink() or not folder.is_dir():
        return
    for path in sorted(folder.rglob("*"), reverse=True):
        if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
            path.rmdir()
    if not any(folder.iterdir()):
        folder.rmdir()


def _steps(encoder, rows: list, batches, span: tuple, cfg: EmbedConfig, settings: dict, optim, output: Output,
           amp) -> None:
    """The loop: step -> log -> checkpoint, over (step, batch) from `batches`. Each batch is tokenized when it is
    trained (a step's texts cost microseconds; the whole file's token lists would cost memory growing with it). A
    loss that is not finite stops the run before anything is saved or marked complete."""
    optimizer, scheduler = optim
    done, steps = span
    out = output.folder
    encoder.train()
    t0, losses = time.time(), []
    bar = tqdm(total=steps, initial=done, desc="embed", unit="step", plain=not cfg.progress)
    with open_append(out / "metrics.jsonl") as metrics:
        for step, batch in batches:
            columns = [encoder.features([rows[i][c] for i in batch]) for c in range(len(rows[0]))]
            loss = cached_step(encoder, columns, cfg.mini_batch, cfg.scale, cfg.symmetric, amp)
            if not math.isfinite(loss):
                raise DataError(f"the loss is {loss} at step {step}: training diverged (--lr {settings['lr']:g}, "
                                f"--temperature {1 / cfg.scale:g}); nothing was saved as complete. Lower --lr or "
                                f"raise --temperature, and give a new --out (or remove {out / CHECKPOINT})")
            losses.append(loss)
            torch.nn.utils.clip_grad_norm_(encoder.parameters(), cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            bar.update(1)
            if step % cfg.log_every == 0 or step == steps:
                metrics.write(json.dumps({"step": step, "loss": float(np.mean(losses)),
                                          "lr": scheduler.get_last_lr()[0], "seconds": round(time.time() - t0, 2)})
                              + "\n")
                metrics.flush()
                bar.set_postfix(loss=f"{np.mean(losses):.4f}")
                losses = []
            if step % cfg.save_every == 0 and step < steps:
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
    """OUT/checkpoint/ replaced whole: written in a staging folder of its own (never a folder a link names), the
    old one's files removed, the new one renamed into place; a failed save leaves nothing half-written."""
    from safetensors.torch import save

    staging = staging_folder(out)
    try:
        new = staging / CHECKPOINT
        atomic_write_bytes(new / "weights.safetensors",
                           save({k: v.contiguous() for k, v in encoder.state_dict().items()}))
        buffer = io.BytesIO()
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "rng": torch.get_rng_state()}, buffer)
        atomic_write_bytes(new / "state.pt", buffer.getvalue())
        atomic_write_json(new / "progress.json", {"step": step, "settings": _comparable(settings)})
        _drop_checkpoint(out)
        final = out / CHECKPOINT
        if final.exists() or final.is_symlink():
            raise DataError(f"{final}: holds files finetune embed did not write; move them away so it can "
                            "checkpoint")
        os.rename(new, final)
        for name in CHECKPOINT_FILES:
            note_written(final / name)
    finally:
        drop_staging(staging)


def _resume(out: Path, settings: dict, encoder, optimizer, scheduler) -> int:
    """The step a checkpoint in OUT resumes from (0: none). The checkpoint is read as untrusted input (a folder may
    come from someone else, or from another run): its mark, settings, step, tensor names and shapes and the
    optimizer's state are checked against this run; any mismatch is one message naming the folder."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from bertkit.safe_load import safe_load

    folder = out / CHECKPOINT
    if not folder.exists() and not folder.is_symlink():
        return 0
    fix = f"remove it (rm -r {folder}) to start again, or give another --out"
    if folder.is_symlink() or not folder.is_dir() or not _is_our_checkpoint(folder):
        raise DataError(f"{folder}: not a checkpoint finetune embed wrote (a link, a file, or files without its "
                        f"progress.json); {fix}")
    saved = read_json_or_none(folder / "progress.json")
    if saved["settings"] != _comparable(settings):
        changed = sorted(k for k in {**saved["settings"], **_comparable(settings)}
                         if saved["settings"].get(k) != _comparable(settings).get(k)) \
            if isinstance(saved["settings"], dict) else ["all"]
        raise DataError(f"{folder}: a run with other settings ({', '.join(changed)}); give another --out, or "
                        f"remove {folder} to start again")
    step = saved["step"]
    if not isinstance(step, int) or isinstance(step, bool) or not 0 < step < settings["steps"]:
        raise DataError(f"{folder}: records step {step!r}, and this run has {settings['steps']} steps; {fix}")
    try:
        weights = load_file(regular_file(folder / "weights.safetensors", out))
        expected = {k: tuple(v.shape) for k, v in encoder.state_dict().items()}
        if {k: tuple(v.shape) for k, v in weights.items()} != expected:
            raise ValueError("its weights are not this model's (other names or shapes)")
        state = safe_load(regular_file(folder / "state.pt", out))
        if not isinstance(state, dict) or set(state) != {"optimizer", "scheduler", "rng"} or \
                not isinstance(state["rng"], torch.Tensor) or state["rng"].dtype != torch.uint8:
            raise ValueError("state.pt is not the optimizer, schedule and generator state finetune embed saves")
        encoder.load_state_dict(weights)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
    except (OSError, RuntimeError, ValueError, KeyError, TypeError, IndexError, SafetensorError) as e:
        raise DataError(f"{folder}: cannot be resumed from ({str(e).splitlines()[0][:200]}); {fix}") from None
    log.info("resuming %s from step %d", out, step)
    return step


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
    saved = read_json_or_none(mark)
    return isinstance(saved, dict) and set(saved) == {"step", "settings"}
