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
`tokens` (as steps: tokens / (sequences a step x the mean tokens of its data's rows)), and so are warmup_tokens,
save_every_tokens, eval_every_tokens and batch_warmup_tokens; `batch_tokens` keeps a step's tokens at every
length; a phase longer than the one before says how much of its data reaches the new length (long_reach). The
reference: plans.md."""
import math
import os
from dataclasses import fields
from pathlib import Path

import tomllib

from bertkit.fileio import atomic_write_json, make_folder, read_json_or_none
from bertkit.formats import read_run_config
from bertkit.pretrain.config import ConfigError, PretrainConfig
from bertkit.pretrain.metrics import say

PLAN = "plan.json"   # shipped plans: plans/*.toml; the reference: plans.md
SHIPPED = Path(__file__).parent / "plans"        # modernbert, bert, budget: `--plan NAME`
# settings a plan may give in tokens, as steps at its phase's tokens a step
IN_TOKENS = {"warmup_tokens": "warmup", "save_every_tokens": "save_every", "eval_every_tokens": "eval_every",
             "batch_warmup_tokens": "batch_warmup_steps"}
LENGTHS = ("tokens", "max_steps", "time_budget", "batch_warmup_steps", *IN_TOKENS)   # what --plan-scale multiplies
NOT_IN_A_PLAN = ("out", "resume", "progress")   # the command's, for every phase
FIRST_PHASE_ONLY = ("init_from",)                # later phases start from the phase before


def plan_file(plan) -> Path:
    """A plan's file: the path given, or a shipped plan by name."""
    if Path(plan).is_file():
        return Path(plan)
    if (SHIPPED / f"{plan}.toml").is_file() and "/" not in str(plan):
        return SHIPPED / f"{plan}.toml"
    shipped = ", ".join(sorted(p.stem for p in SHIPPED.glob("*.toml")))
    raise ConfigError(f"--plan {plan}: no such file, nor a shipped plan ({shipped})")


def scaled(settings: dict, scale: float) -> dict:
    """--plan-scale times a length (tokens, steps or seconds; steps rounded up)."""
    def length(key, value):
        return max(1, math.ceil(value * scale)) if key in ("max_steps", "batch_warmup_steps") else value * scale

    return {k: length(k, v) if k in LENGTHS and scale != 1 else v for k, v in settings.items()}


def read_plan(path, scale: float = 1.0, overrides: dict | None = None) -> tuple[dict, list[dict]]:
    """(settings for every phase, [each phase's own settings with its "name"]): `path` a file or a shipped plan's
    name, `overrides` (--plan-set) over every phase (the command line wins over the file, as a flag wins over a
    recipe), every length times `scale` (--plan-scale); unknown settings refused, naming the phase and the setting."""
    path = plan_file(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"--plan {path}: cannot be read as TOML ({e})") from None
    phases = data.pop("phase", None)
    overrides = overrides or {}
    data = {**data, **overrides}
    if not isinstance(phases, list) or not phases or not all(isinstance(p, dict) for p in phases):
        raise ConfigError(f"--plan {path}: no [[phase]] tables; a plan lists its phases, each a [[phase]] table")
    phases = [{k: v for k, v in p.items() if k not in overrides} for p in phases]
    known = {f.name for f in fields(PretrainConfig)} - set(NOT_IN_A_PLAN)
    names = []
    for where, settings in [("the top level", data)] + [(f"phase {i + 1}", p) for i, p in enumerate(phases)]:
        unknown = set(settings) - known - {"batch_tokens", *IN_TOKENS} - \
            ({"name", "tokens"} if where != "the top level" else set())
        if unknown:
            raise ConfigError(f"--plan {path}: {where} sets {sorted(unknown)[0]!r}, not a pretrain setting (the "
                              "flags' names with _ for -, e.g. max_steps)")
    data = typed(data, path, "the top level")
    phases = [typed(p, path, f"phase {i + 1}") for i, p in enumerate(phases)]
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
    return scaled(data, scale), [scaled({**p, "name": n}, scale) for p, n in zip(phases, names)]


def typed(settings: dict, path, where: str) -> dict:
    """Each setting of the type its flag takes: time_budget as on the command line ("2h") in seconds, a whole
    number written 1e3 as an int; text where a number or true/false belongs refused, naming where."""
    from bertkit.pretrain.budget import parse_duration

    kinds = {f.name: str(f.type).replace("<class '", "").replace("'>", "").replace(" | None", "")
             for f in fields(PretrainConfig)}   # int, float, bool, str, tuple
    kinds.update({**dict.fromkeys((*IN_TOKENS, "tokens"), "float"), "batch_tokens": "int"})   # a plan's own
    out = dict(settings)
    for key, value in settings.items():
        kind = kinds.get(key)
        fraction = isinstance(value, float) and not value.is_integer()
        if key == "time_budget" and isinstance(value, str):
            try:
                out[key] = parse_duration(value)
            except ValueError as e:
                raise ConfigError(f"--plan {path}: {where}: time_budget {e}") from None
        elif kind == "bool" and not isinstance(value, bool) or \
                kind in ("int", "float") and (isinstance(value, (str, bool)) or kind == "int" and fraction):
            want = {"bool": "true or false", "int": "a whole number"}.get(kind, "a number")
            raise ConfigError(f"--plan {path}: {where} sets {key} = {value!r}; give {want}")
        elif kind == "int" and isinstance(value, float):
            out[key] = int(value)
    return out


def phase_config(defaults: dict, phase: dict, index: int, out: Path, previous: Path | None,
                 progress: bool, before: dict | None = None) -> PretrainConfig:
    """`phase` (after the phase `before`, whose run folder is `previous`) as a PretrainConfig."""
    settings = {**defaults, **{k: v for k, v in phase.items() if k not in ("name", "tokens")}}
    for name in ("mixture", "train_only"):   # a list, or "a=0.7, b=0.3" as on the command line
        if isinstance(settings.get(name), str):
            settings[name] = [item.strip() for item in settings[name].split(",") if item.strip()]
    if "mixture" in settings:
        settings.setdefault("instances", "instances")
    for name in ("betas", "mixture", "train_only"):
        if name in settings:
            settings[name] = tuple(settings[name])
    settings["seed"] = int(settings.get("seed", 42)) + index   # a data order of its own
    if previous is not None:
        settings["init_from"], settings["model"] = str(previous), None
        # ModernBERT's handoff: the moments go on, unless the phase before trained other parameters (--train-only)
        trained = [tuple(d.get("train_only", ())) for d in ({**defaults, **(before or {})}, settings)]
        settings.setdefault("init_optimizer", trained[0] == trained[1])
    if "batch_tokens" in settings:
        settings.update(batch_for_tokens(settings, int(settings.pop("batch_tokens")), phase["name"]))
    settings = in_steps(settings, phase.get("tokens"))
    folder = out / f"{index + 1:02d}-{phase['name']}"
    try:
        return PretrainConfig(**settings, out=str(folder), progress=progress,
                              resume=(folder / "checkpoints" / "latest").is_file())
    except TypeError as e:   # a required setting missing (instances)
        raise ConfigError(f"--plan: phase {phase['name']}: {e}") from None


def in_steps(settings: dict, tokens: float | None = None) -> dict:
    """`settings` with each length given in tokens (IN_TOKENS' keys, and `tokens` the run's) as steps at the tokens
    a step of its data holds, rounded up."""
    settings = dict(settings)
    in_tokens = {setting: settings.pop(key) for key, setting in IN_TOKENS.items() if key in settings}
    if tokens is not None:
        in_tokens["max_steps"] = tokens
    if in_tokens:   # the data read once for all of them
        per_step = tokens_a_step(settings)
        settings.update({setting: max(1, math.ceil(float(value) / per_step)) for setting, value in in_tokens.items()})
    return settings


def data_folders(mixture, instances) -> list[str]:
    """The instance folders a phase reads: its mixture's, else its instances."""
    from bertkit.mixture import parse_mixture

    return [m.folder for m in parse_mixture(mixture)] if mixture else [instances]


def batch_for_tokens(settings: dict, batch_tokens: int, name: str) -> dict:
    """`batch_tokens`: the same tokens a step at any length (a context extension keeps its step's size): sequences
    a step = batch_tokens / the instances' length, micro batches the largest that divide them (at most the plan's)."""
    from bertkit.formats import read_instances_manifest

    length = read_instances_manifest(data_folders(settings.get("mixture"), settings.get("instances"))[0]).max_seq_length
    world = int(os.environ.get("WORLD_SIZE", "1"))
    sequences = batch_tokens // length
    if sequences < world or sequences % world or batch_tokens % length:
        raise ConfigError(f"--plan: phase {name}: batch_tokens {batch_tokens} is not a whole number of sequences of "
                          f"{length} tokens on each of {world} rank(s); give a multiple of {length * world}")
    per_rank = sequences // world
    micro = max(m for m in range(1, min(per_rank, int(settings.get("micro_batch") or 32)) + 1) if per_rank % m == 0)
    return {"global_batch": sequences, "micro_batch": micro}


def long_reach(folder, previous_length: int, rows: int = 20_000) -> dict:
    """How much of a longer phase's data uses its new length: of up to `rows` training rows (evenly spaced), the
    share of tokens in document spans longer than the phase before's length (context it never saw), and in spans
    filling nine tenths of a row (the new length reached). MLM-only rows are split at [SEP] into their documents; a
    sentence-pair row is one span."""
    import numpy as np

    from bertkit.data import InstanceDataset

    data = InstanceDataset(folder, "train")
    length, split = data.manifest.max_seq_length, data.manifest.objective == "none"
    picked = np.unique(np.linspace(0, len(data) - 1, num=min(rows, len(data))).astype(np.int64)) if len(data) else []
    spans = []
    for index in picked:
        ids = data.tokens(int(index))
        cuts = np.flatnonzero(ids == data.sep_id) + 1 if split and data.sep_id is not None else [len(ids)]
        spans.append(np.diff(np.concatenate([[0], cuts, [len(ids)]]))[:len(cuts) if len(cuts) else 1])
    spans = np.concatenate(spans) if spans else np.zeros(0, np.int64)
    total = max(int(spans.sum()), 1)
    return {"folder": str(folder), "length": length, "previous_length": previous_length, "rows_measured": len(picked),
            "share_beyond_previous": round(float(spans[spans > previous_length].sum()) / total, 4),
            "share_reaching_length": round(float(spans[spans >= 0.9 * length].sum()) / total, 4)}


def tokens_a_step(settings: dict) -> float:
    """A phase's tokens a step: sequences a step x the mean tokens of a row its data holds (a mixture's weighted by
    its targets); a length in tokens is that many steps, rounded up."""
    from bertkit.data import InstanceDataset
    from bertkit.mixture import open_mixture, parse_mixture

    if settings.get("mixture"):
        train, _ = open_mixture(parse_mixture(settings["mixture"]), settings.get("mixture_temperature"), 0)
        per_row = sum(p * float(d.lengths().mean()) for p, d in zip(train.probabilities, train.datasets))
    else:
        per_row = float(InstanceDataset(settings["instances"], "train").lengths().mean())
    sequences = settings.get("global_batch") or \
        (settings.get("micro_batch") or 32) * int(os.environ.get("WORLD_SIZE", "1"))
    return sequences * per_row


def max_length(cfg: PretrainConfig) -> int:
    from bertkit.formats import read_instances_manifest

    return read_instances_manifest(data_folders(cfg.mixture, cfg.instances)[0]).max_seq_length


def extension(cfg: PretrainConfig, before: int | None, name: str) -> list[dict]:
    """A phase longer than the one before: long_reach of each folder it reads, said; [] otherwise."""
    if before is None or max_length(cfg) <= before:
        return []
    reach = [long_reach(folder, before) for folder in data_folders(cfg.mixture, cfg.instances)]
    for r in reach if int(os.environ.get("RANK", "0")) == 0 else []:
        say(f"{name}: {r['length']} tokens after {r['previous_length']}: in {r['folder']}, "
            f"{r['share_beyond_previous']:.1%} of the tokens lie in documents longer than {r['previous_length']}, "
            f"{r['share_reaching_length']:.1%} in ones filling a row ({r['rows_measured']} rows measured)")
    return reach


def sources(mixture: dict | None) -> dict:
    """A mixture phase's realised tokens per source (its mixture.json), for plan.json."""
    if not mixture:
        return {}
    return {"sources": [{k: s[k] for k in ("folder", "target", "tokens", "share_of_tokens", "share_of_rows")}
                        for s in mixture["sources"]]}


def _finished(cfg: PretrainConfig) -> bool:
    """A phase whose run reached its steps (stopped before plan.json said so): its newest complete checkpoint's."""
    from bertkit.pretrain.checkpoints import find_checkpoint

    if cfg.max_steps is None or not (Path(cfg.out) / "checkpoints").is_dir():
        return False
    marker = find_checkpoint(cfg.out).marker
    return marker is not None and marker.step >= cfg.max_steps


def run_plan(plan_path, out, progress: bool = True, scale: float = 1.0, overrides: dict | None = None) -> dict:
    """Every phase not finished yet, in order; returns the plan's record (plan.json)."""
    from bertkit.pretrain.train import pretrain

    out = Path(out)
    defaults, phases = read_plan(plan_path, scale, overrides)
    record = read_json_or_none(out / PLAN) or {}
    if record and record.get("phases_planned") != phases and any(p.get("done") for p in record.get("phases", [])):
        raise ConfigError(f"{out}: began with another plan (see its {PLAN}); give that plan, or another --out")
    record = {"defaults": defaults, "phases_planned": phases, "phases": record.get("phases", [])}
    previous, length = None, None
    for index, phase in enumerate(phases):
        cfg = phase_config(defaults, phase, index, out, previous, progress, phases[index - 1] if index else None)
        previous, before, length = Path(cfg.out), length, max_length(cfg)
        if index < len(record["phases"]) and record["phases"][index].get("done") or _finished(cfg):
            continue
        make_folder(out)   # never a link: the phases' folders and plan.json go below it
        reach = extension(cfg, before, phase["name"])
        result = pretrain(cfg)
        entry = {"name": phase["name"], "folder": previous.name, "max_steps": cfg.max_steps, "step": result.get("step"),
                 "checkpoint": result.get("checkpoint"), "done": not result.get("stopped_by_signal"),
                 "global_batch": read_run_config(previous).resolved.get("global_batch"), "max_seq_length": length,
                 "tokens": result.get("tokens"), **({"reach": reach} if reach else {}),
                 **sources(result.get("mixture"))}
        record["phases"] = record["phases"][:index] + [entry]
        atomic_write_json(out / PLAN, record)
        if result.get("stopped_by_signal"):
            return {**record, "stopped_by_signal": result["stopped_by_signal"]}
    return record
