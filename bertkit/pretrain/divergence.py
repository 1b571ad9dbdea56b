"""Divergence: a non-finite loss or a loss spike stops the run, or rolls it back to the newest checkpoint that
verifies and goes on with the data after the bad step (PaLM's recipe for loss spikes), at most --max-rollbacks times."""
import collections
import math
import os
import statistics

from bertkit.pretrain.checkpoints import choose_checkpoint, load_checkpoint, restore_rng
from bertkit.pretrain.config import PretrainConfig, TrainingError
from bertkit.pretrain.metrics import say


class Divergence:
    """Non-finite losses and loss spikes (above spike_factor x the median of the last spike_window losses): raise
    TrainingError ("stop"), or return why so the loop rolls back ("rollback"), at most max_rollbacks times."""

    def __init__(self, cfg: PretrainConfig):
        self.cfg, self.recent, self.rollbacks = cfg, collections.deque(maxlen=cfg.spike_window), 0

    def check(self, loss: float, step: int, last_ckpt) -> str | None:
        cfg = self.cfg
        if not math.isfinite(loss):
            problem, policy = f"loss is {loss}", cfg.on_nonfinite
        elif cfg.on_spike != "none" and len(self.recent) >= min(20, cfg.spike_window) \
                and loss > cfg.spike_factor * statistics.median(self.recent):
            median = statistics.median(self.recent)
            problem = (f"loss spike: {loss:.4g} > {cfg.spike_factor:g} x the median {median:.4g} of the last "
                       f"{len(self.recent)} steps")
            policy = cfg.on_spike
        else:
            self.recent.append(loss)
            return None
        where = f"the last good checkpoint is {last_ckpt}" if last_ckpt else "no checkpoint was saved yet"
        if policy == "rollback" and last_ckpt is not None and self.rollbacks < cfg.max_rollbacks:
            self.rollbacks += 1
            return problem
        if policy == "rollback":
            why = "no checkpoint was saved yet" if last_ckpt is None else f"{cfg.max_rollbacks} rollbacks already"
            raise TrainingError(f"{problem} at step {step}; cannot roll back ({why}). Try a lower --lr, a longer "
                                f"--warmup, or check the instances; then resume with --resume.")
        raise TrainingError(
            f"{problem} at step {step}; stopped without saving ({where}). Try a lower --lr, a longer --warmup, "
            f"--precision bf16 or fp32 instead of fp16, --on-nonfinite rollback, and check the instances; "
            f"then resume with --resume (from that checkpoint) or start again.")


def roll_back(run, problem: str) -> None:
    """Reload the newest checkpoint that verifies; the data goes on after the bad step (its window is skipped),
    the RNG and the loader from there, and the metrics of the rolled-back steps are dropped."""
    bad_step, consumed = run.step, run.consumed()
    chosen = choose_checkpoint(run.run_dir, run.rank, say)
    if chosen.tag is None:
        raise TrainingError(f"{problem} at step {bad_step}, and no checkpoint verifies to roll back to")
    run.step, _, run.last_ckpt = load_checkpoint(run.engine, run.run_dir, chosen)
    if run.ema is not None:
        run.ema.load(run.last_ckpt)
    run.skipped = consumed - run.micro_batches_before(run.step)
    run.reopen_loader()
    restore_rng(run.last_ckpt, run.rank)
    run.meter.reduce()  # drop the sums of the rolled-back steps
    run.log.write({"step": bad_step, "rollback_to": run.step, "rollback_reason": problem,
                   "skipped_micro_batches": run.skipped})
    window = run.micro_batches_before(bad_step) - run.micro_batches_before(run.step)
    say(f"{problem} at step {bad_step}: rolled back to {chosen.tag} and skipped {window} micro "
        f"batch(es) of data per rank (rollback {run.divergence.rollbacks} of at most {run.cfg.max_rollbacks})")
    run.interval_started()


def injected_fault(step: int) -> float:
    """Test-only hook: BERTKIT_FAULT_STEPS="7:nan,9:1000" multiplies the loss of those steps' first attempt."""
    faults = dict(f.split(":") for f in os.environ.get("BERTKIT_FAULT_STEPS", "").split(",") if f)
    if str(step) not in faults or step in _FAULTS_DONE:
        return 1.0
    _FAULTS_DONE.add(step)
    return float(faults[str(step)])


_FAULTS_DONE: set = set()
