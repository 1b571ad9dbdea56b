"""The fine-tuning loop every task shares: AdamW, linear warmup then linear decay, evaluation after each epoch,
the best epoch's model saved in HF format, a metrics JSON at the end.

Runs on the CPU, on one GPU, or data-parallel under a launcher that sets WORLD_SIZE/RANK/LOCAL_RANK
(`deepspeed cli.py finetune ...` or torchrun): then each process trains on its shard of the batches through
torch.distributed (DDP), and rank 0 evaluates and saves.
"""
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from bertkit import kernels
from bertkit.distributed import destroy_at_exit
from bertkit.fileio import atomic_write_json, check_folder_owned, read_json_or_none, replace_earlier_output
from bertkit.formats import IGNORE_INDEX
from bertkit.kernel_guard import kernel_uses, resolve_guarded
from bertkit.models import save_pretrained
from bertkit.optim import build_scheduler, param_groups
from bertkit.progress import tqdm
from bertkit.runlog import RunLog, default_report_to
from bertkit.threads import choose_threads


@dataclass
class TrainConfig:
    out_dir: str
    epochs: float = 3.0
    batch_size: int = 32          # global batch (split across processes when distributed)
    eval_batch_size: int = 64
    learning_rate: float = 5e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    seed: int = 42
    device: str = "auto"          # auto | cpu | cuda | cuda:N
    kernels: str = "auto"         # attention/LayerNorm backend (bertkit.kernels): auto | triton | torch | reference
    log_every: int = 10           # steps between records in OUT/metrics.jsonl (and TensorBoard / W&B)
    report_to: str | None = None  # tensorboard, wandb, "tensorboard,wandb" or none; None: tensorboard if installed
    unpadded: bool = False        # pack each batch end to end (varlen attention): no compute spent on padding
    save_model: bool = True
    dropout: float | None = None  # hidden and attention dropout while fine-tuning; None: the model's config.json
    pooling: str | None = None    # sequence classifiers: cls or mean (BertConfig.classifier_pooling); None: the model's
    overwrite: bool = False       # replace an earlier fine-tuning of another task in out_dir
    threads: int | None = None    # torch threads; None: the free cores / processes (bertkit.threads)


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


def collate(rows: list, pad_id: int = 0) -> dict:
    """Right-pad a list of feature dicts into tensors; list-valued labels (token tags) pad with IGNORE_INDEX."""
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


def collate_packed(rows: list, pad_multiple: int = 8) -> dict:
    """The rows end to end, unpadded (--unpadded): input_ids / token_type_ids (T,), cu_seqlens (B+1,) int32,
    max_seqlen (the longest row rounded up: a host-side bucket); per-row labels (B,), per-token labels (T,)."""
    lengths = [len(r["input_ids"]) for r in rows]
    batch = {"input_ids": torch.tensor([t for r in rows for t in r["input_ids"]], dtype=torch.long),
             "token_type_ids": torch.tensor([t for r in rows for t in r["token_type_ids"]], dtype=torch.long),
             "cu_seqlens": torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32),
             "max_seqlen": (max(lengths) + pad_multiple - 1) // pad_multiple * pad_multiple}
    for key in rows[0]:
        if key in batch or key == "attention_mask":
            continue
        values = [r[key] for r in rows]
        if isinstance(values[0], list):
            batch[key] = torch.tensor([v for value in values for v in value], dtype=torch.long)
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
        batch = collate([{k: rows[i][k] for k in ("input_ids", "token_type_ids")} for i in idx])
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
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.learning_rate, betas=(0.9, 0.999),
                             eps=1e-6)


def train(model, train_rows: list, evaluate, best_metric: str, cfg: TrainConfig, *, task: str,
          settings: dict | None = None, tokenizer_dir=None, extra_config: dict | None = None) -> dict:
    """Fine-tune `model` on `train_rows` (feature dicts with labels), calling `evaluate(model) -> (metrics, files)`
    after each epoch; `files` ({name: JSON object}, e.g. SQuAD predictions) are written for the best epoch, whose
    model goes to OUT/best/ (HF format). With no train rows, evaluates once (prediction only).
    Returns the summary written to OUT/metrics.json."""
    world, rank, local_rank = _distributed()
    threads = choose_threads(cfg.threads)
    if rank == 0:
        tqdm.write(threads.describe())
    out_dir = Path(cfg.out_dir)
    device = pick_device(cfg.device, local_rank)
    kernels.use(cfg.kernels)
    backend = resolve_guarded(device, kernel_uses(model, "fp32", cfg.unpadded),  # auto on a GPU: checked there first
                              say=tqdm.write if rank == 0 else lambda m: m.startswith("warning") and tqdm.write(m))
    if world > 1 and not torch.distributed.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
        destroy_at_exit()
    if cfg.dropout is not None:  # every module reads the one shared BertConfig (saved with best/ too)
        model.cfg.set_dropout(cfg.dropout)
    set_seed(cfg.seed)
    model.to(device)
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda"
                                                        else None)
    per_rank = max(1, cfg.batch_size // world)
    steps_per_epoch = math.ceil(len(train_rows) / (per_rank * world)) if train_rows else 0
    total_steps = int(math.ceil(steps_per_epoch * cfg.epochs))
    warmup = int(cfg.warmup_ratio * total_steps)
    summary = {"task": task, "settings": {**(settings or {}), **asdict(cfg), "world_size": world,
                                          "device": str(device), "kernels_used": backend,
                                          "threads": threads.record(),
                                          "train_rows": len(train_rows),
                                          "total_steps": total_steps, "warmup_steps": warmup},
               "best_metric": best_metric, "epochs": []}
    if rank == 0:
        check_folder_owned(out_dir, "finetune")  # a new or empty folder, or an earlier fine-tuning's
        earlier = read_json_or_none(out_dir / "metrics.json")
        replace_earlier_output(out_dir, "fine-tuning", {"task": task}, earlier if isinstance(earlier, dict) else None,
                               cfg.overwrite)
        out_dir.mkdir(parents=True, exist_ok=True)
    log = RunLog(out_dir, rank == 0, cfg.report_to or default_report_to(), config=summary["settings"])
    step = 0

    def run_eval(epoch, train_loss, seconds):
        if rank == 0:
            metrics, files = evaluate(model)
            record = {"epoch": epoch, "train_loss": train_loss, "train_seconds": seconds, **metrics}
            summary["epochs"].append(record)
            log.write({"step": step, "epoch": epoch,
                       **{f"eval_{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}})
            tqdm.write(f"[{task}] epoch {epoch}: " + ", ".join(
                f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items() if k != "epoch"))
            best = summary.get("best")
            if best is None or metrics[best_metric] > best[best_metric]:
                summary["best"], summary["best_epoch"] = record, epoch
                for name, obj in files.items():
                    atomic_write_json(out_dir / name, obj)
                if cfg.save_model:
                    save_pretrained(model, out_dir / "best", tokenizer_dir=tokenizer_dir, extra_config=extra_config)
            atomic_write_json(out_dir / "metrics.json", summary)
        if world > 1:
            torch.distributed.barrier()

    if total_steps == 0:
        run_eval(0, None, 0.0)
        log.close()
        return summary
    optimizer = _optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, total_steps, warmup, "linear")
    rng = np.random.default_rng(cfg.seed)
    epoch, t0 = 0, time.time()
    interval = {"loss": 0.0, "steps": 0, "sequences": 0, "tokens": 0, "slots": 0, "t": time.perf_counter()}
    progress = tqdm(total=total_steps, desc=f"finetune {task}", disable=rank != 0, mininterval=2.0)
    while step < total_steps:
        epoch += 1
        net.train()
        losses = []
        batches = _batches(len(train_rows), per_rank * world, rng)  # same order on every rank (same seed)
        for idx in batches:
            if step >= total_steps:
                break
            mine = idx[rank::world] if world > 1 else idx
            if len(mine) == 0:
                mine = idx[:1]
            rows = [train_rows[i] for i in mine]
            batch = {k: v.to(device) if hasattr(v, "to") else v
                     for k, v in (collate_packed(rows) if cfg.unpadded else collate(rows)).items()}
            loss = net(**batch).loss
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm or float("inf"))
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            step += 1
            interval["loss"] += losses[-1]
            interval["steps"] += 1
            interval["sequences"] += len(mine)
            tokens = int(batch["cu_seqlens"][-1]) if cfg.unpadded else int(batch["attention_mask"].sum())
            interval["tokens"] += tokens
            interval["slots"] += tokens if cfg.unpadded else batch["attention_mask"].numel()
            if step % cfg.log_every == 0 or step == total_steps:
                seconds = time.perf_counter() - interval["t"]
                log.write({"step": step, "epoch": epoch, "loss": interval["loss"] / interval["steps"], "lr": lr,
                           "grad_norm": float(grad_norm), "seq_per_s": interval["sequences"] * world / seconds,
                           "tokens_per_s": interval["tokens"] * world / seconds,
                           "padding_efficiency": interval["tokens"] / interval["slots"], "kernels": backend})
                interval.update(loss=0.0, steps=0, sequences=0, tokens=0, slots=0, t=time.perf_counter())
            progress.update(1)
            progress.set_postfix(epoch=epoch, loss=f"{np.mean(losses[-50:]):.4f}")
        run_eval(epoch, float(np.mean(losses)) if losses else None, time.time() - t0)
    progress.close()
    log.close()
    summary["train_seconds"] = time.time() - t0
    if rank == 0:
        atomic_write_json(out_dir / "metrics.json", summary)
    return summary
