"""Pretraining metrics: sums kept on the device between logs (Meter), one record per log (MetricsLog: JSON lines,
TensorBoard, W&B and the progress bar), model FLOPs utilisation, and `say` for the run's notes on stderr."""
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from bertkit.formats import IGNORE_INDEX
from bertkit.models.electra import rtd_metrics
from bertkit.runlog import RunLog

# dense bf16/fp16 tensor-core peak per GPU, for MFU
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10": 125e12,
              "V100": 125e12, "RTX 4090": 165e12, "RTX 3090": 71e12}


def say(message: str) -> None:
    print(f"\n{message}", file=sys.stderr, flush=True)


def peak_flops() -> float | None:
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def training_flops(n_params: int, num_layers: int, hidden_size: int, seq_len: int, tokens: float) -> float:
    """Forward + backward FLOPs: 6 per parameter per token, plus attention's 12 * L * H * S per token."""
    return 6 * n_params * tokens + 12 * num_layers * hidden_size * seq_len * tokens


def top1_right(logits: torch.Tensor, labels: torch.Tensor, has: torch.Tensor) -> torch.Tensor:
    """(logits.argmax(-1) == labels) & has, read as "the label's logit is the largest": on the CPU torch's argmax
    over a 16,000-word vocabulary takes about 18x as long as a max (44 against 2.4 ms for 640 positions, one
    thread, timed beside other work: the ratio, not the times), a tenth of a tiny model's step. A tie with an
    earlier word counts as right here (never seen in floats)."""
    at_label = logits.gather(-1, torch.where(has, labels, 0).unsqueeze(-1).long()).squeeze(-1)
    return (at_label >= logits.amax(-1)) & has


class Meter:
    """Sums over the micro batches of a log interval, kept on the device (no sync per step).

    mlm_acc counts every chosen position, including the 10 % left unchanged, which a model gets right by copying its
    input; mlm_mask_acc counts only the positions that read [MASK] (given mask_id): the number that says whether
    the model predicts from context or is still in the unigram plateau MLM training starts in."""

    NAMES = ("loss", "mlm_loss", "nsp_loss", "mlm_correct", "mlm_count", "nsp_correct", "nsp_count", "micro",
             "mask_correct", "mask_count",
             "disc_loss", "rtd_correct", "rtd_count", "rtd_tp", "rtd_fp", "rtd_fn")  # the last six: ELECTRA's

    def __init__(self, device, mask_id: int | None = None):
        self.sums = torch.zeros(len(self.NAMES), dtype=torch.float64, device=device)
        self.mask_id = mask_id

    @torch.no_grad()
    def add(self, out, batch):
        """One micro batch's sums; a batch without next_sentence_label (--objective none) adds no NSP numbers."""
        labels = batch["mlm_labels"]
        has = labels != IGNORE_INDEX
        right = top1_right(out.mlm_logits, labels, has)
        mlm_correct = right.sum()
        if self.mask_id is not None:  # the input token at each chosen position: packed batches index flat tokens
            ids, pos = batch["input_ids"], batch["mlm_positions"]
            seen = ids.reshape(-1)[pos] if "cu_seqlens" in batch else ids.gather(1, pos)
            at_mask = has & (seen == self.mask_id)
            mask_correct, mask_count = (right & at_mask).sum().double(), at_mask.sum().double()
        else:
            mask_correct = mask_count = has.new_zeros((), dtype=torch.float64)
        n = float(batch["cu_seqlens"].numel() - 1 if "cu_seqlens" in batch else batch["input_ids"].shape[0])
        if "next_sentence_label" in batch:
            nsp_correct = (out.nsp_logits.argmax(-1) == batch["next_sentence_label"]).sum()
            nsp_loss, nsp_count = out.nsp_loss.detach().double(), n
        else:
            nsp_correct, nsp_loss, nsp_count = has.new_zeros(()), has.new_zeros((), dtype=torch.float64), 0.0
        scalars = torch.tensor([nsp_count, 1.0], dtype=torch.float64, device=self.sums.device)
        values = torch.cat([torch.stack([out.loss.detach().double(), out.mlm_loss.detach().double(),
                                         nsp_loss, mlm_correct.double(),
                                         has.sum().double(), nsp_correct.double()]),
                            scalars, torch.stack([mask_correct, mask_count]), electra_sums(out, self.sums)])
        self.sums += values

    def reduce(self) -> dict:
        """Sums over every rank since the last reduce (then zeroed): losses and accuracies."""
        sums = self.sums.clone()
        dist.all_reduce(sums)
        s = dict(zip(self.NAMES, sums.tolist()))
        self.sums.zero_()
        micro = max(s["micro"], 1)
        r = {"loss": s["loss"] / micro, "mlm_loss": s["mlm_loss"] / micro, "nsp_loss": s["nsp_loss"] / micro,
             "mlm_acc": s["mlm_correct"] / max(s["mlm_count"], 1),
             "nsp_acc": s["nsp_correct"] / max(s["nsp_count"], 1)}
        if s["mask_count"]:
            r["mlm_mask_acc"] = s["mask_correct"] / s["mask_count"]
        if s["rtd_count"]:
            r.update(disc_loss=s["disc_loss"] / micro, **rtd_metrics(*(s[k] for k in (
                "rtd_correct", "rtd_count", "rtd_tp", "rtd_fp", "rtd_fn"))))
        return r


def electra_sums(out, like: torch.Tensor) -> torch.Tensor:
    """[discriminator loss, replaced-token detection counts] of an ELECTRA output; zeros for any other model."""
    if getattr(out, "rtd", None) is None:
        return like.new_zeros(6)
    return torch.cat([out.disc_loss.detach().double().view(1), out.rtd.to(like.device)])


class MetricsLog:
    """Rank 0's records (bertkit.runlog: JSON lines, TensorBoard, W&B) and the progress bar."""

    def __init__(self, run_dir: Path, enabled: bool, total: int, initial: int, progress: bool,
                 report_to="tensorboard", config: dict | None = None):
        self.log = RunLog(run_dir, enabled, report_to, config)
        self.bar = None
        if enabled:   # --no-progress: no bar, a plain line a minute
            from bertkit.progress import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="pretrain", unit="step", dynamic_ncols=True,
                            plain=not progress)

    def write(self, record: dict):
        self.log.write(record)

    def advance(self, n: int, postfix: dict | None = None):
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)

    def close(self):
        self.log.close()
        if self.bar is not None:
            self.bar.close()


def as_float(x):
    if x is None:
        return None
    return float(x.item() if hasattr(x, "item") else x)


def current_lr(engine) -> float:
    return float(engine.optimizer.param_groups[0]["lr"]) if hasattr(engine.optimizer, "param_groups") else \
        float(engine.get_lr()[0])
