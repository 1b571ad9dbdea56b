"""The run folder and its checkpoints: start or resume a run, save and load DeepSpeed checkpoints with every rank's
RNG state, read a checkpoint's fp32 weights (any ZeRO stage), export them in HF format.

A checkpoint is written as checkpoints/global_stepN.partial on every rank, renamed to global_stepN when all ranks
are done, and only then named in checkpoints/latest: a kill never leaves a half-written checkpoint a resume picks.
"""
import io
import os
import random
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

from bertkit.config import BertConfig
from bertkit.fileio import atomic_write_bytes, atomic_write_json
from bertkit.formats import (
    CHECKPOINTS,
    DEEPSPEED_CONFIG,
    RUN_TOKENIZER,
    TOKENIZER_FILES,
    InstancesManifest,
    RunConfig,
    read_run_config,
    write_run_config,
)
from bertkit.hf import save_pretrained
from bertkit.model import BertForPreTraining
from bertkit.pretrain.config import ConfigError, DeepSpeedSettings, PretrainConfig, TrainingError

LATEST = "latest"


def latest_tag(run_dir) -> str | None:
    """The newest complete checkpoint's tag (global_stepN), or None."""
    latest = Path(run_dir) / CHECKPOINTS / LATEST
    return latest.read_text().strip() if latest.is_file() else None


# ---------------------------------------------------------------- starting or resuming a run

def prepare_run_dir(cfg: PretrainConfig, manifest: InstancesManifest) -> RunConfig | None:
    """The previous run's config when resuming (checked against the instances), else None."""
    run_dir = Path(cfg.out)
    if cfg.resume:
        if latest_tag(run_dir) is None:
            raise ConfigError(f"--resume: {run_dir} has no complete checkpoint (checkpoints/latest); "
                              "start without --resume")
        run = read_run_config(run_dir)
        if manifest.vocab_sha256 and run.vocab_sha256 and manifest.vocab_sha256 != run.vocab_sha256:
            raise ConfigError(f"--resume: {cfg.instances} uses another vocabulary than the run's instances "
                              f"{run.pretrain['instances']} (vocab sha256 {manifest.vocab_sha256[:12]}... vs "
                              f"{run.vocab_sha256[:12]}...)")
        return run
    if latest_tag(run_dir) is not None:
        raise ConfigError(f"{run_dir} already holds checkpoints: pass --resume to continue that run, "
                          "or choose a new --out")
    return None


def check_resume(run: RunConfig, cfg: PretrainConfig, settings: DeepSpeedSettings, world: int) -> None:
    """A resume must keep what the data order depends on: ranks, seed and batch sizes."""
    if run.world_size != world:
        raise ConfigError(f"--resume: the run used {run.world_size} rank(s), this launch has {world}; "
                          "resume with the same number")
    before = {"seed": run.pretrain["seed"], "micro_batch": run.resolved["micro_batch"],
              "global_batch": run.resolved["global_batch"]}
    now = {"seed": cfg.seed, "micro_batch": settings.micro_batch, "global_batch": settings.global_batch}
    changed = [f"{k} {before[k]} -> {now[k]}" for k in before if before[k] != now[k]]
    if changed:
        raise ConfigError(f"--resume: {', '.join(changed)}; the run's data order depends on these, so resume "
                          "with the values it started with (see its config.json)")


def write_run_folder(cfg: PretrainConfig, settings: DeepSpeedSettings, ds_config: dict, bert_cfg: BertConfig,
                     init_source: str, manifest: InstancesManifest, world: int, kernels: str) -> None:
    """config.json, deepspeed_config.json and the tokenizer files (rank 0)."""
    run_dir = Path(cfg.out)
    tok_dir = run_dir / RUN_TOKENIZER
    tok_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (Path(cfg.instances) / name).is_file():
            shutil.copyfile(Path(cfg.instances) / name, tok_dir / name)
    atomic_write_json(run_dir / DEEPSPEED_CONFIG, ds_config)
    write_run_config(run_dir, RunConfig(
        stage="pretrain", pretrain=asdict(cfg), resolved=asdict(settings), model=bert_cfg.to_dict(),
        init_from=init_source, instances=str(Path(cfg.instances).resolve()), vocab_size=manifest.vocab_size,
        vocab_sha256=manifest.vocab_sha256, max_seq_length=manifest.max_seq_length, world_size=world,
        deepspeed=ds_config, kernels=kernels))


# ---------------------------------------------------------------- RNG state

def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def seed_rank(seed: int, rank: int) -> None:
    """A fresh run's per-rank generators: dropout differs per rank."""
    torch.manual_seed(seed + 1 + rank)
    np.random.seed((seed + 1 + rank) % 2**32)
    random.seed(seed + 1 + rank)


# ---------------------------------------------------------------- save and load

def _checkpoint_steps(ckpt: Path) -> list[int]:
    steps = []
    for p in ckpt.glob("global_step*"):
        if p.is_dir() and p.name[len("global_step"):].isdigit():
            steps.append(int(p.name[len("global_step"):]))
    return sorted(steps)


def save_checkpoint(engine, run_dir: Path, step: int, rank: int, local_rank: int, keep_last: int) -> Path:
    """Write global_stepN.partial on every rank, then (after a barrier) rename it, point `latest` at it, prune."""
    ckpt = run_dir / CHECKPOINTS
    tag, tmp = f"global_step{step}", f"global_step{step}.partial"
    engine.save_checkpoint(str(ckpt), tag=tmp, client_state={"global_step": step}, save_latest=False)
    (ckpt / tmp).mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(rng_state(), buffer)
    atomic_write_bytes(ckpt / tmp / f"rng_rank{rank}.pt", buffer.getvalue())
    dist.barrier()
    if local_rank == 0:
        if (ckpt / tag).exists():
            shutil.rmtree(ckpt / tag)
        try:
            os.replace(ckpt / tmp, ckpt / tag)
        except FileNotFoundError:  # another node's local rank 0 renamed it on a shared file system
            pass
        atomic_write_bytes(ckpt / LATEST, tag.encode())
        for old in _checkpoint_steps(ckpt)[:-keep_last] if keep_last > 0 else []:
            shutil.rmtree(ckpt / f"global_step{old}", ignore_errors=True)
        for partial in ckpt.glob("*.partial"):
            shutil.rmtree(partial, ignore_errors=True)
    dist.barrier()
    return ckpt / tag


def load_checkpoint(engine, run_dir: Path) -> tuple[int, Path]:
    """Load the latest checkpoint into the engine; returns (its global step, its folder)."""
    ckpt = run_dir / CHECKPOINTS
    tag = latest_tag(run_dir)
    path, client = engine.load_checkpoint(str(ckpt), tag=tag)
    if path is None:
        raise TrainingError(f"{ckpt / tag}: DeepSpeed could not load this checkpoint")
    return int(client["global_step"]), ckpt / tag


def restore_rng(checkpoint: Path, rank: int) -> None:
    set_rng_state(torch.load(checkpoint / f"rng_rank{rank}.pt", weights_only=False))


# ---------------------------------------------------------------- weights and export

def load_run_state_dict(run_dir, tag: str | None = None) -> tuple[dict, RunConfig, str]:
    """fp32 weights of a run's checkpoint (latest by default), ZeRO-3 partitions included.

    Returns (state_dict, the run's config, tag).
    """
    run_dir = Path(run_dir)
    ckpt = run_dir / CHECKPOINTS
    run = read_run_config(run_dir)
    if tag is None:
        tag = latest_tag(run_dir)
        if tag is None:
            raise ConfigError(f"{run_dir}: no complete checkpoint yet (no checkpoints/latest)")
    if not (ckpt / tag).is_dir():
        have = sorted(p.name for p in ckpt.glob("global_step*") if not p.name.endswith(".partial"))
        raise ConfigError(f"{ckpt / tag}: no such checkpoint; the run has {', '.join(have) or 'none'}")
    if run.zero_stage >= 1:
        state = get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag=tag)
    else:
        files = sorted((ckpt / tag).glob("mp_rank_*_model_states.pt"))
        state = torch.load(files[0], map_location="cpu", weights_only=False)["module"]
    return {k: v.float() for k, v in state.items()}, run, tag


def export(run_dir, out_dir, tag: str | None = None) -> Path:
    """Write the HF format (config.json, model.safetensors, tokenizer files) of a run's checkpoint."""
    state, run, tag = load_run_state_dict(run_dir, tag)
    model = BertForPreTraining(BertConfig.from_dict(run.model))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise TrainingError(f"{run_dir} ({tag}): checkpoint does not fit the model "
                            f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    tok = Path(run_dir) / RUN_TOKENIZER
    extra = {"bertkit": {"run": str(Path(run_dir).resolve()), "checkpoint": tag, "vocab_sha256": run.vocab_sha256}}
    return save_pretrained(model, out_dir, tokenizer_dir=tok if (tok / "vocab.txt").is_file() else None,
                           extra_config=extra)
