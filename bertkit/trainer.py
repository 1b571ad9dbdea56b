"""The pretraining loop: BERT MLM + NSP on an instances folder, under DeepSpeed (ZeRO stage 0-3).

`pretrain(PretrainConfig(...))` is the whole stage. Under `deepspeed cli.py pretrain` every rank runs it; under
`bertkit pretrain` it makes a process group of one itself. The run folder holds:

  config.json              the resolved settings, the model shape and the vocabulary's sha256 (checked on --resume)
  deepspeed_config.json    the DeepSpeed config actually used (generated from flags, merged with --deepspeed-config)
  tokenizer/               the instances folder's vocabulary and tokenizer files (export copies them)
  checkpoints/global_stepN DeepSpeed checkpoints + per-rank RNG state; written as global_stepN.partial, then renamed;
  checkpoints/latest       the last complete one (written atomically after the rename)
  metrics.jsonl            one JSON object per logged step / evaluation; a resumed run appends (later lines win)
  tensorboard/             when tensorboard is installed
"""
import copy
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bertkit.data import EpochBatches, InstanceDataset, batch_loader, collate, collate_packed, read_instances_manifest
from bertkit.fileio import atomic_write_bytes, atomic_write_json, sha256_file

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
DEFAULTS = dict(micro_batch=32, grad_clip=1.0, optimizer="lamb", lr=1e-3, weight_decay=0.01)
# ZeRO 1-3 hand the optimizer flat partitions, so LAMB would take one trust ratio per partition instead of one
# per tensor: LAMB defaults to stage 0 (plain data parallel, per-tensor LAMB, NVIDIA's setting), AdamW to 2.
DEFAULT_ZERO_STAGE = {"lamb": 0, "adamw": 2}


class TrainingError(RuntimeError):
    pass


class ConfigError(ValueError):
    pass


@dataclass
class PretrainConfig:
    instances: str
    out: str
    model: str = "base"                   # preset (tiny ... large) or an HF config.json / model folder
    max_steps: int = 10000                # optimizer steps
    # None below = "not given": the --deepspeed-config value is used, else DEFAULTS
    micro_batch: int | None = None        # sequences per rank per forward
    global_batch: int | None = None       # sequences per optimizer step; None = micro_batch * ranks
    zero_stage: int | None = None
    precision: str | None = None          # auto | fp32 | bf16 | fp16; auto = bf16 if the GPU has it, fp16, CPU fp32
    grad_clip: float | None = None
    optimizer: str | None = None          # lamb | adamw
    lr: float | None = None               # peak learning rate
    weight_decay: float | None = None
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-6
    schedule: str = "linear"              # linear (BERT paper) | poly (power 0.5, NVIDIA's recipe)
    warmup: float = 0.01                  # < 1: fraction of max_steps; >= 1: steps
    deepspeed_config: str | None = None
    init_from: str | None = None          # phase 2: start from an export or a run folder's latest checkpoint
    resume: bool = False
    save_every: int = 1000
    keep_last: int = 3
    log_every: int = 10
    eval_every: int = 1000
    eval_batches: int = 20
    seed: int = 42
    num_workers: int = 1
    dropout: float | None = None          # overrides the model's hidden and attention dropout
    unpadded: bool = False                # packed batches (varlen attention): no compute on padding
    progress: bool = True


# ---------------------------------------------------------------- DeepSpeed config: flags + a user's file

def _get(d: dict, path):
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def _precision_of(user: dict):
    if _get(user, ("bf16", "enabled")) or _get(user, ("bfloat16", "enabled")):
        return "bf16"
    if _get(user, ("fp16", "enabled")):
        return "fp16"
    if "fp16" in user or "bf16" in user:
        return "fp32"
    return None


def resolve_deepspeed_config(cfg: PretrainConfig, world_size: int, user: dict | None, on_cuda: bool,
                             bf16_supported: bool, source: str = "--deepspeed-config") -> tuple[dict, dict]:
    """Merge the flags with a user's DeepSpeed config. Returns (ds_config, resolved settings).

    A value given both as a flag and in the file must agree (else ConfigError naming both); where only one
    speaks it wins; where neither does, DEFAULTS apply. The optimizer section is read into the settings and
    removed: bertkit builds the optimizer itself (FusedLamb on CUDA, the PyTorch LAMB elsewhere).
    """
    user = copy.deepcopy(user or {})
    paths = {"micro_batch": ("train_micro_batch_size_per_gpu",), "global_batch": ("train_batch_size",),
             "zero_stage": ("zero_optimization", "stage"), "grad_clip": ("gradient_clipping",),
             "optimizer": ("optimizer", "type"), "lr": ("optimizer", "params", "lr"),
             "weight_decay": ("optimizer", "params", "weight_decay")}
    flag_name = {"micro_batch": "--micro-batch", "global_batch": "--global-batch", "zero_stage": "--zero-stage",
                 "grad_clip": "--grad-clip", "optimizer": "--optimizer", "lr": "--lr",
                 "weight_decay": "--weight-decay", "precision": "--precision"}
    resolved = {}
    for name, path in paths.items():
        flag, theirs = getattr(cfg, name), _get(user, path)
        if name == "optimizer" and theirs is not None:
            theirs = str(theirs).lower()
            if theirs not in ("lamb", "adamw"):
                raise ConfigError(f"{source}: optimizer type {theirs!r} is not supported; use Lamb or AdamW")
        if flag is not None and theirs is not None and flag != theirs:
            raise ConfigError(f"{flag_name[name]} {flag} contradicts {source}'s {'.'.join(path)} = {theirs}; "
                              "remove one of them")
        resolved[name] = flag if flag is not None else theirs if theirs is not None else DEFAULTS.get(name)
    if resolved["zero_stage"] is None:
        resolved["zero_stage"] = DEFAULT_ZERO_STAGE[resolved["optimizer"]]
    theirs_precision = _precision_of(user)
    if cfg.precision not in (None, "auto") and theirs_precision and cfg.precision != theirs_precision:
        raise ConfigError(f"--precision {cfg.precision} contradicts {source}'s precision ({theirs_precision}: "
                          "see its fp16/bf16 sections); remove one of them")
    precision = theirs_precision or cfg.precision or "auto"
    if precision == "auto":
        precision = ("bf16" if bf16_supported else "fp16") if on_cuda else "fp32"
    if precision not in ("fp32", "bf16", "fp16"):
        raise ConfigError(f"--precision {precision!r}: choose auto, fp32, bf16 or fp16")
    if precision == "fp16" and not on_cuda:
        raise ConfigError("--precision fp16 needs a GPU; on the CPU use fp32 (or bf16)")
    resolved["precision"] = precision

    micro = resolved["micro_batch"]
    gas_user = _get(user, ("gradient_accumulation_steps",))
    if resolved["global_batch"] is None:
        resolved["global_batch"] = micro * world_size * (gas_user or 1)
    if resolved["global_batch"] % (micro * world_size):
        raise ConfigError(f"global batch {resolved['global_batch']} is not a multiple of micro batch {micro} x "
                          f"{world_size} rank(s); change --global-batch or --micro-batch")
    gas = resolved["global_batch"] // (micro * world_size)
    if gas_user is not None and gas_user != gas:
        raise ConfigError(f"{source}'s gradient_accumulation_steps = {gas_user} contradicts --global-batch "
                          f"{resolved['global_batch']} / (--micro-batch {micro} x {world_size} ranks) = {gas}")
    resolved["grad_accum"] = gas

    ds = user
    ds.pop("optimizer", None)
    ds["train_micro_batch_size_per_gpu"] = micro
    ds["train_batch_size"] = resolved["global_batch"]
    ds["gradient_accumulation_steps"] = gas
    ds["gradient_clipping"] = resolved["grad_clip"]
    ds.setdefault("zero_optimization", {})["stage"] = resolved["zero_stage"]
    ds["zero_allow_untested_optimizer"] = True  # our PyTorch LAMB is a "client" optimizer to DeepSpeed
    ds.setdefault("steps_per_print", 1 << 30)   # bertkit logs metrics itself
    ds.setdefault("wall_clock_breakdown", False)
    if precision == "bf16":
        ds.setdefault("bf16", {})["enabled"] = True
        ds.pop("fp16", None)
    elif precision == "fp16":
        fp16 = ds.setdefault("fp16", {})
        fp16["enabled"] = True
        for k, v in (("loss_scale", 0), ("initial_scale_power", 16), ("loss_scale_window", 1000),
                     ("hysteresis", 2), ("min_loss_scale", 1)):
            fp16.setdefault(k, v)  # loss_scale 0 = dynamic loss scaling
        ds.pop("bf16", None)
    else:
        ds.pop("fp16", None)
        ds.pop("bf16", None)
    return ds, resolved


# ---------------------------------------------------------------- process group and devices

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed():
    """Join the launcher's process group, or make a group of one (`bertkit pretrain` without a launcher)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if acc.device_name() == "cpu":
        # DeepSpeed's CPU backend compiles a shared-memory op (~1 min) used only by inference all-reduce;
        # training's collectives go through gloo either way, so skip building it.
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend=acc.communication_backend_name())
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if acc.device_name() == "cuda":
        acc.set_device(local_rank)
    return dist.get_rank(), dist.get_world_size(), local_rank, acc


def rng_state() -> dict:
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# ---------------------------------------------------------------- model and weights

def load_run_state_dict(run_dir, tag: str | None = None) -> tuple[dict, dict, str]:
    """fp32 weights of a run's checkpoint (latest by default), ZeRO-3 partitions included.

    Returns (state_dict, run config.json, tag).
    """
    import torch

    run_dir = Path(run_dir)
    ckpt = run_dir / "checkpoints"
    if not (run_dir / "config.json").is_file():
        raise ConfigError(f"{run_dir}: no config.json, so not a bertkit pretrain run folder")
    run = json.loads((run_dir / "config.json").read_text())
    if tag is None:
        if not (ckpt / "latest").is_file():
            raise ConfigError(f"{run_dir}: no complete checkpoint yet (no checkpoints/latest)")
        tag = (ckpt / "latest").read_text().strip()
    if not (ckpt / tag).is_dir():
        have = sorted(p.name for p in ckpt.glob("global_step*") if not p.name.endswith(".partial"))
        raise ConfigError(f"{ckpt / tag}: no such checkpoint; the run has {', '.join(have) or 'none'}")
    if run["deepspeed"]["zero_optimization"]["stage"] >= 1:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag=tag)
    else:
        files = sorted((ckpt / tag).glob("mp_rank_*_model_states.pt"))
        state = torch.load(files[0], map_location="cpu", weights_only=False)["module"]
    return {k: v.float() for k, v in state.items()}, run, tag


def _build_model(cfg: PretrainConfig, manifest: dict, run_config: dict | None):
    """(model, BertConfig, init source description)."""
    from bertkit.config import BertConfig
    from bertkit.model import BertForPreTraining

    vocab_size = manifest["vocab_size"]
    state, source = None, "random initialisation"
    if run_config is not None:  # --resume: the run's own shape; weights come from the checkpoint
        bert_cfg = BertConfig.from_dict(run_config["model"])
    elif cfg.init_from:
        init = Path(cfg.init_from)
        if (init / "checkpoints" / "latest").is_file():
            state, run, tag = load_run_state_dict(init)
            bert_cfg = BertConfig.from_dict(run["model"])
            source = f"{init} ({tag})"
            init_sha = run.get("vocab_sha256")
        else:
            from bertkit.checkpoint import load_pretrained

            loaded = load_pretrained(init, head="pretraining")
            bert_cfg, state, source = loaded.cfg, loaded.state_dict(), str(init)
            init_sha = sha256_file(init / "vocab.txt") if (init / "vocab.txt").is_file() else None
        if init_sha and manifest.get("vocab_sha256") and init_sha != manifest["vocab_sha256"]:
            raise ConfigError(f"--init-from {init} was trained with another vocabulary (vocab.txt sha256 "
                              f"{init_sha[:12]}...) than --instances {cfg.instances} ({manifest['vocab_sha256'][:12]}"
                              "...); make the instances with the tokenizer of the first phase")
    elif Path(cfg.model).exists():
        p = Path(cfg.model)
        p = p / "config.json" if p.is_dir() else p
        d = json.loads(p.read_text())
        bert_cfg = BertConfig.from_hf_dict(d, str(p)) if "model_type" in d else BertConfig.from_dict(d)
    else:
        bert_cfg = BertConfig.preset(cfg.model, vocab_size=vocab_size)
    if cfg.dropout is not None:
        bert_cfg.hidden_dropout = bert_cfg.attention_dropout = cfg.dropout
    if bert_cfg.vocab_size != vocab_size:
        raise ConfigError(f"the model's vocabulary has {bert_cfg.vocab_size} tokens ({source if state else cfg.model})"
                          f" but {cfg.instances} was made with {vocab_size} (manifest vocab_size): use instances "
                          "made with the model's tokenizer, or a model config with the instances' vocab_size")
    max_len = manifest.get("max_seq_length")
    if max_len and max_len > bert_cfg.max_position_embeddings:
        raise ConfigError(f"{cfg.instances} has sequences of {max_len} tokens but the model has only "
                          f"{bert_cfg.max_position_embeddings} positions")
    model = BertForPreTraining(bert_cfg)
    if state is not None:
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ConfigError(f"--init-from {cfg.init_from}: weights do not fit the pretraining model "
                              f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    return model, bert_cfg, source


class _AttrDict(dict):
    __getattr__ = dict.__getitem__


def prepare_for_zero3(model) -> None:
    """ZeRO-3 gathers a module's parameters around its own forward, and again for its backward through hooks
    on the tensors it returns. Two things in the model need telling: some parameters are read by another module
    (LayerNorm weights fed to the fused kernels, the word embeddings as the MLM decoder), and the model returns
    a dataclass, whose tensors DeepSpeed does not see; a forward hook (before DeepSpeed's) makes it a dict that
    still reads as attributes."""
    import torch.nn as nn
    from deepspeed.runtime.zero.partition_parameters import register_external_parameter

    for parent in model.modules():
        for child in parent.children():
            if isinstance(child, nn.LayerNorm):
                for p in child.parameters():
                    register_external_parameter(parent, p)
    register_external_parameter(model, model.bert.embeddings.word_embeddings.weight)
    for module in model.modules():
        module.register_forward_hook(
            lambda mod, args, out: _AttrDict(vars(out)) if dataclasses.is_dataclass(out) else None)


# ---------------------------------------------------------------- checkpoints

def _checkpoint_steps(ckpt: Path) -> list[int]:
    steps = []
    for p in ckpt.glob("global_step*"):
        if p.is_dir() and p.name[len("global_step"):].isdigit():
            steps.append(int(p.name[len("global_step"):]))
    return sorted(steps)


def save_checkpoint(engine, run_dir: Path, step: int, rank: int, local_rank: int, keep_last: int, client: dict):
    """Write global_stepN.partial on every rank, then (after a barrier) rename it, point `latest` at it, prune."""
    import torch
    import torch.distributed as dist

    ckpt = run_dir / "checkpoints"
    tag, tmp = f"global_step{step}", f"global_step{step}.partial"
    engine.save_checkpoint(str(ckpt), tag=tmp, client_state=client, save_latest=False)
    (ckpt / tmp).mkdir(parents=True, exist_ok=True)
    buffer = __import__("io").BytesIO()
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
        atomic_write_bytes(ckpt / "latest", tag.encode())
        for old in _checkpoint_steps(ckpt)[:-keep_last] if keep_last > 0 else []:
            shutil.rmtree(ckpt / f"global_step{old}", ignore_errors=True)
        for partial in ckpt.glob("*.partial"):
            shutil.rmtree(partial, ignore_errors=True)
    dist.barrier()
    return ckpt / tag


# ---------------------------------------------------------------- metrics

PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A10": 125e12,
              "V100": 125e12, "RTX 4090": 165e12, "RTX 3090": 71e12}


def _peak_flops() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


class MetricsLog:
    """Rank 0 writes JSON lines, TensorBoard scalars (when installed) and the progress bar."""

    def __init__(self, run_dir: Path, enabled: bool, total: int, initial: int, progress: bool):
        self.enabled = enabled
        self.file = open(run_dir / "metrics.jsonl", "a", encoding="utf-8") if enabled else None
        self.tb = None
        self.bar = None
        if not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tensorboard"))
        except Exception:  # tensorboard not installed
            self.tb = None
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="pretrain", unit="step", dynamic_ncols=True)

    def write(self, record: dict):
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and v is not None:
                    self.tb.add_scalar(k, v, record["step"])

    def advance(self, n: int, postfix: dict | None = None):
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)

    def close(self):
        if self.enabled:
            self.file.close()
            if self.tb is not None:
                self.tb.close()
            if self.bar is not None:
                self.bar.close()


class Meter:
    """Sums over the micro batches of a log interval, kept on the device (no sync per step)."""

    NAMES = ("loss", "mlm_loss", "nsp_loss", "mlm_correct", "mlm_count", "nsp_correct", "nsp_count", "micro",
             "sequences", "tokens")

    def __init__(self, device):
        import torch

        self.sums = torch.zeros(len(self.NAMES), dtype=torch.float64, device=device)

    def add(self, out, batch):
        import torch

        with torch.no_grad():
            labels = batch["mlm_labels"]
            has = labels != -100
            mlm_correct = ((out.mlm_logits.argmax(-1) == labels) & has).sum()
            nsp_correct = (out.nsp_logits.argmax(-1) == batch["next_sentence_label"]).sum()
            n = float(batch["next_sentence_label"].shape[0])
            scalars = torch.tensor([n, 1.0, n], dtype=torch.float64, device=self.sums.device)  # nsp_count micro seqs
            # non-padding tokens: a packed batch has no padding
            tokens = batch["attention_mask"].sum() if "attention_mask" in batch else batch["input_ids"].new_tensor(
                batch["input_ids"].numel())
            values = torch.cat([torch.stack([out.loss.detach().double(), out.mlm_loss.detach().double(),
                                             out.nsp_loss.detach().double(), mlm_correct.double(),
                                             has.sum().double(), nsp_correct.double()]),
                                scalars, tokens.double().view(1)])
            self.sums += values

    def reduce(self) -> dict:
        import torch.distributed as dist

        sums = self.sums.clone()
        dist.all_reduce(sums)
        s = dict(zip(self.NAMES, sums.tolist()))
        self.sums.zero_()
        micro = max(s["micro"], 1)
        return {"loss": s["loss"] / micro, "mlm_loss": s["mlm_loss"] / micro, "nsp_loss": s["nsp_loss"] / micro,
                "mlm_acc": s["mlm_correct"] / max(s["mlm_count"], 1), "nsp_acc": s["nsp_correct"] / max(s["nsp_count"], 1),
                "sequences": s["sequences"], "tokens": s["tokens"]}


def to_device(batch: dict, device) -> dict:
    """Tensors to the device; plain values (a packed batch's max_seqlen) stay on the host."""
    return {k: v.to(device, non_blocking=True) if hasattr(v, "to") else v for k, v in batch.items()}


def evaluate(engine, dataset, micro_batch: int, rank: int, world: int, max_batches: int, device, seed: int,
             unpadded: bool = False):
    """MLM/NSP loss and accuracy on the first max_batches micro batches (per rank) of the held-out instances."""
    import torch

    micro_batch = min(micro_batch, len(dataset) // world)  # a small holdout still gets evaluated
    if micro_batch < 1:
        return None
    batches = EpochBatches(len(dataset), micro_batch, seed, rank, world, shuffle=False)
    if batches.per_epoch == 0:
        return None
    meter = Meter(device)
    was_training = engine.module.training
    engine.module.eval()
    with torch.no_grad():
        for i, keys in enumerate(batches):
            if i >= min(max_batches, batches.per_epoch):
                break
            batch = to_device((collate_packed if unpadded else collate)([dataset[k] for k in keys]), device)
            meter.add(engine(**batch), batch)
    engine.module.train(was_training)
    r = meter.reduce()
    return {f"eval_{k}": r[k] for k in ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc")}


# ---------------------------------------------------------------- the loop

class _StopFlag:
    def __init__(self):
        self.signal = None

    def __call__(self, signum, frame):
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.signal = signum


def _prepare_run_dir(cfg: PretrainConfig, run_dir: Path, manifest: dict) -> dict | None:
    """The previous run's config.json when resuming (checked against this one), else None."""
    ckpt_latest = run_dir / "checkpoints" / "latest"
    if cfg.resume:
        if not ckpt_latest.is_file():
            raise ConfigError(f"--resume: {run_dir} has no complete checkpoint (checkpoints/latest); "
                              "start without --resume")
        run = json.loads((run_dir / "config.json").read_text())
        if manifest.get("vocab_sha256") and run.get("vocab_sha256") and manifest["vocab_sha256"] != run["vocab_sha256"]:
            raise ConfigError(f"--resume: {cfg.instances} uses another vocabulary than the run's instances "
                              f"{run['pretrain']['instances']} (vocab sha256 {manifest['vocab_sha256'][:12]}... vs "
                              f"{run['vocab_sha256'][:12]}...)")
        return run
    if ckpt_latest.is_file():
        raise ConfigError(f"{run_dir} already holds checkpoints: pass --resume to continue that run, "
                          "or choose a new --out")
    return None


def pretrain(cfg: PretrainConfig) -> dict:
    """Train; returns the last logged metrics (plus "step" and "checkpoint")."""
    manifest = read_instances_manifest(cfg.instances)  # errors before DeepSpeed is even imported
    import deepspeed
    import torch
    import torch.distributed as dist

    from bertkit.optim import build_optimizer, build_scheduler, param_groups

    run_dir = Path(cfg.out)
    rank, world, local_rank, acc = init_distributed()
    on_cuda = acc.device_name() == "cuda"
    device = torch.device(acc.device_name(local_rank)) if on_cuda else torch.device("cpu")
    run_config = _prepare_run_dir(cfg, run_dir, manifest)
    if run_config is not None and run_config["world_size"] != world:
        raise ConfigError(f"--resume: the run used {run_config['world_size']} rank(s), this launch has {world}; "
                          "resume with the same number")

    user = None
    if cfg.deepspeed_config:
        try:
            user = json.loads(Path(cfg.deepspeed_config).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"--deepspeed-config {cfg.deepspeed_config}: cannot read it ({e})") from e
    ds_config, res = resolve_deepspeed_config(cfg, world, user, on_cuda, on_cuda and torch.cuda.is_bf16_supported(),
                                              source=str(cfg.deepspeed_config))

    if res["optimizer"] == "lamb" and res["zero_stage"] >= 1 and rank == 0:
        print(f"warning: LAMB under ZeRO stage {res['zero_stage']} sees flat partitions, so its trust ratio is "
              "per partition, not per layer; use --zero-stage 0 for layer-wise LAMB, or --optimizer adamw",
              file=sys.stderr, flush=True)
    if run_config is not None:  # the data order depends on these: a resume must not change them
        before = {"seed": run_config["pretrain"]["seed"], "micro_batch": run_config["resolved"]["micro_batch"],
                  "global_batch": run_config["resolved"]["global_batch"]}
        now = {"seed": cfg.seed, "micro_batch": res["micro_batch"], "global_batch": res["global_batch"]}
        changed = [f"{k} {before[k]} -> {now[k]}" for k in before if before[k] != now[k]]
        if changed:
            raise ConfigError(f"--resume: {', '.join(changed)}; the run's data order depends on these, so resume "
                              "with the values it started with (see its config.json)")
    torch.manual_seed(cfg.seed)  # same initial weights on every rank
    model, bert_cfg, init_source = _build_model(cfg, manifest, run_config)
    if res["zero_stage"] == 3:
        prepare_for_zero3(model)
    warmup = int(cfg.warmup * cfg.max_steps) if cfg.warmup < 1 else int(cfg.warmup)
    optimizer = build_optimizer(res["optimizer"], param_groups(model, res["weight_decay"]), res["lr"],
                                cfg.betas, cfg.eps, on_cuda)
    scheduler = None if "scheduler" in ds_config else build_scheduler(optimizer, cfg.max_steps, warmup, cfg.schedule)
    engine, _, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                                   config=ds_config, dist_init_required=False)

    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        tok_dir = run_dir / "tokenizer"
        tok_dir.mkdir(exist_ok=True)
        for name in TOKENIZER_FILES:
            if (Path(cfg.instances) / name).is_file():
                shutil.copyfile(Path(cfg.instances) / name, tok_dir / name)
        atomic_write_json(run_dir / "deepspeed_config.json", ds_config)
        atomic_write_json(run_dir / "config.json", {
            "stage": "pretrain", "pretrain": asdict(cfg), "resolved": res, "model": bert_cfg.to_dict(),
            "init_from": init_source, "instances": str(Path(cfg.instances).resolve()),
            "vocab_size": manifest["vocab_size"], "vocab_sha256": manifest.get("vocab_sha256"),
            "max_seq_length": manifest.get("max_seq_length"), "world_size": world, "deepspeed": ds_config})
    dist.barrier()

    step = 0
    if cfg.resume:
        ckpt = run_dir / "checkpoints"
        tag = (ckpt / "latest").read_text().strip()
        path, client = engine.load_checkpoint(str(ckpt), tag=tag)
        if path is None:
            raise TrainingError(f"{ckpt / tag}: DeepSpeed could not load this checkpoint")
        step = int(client["global_step"])
    else:
        torch.manual_seed(cfg.seed + 1 + rank)  # dropout differs per rank
        np.random.seed((cfg.seed + 1 + rank) % 2**32)
        random.seed(cfg.seed + 1 + rank)

    train = InstanceDataset(cfg.instances, "train", cfg.seed, manifest)
    holdout = InstanceDataset(cfg.instances, "holdout", cfg.seed, manifest)
    gas, micro = res["grad_accum"], res["micro_batch"]
    sampler = EpochBatches(len(train), micro, cfg.seed, rank, world)
    if sampler.per_epoch == 0:
        raise ConfigError(f"{cfg.instances}: {len(train)} training instances cannot fill one micro batch of "
                          f"{micro} on each of {world} rank(s); lower --micro-batch")
    consumed = step * gas  # micro batches this rank has already trained on: skip them at the sampler
    sampler.start_epoch, sampler.start = divmod(consumed, sampler.per_epoch)
    # draws from torch's RNG: restore after it
    loader = iter(batch_loader(train, sampler, cfg.num_workers, unpadded=cfg.unpadded))
    if cfg.resume:
        set_rng_state(torch.load(run_dir / "checkpoints" / tag / f"rng_rank{rank}.pt", weights_only=False))

    stop = _StopFlag()
    old_handlers = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    log = MetricsLog(run_dir, rank == 0, cfg.max_steps, step, cfg.progress)
    meter = Meter(device)
    peak = _peak_flops()
    n_params = sum(p.numel() for p in model.parameters())
    last_ckpt = (run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
                 if cfg.resume else None)
    record, t0, steps_in_interval = {}, time.perf_counter(), 0
    engine.train()
    try:
        while step < cfg.max_steps:
            step_loss = torch.zeros(2, dtype=torch.float64, device=device)  # [loss sum, stop requested]
            for k in range(gas):
                batch = to_device(next(loader), device)
                try:
                    out = engine(**batch)
                    engine.backward(out.loss)
                    engine.step()
                except (torch.OutOfMemoryError, MemoryError) as e:
                    b, ids = batch["next_sentence_label"].shape[0], batch["input_ids"]
                    shape = (f"{b} packed sequences, {ids.numel()} tokens" if cfg.unpadded
                             else f"{b} sequences x {ids.shape[1]} tokens")
                    raise TrainingError(
                        f"out of memory at step {step + 1}, micro batch {k + 1} of {gas} on rank {rank}: "
                        f"{shape}. Try --micro-batch {max(1, micro // 2)} with the same "
                        f"--global-batch {res['global_batch']} (more gradient accumulation), or ZeRO stage 3"
                    ) from e
                meter.add(out, batch)
                step_loss[0] += out.loss.detach().double() / gas
            step += 1
            steps_in_interval += 1
            step_loss[1] = 1.0 if stop.signal is not None else 0.0
            dist.all_reduce(step_loss)  # every rank sees the same loss and stop request, so all stop together
            loss = step_loss[0].item() / world
            if not math.isfinite(loss):
                where = f"the last good checkpoint is {last_ckpt}" if last_ckpt else "no checkpoint was saved yet"
                raise TrainingError(
                    f"loss is {loss} at step {step}; stopped without saving ({where}). Try a lower --lr, "
                    f"a longer --warmup, --precision bf16 or fp32 instead of fp16, and check the instances; "
                    f"then resume with --resume (from that checkpoint) or start again.")

            if step % cfg.log_every == 0 or step == cfg.max_steps:
                elapsed = time.perf_counter() - t0
                m = meter.reduce()
                record = {"step": step, "loss": m["loss"], "mlm_loss": m["mlm_loss"], "mlm_acc": m["mlm_acc"],
                          "nsp_loss": m["nsp_loss"], "nsp_acc": m["nsp_acc"], "lr": scheduler_lr(engine),
                          "grad_norm": _float(engine.get_global_grad_norm()),
                          "seq_per_s": m["sequences"] / elapsed, "tokens_per_s": m["tokens"] / elapsed,
                          "epoch": (step * gas) // sampler.per_epoch}
                if res["precision"] == "fp16":
                    record["loss_scale"] = _float(getattr(engine.optimizer, "cur_scale", None)
                                                  or getattr(engine.optimizer, "loss_scale", None))
                    record["skipped_steps"] = int(engine.skipped_steps)
                if peak:
                    seq = batch["max_seqlen"] if cfg.unpadded else batch["input_ids"].shape[1]
                    flops = 6 * n_params * m["tokens"] + 12 * bert_cfg.num_layers * bert_cfg.hidden_size * \
                        seq * m["tokens"]
                    record["mfu"] = flops / elapsed / (peak * world)
                log.write(record)
                log.advance(steps_in_interval, {"loss": f"{record['loss']:.3f}", "seq/s": f"{record['seq_per_s']:.0f}"})
                t0, steps_in_interval = time.perf_counter(), 0

            if holdout and len(holdout) and cfg.eval_every and step % cfg.eval_every == 0:
                ev = evaluate(engine, holdout, micro, rank, world, cfg.eval_batches, device, cfg.seed,
                              cfg.unpadded)
                if ev:
                    log.write({"step": step, **ev})
                t0 = time.perf_counter()

            stopping = step_loss[1].item() > 0
            if step % cfg.save_every == 0 or step == cfg.max_steps or stopping:
                last_ckpt = save_checkpoint(engine, run_dir, step, rank, local_rank, cfg.keep_last,
                                            {"global_step": step})
                t0 = time.perf_counter()
            if stopping:
                if rank == 0:
                    print(f"\nstopped by signal at step {step}; saved {last_ckpt}. Continue with --resume.",
                          flush=True)
                break
    finally:
        log.close()
        for s, h in old_handlers.items():
            signal.signal(s, h)
    return {**record, "step": step, "checkpoint": str(last_ckpt) if last_ckpt else None}


def _float(x):
    if x is None:
        return None
    return float(x.item() if hasattr(x, "item") else x)


def scheduler_lr(engine) -> float:
    return float(engine.optimizer.param_groups[0]["lr"]) if hasattr(engine.optimizer, "param_groups") else \
        float(engine.get_lr()[0])


# ---------------------------------------------------------------- export

def export(run_dir, out_dir, tag: str | None = None) -> Path:
    """Write the HF format (config.json, model.safetensors, tokenizer files) of a run's checkpoint."""
    from bertkit.checkpoint import save_pretrained
    from bertkit.config import BertConfig
    from bertkit.model import BertForPreTraining

    state, run, tag = load_run_state_dict(run_dir, tag)
    model = BertForPreTraining(BertConfig.from_dict(run["model"]))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise TrainingError(f"{run_dir} ({tag}): checkpoint does not fit the model "
                            f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    tok = Path(run_dir) / "tokenizer"
    extra = {"bertkit": {"run": str(Path(run_dir).resolve()), "checkpoint": tag,
                         "vocab_sha256": run.get("vocab_sha256")}}
    return save_pretrained(model, out_dir, tokenizer_dir=tok if (tok / "vocab.txt").is_file() else None,
                           extra_config=extra)
