"""A run's metrics as it goes: JSON lines (RUN/metrics.jsonl, the record bertkit itself reads back), TensorBoard
(RUN/tensorboard/) and Weights & Biases (offline, RUN/wandb/), for pretraining and fine-tuning alike.

Records are flat dicts with a "step"; numbers become scalars grouped by kind: eval_* under eval/, throughput under
perf/, everything else under train/. Strings (the kernels backend) stay in the JSON lines only.
"""
import json
import os
import time
from pathlib import Path

from bertkit.fileio import note_written, open_append
from bertkit.formats import METRICS, TENSORBOARD

REPORT_TO = ("tensorboard", "wandb")
PERF = ("seq_per_s", "tokens_per_s", "mfu", "padding_efficiency")


class ReportError(ValueError):
    pass


def scalar_tag(key: str) -> str:
    if key.startswith("eval_"):
        return "eval/" + key[len("eval_"):]
    return ("perf/" if key in PERF else "train/") + key


def parse_report_to(value) -> tuple:
    """"tensorboard", "tensorboard,wandb", "none" or a sequence -> a tuple of REPORT_TO names."""
    names = value.split(",") if isinstance(value, str) else list(value or ())
    names = tuple(n.strip() for n in names if n.strip() and n.strip() != "none")
    unknown = [n for n in names if n not in REPORT_TO]
    if unknown:
        raise ReportError(f"--report-to {','.join(unknown)}: choose from {', '.join(REPORT_TO)} or none")
    return names


class RunLog:
    """Writes one process's records (rank 0's: other ranks pass enabled=False)."""

    def __init__(self, run_dir, enabled: bool = True, report_to=("tensorboard",), config: dict | None = None):
        self.enabled = enabled
        self.file = self.tb = self.wandb = None
        if not enabled:
            return
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir, self.began = run_dir, time.time_ns()
        self.file = open_append(run_dir / METRICS)
        report_to = parse_report_to(report_to)
        if "tensorboard" in report_to:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ReportError("--report-to tensorboard needs TensorBoard: pip install 'bertkit[tensorboard]' "
                                  "(or --report-to none)") from e
            self.tb = SummaryWriter(str(run_dir / TENSORBOARD))
        if "wandb" in report_to:
            try:
                import wandb
            except ImportError as e:
                raise ReportError("--report-to wandb needs Weights & Biases: pip install wandb") from e
            # offline unless the user set WANDB_MODE: `wandb sync RUN/wandb/offline-run-*` uploads it later
            self.wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "bertkit"), dir=str(run_dir),
                                    mode=os.environ.get("WANDB_MODE", "offline"), config=config or {},
                                    name=run_dir.name)

    def write(self, record: dict):
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        scalars = {k: v for k, v in record.items()
                   if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(scalar_tag(k), v, record["step"])
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log({scalar_tag(k): v for k, v in scalars.items()}, step=record["step"])

    def close(self):
        if not self.enabled:
            return
        self.file.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
        # TensorBoard and W&B write their own files: named to the record of what this command wrote
        for folder in (self.run_dir / TENSORBOARD, self.run_dir / "wandb"):
            for path in folder.rglob("*") if folder.is_dir() and not folder.is_symlink() else ():
                if path.is_file() and not path.is_symlink() and path.stat().st_mtime_ns >= self.began:
                    note_written(path)


class Throughput:
    """A log interval's clock and what its batches held, as the rates every training record carries (PERF), in
    pretraining and fine-tuning alike. Counts stay as the batch gives them (tensors on the device: no sync per step)
    until `rates` reads them once."""

    def __init__(self):
        self.restart()

    def restart(self) -> None:
        """A new interval (also after an evaluation, whose time is not training's)."""
        self.sequences = self.tokens = self.slots = 0
        self.t = time.perf_counter()

    def add_batch(self, batch: dict) -> None:
        """A collated batch: packed (cu_seqlens ends at the real tokens; a tail past it is padding) or padded
        (attention_mask marks the real tokens)."""
        ids = batch["input_ids"]
        if "cu_seqlens" in batch:
            self.sequences += batch["cu_seqlens"].numel() - 1
            self.tokens, self.slots = self.tokens + batch["cu_seqlens"][-1].long(), self.slots + ids.numel()
        else:
            self.sequences += ids.shape[0]
            self.tokens = self.tokens + batch["attention_mask"].sum() if "attention_mask" in batch else \
                self.tokens + ids.numel()
            self.slots += ids.numel()

    def rates(self, over_ranks: bool = False) -> dict:
        """Sequences and tokens per second (summed over the ranks when asked: every rank must call it then) and
        the share of the positions computed that were real tokens; the interval then restarts."""
        seconds = time.perf_counter() - self.t
        counts = [float(x) for x in (self.sequences, self.tokens, self.slots)]
        if over_ranks:
            import torch
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                like = self.tokens if isinstance(self.tokens, torch.Tensor) else torch.zeros(())
                summed = torch.tensor(counts, dtype=torch.float64, device=like.device)
                dist.all_reduce(summed)
                counts = summed.tolist()
        sequences, tokens, slots = counts
        self.restart()
        return {"seq_per_s": sequences / seconds, "tokens_per_s": tokens / seconds,
                "padding_efficiency": tokens / max(slots, 1)}


def default_report_to() -> str:
    """TensorBoard when it is installed (the tensorboard extra), else nothing besides metrics.jsonl."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return "none"
    return "tensorboard"


def read_metrics(run_dir) -> list[dict]:
    """RUN/metrics.jsonl, records merged per step (a resumed run appends: later lines win)."""
    by_step = {}
    path = Path(run_dir) / METRICS
    if not path.is_file():
        return []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            by_step.setdefault(r["step"], {}).update(r)
    return [by_step[s] for s in sorted(by_step)]
