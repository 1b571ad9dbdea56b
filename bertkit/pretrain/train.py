"""The pretraining loop: BERT MLM + NSP on an instances folder, under DeepSpeed (ZeRO stage 0-3).

`pretrain(PretrainConfig(...))` is the whole stage. Under `deepspeed cli.py pretrain` every rank runs it; under
`bertkit pretrain` it makes a process group of one itself. It reads top to bottom: settings, model, engine, data,
then the loop (forward/backward/step per micro batch, a log record, an evaluation, a checkpoint).
"""
import collections
import functools
import json
import math
import os
import signal
import socket
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import deepspeed
import deepspeed.ops
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator
from torch.optim.lr_scheduler import LambdaLR

from bertkit import kernels
from bertkit.data import EpochBatches, InstanceDataset, batch_loader, close_loader, collate, collate_packed
from bertkit.distributed import destroy_at_exit
from bertkit.fileio import disk_errors
from bertkit.formats import RUN_CONFIG, InstancesManifest, read_instances_manifest, read_run_config
from bertkit.kernel_guard import kernel_uses, resolve_guarded
from bertkit.models import describe, family_of
from bertkit.optim import build_optimizer, build_scheduler, param_groups
from bertkit.pretrain.budget import BudgetSchedule, plan_schedule
from bertkit.pretrain.checkpoints import (
    choose_checkpoint,
    load_checkpoint,
    prepare_run_dir,
    restore_rng,
    run_folder_lock,
    save_checkpoint,
    seed_rank,
    write_run_folder,
)
from bertkit.pretrain.config import ConfigError, PretrainConfig, TrainingError, resolve_deepspeed_config
from bertkit.pretrain.metrics import Meter, MetricsLog, as_float, current_lr, peak_flops, training_flops
from bertkit.pretrain.plateau import Plateau
from bertkit.pretrain.resume import apply as apply_resume_changes, compare as resume_changes, inherit
from bertkit.pretrain.start import build_model, planned_family
from bertkit.recipes import RECIPES, as_flags
from bertkit.runlog import ReportError, default_report_to, parse_report_to
from bertkit.threads import choose_threads


def pretrain(cfg: PretrainConfig, given: set | None = None) -> dict:
    """Train; returns the last logged metrics (plus "step", "checkpoint" and "stopped_by_signal": the signal number
    that stopped the run early, or None). With --resume, a setting left None (or, from the CLI, a flag not in
    `given`) is the run's own."""
    if cfg.resume and (Path(cfg.out) / RUN_CONFIG).is_file():
        cfg = inherit(cfg, read_run_config(cfg.out), given)
    manifest = read_instances_manifest(cfg.instances)
    cfg = cfg.with_recipe(read_user_deepspeed_config(cfg))
    cfg.check()
    try:
        parse_report_to(cfg.report_to or "none")
    except ReportError as e:
        raise ConfigError(str(e)) from None
    rank, world, _, device = init_distributed()  # rank: the global rank, on every node; it decides who writes
    with run_folder_lock(Path(cfg.out), rank), \
            disk_errors(cfg.out, "free space (or fix the disk), then resume with --resume"):
        return _pretrain(cfg, manifest, rank, world, device)


def _pretrain(cfg: PretrainConfig, manifest, rank: int, world: int, device) -> dict:
    run_dir = Path(cfg.out)
    on_cuda = device.type == "cuda"
    threads = choose_threads(cfg.threads)
    if rank == 0:
        say(threads.describe())
    kernels.use(cfg.kernels)
    try:
        kernels.resolve(device)  # a backend this device cannot run stops here, before anything is loaded
        budget, max_steps = plan_schedule(cfg)  # budget: --time-budget / --schedule-from, else None
    except (kernels.BackendError, ValueError) as e:
        raise ConfigError(str(e)) from None
    chosen = choose_checkpoint(run_dir, rank, say) if cfg.resume else None
    previous_run = prepare_run_dir(cfg, manifest, chosen)
    if planned_family(cfg, manifest, previous_run).splits_documents and not cfg.unpadded:
        cfg = replace(cfg, unpadded=True)  # its documents are cut apart in packed rows; padding would join them
        if rank == 0:
            say("ModernBERT trains on packed batches (--unpadded): each document attends only to itself")
    ds_config, settings = resolve_settings(cfg, world, rank, on_cuda)
    objective = cfg.effective_objective(previous_run.objective if previous_run else manifest.objective)
    changes = [] if previous_run is None else \
        resume_changes(previous_run, cfg, settings, world, manifest, objective, chosen.marker and chosen.marker.step)
    if cfg.recipe and rank == 0:
        say_recipe(cfg, manifest)
    if objective == "electra" and manifest.objective in ("nsp", "sop") and rank == 0:
        say(f"note: ELECTRA trains replaced-token detection only; the instances' {manifest.objective.upper()} "
            "labels are not used")

    # model, optimizer, engine
    torch.manual_seed(cfg.seed)  # same initial weights on every rank
    model, bert_cfg, init_source = build_model(cfg, manifest, previous_run, objective)
    # logged with the run (the weights never depend on it); auto on a GPU is checked there first
    backend = resolve_guarded(device, kernel_uses(model, settings.precision, cfg.unpadded),
                              say=say if rank == 0 else lambda m: m.startswith("warning") and say(m))
    optimizer = build_optimizer(settings.optimizer, param_groups(model, settings.weight_decay), settings.lr,
                                cfg.betas, cfg.eps, on_cuda)
    scheduler = None if "scheduler" in ds_config else LambdaLR(optimizer, budget) if budget else \
        build_scheduler(optimizer, max_steps, cfg.warmup_steps(max_steps), cfg.schedule, cfg.decay)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=ds_config, dist_init_required=False)
    if rank == 0:
        write_run_folder(cfg, settings, ds_config, describe(model), init_source, manifest, world, backend, objective,
                         previous_run, changes, chosen.marker.step if changes and chosen.marker else None,
                         threads.record())
    dist.barrier()

    step, skipped, last_ckpt = 0, 0, None  # skipped: micro batches passed over by divergence rollbacks
    if cfg.resume:
        step, skipped, last_ckpt = load_checkpoint(engine, run_dir, chosen)  # restores the budget's time used too
        apply_resume_changes(changes, scheduler, settings, ds_config)
        if changes and rank == 0:
            say(f"--resume at step {step} changes {'; '.join(map(str, changes))} (from step {step + 1} on)")
    else:
        seed_rank(cfg.seed, rank)

    # data: this rank's micro batches from the first one not yet trained on
    train = InstanceDataset(cfg.instances, "train", cfg.seed, manifest)
    holdout = InstanceDataset(cfg.instances, "holdout", cfg.seed, manifest)
    gas, micro = settings.grad_accum, settings.micro_batch
    sampler = EpochBatches(len(train), micro, cfg.seed, rank, world)
    if sampler.per_epoch == 0:
        raise ConfigError(f"{cfg.instances}: {len(train)} training instances cannot fill one micro batch of "
                          f"{micro} on each of {world} rank(s); lower --micro-batch")
    # ModernBERT: the documents an MLM-only row holds never attend across each other
    split_at = train.sep_id if family_of(model).splits_documents else None
    loader = open_loader(train, sampler, step * gas + skipped, cfg, split_at)
    stop = StopFlag()
    old_handlers = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    log = None
    try:
        if cfg.resume:
            restore_rng(last_ckpt, rank)  # after the loader: making it draws from torch's generator
        divergence = Divergence(cfg)
        log = MetricsLog(run_dir, rank == 0, max_steps, step, cfg.progress, cfg.report_to or default_report_to(),
                         config={"pretrain": asdict(cfg), "resolved": asdict(settings), "model": bert_cfg.to_dict()})
        if changes:
            log.write({"step": step, "resume_changes": {c.setting: [c.before, c.after] for c in changes}})
        meter = Meter(device, train.mask_id)
        count_flops = functools.partial(training_flops, sum(p.numel() for p in model.parameters()),
                                        model.cfg.num_layers, model.cfg.hidden_size)
        record, t0, steps_in_interval, grad_norm = {}, time.perf_counter(), 0, None
        clock0 = time.perf_counter() - (budget.used_s if budget else 0.0)  # a resumed budget counts time used
        eval_clock = EvalClock(budget, cfg.eval_every)
        plateau = Plateau.measure(holdout) if len(holdout) and cfg.eval_every and rank == 0 else None
        engine.train()
        while not finished(step, max_steps, budget):
            step_loss = torch.zeros(3, dtype=torch.float64, device=device)  # [loss sum, stop requested, seconds]
            for k in range(gas):
                batch = for_objective(to_device(next(loader), device), objective)
                try:
                    out = engine(**batch)
                    loss_k = out.loss * _injected_fault(step + 1)
                    engine.backward(loss_k)
                    if k == gas - 1 and settings.zero_stage == 0:  # DeepSpeed reports no norm there; before clipping
                        grad_norm = global_grad_norm(model)
                    engine.step()
                except (torch.OutOfMemoryError, MemoryError) as e:
                    raise out_of_memory(batch, step, k, gas, rank, cfg.unpadded, settings.global_batch, micro) from e
                meter.add(out, batch)
                step_loss[0] += loss_k.detach().double() / gas
            step += 1
            steps_in_interval += 1
            step_loss[1] = 1.0 if stop.signal is not None else 0.0
            step_loss[2] = time.perf_counter() - clock0
            dist.all_reduce(step_loss)  # every rank sees the same loss, stop request and clock: all act together
            loss, seconds = step_loss[0].item() / world, step_loss[2].item() / world
            if budget:
                budget.used_s = seconds
            if problem := divergence.check(loss, step, last_ckpt):  # every rank sees the same loss: same decision
                bad_step, consumed = step, step * gas + skipped
                step, skipped, last_ckpt, chosen = roll_back(engine, run_dir, rank, bad_step, consumed, gas, problem)
                close_loader(loader)
                loader = open_loader(train, sampler, step * gas + skipped, cfg, split_at)
                restore_rng(last_ckpt, rank)
                meter.reduce()  # drop the sums of the rolled-back steps
                log.write({"step": bad_step, "rollback_to": step, "rollback_reason": problem,
                           "skipped_micro_batches": skipped})
                say(f"{problem} at step {bad_step}: rolled back to {chosen.tag} and skipped "
                    f"{(bad_step - step) * gas} micro batch(es) of data per rank (rollback {divergence.rollbacks} "
                    f"of at most {cfg.max_rollbacks})")
                t0, steps_in_interval = time.perf_counter(), 0
                continue

            last = finished(step, max_steps, budget)
            if step % cfg.log_every == 0 or last:
                record = train_record(meter.reduce(), time.perf_counter() - t0, step, seconds, engine, grad_norm,
                                      settings, objective, sampler.per_epoch, backend, batch, count_flops, cfg)
                log.write(record)
                log.advance(steps_in_interval, {"loss": f"{record['loss']:.3f}", "seq/s": f"{record['seq_per_s']:.0f}"})
                t0, steps_in_interval = time.perf_counter(), 0

            if len(holdout) and cfg.eval_every and (step % cfg.eval_every == 0 or eval_clock.due(seconds, last)):
                ev = evaluate(engine, holdout, micro, rank, world, cfg.eval_batches, device, cfg.seed, cfg.unpadded,
                              objective, split_at)
                if ev:
                    log.write({"step": step, "elapsed_s": seconds, **ev})
                    progress = seconds / budget.budget_s if budget and budget.budget_s else step / (max_steps or step)
                    if plateau and (note := plateau.check(ev, step, progress)):
                        say(note)
                        log.write({"step": step, "plateau": {"baseline": plateau.baseline, "token": plateau.token}})
                t0 = time.perf_counter()

            stopping = step_loss[1].item() > 0
            if step % cfg.save_every == 0 or last or stopping:
                last_ckpt = save_checkpoint(engine, run_dir, step, rank, cfg.keep_last, skipped)
                if budget and rank == 0:
                    budget.record(run_dir, step)
                t0 = time.perf_counter()
            if stopping:
                if rank == 0:
                    print(f"\nstopped by signal at step {step}; saved {last_ckpt}. Continue with --resume.",
                          flush=True)
                break
        if budget and budget.spent() and rank == 0:
            print(f"\ntime budget of {budget.budget_s:.0f} s spent after {step} steps; saved {last_ckpt}",
                  flush=True)
    except ReportError as e:
        raise ConfigError(str(e)) from None
    finally:
        close_loader(loader)  # its workers ignore SIGTERM: left to interpreter exit, they would hang it
        if log is not None:
            log.close()
        for s, h in old_handlers.items():
            signal.signal(s, h)
    return {**record, "step": step, "checkpoint": str(last_ckpt) if last_ckpt else None,
            "stopped_by_signal": stop.signal}


def say_recipe(cfg: PretrainConfig, manifest: InstancesManifest) -> None:
    """The recipe's settings, the ones the flags changed, and instances made otherwise than it was measured on."""
    recipe = RECIPES[cfg.recipe]
    yours = {k: getattr(cfg, k) for k, v in recipe["pretrain"].items() if getattr(cfg, k) not in (None, v)}
    say(f"recipe {cfg.recipe}: {as_flags(recipe['pretrain'])}" + (f"; yours win: {as_flags(yours)}" if yours else ""))
    made = {"max_seq_length": manifest.max_seq_length, "mode": manifest.mode}
    differ = {k: v for k, v in made.items() if recipe["make-instances"].get(k, v) != v}
    if differ:
        say(f"note: recipe {cfg.recipe} was measured on instances made with `make-instances --recipe {cfg.recipe}` "
            f"({as_flags(recipe['make-instances'])}); {cfg.instances} has {as_flags(differ)}")


class EvalClock:
    """A time-budgeted run also evaluates every tenth of its budget and at its end, so a budget shorter than
    --eval-every steps still draws a held-out curve. Every rank sees the same all-reduced clock: all evaluate."""

    def __init__(self, budget: BudgetSchedule | None, eval_every: int):
        live = budget is not None and budget.replay is None and budget.budget_s  # a replay keeps its steps' evals
        self.every = budget.budget_s / 10 if live and eval_every else None
        self.next = ((budget.used_s // self.every) + 1) * self.every if self.every else None

    def due(self, seconds: float, last: bool) -> bool:
        if self.every is None or not (last or seconds >= self.next):
            return False
        self.next = (seconds // self.every + 1) * self.every
        return True


def finished(step: int, max_steps: int | None, budget: BudgetSchedule | None) -> bool:
    return (max_steps is not None and step >= max_steps) or (budget is not None and budget.spent())


def open_loader(train, sampler: EpochBatches, consumed: int, cfg: PretrainConfig, split_at: int | None = None):
    """This rank's batches from micro batch `consumed` (counted over epochs) on."""
    sampler.start_epoch, sampler.start = divmod(consumed, sampler.per_epoch)
    return iter(batch_loader(train, sampler, cfg.num_workers, unpadded=cfg.unpadded, split_at=split_at))


def roll_back(engine, run_dir: Path, rank: int, bad_step: int, consumed: int, gas: int, problem: str):
    """Reload the newest checkpoint that verifies; the data goes on after the bad step (its window is skipped).
    Returns (step, skipped micro batches, checkpoint path, the chosen checkpoint)."""
    chosen = choose_checkpoint(run_dir, rank, say)
    if chosen.tag is None:
        raise TrainingError(f"{problem} at step {bad_step}, and no checkpoint verifies to roll back to")
    step, _, last_ckpt = load_checkpoint(engine, run_dir, chosen)
    return step, consumed - step * gas, last_ckpt, chosen


def train_record(m: dict, interval_s: float, step: int, elapsed_s: float, engine, grad_norm, settings, objective,
                 per_epoch: int, backend: str, batch: dict, count_flops, cfg: PretrainConfig) -> dict:
    """One training log record from the Meter's sums over the interval; count_flops(seq_len, tokens) for the MFU."""
    record = {"step": step, "loss": m["loss"], "mlm_loss": m["mlm_loss"], "mlm_acc": m["mlm_acc"],
              **{k: m[k] for k in ("mlm_mask_acc",) if k in m}, **sentence_metrics(m, objective),
              "lr": current_lr(engine), "grad_norm": as_float(engine.get_global_grad_norm()) or as_float(grad_norm),
              "seq_per_s": m["sequences"] / interval_s, "tokens_per_s": m["tokens"] / interval_s,
              "padding_efficiency": m["padding_efficiency"], "epoch": (step * settings.grad_accum) // per_epoch,
              "elapsed_s": elapsed_s, "kernels": backend}
    if settings.precision == "fp16":
        record["loss_scale"] = as_float(getattr(engine.optimizer, "cur_scale", None)
                                        or getattr(engine.optimizer, "loss_scale", None))
        record["skipped_steps"] = int(engine.skipped_steps)
    if peak := peak_flops():
        seq = batch["max_seqlen"] if cfg.unpadded else batch["input_ids"].shape[1]
        flops = count_flops(seq, m["tokens"])
        record["mfu"] = flops / interval_s / (peak * dist.get_world_size())
    return record


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


def _injected_fault(step: int) -> float:
    """Test-only hook: BERTKIT_FAULT_STEPS="7:nan,9:1000" multiplies the loss of those steps' first attempt."""
    faults = dict(f.split(":") for f in os.environ.get("BERTKIT_FAULT_STEPS", "").split(",") if f)
    if str(step) not in faults or step in _FAULTS_DONE:
        return 1.0
    _FAULTS_DONE.add(step)
    return float(faults[str(step)])


_FAULTS_DONE: set = set()


def say(message: str) -> None:
    print(f"\n{message}", file=sys.stderr, flush=True)


def evaluate(engine, dataset, micro_batch: int, rank: int, world: int, max_batches: int, device, seed: int,
             unpadded: bool = False, objective: str = "nsp", split_at: int | None = None):
    """MLM (and NSP/SOP) loss and accuracy on the first max_batches micro batches (per rank) of the held-out
    instances."""
    micro_batch = min(micro_batch, len(dataset) // world)  # a small holdout still gets evaluated
    if micro_batch < 1:
        return None
    batches = EpochBatches(len(dataset), micro_batch, seed, rank, world, shuffle=False)
    if batches.per_epoch == 0:
        return None
    meter = Meter(device, dataset.mask_id)
    was_training = engine.module.training
    engine.module.eval()
    with torch.no_grad():
        for i, keys in enumerate(batches):
            if i >= min(max_batches, batches.per_epoch):
                break
            rows = [dataset[k] for k in keys]
            batch = to_device(collate_packed(rows, split_at=split_at) if unpadded else collate(rows), device)
            batch = for_objective(batch, objective)
            meter.add(engine(**batch), batch)
    engine.module.train(was_training)
    r = meter.reduce()
    return {f"eval_{k}": v for k, v in {"loss": r["loss"], "mlm_loss": r["mlm_loss"], "mlm_acc": r["mlm_acc"],
                                         **{k: r[k] for k in ("mlm_mask_acc",) if k in r},
                                         **sentence_metrics(r, objective)}.items()}


def for_objective(batch: dict, objective: str) -> dict:
    """MLM alone (instances made with --objective none, or pretrain --objective mlm) and ELECTRA: the model gets no
    sentence label, so it computes no NSP loss."""
    if objective in ("none", "electra"):
        batch.pop("next_sentence_label", None)
    return batch


def sentence_metrics(m: dict, objective: str) -> dict:
    """The second task's metrics under its own name: nsp_* or sop_*; ELECTRA's discriminator loss and replaced-token
    detection accuracy and F1; nothing for MLM alone."""
    if objective == "electra":
        return {k: m[k] for k in ("disc_loss", "rtd_acc", "rtd_f1")}
    if objective == "none":
        return {}
    return {f"{objective}_loss": m["nsp_loss"], f"{objective}_acc": m["nsp_acc"]}


# ---------------------------------------------------------------- the pieces pretrain() is made of

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed():
    """Join the launcher's process group, or make a group of one (`bertkit pretrain` without a launcher).
    Returns (global rank, world size, local rank, device). On several nodes every node's launcher numbers its own
    ranks from LOCAL_RANK 0: the local rank only picks this node's GPU; who writes what is decided by the global
    rank (and the data a rank reads by the global rank and world size)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    acc = get_accelerator()
    if acc.device_name() == "cpu":
        # DeepSpeed's CPU backend compiles a shared-memory op (~1 min) used only by inference all-reduce;
        # training's collectives go through gloo either way, so skip building it.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    made_here = not dist.is_initialized()
    try:
        deepspeed.init_distributed(dist_backend=acc.communication_backend_name())  # or adopts the caller's group
    except dist.DistNetworkError as e:
        if "EADDRINUSE" not in str(e):
            raise
        raise ConfigError(f"port {os.environ.get('MASTER_PORT')} is taken (another run on this machine?): launch "
                          "with `deepspeed --master_port N …` (any free port), or set MASTER_PORT") from None
    if made_here:
        destroy_at_exit()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cpu")
    if acc.device_name() == "cuda":
        acc.set_device(local_rank)
        device = torch.device(acc.device_name(local_rank))
    return dist.get_rank(), dist.get_world_size(), local_rank, device


def resolve_settings(cfg: PretrainConfig, world: int, rank: int, on_cuda: bool):
    """(DeepSpeed config, DeepSpeedSettings): the flags merged with the user's DeepSpeed config."""
    ds_config, settings = resolve_deepspeed_config(cfg, world, read_user_deepspeed_config(cfg), on_cuda,
                                                   on_cuda and torch.cuda.is_bf16_supported(),
                                                   source=str(cfg.deepspeed_config))
    if settings.optimizer == "lamb" and settings.zero_stage >= 1 and rank == 0:
        print(f"warning: LAMB under ZeRO stage {settings.zero_stage} sees flat partitions, so its trust ratio is "
              "per partition, not per layer; use --zero-stage 0 for layer-wise LAMB, or --optimizer adamw",
              file=sys.stderr, flush=True)
    if on_cuda and cfg.precision in (None, "auto") and rank == 0:
        picked = "bf16 (this GPU has it)" if settings.precision == "bf16" else \
            "fp16 with dynamic loss scaling (this GPU has no bf16)"
        print(f"precision auto: {picked}", file=sys.stderr, flush=True)
    return ds_config, settings


def read_user_deepspeed_config(cfg: PretrainConfig) -> dict | None:
    if not cfg.deepspeed_config:
        return None
    try:
        return json.loads(Path(cfg.deepspeed_config).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--deepspeed-config {cfg.deepspeed_config}: cannot read it ({e})") from e


def global_grad_norm(model) -> torch.Tensor:
    """The L2 norm of all gradients (stays on the device until logged)."""
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())


def to_device(batch: dict, device) -> dict:
    """Tensors to the device; plain values (a packed batch's max_seqlen) stay on the host."""
    return {k: v.to(device, non_blocking=True) if hasattr(v, "to") else v for k, v in batch.items()}


def out_of_memory(batch, step, k, gas, rank, unpadded, global_batch, micro) -> TrainingError:
    """The error for an out-of-memory micro batch: where, its shape, and what to change."""
    ids = batch["input_ids"]
    b = batch["cu_seqlens"].numel() - 1 if "cu_seqlens" in batch else ids.shape[0]
    shape = f"{b} packed sequences, {ids.numel()} tokens" if unpadded else f"{b} sequences x {ids.shape[1]} tokens"
    return TrainingError(f"out of memory at step {step + 1}, micro batch {k + 1} of {gas} on rank {rank}: {shape}. "
                         f"Try --micro-batch {max(1, micro // 2)} with the same --global-batch {global_batch} (more "
                         "gradient accumulation), or ZeRO stage 3")


class StopFlag:
    """SIGTERM / SIGINT handler: the loop saves a checkpoint at the end of the step and stops."""

    def __init__(self):
        self.signal = None

    def __call__(self, signum, frame):
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.signal = signum
