"""The fine-tuning loop every task shares: AdamW, linear warmup then linear decay, evaluation after each epoch,
the kept epoch's model (--select: the last, or the best on held-out training rows) saved in HF format, a
metrics JSON at the end.

Runs on the CPU, on one GPU, or data-parallel under a launcher that sets WORLD_SIZE/RANK/LOCAL_RANK
(`deepspeed cli.py finetune ...` or torchrun): then each process trains on its shard of the batches through
torch.distributed (DDP), and rank 0 evaluates and saves.
"""
import contextlib
import functools
import io
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from bertkit import kernels
from bertkit.data import to_device
from bertkit.distributed import destroy_at_exit
from bertkit.errors import DataError
from bertkit.fileio import (
    FolderNotOwnedError,
    atomic_write_bytes,
    atomic_write_json,
    disk_errors,
    folder_lock,
    read_json_or_none,
)
from bertkit.formats import IGNORE_INDEX
from bertkit.kernel_guard import kernel_uses, resolve_guarded
from bertkit.models import save_pretrained
from bertkit.optim import adamw, build_scheduler, param_groups
from bertkit.outputs import Output, refuse_other_inputs
from bertkit.precision import autocast, resolve as resolve_precision, slow_bf16_note
from bertkit.progress import tqdm
from bertkit.rng import rng_state, set_rng_state
from bertkit.runlog import RunLog, Throughput, default_report_to
from bertkit.safe_load import safe_load
from bertkit.threads import choose_threads


@dataclass
class TrainConfig:
    out_dir: str
    epochs: float = 3.0
    batch_size: int = 32          # global batch (split across processes when distributed)
    eval_batch_size: int = 64
    learning_rate: float | None = 5e-5  # None: rate_for_width(the model's hidden size, base_learning_rate)
    base_learning_rate: float = 5e-5    # the rate for BERT-base-wide models when learning_rate is None
    weight_decay: float = 0.01
    adam_eps: float = 1e-8        # transformers' Trainer's (BERT used 1e-6; measured in the parity README)
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    seed: int = 42
    device: str = "auto"          # auto | cpu | cuda | cuda:N
    kernels: str = "auto"         # attention/LayerNorm backend (bertkit.kernels): auto | triton | torch | reference
    log_every: int = 10           # steps between records in OUT/metrics.jsonl (and TensorBoard / W&B)
    report_to: str | None = None  # tensorboard, wandb, "tensorboard,wandb" or none; None: tensorboard if installed
    unpadded: bool = True         # pack each batch end to end (varlen attention): no compute spent on padding;
                                  # False (--padded): pad each batch to its longest row
    compile: bool = False         # the model under torch.compile (its first batches compile)
    precision: str = "auto"       # fp32 | bf16: autocast over fp32 weights while training; evaluation runs in fp32
                                  # | auto: bf16 where the device has bf16 units, else fp32 (metrics.json: the one used)
    save_model: bool = True
    dropout: float | None = None  # hidden and attention dropout while fine-tuning; None: the model's config.json
    pooling: str | None = None    # sequence classifiers: cls or mean (BertConfig.classifier_pooling); None: the model's
    overwrite: bool = False       # replace an earlier fine-tuning of another task in out_dir
    threads: int | None = None    # torch threads; None: the free cores / processes (bertkit.threads)
    checkpoint_minutes: float = 10.0  # the training state to OUT/resume/ this often and between epochs (one process
                                  # only); the same command run again continues from it. 0: never
    select: str = "last"          # which epoch's model is kept and reported: last | validation (the best on a split
                                  # of the training file, never on the scored one)
    validation_share: float = 0.1  # --select validation: this share of the training rows, stratified by label

    def __post_init__(self):
        if self.select not in SELECT:
            raise ValueError(f"select {self.select!r}: choose from {', '.join(SELECT)}")


SELECT = ("last", "validation")


def rate_for_width(hidden_size: int, base: float) -> float:
    """The fine-tuning rate when none is given: `base` (the command's BERT-base rate) for models 768 wide or wider;
    narrower ones take more, geometrically in the width, up to 1e-3 at 128 (preset tiny). Measured: tiny on SST-2
    sits at chance (0.507) at 2e-5 and reaches 0.741 at 1e-3; the transfer benchmark's tiny fine-tunes best at 1e-3
    on SST-2, STS-B and NER (docs/studies/2026-11-23-transfer-benchmark.md)."""
    if hidden_size >= 768 or base >= 1e-3:
        return base
    t = math.log(768 / max(hidden_size, 128)) / math.log(768 / 128)  # 0 at 768, 1 at 128 and below
    return float(f"{base * (1e-3 / base) ** t:.2g}")


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _distributed():
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return world, int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def collate_features(rows: list, pad_id: int = 0) -> dict:
    """Right-pad a task's feature dicts into tensors; list-valued labels (token tags) pad with IGNORE_INDEX. (Not
    bertkit.data.collate: pretraining instances carry MLM slots and NSP labels, a task's features any label keys.)"""
    width = max(len(r["input_ids"]) for r in rows)
    batch = {
        "input_ids": torch.full((len(rows), width), pad_id, dtype=torch.long),
        "token_type_ids": torch.zeros((len(rows), width), dtype=torch.long),
        "attention_mask": torch.zeros((len(rows), width), dtype=torch.long),
    }
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        batch["input_ids"][i, :n] = torch.tensor(r["input_ids"])
        batch["token_type_ids"][i, :n] = torch.tensor(r["token_type_ids"])
        batch["attention_mask"][i, :n] = 1
    for key in rows[0]:
        if key in batch:
            continue
        values = [r[key] for r in rows]
        if isinstance(values[0], list):
            t = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
            for i, v in enumerate(values):
                t[i, :len(v)] = torch.tensor(v, dtype=torch.long)
            batch[key] = t
        else:
            batch[key] = torch.tensor(values, dtype=torch.float if isinstance(values[0], float) else torch.long)
    return batch


def packed_size(tokens: int) -> int:
    """A packed batch's token count rounded up (by at most a sixteenth, at most 127 tokens). Without it every step
    has a new size, and glibc's heap, handed activations of ever new sizes, fragments: all-MiniLM-L6-v2 on RTE
    peaked at 4.9 GB packed against 2.6 GB padded; with it, below the padded peak (bertkit/finetune/README.md)."""
    step = min(128, 1 << max(0, tokens.bit_length() - 5))
    return -(-tokens // step) * step


def pack_features(rows: list, pad_multiple: int = 8) -> dict:
    """A task's feature dicts end to end, unpadded (the default; --padded is collate_features): input_ids /
    token_type_ids (T,), cu_seqlens (B+1,) int32, max_seqlen (the longest row rounded up: a host-side bucket);
    per-row labels (B,), per-token labels (T,). T is packed_size(the rows' tokens): the tail past cu_seqlens[-1]
    belongs to no sequence (the models leave it out of attention, pooling and losses; its tags are IGNORE_INDEX)."""
    lengths = [len(r["input_ids"]) for r in rows]
    tail = packed_size(sum(lengths)) - sum(lengths)
    batch = {"input_ids": torch.tensor([t for r in rows for t in r["input_ids"]] + [0] * tail, dtype=torch.long),
             "token_type_ids": torch.tensor([t for r in rows for t in r["token_type_ids"]] + [0] * tail,
                                            dtype=torch.long),
             "cu_seqlens": torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32),
             "max_seqlen": (max(lengths) + pad_multiple - 1) // pad_multiple * pad_multiple}
    for key in rows[0]:
        if key in batch or key == "attention_mask":
            continue
        values = [r[key] for r in rows]
        if isinstance(values[0], list):
            batch[key] = torch.tensor([v for value in values for v in value] + [IGNORE_INDEX] * tail,
                                      dtype=torch.long)
        else:
            batch[key] = torch.tensor(values, dtype=torch.float if isinstance(values[0], float) else torch.long)
    return batch


def _batches(n: int, batch_size: int, shuffle_rng=None):
    order = np.arange(n)
    if shuffle_rng is not None:
        shuffle_rng.shuffle(order)
    return [order[i:i + batch_size] for i in range(0, n, batch_size)]


@torch.no_grad()
def predict(model, rows: list, batch_size: int, outputs=("logits",), per_token: bool = False,
            desc: str = "eval") -> dict:
    """Run the model over feature dicts (labels ignored) and return {output name: list of per-row numpy arrays};
    per-token outputs (per_token=True) are cut to each row's own length."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    # sort by length so padding stays small, then restore the order
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
    results = {name: [None] * len(rows) for name in outputs}
    for start in tqdm(range(0, len(rows), batch_size), desc=desc, leave=False, mininterval=2.0):
        idx = order[start:start + batch_size]
        batch = collate_features([{k: rows[i][k] for k in ("input_ids", "token_type_ids")} for i in idx])
        batch = {k: v.to(device) for k, v in batch.items()}
        out = model(**batch)
        for name in outputs:
            values = getattr(out, name).float().cpu().numpy()
            for j, i in enumerate(idx):
                results[name][i] = values[j][:len(rows[i]["input_ids"])] if per_token else values[j]
    model.train(was_training)
    return results


def _optimizer(model, cfg: TrainConfig):
    # no weight decay on biases and LayerNorm weights (optim.param_groups), as BERT's AdamWeightDecayOptimizer
    return adamw(param_groups(model, cfg.weight_decay), cfg.learning_rate, (0.9, 0.999), cfg.adam_eps)


@dataclass
class FineTuning:
    """One fine-tuning's state: where it runs, its output and log, and the summary metrics.json receives."""
    cfg: TrainConfig
    model: torch.nn.Module
    net: torch.nn.Module         # the model, or its DDP wrapper
    device: torch.device
    world: int
    rank: int
    out_dir: Path
    log: RunLog
    summary: dict
    backend: str
    total_steps: int
    step: int = 0
    resumed: dict | None = None  # the OUT/resume/ state this fine-tuning continues from


def train(model, train_rows: list, evaluate, best_metric: str, cfg: TrainConfig, *, task: str,
          settings: dict | None = None, tokenizer_dir=None, extra_config: dict | None = None,
          validate=None) -> dict:
    """Fine-tune `model` on `train_rows` (feature dicts with labels), calling `evaluate(model) -> (metrics, files)`
    on the scored set after each epoch. The epoch kept (its `files` ({name: JSON object}, e.g. SQuAD predictions)
    written, its model in OUT/best/, its scores reported as "best") is chosen by cfg.select, never by the scored
    set: the last epoch, or the best by `validate(model) -> metrics` on a split of the training rows (the task's
    runner makes it). With no train rows, evaluates once (prediction only).
    Returns the summary written to OUT/metrics.json."""
    if cfg.select == "validation" and validate is None and train_rows:
        raise DataError(f"--select validation: {task} has no validation split yet; give --select last (the last "
                        "epoch's model, chosen without looking at any score)")
    longest = (settings or {}).get("max_seq_length")
    if longest and longest > model.cfg.max_length:  # before any step, not a traceback at the first long batch
        raise DataError(f"--max-seq-length {longest} is longer than the {model.cfg.max_length} positions of the "
                        f"model in {settings.get('model')}; give --max-seq-length {model.cfg.max_length} or less")
    if cfg.learning_rate is None:
        cfg = replace(cfg, learning_rate=rate_for_width(model.cfg.hidden_size, cfg.base_learning_rate))
        if _distributed()[1] == 0:
            tqdm.write(f"learning rate {cfg.learning_rate:g} for a model {model.cfg.hidden_size} wide (--lr sets "
                       "another)")
    with fine_tuning_folder(Path(cfg.out_dir), cfg.overwrite) as output:
        return _train(model, train_rows, (evaluate, validate), best_metric, cfg, task, settings, output,
                      functools.partial(save_pretrained, tokenizer_dir=tokenizer_dir, extra_config=extra_config),
                      pretraining_corpus(tokenizer_dir, settings or {}))


def pretraining_corpus(model_dir, settings: dict) -> dict:
    """Whether the corpus the model was pretrained on was cleaned of the scored file (prepare-corpus
    --decontaminate, as its export records it): a score on text the model saw in pretraining is not a transfer."""
    config = read_json_or_none(Path(model_dir) / "config.json") if model_dir else None
    known = (config or {}).get("bertkit", {}) if isinstance(config, dict) else {}
    scored = settings.get("dev_file") or settings.get("predict_file")
    name = Path(scored).name if scored and scored != "None" else None
    if not isinstance(known, dict) or "decontaminated_against" not in known:
        return {"decontaminated_against": None, "scored_file": name,
                "note": "not recorded: not a bertkit export, or its corpus is not where the run found it"}
    against = [str(x) for x in known["decontaminated_against"]]
    return {"decontaminated_against": against, "scored_file": name,
            "scored_file_decontaminated": (name in against) if name else None}


@contextlib.contextmanager
def fine_tuning_folder(out_dir: Path, overwrite: bool):
    """Rank 0 holds OUT's lock for the whole fine-tuning (a second one into OUT stops at once, naming the first; a
    dead one's lock is taken over) and records at the end, however it ends, which files it wrote there."""
    if _distributed()[1] != 0:
        yield None
        return
    retry = "free space, then run the same command again (it goes on from its last saved state)"
    with folder_lock(out_dir, "finetune", tqdm.write, overwrite=overwrite), disk_errors(out_dir, retry):
        output = Output(out_dir, "fine-tuning")
        try:
            yield output
        finally:
            if out_dir.is_dir() and any(not p.name.startswith(".") for p in out_dir.iterdir()) and \
                    (note := output.finish()):
                tqdm.write(note)


def _train(model, train_rows, evaluate, best_metric, cfg, task, settings, output, save, pretraining=None) -> dict:
    ft = start_fine_tuning(model, train_rows, best_metric, cfg, task, settings, output)
    if pretraining is not None:
        ft.summary["pretraining_corpus"] = pretraining
    if ft.total_steps == 0:  # prediction only
        end_of_epoch(ft, evaluate, save, 0, None, 0.0)
        ft.log.close()
        return ft.summary
    loop = Loop(ft, train_rows)
    while ft.step < ft.total_steps:
        for rows in loop.epoch_batches():
            train_step(ft, loop, rows)
            if ft.step % cfg.log_every == 0 or ft.step == ft.total_steps:
                log_training(ft, loop)
            loop.checkpoints.if_due(loop.epoch, loop.epoch_rng, loop.losses, loop.elapsed())
        end_of_epoch(ft, evaluate, save, loop.epochs_reached(), loop.mean_loss(), loop.elapsed())
        loop.next_epoch()
    return finish(ft, loop)


class Loop:
    """The training loop's own state: optimizer and schedule, the shuffle's generator, the epoch being trained and
    its losses so far, the saved-state writer and the progress bar (a resumed fine-tuning starts from its state)."""

    def __init__(self, ft: FineTuning, train_rows: list):
        self.ft, self.rows = ft, train_rows
        self.optimizer = _optimizer(ft.model, ft.cfg)
        self.scheduler = build_scheduler(self.optimizer, ft.total_steps, ft.summary["settings"]["warmup_steps"],
                                         "linear")
        self.rng, self.throughput, self.interval_losses = np.random.default_rng(ft.cfg.seed), Throughput(), []
        self.batch_size = max(1, ft.cfg.batch_size // ft.world) * ft.world
        self.epoch, self.t0, self.losses = 0, time.time(), []
        if ft.resumed:
            self.epoch, self.t0, self.losses = continue_from(ft, self.optimizer, self.scheduler, self.rng)
        self.checkpoints = Checkpoints(ft, self.optimizer, self.scheduler)
        self.progress = tqdm(total=ft.total_steps, initial=ft.step, desc=f"finetune {ft.summary['task']}",
                             disable=ft.rank != 0, mininterval=2.0)
        self.lr = self.grad_norm = None

    def epoch_batches(self):
        """This rank's rows of each batch of the next epoch, shuffled alike on every rank (the seed); a resumed
        epoch skips the batches it already trained on."""
        ft = self.ft
        self.epoch += 1
        ft.net.train()
        self.epoch_rng = self.rng.bit_generator.state  # before this epoch's shuffle: a resume shuffles again from it
        for idx in _batches(len(self.rows), self.batch_size, self.rng)[len(self.losses):]:
            if ft.step >= ft.total_steps:
                return
            mine = idx[ft.rank::ft.world] if ft.world > 1 else idx
            yield [self.rows[i] for i in (mine if len(mine) else idx[:1])]  # a last batch smaller than the world

    def record(self, loss: float, batch: dict, grad_norm: float, lr: float) -> None:
        self.losses.append(loss)
        self.interval_losses.append(loss)
        self.throughput.add_batch(batch)
        self.grad_norm, self.lr = grad_norm, lr
        self.progress.update(1)
        self.progress.set_postfix(epoch=self.epoch, loss=f"{np.mean(self.losses[-50:]):.4f}")

    def elapsed(self) -> float:
        return time.time() - self.t0

    def mean_loss(self) -> float | None:
        return float(np.mean(self.losses)) if self.losses else None

    def epochs_reached(self) -> float:
        """The epoch just ended, or the fraction of one a run shorter than an epoch trained (--epochs 0.1: 0.1)."""
        return min(self.epoch, round(self.ft.step / math.ceil(len(self.rows) / self.batch_size), 2))

    def next_epoch(self) -> None:
        """Between epochs: the state saved (a resume starts the next epoch from it)."""
        self.losses = []
        if self.ft.step < self.ft.total_steps:
            self.checkpoints.save(self.epoch, self.rng.bit_generator.state, self.losses, self.elapsed())


def train_step(ft: FineTuning, loop: Loop, rows: list) -> None:
    """One optimizer step on this rank's rows (clipped; the rate the step used is logged)."""
    batch = to_device(pack_features(rows) if ft.cfg.unpadded else collate_features(rows), ft.device)
    with autocast(ft.device, ft.cfg.precision):
        loss = ft.net(**batch).loss
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(ft.model.parameters(), ft.cfg.max_grad_norm or float("inf"))
    lr = loop.scheduler.get_last_lr()[0]
    loop.optimizer.step()
    loop.scheduler.step()
    loop.optimizer.zero_grad(set_to_none=True)
    ft.step += 1
    loop.record(loss.item(), batch, float(grad_norm), lr)


def log_training(ft: FineTuning, loop: Loop) -> None:
    ft.log.write({"step": ft.step, "epoch": loop.epoch, "loss": float(np.mean(loop.interval_losses)),
                  **loop.throughput.rates(over_ranks=ft.world > 1), "lr": loop.lr, "grad_norm": loop.grad_norm,
                  "kernels": ft.backend})
    loop.interval_losses.clear()


def finish(ft: FineTuning, loop: Loop) -> dict:
    """metrics.json with train_seconds, written last (a run killed before has none); the saved state removed."""
    loop.progress.close()
    ft.log.close()
    ft.summary["train_seconds"] = loop.elapsed()
    if ft.rank == 0:
        atomic_write_json(ft.out_dir / "metrics.json", ft.summary)
        loop.checkpoints.remove()
    return ft.summary


# ---------------------------------------------------------------- resuming a killed fine-tuning
# A CPU fine-tuning of a large task runs for hours: a killed one continues from OUT/resume/state.pt when the same
# command runs again, and ends exactly where an uninterrupted one would (tested). Settings that say where and how it
# runs may change between the two; any other change starts afresh, saying why.
RESUME, STATE = "resume", "state.pt"
RESUME_FREE = ("threads", "device", "kernels", "kernels_used", "compile", "report_to", "log_every", "overwrite",
               "checkpoint_minutes")


class Checkpoints:
    """Writes OUT/resume/state.pt every cfg.checkpoint_minutes and between epochs (one process only: with several,
    each would need its own generators' states). It replaces and removes only a state of its own: one this run
    resumed from or wrote, or one bertkit wrote earlier (a user's folder of that name keeps its files)."""

    def __init__(self, ft: FineTuning, optimizer, scheduler):
        self.ft, self.optimizer, self.scheduler = ft, optimizer, scheduler
        self.every_s = ft.cfg.checkpoint_minutes * 60 if ft.cfg.checkpoint_minutes > 0 and ft.world == 1 else None
        self.last = time.time()
        self.path = ft.out_dir / RESUME / STATE
        self.ours = ft.resumed is not None or (ft.rank == 0 and _is_saved_state(self.path))
        self.stamp = _stamp(self.path) if self.ours else None   # the file found ours; remove() takes only it
        taken = self.path.parent.is_symlink() or self.path.is_symlink() or self.path.exists()
        if self.every_s is not None and taken and not self.ours:
            raise _foreign_state(self.path.parent, "holds files bertkit did not write")

    def if_due(self, epoch: int, epoch_rng: dict, losses: list, elapsed: float) -> None:
        if self.every_s is not None and time.time() - self.last >= self.every_s and self.ft.step < self.ft.total_steps:
            self.save(epoch - 1, epoch_rng, losses, elapsed)

    def save(self, epochs_done: int, epoch_rng: dict, losses: list, elapsed: float) -> None:
        """The state after `epochs_done` whole epochs and `losses` steps of the next, whose shuffle starts from
        `epoch_rng`."""
        if self.every_s is None:
            return
        ft, buffer = self.ft, io.BytesIO()
        torch.save({"step": ft.step, "epochs_done": epochs_done, "epoch_rng": epoch_rng, "losses": list(losses),
                    "elapsed_s": elapsed, "rng": rng_state(), "model": ft.model.state_dict(),
                    "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                    "summary": json.dumps(ft.summary)}, buffer)
        self.path.parent.mkdir(exist_ok=True)
        atomic_write_bytes(self.path, buffer.getvalue())
        self.ours, self.stamp, self.last = True, _stamp(self.path), time.time()

    def remove(self) -> None:
        """The state, then OUT/resume/ if that left it empty; nothing that is not the state's."""
        if not self.ours or self.path.is_symlink() or self.path.parent.is_symlink():
            return
        if _stamp(self.path) == self.stamp:   # not a file put in its place since
            self.path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):   # not empty: the rest is the user's
            self.path.parent.rmdir()


def _foreign_state(path: Path, what: str) -> FolderNotOwnedError:
    return FolderNotOwnedError(f"{path}: {what}, where a fine-tuning keeps the state it resumes from; move it away "
                               "(a damaged state of an earlier run may be deleted), or pass --checkpoint-minutes 0")


def _stamp(path: Path) -> tuple | None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _is_saved_state(path: Path) -> bool:
    """Whether `path` is a fine-tuning state bertkit wrote (read as plain data), in a real folder, no link."""
    if path.is_symlink() or path.parent.is_symlink() or not path.is_file():
        return False
    try:
        return _not_a_saved_state(safe_load(path), None) is None
    except (RuntimeError, EOFError, OSError, ValueError):
        return False


def saved_state(out_dir: Path, task: str, settings: dict, model=None) -> dict | None:
    """The state of an unfinished fine-tuning of `task` in out_dir with these settings, else None (saying why a
    state there is not used). Loaded as plain data: a folder from elsewhere cannot run code (bertkit.safe_load);
    one that is not what bertkit wrote (other keys, or weights of another shape than `model`'s) is not used."""
    path = out_dir / RESUME / STATE
    if not path.is_file():
        return None
    try:
        state = safe_load(path)
        foreign = "a link" if path.is_symlink() or path.parent.is_symlink() else _not_a_saved_state(state, None)
    except (RuntimeError, EOFError) as e:  # damaged (its write is atomic, so not by a kill)
        foreign = f"unreadable: {str(e).splitlines()[0]}"
    if foreign is not None:
        if settings.get("checkpoint_minutes", 0) > 0:   # its next save would replace a file that may be the user's
            raise _foreign_state(path, f"not a fine-tuning state bertkit wrote ({foreign})")
        tqdm.write(f"{path}: not a fine-tuning state bertkit wrote ({foreign}); not used")
        return None
    if (why := _not_a_saved_state(state, model)) is not None:   # bertkit's, for another model
        tqdm.write(f"{path}: a fine-tuning state of another model ({why}); starting afresh")
        return None
    earlier = json.loads(state["summary"])
    mine, theirs = json.loads(json.dumps(settings)), earlier["settings"]
    differ = sorted(k for k in set(mine) | set(theirs) if k not in RESUME_FREE and mine.get(k) != theirs.get(k))
    if earlier["task"] != task or differ:
        said = "the task" if earlier["task"] != task else ", ".join(
            f"{k} {theirs.get(k)} (this command: {mine.get(k)})" for k in differ[:4])
        tqdm.write(f"{path}: an unfinished fine-tuning with another setting ({said}); starting afresh")
        return None
    state["summary"] = earlier
    tqdm.write(f"resuming the fine-tuning in {out_dir} at step {state['step']} of {settings['total_steps']} "
               f"({path})")
    return state


STATE_KEYS = {"step": int, "epochs_done": int, "epoch_rng": dict, "losses": list, "elapsed_s": (int, float),
              "rng": dict, "model": dict, "optimizer": dict, "scheduler": dict, "summary": str}


def _not_a_saved_state(state, model) -> str | None:
    """Why `state` is not what Checkpoints.save writes (for this model), or None."""
    if not isinstance(state, dict):
        return f"a {type(state).__name__}, not a dictionary"
    for key, kind in STATE_KEYS.items():
        if not isinstance(state.get(key), kind):
            return f"its {key!r} is missing or of another type"
    try:
        summary = json.loads(state["summary"])
    except ValueError:
        return "its summary is not JSON"
    if not (isinstance(summary, dict) and isinstance(summary.get("settings"), dict) and "task" in summary):
        return "its summary lacks the task and settings"
    if model is not None:
        mine = model.state_dict()
        theirs = state["model"]
        if set(mine) != set(theirs) or any(not torch.is_tensor(theirs[k]) or theirs[k].shape != v.shape
                                           for k, v in mine.items()):
            return "its weights are not this model's"
    return None


def continue_from(ft: FineTuning, optimizer, scheduler, rng) -> tuple:
    """Put the saved state back: weights, optimizer, schedule, generators, the summary so far; -> (epochs done,
    the loop's start time, the losses of the unfinished epoch)."""
    state = ft.resumed
    ft.model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    rng.bit_generator.state = state["epoch_rng"]
    ft.step, ft.summary = state["step"], {**state["summary"], "settings": ft.summary["settings"]}
    return state["epochs_done"], time.time() - state["elapsed_s"], state["losses"]


def chosen(ft: FineTuning, record: dict) -> bool:
    """Whether this epoch replaces the one kept: always under --select last; under validation, when its validation
    score is higher. The scored set never decides (its best epoch is a maximum over noisy scores: optimistic)."""
    best, metric = ft.summary.get("best"), ft.summary["best_metric"]
    if best is None or "validation" not in record:
        return True
    return record["validation"][metric] > best["validation"][metric]


def finished_fine_tuning(out_dir, task: str | None = None) -> dict | None:
    """The metrics.json of a fine-tuning (of `task`, if given) that ran to its end, else None: `train_seconds` is
    written last, so a run killed part-way never has it."""
    summary = read_json_or_none(Path(out_dir) / "metrics.json")
    if isinstance(summary, dict) and "train_seconds" in summary and task in (None, summary.get("task")):
        return summary
    return None


def start_fine_tuning(model, train_rows: list, best_metric: str, cfg: TrainConfig, task: str,
                      settings: dict | None, output: Output | None) -> FineTuning:
    """Threads, device and kernels, the process group, dropout, the seed, the steps and the output folder."""
    world, rank, local_rank = _distributed()
    threads = choose_threads(cfg.threads)
    if rank == 0:
        tqdm.write(threads.describe())
    device = pick_device(cfg.device, local_rank)
    cfg = replace(cfg, precision=resolve_precision(device, cfg.precision))
    if rank == 0 and (note := slow_bf16_note(device, cfg.precision)):
        tqdm.write(note)
    kernels.use(cfg.kernels)
    # auto on a GPU: checked (and both backends timed) there first
    backend = resolve_guarded(device, kernel_uses(model, cfg.precision, cfg.unpadded, batch=cfg.batch_size),
                              say=tqdm.write if rank == 0 else lambda m: m.startswith("warning") and tqdm.write(m),
                              compiled=cfg.compile)
    if world > 1 and not torch.distributed.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
        destroy_at_exit()
    if cfg.dropout is not None:  # every module reads the one shared BertConfig (saved with best/ too)
        model.cfg.set_dropout(cfg.dropout)
    set_seed(cfg.seed)
    model.to(device)
    if cfg.compile:  # in place: the module, its state_dict and what save_pretrained writes are unchanged
        model.compile()
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda"
                                                        else None)
    per_rank = max(1, cfg.batch_size // world)
    steps_per_epoch = math.ceil(len(train_rows) / (per_rank * world)) if train_rows else 0
    total_steps = int(math.ceil(steps_per_epoch * cfg.epochs))
    summary = {"task": task, "settings": {**(settings or {}), **asdict(cfg), "world_size": world,
                                          "device": str(device), "kernels_used": backend,
                                          "threads": threads.record(), "train_rows": len(train_rows),
                                          "total_steps": total_steps,
                                          "warmup_steps": int(cfg.warmup_ratio * total_steps)},
               "best_metric": best_metric, "epochs": []}
    out_dir, resumed = Path(cfg.out_dir), None
    if rank == 0:
        if world == 1 and not cfg.overwrite:
            resumed = saved_state(out_dir, task, summary["settings"], model)
        if resumed is None:
            earlier = read_json_or_none(out_dir / "metrics.json")
            refuse_other_inputs(out_dir, "fine-tuning", {"task": task}, earlier if isinstance(earlier, dict) else None,
                                cfg.overwrite)
            output.remove_earlier()  # bertkit's own files only: nothing stale survives, nothing of the user's goes
            out_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_json(out_dir / "metrics.json", summary)  # from the start: a folder killed in its first
            # epoch is known as ours
    log = RunLog(out_dir, rank == 0, cfg.report_to or default_report_to(), config=summary["settings"])
    return FineTuning(cfg, model, net, device, world, rank, out_dir, log, summary, backend, total_steps,
                      resumed=resumed)


def end_of_epoch(ft: FineTuning, evaluate, save, epoch: int, train_loss, seconds: float) -> None:
    """Rank 0 scores the epoch (and, with --select validation, measures it on the validation split); the epoch
    chosen writes its files and its model (OUT/best/); metrics.json every time. evaluate: (scored, validate)."""
    if ft.rank == 0:
        scored, validate = evaluate
        # in fp32 whatever trained: bf16 logits (8 bits of mantissa) reorder close answers; predicting a bf16-trained
        # SQuAD model in fp32 gave F1 17.80 against 17.18 in bf16 (bertkit/finetune/README.md, bf16)
        metrics, files = scored(ft.model)
        record = {"epoch": epoch, "train_loss": train_loss, "train_seconds": seconds, **metrics}
        if validate is not None and ft.cfg.select == "validation":
            record["validation"] = validate(ft.model)
        ft.summary["epochs"].append(record)
        ft.log.write({"step": ft.step, "epoch": epoch,
                      **{f"eval_{k}": v for k, v in metrics.items() if isinstance(v, (int, float))},
                      **{f"validation_{k}": v for k, v in record.get("validation", {}).items()
                         if isinstance(v, (int, float))}})
        tqdm.write(f"[{ft.summary['task']}] epoch {epoch}: " + ", ".join(
            f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()
            if k not in ("epoch", "validation")) + "".join(
            f", validation {k}={v:.4f}" for k, v in record.get("validation", {}).items() if isinstance(v, float)))
        if chosen(ft, record):
            ft.summary["best"], ft.summary["best_epoch"] = record, epoch
            for name, obj in files.items():
                atomic_write_json(ft.out_dir / name, obj)
            if ft.cfg.save_model:
                save(ft.model, ft.out_dir / "best")
        atomic_write_json(ft.out_dir / "metrics.json", ft.summary)
    if ft.world > 1:
        torch.distributed.barrier()
