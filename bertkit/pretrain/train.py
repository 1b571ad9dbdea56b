"""The pretraining loop: BERT-family MLM (+ NSP/SOP, or ELECTRA's replaced-token detection) on an instances
folder, under DeepSpeed (ZeRO stage 0-3).

`pretrain(PretrainConfig(...))` is the whole stage. Under `deepspeed cli.py pretrain` every rank runs it; under
`bertkit pretrain` it makes a process group of one itself. The set-up is run.py's `start_run`; the loop below reads
micro-steps -> roll back? -> log -> evaluate -> save -> stop?.
"""
import os
import signal
import socket
import time
from pathlib import Path

import deepspeed
import deepspeed.ops
import torch
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from bertkit.data import EpochBatches, collate, collate_packed, scheduled_rate, to_device
from bertkit.distributed import destroy_at_exit
from bertkit.fileio import disk_errors
from bertkit.formats import RUN_CONFIG, read_instances_manifest, read_run_config
from bertkit.precision import autocast
from bertkit.pretrain.checkpoints import run_folder_lock, save_checkpoint
from bertkit.pretrain.config import ConfigError, PretrainConfig, TrainingError
from bertkit.pretrain.divergence import injected_fault, roll_back
from bertkit.pretrain.ema import EMA_FILE
from bertkit.pretrain.metrics import Meter, as_float, current_lr, peak_flops, say
from bertkit.pretrain.resume import inherit
from bertkit.pretrain.run import Run, read_user_deepspeed_config, record_mixture, start_run
from bertkit.pretrain.start import spec_family
from bertkit.runlog import ReportError, parse_report_to


def pretrain(cfg: PretrainConfig, given: set | None = None) -> dict:
    """Train; returns the last logged metrics (plus "step", "checkpoint" and "stopped_by_signal": the signal number
    that stopped the run early, or None). With --resume, a setting left None (or, from the CLI, a flag not in
    `given`) is the run's own."""
    resuming = cfg.resume and (Path(cfg.out) / RUN_CONFIG).is_file()
    if resuming:
        cfg = inherit(cfg, read_run_config(cfg.out), given)
    if cfg.mixture:
        cfg = cfg.with_mixture(None if resuming else given)
    manifest = read_instances_manifest(cfg.instances)
    cfg = cfg.with_recipe(read_user_deepspeed_config(cfg), lambda model: spec_family(model, cfg.init_from), resuming)
    cfg.check()
    try:
        parse_report_to(cfg.report_to or "none")
    except ReportError as e:
        raise ConfigError(str(e)) from None
    rank, world, _, device = init_distributed()  # rank: the global rank, on every node; it decides who writes
    before = exit_on_sigterm()
    try:
        with run_folder_lock(Path(cfg.out), rank), \
                disk_errors(cfg.out, "free space (or fix the disk), then resume with --resume"):
            return _pretrain(cfg, manifest, rank, world, device)
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)


def exit_on_sigterm():
    """Until the loop installs its own handler (a checkpoint, then stop), SIGTERM raises SystemExit: a launcher
    stopping this rank because another failed (a bad --init-from) still releases the folder lock and removes a run
    folder this run made, rather than leaving one that holds only its lock."""
    def stop(signum, frame):
        raise SystemExit(128 + signum)
    try:
        return signal.signal(signal.SIGTERM, stop)  # the caller's handler, put back at the end
    except ValueError:  # not the main thread (an embedding program's worker): its own handling stands
        return None


def _pretrain(cfg: PretrainConfig, manifest, rank: int, world: int, device) -> dict:
    run = start_run(cfg, manifest, rank, world, device)
    cfg = run.cfg  # start_run may settle a flag (ModernBERT always packs)
    try:
        run.engine.train()
        while not run.finished():
            loss, seconds, stopping = train_step(run)
            if problem := run.divergence.check(loss, run.step, run.last_ckpt):  # the same on every rank
                roll_back(run, problem)
                continue
            if run.ema is not None:   # a step that stands
                run.ema.update()
            last = run.finished()
            if run.step % cfg.log_every == 0 or last:
                log_training(run, seconds)
            if len(run.holdout) and cfg.eval_every and (run.step % cfg.eval_every == 0 or last or
                                                        run.eval_clock.due(seconds, last)):  # the end: its score
                evaluate_and_log(run, seconds)
            if run.step % cfg.save_every == 0 or last or stopping:
                run.last_ckpt = save_checkpoint(run.engine, run.run_dir, run.step, rank, cfg.keep_last, run.skipped,
                                                seconds, {EMA_FILE: run.ema.to_bytes()} if run.ema else None)
                if run.budget and rank == 0:
                    run.budget.record(run.run_dir, run.step)
                if cfg.mixture and rank == 0:
                    run.mixture = record_mixture(run)
                run.throughput.restart()   # checkpoint time is not training's
            if stopping:
                if rank == 0:
                    print(f"\nstopped by signal at step {run.step}; saved {run.last_ckpt}. Continue with --resume.",
                          flush=True)
                break
        if run.budget and run.budget.spent() and rank == 0:
            print(f"\ntime budget of {run.budget.budget_s:.0f} s spent after {run.step} steps; saved {run.last_ckpt}",
                  flush=True)
    except ReportError as e:
        raise ConfigError(str(e)) from None
    finally:
        run.close()
    return {**run.record, "step": run.step, "checkpoint": str(run.last_ckpt) if run.last_ckpt else None,
            "stopped_by_signal": run.stop.signal, "held_out": getattr(run, "held_out", None),
            "mixture": run.mixture, "tokens": run.tokens_drawn()}


def train_step(run: Run) -> tuple[float, float, bool]:
    """One optimizer step over grad-accumulation micro batches; returns (loss, seconds since the run's start, stop
    requested), all-reduced so that every rank sees the same values and acts alike."""
    gas, warming = run.grad_accum_at(run.step), run.cfg.batch_warmup_steps is not None
    if warming and gas * run.settings.micro_batch * run.world != run.engine.train_batch_size():
        run.engine.set_train_batch_size(gas * run.settings.micro_batch * run.world)   # the loss scales by 1/gas
    sums = torch.zeros(3, dtype=torch.float64, device=run.device)  # [loss sum, stop requested, seconds]
    for k in range(gas):
        if warming:   # DeepSpeed counts its boundary modulo a fixed count; ours moves
            run.engine.set_gradient_accumulation_boundary(k == gas - 1)
        batch = for_objective(to_device(next(run.loader), run.device), run.objective)
        try:
            with cpu_autocast(run.device, run.settings.precision):
                out = run.engine(**batch)
            loss_k = out.loss * injected_fault(run.step + 1)
            run.engine.backward(loss_k)
            if k == gas - 1 and run.settings.zero_stage == 0:  # DeepSpeed reports no norm there; before clipping
                run.grad_norm = global_grad_norm(run.model)
            run.engine.step()
        except (torch.OutOfMemoryError, MemoryError) as e:
            raise out_of_memory(batch, run, k) from e
        run.meter.add(out, batch)
        run.throughput.add_batch(batch)
        sums[0] += loss_k.detach().double() / gas
    run.batch = batch
    run.step += 1
    run.steps_in_interval += 1
    sums[1] = 1.0 if run.stop.signal is not None else 0.0
    sums[2] = time.perf_counter() - run.clock0
    dist.all_reduce(sums)
    seconds = sums[2].item() / run.world
    if run.budget:
        run.budget.used_s = seconds
    return sums[0].item() / run.world, seconds, sums[1].item() > 0


def cpu_autocast(device, precision: str):
    """bf16 on a CPU is autocast over fp32 weights (bertkit.precision); on a GPU DeepSpeed's bf16 holds the weights
    in bf16 itself."""
    return autocast(device, precision if torch.device(device).type == "cpu" else "fp32")


def log_training(run: Run, seconds: float) -> None:
    """The interval's training record: to metrics.jsonl (TensorBoard, W&B) and the progress bar."""
    run.record = train_record(run, run.meter.reduce(), run.throughput.rates(over_ranks=True), seconds)
    run.log.write(run.record)
    run.log.advance(run.steps_in_interval, {"loss": f"{run.record['loss']:.3f}",
                                            "seq/s": f"{run.record['seq_per_s']:.0f}"})
    run.interval_started()


def evaluate_and_log(run: Run, seconds: float) -> None:
    """Held-out metrics, and once per run the note that training sits on the unigram plateau."""
    def scored(dataset, batches):
        return evaluate(run.engine, dataset, run.settings.micro_batch, run.rank, run.world, batches, run.device,
                        run.cfg.seed, run.cfg.unpadded, run.objective, run.split_at, run.settings.precision)

    ev = scored(run.holdout, run.cfg.eval_batches)
    if ev and run.cfg.mixture:   # each folder's own held-out score: which one the model finds hard
        sources = run.holdout.datasets
        for name, dataset in zip(source_names(sources), sources):
            one = scored(dataset, max(1, run.cfg.eval_batches // len(sources))) if len(dataset) else None
            ev.update({f"{k}/{name}": v for k, v in (one or {}).items()
                       if k in ("eval_loss", "eval_mlm_acc", "eval_mlm_mask_acc")})
    if ev:
        run.log.write({"step": run.step, "elapsed_s": seconds, **ev})
        run.held_out = {"step": run.step, **ev}   # the run's closing summary says the last one
        budget = run.budget
        progress = seconds / budget.budget_s if budget and budget.budget_s else run.step / (run.max_steps or run.step)
        if run.plateau and (note := run.plateau.check(ev, run.step, progress)):
            say(note)
            run.log.write({"step": run.step, "plateau": {"baseline": run.plateau.baseline,
                                                         "token": run.plateau.token}})
    run.throughput.restart()   # evaluation time is not training's


def source_names(datasets) -> list[str]:
    """Each mixed folder's name as a metric's suffix (letters, digits, . - _), numbered where two share one."""
    import re

    names = [re.sub(r"[^\w.-]", "_", Path(d.dir).name) or "source" for d in datasets]
    return [f"{n}{i + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]


def train_record(run: Run, m: dict, rates: dict, elapsed_s: float) -> dict:
    """One training log record from the Meter's sums and the Throughput's rates over the interval."""
    step, engine, settings, batch = run.step, run.engine, run.settings, run.batch
    epoch = run.consumed() // run.sampler.per_epoch
    record = {"step": step, "loss": m["loss"], "mlm_loss": m["mlm_loss"], "mlm_acc": m["mlm_acc"],
              **{k: m[k] for k in ("mlm_mask_acc",) if k in m}, **sentence_metrics(m, run.objective),
              "lr": current_lr(engine), "grad_norm": as_float(engine.get_global_grad_norm()) or as_float(run.grad_norm),
              **rates, "epoch": epoch,
              "elapsed_s": elapsed_s, "kernels": run.backend}
    if run.cfg.masked_lm_prob_end is not None:   # the scheduled rate this step's rows were masked at
        record["masked_lm_prob"] = scheduled_rate(run.cfg.masked_lm_prob, run.cfg.masked_lm_prob_end, run.max_steps,
                                                  step - 1)
    if settings.precision == "fp16":
        record["loss_scale"] = as_float(getattr(engine.optimizer, "cur_scale", None)
                                        or getattr(engine.optimizer, "loss_scale", None))
        record["skipped_steps"] = int(engine.skipped_steps)
    if peak := peak_flops():
        seq = batch["max_seqlen"] if run.cfg.unpadded else batch["input_ids"].shape[1]
        flops_per_s = run.count_flops(seq, rates["tokens_per_s"])   # linear in the tokens
        record["mfu"] = flops_per_s / (peak * dist.get_world_size())
    return record


def evaluate(engine, dataset, micro_batch: int, rank: int, world: int, max_batches: int, device, seed: int,
             unpadded: bool = False, objective: str = "nsp", split_at: int | None = None, precision: str = "fp32"):
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
            with cpu_autocast(device, precision):
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


def global_grad_norm(model) -> torch.Tensor:
    """The L2 norm of all gradients (stays on the device until logged)."""
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())


def out_of_memory(batch, run: Run, k: int) -> TrainingError:
    """The error for an out-of-memory micro batch: where, its shape, and what to change."""
    step, gas, rank, unpadded = run.step, run.settings.grad_accum, run.rank, run.cfg.unpadded
    global_batch, micro = run.settings.global_batch, run.settings.micro_batch
    ids = batch["input_ids"]
    b = batch["cu_seqlens"].numel() - 1 if "cu_seqlens" in batch else ids.shape[0]
    shape = f"{b} packed sequences, {ids.numel()} tokens" if unpadded else f"{b} sequences x {ids.shape[1]} tokens"
    return TrainingError(f"out of memory at step {step + 1}, micro batch {k + 1} of {gas} on rank {rank}: {shape}. "
                         f"Try --micro-batch {max(1, micro // 2)} with the same --global-batch {global_batch} (more "
                         "gradient accumulation), or ZeRO stage 3")
