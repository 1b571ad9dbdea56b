"""`pretrain --plan plan.toml`: a run in phases, as 2025's encoders train (ModernBERT, mmBERT: a long stable phase,
a context extension, a decay, each with its own data, masking rate and schedule), in one file.

    seed = 1                    # top-level keys: every phase's settings (PretrainConfig's fields)
    model = "modernbert-tiny"
    micro_batch = 32
    [[phase]]
    name = "stable"
    mixture = ["inst-ko=0.7", "inst-en=0.3"]
    max_steps = 3000
    schedule = "wsd"
    decay = 0.0                 # no decay: the checkpoint at its end is the "pre-decay" one
    masked_lm_prob = 0.3
    [[phase]]
    name = "decay"
    instances = "inst-ko"
    max_steps = 500
    schedule = "wsd"
    warmup = 0
    decay = 1.0
    masked_lm_prob = 0.15

Each phase is a pretraining run of its own in RUN/NN-NAME (its checkpoints, metrics and config), the second and later
started from the one before: its last checkpoint's weights (--init-from) and optimizer state (--init-optimizer, as
ModernBERT hands over; `init_optimizer = false` in a phase starts the moments anew), while each phase has its own
schedule clock, peak and data order (seed + the phase's index). RUN/plan.json records the plan and each
phase's end (steps, checkpoint). Running the same command again skips the finished phases and resumes the unfinished
one from its last checkpoint, with the same losses as a run never stopped. A phase's length is `max_steps`, or
`tokens` (as steps: tokens / (sequences a step x the mean tokens of its data's rows))."""
from dataclasses import fields
from pathlib import Path

import tomllib

from bertkit.fileio import atomic_write_json, make_folder, read_json_or_none
from bertkit.pretrain.config import ConfigError, PretrainConfig

PLAN = "plan.json"
NOT_IN_A_PLAN = ("out", "resume", "progress")   # the command's, for every phase
FIRST_PHASE_ONLY = ("init_from",)                # later phases start from the phase before


def read_plan(path) -> tuple[dict, list[dict]]:
    """(settings for every phase, [each phase's own settings with its "name"]); unknown settings refused, naming
    the phase and the setting."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"--plan {path}: cannot be read as TOML ({e})") from None
    phases = data.pop("phase", None)
    if not isinstance(phases, list) or not phases or not all(isinstance(p, dict) for p in phases):
        raise ConfigError(f"--plan {path}: no [[phase]] tables; a plan lists its phases, each a [[phase]] table")
    known = {f.name for f in fields(PretrainConfig)} - set(NOT_IN_A_PLAN)
    names = []
    for where, settings in [("the top level", data)] + [(f"phase {i + 1}", p) for i, p in enumerate(phases)]:
        unknown = set(settings) - known - ({"name", "tokens"} if where != "the top level" else set())
        if unknown:
            raise ConfigError(f"--plan {path}: {where} sets {sorted(unknown)[0]!r}, not a pretrain setting (the "
                              "flags' names with _ for -, e.g. max_steps)")
    for i, phase in enumerate(phases):
        if "tokens" in phase and "max_steps" in phase:
            raise ConfigError(f"--plan {path}: phase {i + 1} gives both tokens and max_steps; its length is one")
        if i and any(k in phase for k in FIRST_PHASE_ONLY):
            raise ConfigError(f"--plan {path}: phase {i + 1} sets init_from; a later phase starts from the one "
                              "before it")
        name = str(phase.get("name", f"phase{i + 1}"))
        if not name.replace("-", "").replace("_", "").isalnum() or name in names:
            raise ConfigError(f"--plan {path}: phase {i + 1}'s name {name!r}: letters, digits, - and _, once each")
        names.append(name)
    return data, [{**p, "name": n} for p, n in zip(phases, names)]


def phase_config(defaults: dict, phase: dict, index: int, out: Path, previous: Path | None,
                 progress: bool) -> PretrainConfig:
    settings = {**defaults, **{k: v for k, v in phase.items() if k not in ("name", "tokens")}}
    if "mixture" in settings:
        settings["mixture"] = tuple(settings["mixture"])
        settings.setdefault("instances", "instances")
    if "betas" in settings:
        settings["betas"] = tuple(settings["betas"])
    settings["seed"] = int(settings.get("seed", 42)) + index   # a data order of its own
    if previous is not None:
        settings["init_from"], settings["model"] = str(previous), None
        settings.setdefault("init_optimizer", True)   # ModernBERT's handoff: the moments go on
    if "tokens" in phase:
        settings["max_steps"] = steps_for_tokens(settings, float(phase["tokens"]))
    folder = out / f"{index + 1:02d}-{phase['name']}"
    try:
        return PretrainConfig(**settings, out=str(folder), progress=progress,
                              resume=(folder / "checkpoints" / "latest").is_file())
    except TypeError as e:   # a required setting missing (instances)
        raise ConfigError(f"--plan: phase {phase['name']}: {e}") from None


def steps_for_tokens(settings: dict, tokens: float) -> int:
    """A phase's length in tokens as steps: tokens / (sequences a step x the mean tokens of a row its data holds,
    a mixture's weighted by its targets), at least 1."""
    import math
    import os

    from bertkit.data import InstanceDataset
    from bertkit.mixture import open_mixture, parse_mixture

    if settings.get("mixture"):
        train, _ = open_mixture(parse_mixture(settings["mixture"]), settings.get("mixture_temperature"), 0)
        per_row = sum(p * float(d.lengths().mean()) for p, d in zip(train.probabilities, train.datasets))
    else:
        per_row = float(InstanceDataset(settings["instances"], "train").lengths().mean())
    sequences = settings.get("global_batch") or \
        (settings.get("micro_batch") or 32) * int(os.environ.get("WORLD_SIZE", "1"))
    return max(1, math.ceil(tokens / (sequences * per_row)))


def _finished(cfg: PretrainConfig) -> bool:
    """A phase whose run reached its steps (stopped before plan.json said so): its newest complete checkpoint's."""
    from bertkit.pretrain.checkpoints import find_checkpoint

    if cfg.max_steps is None or not (Path(cfg.out) / "checkpoints").is_dir():
        return False
    marker = find_checkpoint(cfg.out).marker
    return marker is not None and marker.step >= cfg.max_steps


def run_plan(plan_path, out, progress: bool = True) -> dict:
    """Every phase not finished yet, in order; returns the plan's record (plan.json)."""
    from bertkit.pretrain.train import pretrain

    out = Path(out)
    defaults, phases = read_plan(plan_path)
    record = read_json_or_none(out / PLAN) or {}
    if record and record.get("phases_planned") != phases and any(p.get("done") for p in record.get("phases", [])):
        raise ConfigError(f"{out}: began with another plan (see its {PLAN}); give that plan, or another --out")
    record = {"defaults": defaults, "phases_planned": phases, "phases": record.get("phases", [])}
    previous = None
    for index, phase in enumerate(phases):
        cfg = phase_config(defaults, phase, index, out, previous, progress)
        previous = Path(cfg.out)
        if index < len(record["phases"]) and record["phases"][index].get("done") or _finished(cfg):
            continue
        make_folder(out)   # never a link: the phases' folders and plan.json go below it
        result = pretrain(cfg)
        entry = {"name": phase["name"], "folder": previous.name, "max_steps": cfg.max_steps, "step": result.get("step"),
                 "checkpoint": result.get("checkpoint"), "done": not result.get("stopped_by_signal")}
        record["phases"] = record["phases"][:index] + [entry]
        atomic_write_json(out / PLAN, record)
        if result.get("stopped_by_signal"):
            return {**record, "stopped_by_signal": result["stopped_by_signal"]}
    return record
