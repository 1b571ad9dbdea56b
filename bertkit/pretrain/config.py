"""Pretraining settings: the flags (PretrainConfig) merged with a user's DeepSpeed config into the values a run
uses (DeepSpeedSettings) and the DeepSpeed config it hands to deepspeed.initialize."""
import copy
from dataclasses import dataclass, replace

from bertkit.recipes import DEFAULTS, RECIPES, flag, recipe_settings


class ConfigError(ValueError):
    pass


class TrainingError(RuntimeError):
    pass


DEFAULT_WARMUP = DEFAULTS["warmup"]


@dataclass
class PretrainConfig:
    instances: str
    out: str
    model: str | None = None              # preset (tiny ... large) or an HF config.json / model folder; None: base
                                          # (on --resume: the run's own)
    max_steps: int | None = None          # optimizer steps; None: 10,000, or no limit with time_budget, or the
                                          # recorded steps with schedule_from
    time_budget: float | None = None      # seconds (--time-budget 2h): the schedule follows the clock; stop when spent
    schedule_from: str | None = None      # a time-budgeted run folder whose recorded schedule is replayed
    # None below = "not given": the --deepspeed-config value is used, else DeepSpeedSettings' default
    micro_batch: int | None = None        # sequences per rank per forward
    global_batch: int | None = None       # sequences per optimizer step; None = micro_batch * ranks
    zero_stage: int | None = None
    precision: str | None = None          # auto | fp32 | bf16 | fp16; auto = bf16 where the GPU or CPU has bf16
                                          # units, else fp16 (GPU) or fp32 (CPU); a CPU's bf16 is autocast over
                                          # fp32 weights (bertkit.precision)
    grad_clip: float | None = None
    optimizer: str | None = None          # lamb | adamw | stableadamw (AdamW with update clipping)
    lr: float | None = None               # peak learning rate
    weight_decay: float | None = None
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-6
    schedule: str = "linear"              # linear (BERT paper) | poly (power 0.5, NVIDIA's recipe) | cosine | wsd
                                          # (ModernBERT's warmup-stable-decay) | wsd-linear | wsd-cosine
    decay: float = 0.1                    # wsd*: the last fraction of the run, decayed (1 - sqrt, a line, a cosine)
    warmup: float | None = None           # < 1: fraction of max_steps (or of the time budget); >= 1: steps;
                                          # None: the recipe's, else DEFAULT_WARMUP
    recipe: str | None = None             # a RECIPES name: its settings where the flags are silent
    deepspeed_config: str | None = None
    init_from: str | None = None          # phase 2: start from an export or a run folder's latest checkpoint
    init_optimizer: bool = False          # with init_from a run folder: its optimizer state too (a new schedule)
    resume: bool = False
    save_every: int = 1000
    keep_last: int = 3
    log_every: int = 10
    eval_every: int = 1000
    eval_batches: int = 20
    seed: int = 42
    num_workers: int = 1
    dropout: float | None = None          # overrides the model's hidden and attention dropout
    norm: str | None = None               # post (BERT) | pre (MegatronBERT's pre-LN); None: the model's own (post)
    objective: str | None = None          # None: the instances' (MLM + NSP/SOP, or MLM); mlm: MLM alone; electra
    generator_size: float = 0.25          # ELECTRA: the generator's width as a fraction of the discriminator's
    disc_weight: float = 50.0             # ELECTRA: loss = generator MLM + disc_weight x discriminator
    rope_theta: float | None = None       # ModernBERT: the global layers' RoPE base (a longer second phase raises it)
    rope_theta_local: float | None = None  # ModernBERT: the local (sliding-window) layers' RoPE base
    pad_vocab_to: int | None = None       # embedding/decoder rows rounded up to this multiple (default 8); 64 is
                                          # MosaicBERT's and ModernBERT's. Export trims them
    unpadded: bool = False                # packed batches (varlen attention): no compute on padding
    compile: bool = False                 # the model under torch.compile (the first steps compile: minutes on a CPU)
    token_budget: int | None = None       # packed micro batches filled to this many tokens by best fit (ModernBERT's
                                          # fixed budget); None: --micro-batch sequences each
    mixture: tuple = ()                   # several instance folders as one: "DIR=WEIGHT" (or "DIR" with
                                          # mixture_temperature) items; instances is then the first (bertkit.mixture)
    mixture_max_epochs: float | None = None    # no folder of a mixture drawn more than this many passes in the run
    mixture_temperature: float | None = None   # no weights: each folder's rows raised to this (1: by size)
    masked_lm_prob: float | None = None   # dynamic instances masked at this rate in training (ModernBERT: 0.3); the
                                          # held-out split keeps the instances' own, so curves compare
    batch_warmup_from: float | None = None   # sequences a step start at this share of global_batch (ModernBERT: 1/6)
    batch_warmup_steps: int | None = None    # ... and grow linearly to it over these steps
    ema: float | None = None              # decay of a moving average of the weights kept beside training (0.999)
    masked_lm_prob_end: float | None = None   # the rate moves linearly from masked_lm_prob at the first step to this
                                              # at the last (mmBERT lowers it as training goes)
    train_only: tuple = ()                # "head" (the modules beside the encoder), "embeddings" (the word embeddings,
                                          # tied to the decoder): all else frozen, e.g. a new head learns first
    kernels: str = "auto"                 # attention/LayerNorm backend (bertkit.kernels): auto|triton|torch|reference
    threads: int | None = None            # torch threads per rank; None: the free cores / ranks (bertkit.threads)
    report_to: str | None = None          # tensorboard, wandb (offline), both "tensorboard,wandb", or none;
                                          # None: tensorboard when installed
    # divergence: stop (raise, as BERT trainers do) or roll back to the last good checkpoint, skipping the data
    # between it and the bad step (PaLM's recipe for loss spikes), at most max_rollbacks times
    on_nonfinite: str = "stop"            # stop | rollback
    on_spike: str = "none"                # none | stop | rollback
    spike_factor: float = 4.0             # a spike: loss above spike_factor x the median of the last spike_window
    spike_window: int = 100
    max_rollbacks: int = 3

    def with_recipe(self, deepspeed_user: dict | None = None, family_for=None,
                    resuming: bool = False) -> "PretrainConfig":
        """This config with its recipe's settings where neither a flag nor the user's DeepSpeed config gave one,
        and the defaults that wait for a recipe (warmup) filled in. family_for(model spec) -> bertkit.models.Family
        picks the recipe's settings for the family of the model the run builds. A resumed run keeps its own model
        (one made before the recipe named a model recorded none)."""
        if self.recipe is not None and self.recipe not in RECIPES:
            raise ConfigError(f"--recipe {self.recipe!r}: choose one of {', '.join(RECIPES)}")
        values, settings = {}, {}
        if self.recipe:
            model = self.model or (None if resuming else RECIPES[self.recipe]["pretrain"].get("model"))
            settings = recipe_settings(self.recipe, family_for(model) if family_for else None)
            if resuming or self.init_from:  # the model is the run's own, or --init-from's
                settings.pop("model", None)
        for name, value in settings.items():
            in_file = name in DEEPSPEED_PATHS and _get(deepspeed_user or {}, DEEPSPEED_PATHS[name]) is not None
            if getattr(self, name) is None and not in_file:
                values[name] = value
        if values.get("warmup", self.warmup) is None:
            values["warmup"] = DEFAULT_WARMUP
        return replace(self, **values)

    def check_model_spec(self) -> None:
        """--model names a family's preset, or an existing config.json / model folder."""
        from pathlib import Path

        from bertkit.models import preset_names

        names = preset_names()
        if self.model and self.model not in names and not Path(self.model).exists():
            raise ConfigError(f"--model {self.model}: no such preset, file or folder; choose one of {', '.join(names)}"
                              ", or give a config.json or model folder")

    def check(self) -> None:
        from pathlib import Path

        from bertkit.models.bert_config import SIZE_LIMITS

        top = SIZE_LIMITS["vocab_pad_multiple"]
        if self.pad_vocab_to is not None and not (isinstance(self.pad_vocab_to, int) and 1 <= self.pad_vocab_to <= top):
            raise ConfigError(f"--pad-vocab-to {self.pad_vocab_to}: choose 1 to {top} (64 is ModernBERT's)")
        self.check_model_spec()
        if self.on_nonfinite not in ("stop", "rollback"):
            raise ConfigError(f"--on-nonfinite {self.on_nonfinite!r}: choose stop or rollback")
        if self.on_spike not in ("none", "stop", "rollback"):
            raise ConfigError(f"--on-spike {self.on_spike!r}: choose none, stop or rollback")
        if self.spike_factor <= 1 or self.spike_window < 2:
            raise ConfigError("--spike-factor must be above 1 and --spike-window at least 2")
        if self.time_budget is not None and self.schedule_from:
            raise ConfigError("--time-budget and --schedule-from: give one (--schedule-from replays a budgeted run)")
        if self.time_budget is not None and not (self.time_budget > 0 and 0 <= self.warmup < 1):
            raise ConfigError("--time-budget needs a budget above 0 and --warmup as a fraction of it (below 1)")
        if self.objective not in (None, "mlm", "electra"):
            raise ConfigError(f"--objective {self.objective!r}: choose mlm or electra (or leave it to the instances)")
        if not (0 < self.generator_size <= 1 and self.disc_weight > 0):
            raise ConfigError("--generator-size must be in (0, 1] and --disc-weight above 0")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"--max-steps {self.max_steps}: give at least 1")
        if self.init_optimizer and not (self.init_from and (Path(self.init_from) / "checkpoints").is_dir()):
            raise ConfigError(f"--init-optimizer: {self.init_from or '--init-from'} holds no optimizer state; it "
                              "carries the state of a run folder's checkpoint (an export holds weights only)")
        if self.masked_lm_prob is not None and not 0 < self.masked_lm_prob < 1:
            raise ConfigError(f"--masked-lm-prob {self.masked_lm_prob}: must be between 0 and 1")
        if (self.batch_warmup_from is None) != (self.batch_warmup_steps is None) or \
                self.batch_warmup_from is not None and not (0 < self.batch_warmup_from < 1 and
                                                            self.batch_warmup_steps >= 1):
            raise ConfigError("--batch-warmup-from (a share of --global-batch, between 0 and 1) and "
                              "--batch-warmup-steps (at least 1) go together")
        if self.ema is not None and not 0 < self.ema < 1:
            raise ConfigError(f"--ema {self.ema}: a decay between 0 and 1 (0.999: about the last 1,000 steps)")
        if self.masked_lm_prob_end is not None and not (self.masked_lm_prob is not None and self.time_budget is None
                                                        and 0 < self.masked_lm_prob_end < 1):
            raise ConfigError(f"--masked-lm-prob-end {self.masked_lm_prob_end}: a rate between 0 and 1 that the "
                              "training rate moves to from --masked-lm-prob (give both) over --max-steps (not a "
                              "--time-budget)")
        if set(self.train_only) - {"head", "embeddings"}:
            raise ConfigError(f"--train-only {','.join(self.train_only)}: choose head, embeddings or both "
                              "(head,embeddings); every other parameter is frozen")
        if self.mixture and self.token_budget is not None:
            raise ConfigError("--token-budget packs rows by their lengths, which a mixture's rows change every epoch; "
                              "train a --mixture with --micro-batch")
        if self.mixture_max_epochs is not None and not (self.mixture and self.mixture_max_epochs > 0 and
                                                        self.time_budget is None):
            raise ConfigError("--mixture-max-epochs caps a --mixture's folders over the run's --max-steps (not a "
                              "--time-budget), at a number above 0")
        if self.mixture_temperature is not None and not (self.mixture and self.mixture_temperature >= 0):
            raise ConfigError("--mixture-temperature goes with a --mixture of folders without weights, at 0 or above")

    def with_mixture(self, given: set | None = None) -> "PretrainConfig":
        """--mixture's folders resolved (recorded so, a resume finds them from anywhere) and --instances its first
        (whose manifest describes the model's inputs)."""
        from pathlib import Path

        from bertkit.mixture import parse_mixture, read_manifests

        try:
            sources = parse_mixture(self.mixture)
            read_manifests(sources)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        first = Path(sources[0].folder).resolve()
        if given is not None and "instances" in given and Path(self.instances).resolve() != first:
            raise ConfigError("--instances and --mixture: name the folders in --mixture only (the first is the "
                              "run's --instances)")
        items = tuple(f"{Path(s.folder).resolve()}" + ("" if s.weight is None else f"={s.weight!r}") for s in sources)
        return replace(self, instances=str(first), mixture=items)
    progress: bool = True

    def effective_objective(self, instances_objective: str) -> str:
        """What the run trains: nsp | sop | none (MLM alone) | electra."""
        return {"mlm": "none", "electra": "electra"}.get(self.objective, instances_objective)

    def warmup_steps(self, max_steps: int) -> int:
        return int(self.warmup * max_steps) if self.warmup < 1 else int(self.warmup)


@dataclass
class DeepSpeedSettings:
    """What a run uses, each from a flag, the user's DeepSpeed config, or the default here."""
    micro_batch: int = 32
    global_batch: int | None = None       # default: micro_batch x ranks x the file's gradient_accumulation_steps
    zero_stage: int | None = None         # default: 0 with LAMB (per-tensor trust ratios, NVIDIA's setting), 2 AdamW
    grad_clip: float = 1.0
    optimizer: str = "lamb"
    lr: float = DEFAULTS["lr"]
    weight_decay: float = 0.01
    precision: str = "auto"
    grad_accum: int = 1


# where each setting lives in a DeepSpeed config, and its flag
DEEPSPEED_PATHS = {"micro_batch": ("train_micro_batch_size_per_gpu",), "global_batch": ("train_batch_size",),
                   "zero_stage": ("zero_optimization", "stage"), "grad_clip": ("gradient_clipping",),
                   "optimizer": ("optimizer", "type"), "lr": ("optimizer", "params", "lr"),
                   "weight_decay": ("optimizer", "params", "weight_decay")}
# ZeRO 1-3 hand the optimizer flat partitions, so LAMB would take one trust ratio per partition instead of one
# per tensor: LAMB defaults to stage 0 (plain data parallel, per-tensor LAMB), AdamW to 2.
DEFAULT_ZERO_STAGE = {"lamb": 0, "adamw": 2, "stableadamw": 2}


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
                             bf16_supported: bool, source: str = "--deepspeed-config"
                             ) -> tuple[dict, DeepSpeedSettings]:
    """Merge the flags with a user's DeepSpeed config. Returns (ds_config, settings).

    A value given both as a flag and in the file must agree (else ConfigError naming both); where only one
    speaks it wins; where neither does, DeepSpeedSettings' default applies. The optimizer section is read into the
    settings and removed: bertkit builds the optimizer itself (FusedLamb on CUDA, the PyTorch LAMB elsewhere).
    """
    user = copy.deepcopy(user or {})
    defaults = DeepSpeedSettings()
    chosen = {}
    for name, path in DEEPSPEED_PATHS.items():
        given, theirs = getattr(cfg, name), _get(user, path)
        if name == "optimizer" and theirs is not None:
            theirs = str(theirs).lower()
            if theirs not in ("lamb", "adamw"):
                raise ConfigError(f"{source}: optimizer type {theirs!r} is not supported; use Lamb or AdamW")
        if given is not None and theirs is not None and given != theirs:
            raise ConfigError(f"{flag(name)} {given} contradicts {source}'s {'.'.join(path)} = {theirs}; "
                              "remove one of them")
        chosen[name] = given if given is not None else theirs if theirs is not None else getattr(defaults, name)
    s = DeepSpeedSettings(**chosen)
    if s.zero_stage is None:
        s.zero_stage = DEFAULT_ZERO_STAGE[s.optimizer]

    theirs_precision = _precision_of(user)
    if cfg.precision not in (None, "auto") and theirs_precision and cfg.precision != theirs_precision:
        raise ConfigError(f"--precision {cfg.precision} contradicts {source}'s precision ({theirs_precision}: "
                          "see its fp16/bf16 sections); remove one of them")
    s.precision = theirs_precision or cfg.precision or "auto"
    if s.precision == "auto":  # bf16 where the device multiplies it in hardware (a CPU's: autocast, bertkit.precision)
        s.precision = "bf16" if bf16_supported else "fp16" if on_cuda else "fp32"
    if s.precision not in ("fp32", "bf16", "fp16"):
        raise ConfigError(f"--precision {s.precision!r}: choose auto, fp32, bf16 or fp16")
    if s.precision == "fp16" and not on_cuda:
        raise ConfigError("--precision fp16 needs a GPU; on the CPU use fp32 (or bf16)")

    gas_user = _get(user, ("gradient_accumulation_steps",))
    if s.global_batch is None:
        s.global_batch = s.micro_batch * world_size * (gas_user or 1)
    if s.global_batch % (s.micro_batch * world_size):
        raise ConfigError(f"global batch {s.global_batch} is not a multiple of micro batch {s.micro_batch} x "
                          f"{world_size} rank(s); change --global-batch or --micro-batch")
    s.grad_accum = s.global_batch // (s.micro_batch * world_size)
    if gas_user is not None and gas_user != s.grad_accum:
        raise ConfigError(f"{source}'s gradient_accumulation_steps = {gas_user} contradicts --global-batch "
                          f"{s.global_batch} / (--micro-batch {s.micro_batch} x {world_size} ranks) = {s.grad_accum}")
    return _deepspeed_config(user, s, on_cuda), s


def _deepspeed_config(user: dict, s: DeepSpeedSettings, on_cuda: bool = True) -> dict:
    """The user's DeepSpeed config with the settings written in (what deepspeed.initialize gets)."""
    ds = user
    ds.pop("optimizer", None)
    ds["train_micro_batch_size_per_gpu"] = s.micro_batch
    ds["train_batch_size"] = s.global_batch
    ds["gradient_accumulation_steps"] = s.grad_accum
    ds["gradient_clipping"] = s.grad_clip
    ds.setdefault("zero_optimization", {})["stage"] = s.zero_stage
    ds["zero_allow_untested_optimizer"] = True  # our PyTorch LAMB is a "client" optimizer to DeepSpeed
    ds.setdefault("steps_per_print", 1 << 30)   # bertkit logs metrics itself
    ds.setdefault("wall_clock_breakdown", False)
    if s.precision == "bf16" and on_cuda:
        ds.setdefault("bf16", {})["enabled"] = True
        ds.pop("fp16", None)
    elif s.precision == "fp16":
        fp16 = ds.setdefault("fp16", {})
        fp16["enabled"] = True
        for k, v in (("loss_scale", 0), ("initial_scale_power", 16), ("loss_scale_window", 1000),
                     ("hysteresis", 2), ("min_loss_scale", 1)):
            fp16.setdefault(k, v)  # loss_scale 0 = dynamic loss scaling
        ds.pop("bf16", None)
    else:
        ds.pop("fp16", None)
        ds.pop("bf16", None)
    return ds
