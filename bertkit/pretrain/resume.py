"""What a --resume may change, in one place. A setting the command does not give is the run's own (read from its
config.json), so `pretrain --out RUN --resume` alone continues the run. A setting it gives is compared with what
the run recorded:

- KEPT settings (what the data order, the weights and the optimizer state depend on) must match: a change is
  refused naming both values;
- every other setting is APPLIED from the resumed step on, said on the terminal and recorded (metrics.jsonl, and
  config.json's `changes` with the step it took effect).
"""
from dataclasses import dataclass, fields, replace
from pathlib import Path

from bertkit.formats import USER_DEEPSPEED_CONFIG, RunConfig
from bertkit.pretrain.config import ConfigError, DeepSpeedSettings, PretrainConfig

# flags (PretrainConfig) and resolved settings (DeepSpeedSettings) a resume cannot change
KEPT_FLAGS = ("seed", "time_budget", "schedule_from", "betas", "eps", "norm", "pad_vocab_to", "model", "init_from",
              "token_budget", "mixture", "mixture_temperature", "batch_warmup_from", "batch_warmup_steps",
              "mixture_max_epochs", "train_only")
KEPT_SETTINGS = ("micro_batch", "global_batch", "zero_stage", "precision", "optimizer")
APPLIED_SETTINGS = ("lr", "weight_decay", "grad_clip")
NOT_COMPARED = ("instances", "out", "resume", "progress", "deepspeed_config", "recipe", "objective",
                "init_optimizer")   # read only when a run begins
WHY_KEPT = {"seed": "the data order", "micro_batch": "the data order", "global_batch": "the data order",
            "token_budget": "the data order", "mixture": "the data order", "batch_warmup_from": "the data order",
            "batch_warmup_steps": "the data order", "mixture_max_epochs": "the data order",
            "mixture_temperature": "the data order", "max_steps": "a --mixture-max-epochs cap's run length",
            "time_budget": "the schedule", "schedule_from": "the schedule", "model": "the weights",
            "norm": "the weights", "pad_vocab_to": "the weights", "init_from": "the weights (the run's own checkpoint "
            "continues it)", "zero_stage": "the optimizer state", "precision": "the optimizer state",
            "optimizer": "the optimizer state", "betas": "the optimizer state", "eps": "the optimizer state",
            "train_only": "the optimizer state"}


@dataclass
class Change:
    setting: str
    before: object
    after: object

    def __str__(self) -> str:
        return f"{self.setting} {self.before} -> {self.after}"


def own_deepspeed_config(run_dir, recorded: str) -> Path:
    """The copy of --deepspeed-config that the run keeps; a run from before that copy names only a path, which a
    folder from someone else could point anywhere: it is not followed."""
    own = Path(run_dir) / USER_DEEPSPEED_CONFIG
    if not own.is_file():
        raise ConfigError(f"{run_dir} began with --deepspeed-config {recorded}, and keeps no copy of it (a run from an "
                          "older bertkit); give it again: --resume --deepspeed-config FILE")
    return own


def inherit(cfg: PretrainConfig, run: RunConfig, given: set | None = None) -> PretrainConfig:
    """cfg with the run's recorded value wherever the command gave none: a field left None, or (from the CLI, which
    knows) a flag not on the command line."""
    values = {}
    for f in fields(PretrainConfig):
        if f.name in ("resume", "out", "progress") or f.name not in run.pretrain:
            continue
        unset = getattr(cfg, f.name) in (None, ()) or (given is not None and f.name not in given)
        if unset:
            values[f.name] = run.pretrain[f.name]
    if values.get("precision", cfg.precision) in (None, "auto") and run.resolved.get("precision"):
        # what auto chose when the run began (its optimizer state is in it), not what auto would choose here
        values["precision"] = run.resolved["precision"]
    if "instances" in values:
        values["instances"] = run.instances  # recorded resolved: the run can be resumed from any folder
    if values.get("deepspeed_config"):  # the run's own copy, never the path its config.json names
        values["deepspeed_config"] = str(own_deepspeed_config(cfg.out, values["deepspeed_config"]))
    for name in ("betas", "mixture", "train_only"):
        if isinstance(values.get(name), list):
            values[name] = tuple(values[name])
    return replace(cfg, **values)


def compare(run: RunConfig, cfg: PretrainConfig, settings: DeepSpeedSettings, world: int, manifest, objective: str,
            step: int | None) -> list[Change]:
    """The applied changes; a kept setting that differs raises ConfigError naming each one."""
    def norm(v):
        return list(v) if isinstance(v, tuple) else v

    refused, applied = [], []
    if run.world_size != world:
        raise ConfigError(f"--resume: the run used {run.world_size} rank(s), this launch has {world}; "
                          "resume with the same number")
    for name in KEPT_SETTINGS + APPLIED_SETTINGS:
        before, after = run.resolved.get(name), getattr(settings, name)
        if before is not None and before != after:
            (refused if name in KEPT_SETTINGS else applied).append(Change(name, before, after))
    for f in fields(PretrainConfig):
        if f.name in NOT_COMPARED or f.name not in run.pretrain or f.name in DeepSpeedSettings.__dataclass_fields__:
            continue
        before, after = norm(run.pretrain[f.name]), norm(getattr(cfg, f.name))
        if f.name == "model" and before != after and same_shape(after, run):
            continue  # another path to the same shape
        if before != after and not (f.name in ("norm", "pad_vocab_to", "init_from") and after is None):
            (refused if f.name in KEPT_FLAGS else applied).append(Change(f.name, before, after))
    if run.objective != objective:
        refused.append(Change("objective", run.objective, objective))
    if run.max_seq_length and manifest.max_seq_length != run.max_seq_length:
        refused.append(Change("the instances' max_seq_length", run.max_seq_length, manifest.max_seq_length))
    if run.instances_id and manifest_id(manifest) != run.instances_id:
        refused.append(Change("the instances", f"{run.instances} ({run.instances_id[:12]}...)",
                              f"{cfg.instances} ({manifest_id(manifest)[:12]}...)"))
    if refused:
        why = sorted({WHY_KEPT.get(c.setting, "the data") for c in refused})
        raise ConfigError(f"--resume: {'; '.join(map(str, refused))}; the run's data order and schedule depend on "
                          f"these ({', '.join(why)}), so resume with the values it started with (see its "
                          "config.json), or start a new run from it with --init-from")
    if step is not None and cfg.max_steps is not None and cfg.max_steps <= step:
        raise ConfigError(f"--max-steps {cfg.max_steps}: the run is already at step {step}; give more steps to "
                          f"train on, or export it as it is (bertkit export {cfg.out})")
    return applied


def check_weights_format(run: RunConfig, ds_config: dict, out) -> None:
    """A run saved with DeepSpeed's bf16 (weights and optimizer in its bf16 format: any GPU run in bf16, and a CPU
    run in bf16 before 2026-11-26) cannot continue on an engine without it, as a CPU's bf16 now is (autocast over
    fp32 weights, bertkit.precision): DeepSpeed would fail deep inside its loader."""
    def bf16(config: dict) -> bool:
        return bool(config.get("bf16", {}).get("enabled"))

    if bf16(run.deepspeed) and not bf16(ds_config):
        raise ConfigError(f"--resume: {out} was saved with DeepSpeed's bf16 weights (a GPU run, or --precision bf16 "
                          "on a CPU before 2026-11-26); on a CPU bf16 is now autocast over fp32 weights, whose engine "
                          f"cannot load them. Its weights are fine: `bertkit export {out}` writes them, and `bertkit "
                          f"pretrain --init-from {out} ...` continues training from them in a new run")


def same_shape(spec, run: RunConfig) -> bool:
    from bertkit.models import family_of

    family = family_of(run.model)
    try:
        named = family.config_from_spec(spec, run.vocab_size)
        return named is not None and named.shape() == family.config_from_dict(run.model).shape()
    except (OSError, ValueError, KeyError, TypeError):
        return False


def manifest_id(manifest) -> str:
    """The instances' identity: their shards' checksums (a moved folder keeps it, other instances do not)."""
    import hashlib

    return hashlib.sha256("".join(f"{s.file}:{s.checksum};" for s in manifest.shards).encode()).hexdigest()


def apply(changes: list[Change], scheduler, settings: DeepSpeedSettings, ds_config: dict) -> None:
    """After the checkpoint is loaded (which restores the old learning rate and weight decay into the optimizer):
    the new peak rate and decay, and the learning rate of the next step from the schedule as it is now (a changed
    --max-steps, --warmup or --schedule takes effect at once)."""
    names = {c.setting for c in changes}
    schedule_changes = names & {"lr", "max_steps", "warmup", "schedule"}
    if "scheduler" in ds_config and schedule_changes:
        raise ConfigError(f"--resume: {', '.join(sorted(schedule_changes))} cannot change under the DeepSpeed "
                          "config's own scheduler; change it there, or resume with the run's values")
    if scheduler is None:
        return
    if "lr" in names:
        scheduler.base_lrs = [settings.lr for _ in scheduler.base_lrs]
    for group, base, fn in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * fn(scheduler.last_epoch)
        if "weight_decay" in names and group.get("weight_decay"):
            group["weight_decay"] = settings.weight_decay
