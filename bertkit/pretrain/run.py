"""A pretraining run's set-up, torchtitan's shape: `start_run` turns a PretrainConfig into a Run (engine, data, log,
meter, budget, divergence guard, step counters) that the loop in train.py drives. It reads top to bottom:
settings, the model and its engine, the run folder, the resumed state, the data, the log."""
import functools
import json
import signal
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import deepspeed
import numpy as np
import torch
from torch.optim.lr_scheduler import LambdaLR

from bertkit import kernels
from bertkit.data import (
    EpochBatches,
    InstanceDataset,
    RateSchedule,
    TokenBudgetBatches,
    batch_loader,
    close_loader,
    tokens_drawn,
)
from bertkit.errors import regular_file
from bertkit.fileio import atomic_write_json, read_json_or_none
from bertkit.formats import USER_DEEPSPEED_CONFIG, InstancesError, InstancesManifest
from bertkit.kernel_guard import kernel_uses, resolve_guarded
from bertkit.models import Family, describe, family_of
from bertkit.optim import build_optimizer, build_scheduler, param_groups
from bertkit.precision import bf16_units, slow_bf16_note
from bertkit.pretrain.budget import BudgetSchedule, plan_schedule
from bertkit.pretrain.checkpoints import (
    carry_optimizer,
    choose_checkpoint,
    load_checkpoint,
    prepare_run_dir,
    restore_rng,
    seed_rank,
    write_run_folder,
)
from bertkit.pretrain.config import ConfigError, PretrainConfig, resolve_deepspeed_config
from bertkit.pretrain.divergence import Divergence
from bertkit.pretrain.ema import EMA
from bertkit.pretrain.metrics import Meter, MetricsLog, say, training_flops
from bertkit.pretrain.plateau import Plateau
from bertkit.pretrain.resume import apply as apply_resume_changes, check_weights_format, compare as resume_changes
from bertkit.pretrain.start import build_model, planned_family
from bertkit.recipes import RECIPES, as_flags, recipe_settings
from bertkit.runlog import Throughput, default_report_to
from bertkit.threads import choose_threads


@dataclass
class Run:
    """What the loop reads and moves: the engine and its settings, the data, the log, and where the run stands."""
    cfg: PretrainConfig
    rank: int
    world: int
    device: torch.device
    engine: object
    settings: object             # DeepSpeedSettings
    objective: str               # nsp | sop | none (MLM alone) | electra
    backend: str                 # the kernels' backend actually used
    budget: BudgetSchedule | None
    max_steps: int | None
    train: InstanceDataset       # or a bertkit.mixture.Mixture
    holdout: InstanceDataset     # or a bertkit.mixture.Joined
    sampler: EpochBatches | TokenBudgetBatches
    split_at: int | None         # ModernBERT: packed rows attend within each [SEP]-ended document
    log: MetricsLog
    meter: Meter
    count_flops: object          # count_flops(seq_len, tokens) for the MFU
    step: int = 0
    skipped: int = 0             # micro batches passed over by divergence rollbacks
    last_ckpt: Path | None = None
    loader: object = None
    divergence: Divergence = None
    eval_clock: object = None
    plateau: Plateau | None = None
    stop: object = None
    grad_norm: object = None     # measured by the loop where DeepSpeed reports none
    record: dict = field(default_factory=dict)  # the last training record
    batch: dict | None = None    # the last micro batch (its shape feeds the MFU)
    old_handlers: dict = field(default_factory=dict)
    clock0: float = 0.0          # perf_counter at the run's start, less the time a resumed run had used
    throughput: Throughput = field(default_factory=Throughput)   # the log interval's clock and batch counts
    steps_in_interval: int = 0
    mixture: dict | None = None  # --mixture: what each folder has given so far (mixture.json)
    ema: object = None           # --ema: the moving average of the weights (global rank 0)

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.out)

    @property
    def model(self):
        return self.engine.module

    def finished(self) -> bool:
        return (self.max_steps is not None and self.step >= self.max_steps) or \
            (self.budget is not None and self.budget.spent())

    def consumed(self) -> int:
        """Micro batches this rank has drawn from the data (over epochs), skipped ones included."""
        return self.micro_batches_before(self.step) + self.skipped

    @functools.cached_property
    def warmup_ends(self) -> np.ndarray:
        """--batch-warmup-*: the micro batches drawn by the end of each warmup step: step s takes
        --batch-warmup-from's share of the full count at step 0, growing linearly to it at --batch-warmup-steps."""
        full, warmup = self.settings.grad_accum, self.cfg.batch_warmup_steps or 0
        first = max(1, round((self.cfg.batch_warmup_from or 1) * full))
        return np.cumsum([max(1, round(first + (full - first) * s / warmup)) for s in range(warmup)], dtype=np.int64)

    def grad_accum_at(self, step: int) -> int:
        """Micro batches in step `step` (0-based)."""
        return self.micro_batches_before(step + 1) - self.micro_batches_before(step)

    def micro_batches_before(self, step: int) -> int:
        ends, warmup = self.warmup_ends, len(self.warmup_ends)
        if step <= warmup:
            return int(ends[step - 1]) if step else 0
        return int(ends[-1] if warmup else 0) + (step - warmup) * self.settings.grad_accum

    def step_of(self, micro_batch: int) -> int:
        """The step a run's micro batch falls in (rollbacks' skipped ones aside)."""
        ends = self.warmup_ends
        if len(ends) and micro_batch < ends[-1]:
            return int(np.searchsorted(ends, micro_batch, side="right"))
        return len(ends) + (micro_batch - int(ends[-1] if len(ends) else 0)) // self.settings.grad_accum

    def tokens_drawn(self) -> int:
        """Tokens of every rank's micro batches drawn so far (a mixture's from its sources)."""
        if self.cfg.mixture:
            return sum(self.train.realised(self.sampler, self.consumed())["tokens"])
        return tokens_drawn(self.sampler, self.train.lengths(), self.consumed())

    def reopen_loader(self) -> None:
        """This rank's batches from the first micro batch not yet consumed."""
        if self.loader is not None:
            close_loader(self.loader)
        self.sampler.start_epoch, self.sampler.start = divmod(self.consumed(), self.sampler.per_epoch)
        batches = self.sampler if self.cfg.masked_lm_prob_end is None else \
            RateSchedule(self.sampler, self.cfg.masked_lm_prob, self.cfg.masked_lm_prob_end, self.max_steps,
                         self.step_of, self.consumed())
        self.loader = iter(batch_loader(self.train, batches, self.cfg.num_workers, unpadded=self.cfg.unpadded,
                                        split_at=self.split_at))

    def interval_started(self) -> None:
        """A new log interval: throughput is measured from here."""
        self.throughput.restart()
        self.steps_in_interval = 0

    def close(self) -> None:
        if self.loader is not None:
            close_loader(self.loader)  # its workers ignore SIGTERM: left to interpreter exit, they would hang it
        self.log.close()
        for s, h in self.old_handlers.items():
            signal.signal(s, h)


def sampler_for(cfg: PretrainConfig, train: InstanceDataset, micro_batch: int, rank: int, world: int):
    """This rank's micro batches: --micro-batch sequences each, or packed to --token-budget tokens by best fit."""
    if cfg.token_budget is None:
        sampler = EpochBatches(len(train), micro_batch, cfg.seed, rank, world)
        what = f"one micro batch of {micro_batch}"
    else:
        if not cfg.unpadded:
            raise ConfigError("--token-budget fills packed micro batches: add --unpadded")
        try:
            sampler = TokenBudgetBatches(train.lengths(), cfg.token_budget, cfg.seed, rank, world)
        except InstancesError as e:
            raise ConfigError(f"{cfg.instances}: {e}") from None
        what = f"one micro batch of {cfg.token_budget} tokens"
    if sampler.per_epoch == 0:
        raise ConfigError(f"{cfg.instances}: {len(train)} training instances cannot fill {what} on each of {world} "
                          f"rank(s); lower --{'micro-batch' if cfg.token_budget is None else 'token-budget'}")
    return sampler


def training_data(cfg: PretrainConfig, manifest: InstancesManifest, rows_planned: int | None = None) -> tuple:
    """(training rows, held-out rows): of --instances, or --mixture's folders in their proportions (their held-out
    splits joined); the training rows masked at --masked-lm-prob where given, the held-out ones as made."""
    from bertkit.mixture import open_mixture, parse_mixture

    try:
        if cfg.mixture:
            cap = (cfg.mixture_max_epochs, rows_planned) if cfg.mixture_max_epochs is not None else None
            train, holdout = open_mixture(parse_mixture(cfg.mixture), cfg.mixture_temperature, cfg.seed, cap)
        else:
            train, holdout = InstanceDataset(cfg.instances, "train", cfg.seed, manifest), \
                InstanceDataset(cfg.instances, "holdout", cfg.seed, manifest)
        if cfg.masked_lm_prob is not None:   # room for the highest rate a schedule reaches
            for dataset in getattr(train, "datasets", [train]):
                dataset.masked_at(max(cfg.masked_lm_prob, cfg.masked_lm_prob_end or 0))
    except (ValueError, InstancesError) as e:
        raise ConfigError(f"--masked-lm-prob: {e}" if "static instances" in str(e) else str(e)) from None
    return train, holdout


def capped_rows(cfg: PretrainConfig, planned: int | None, previous_run, rank: int) -> int | None:
    """The run length --mixture-max-epochs caps the shares over: the planned draws, or on a resume the length the run
    began with (its mixture.json), so the shares, and the data order with them, stay those of the first start."""
    recorded = read_json_or_none(Path(cfg.out) / "mixture.json") if previous_run and cfg.mixture_max_epochs else None
    if not recorded or not recorded.get("capped_for_rows"):
        return planned
    if rank == 0 and recorded["capped_for_rows"] != planned:
        say(f"--mixture-max-epochs: the shares stay those capped for the run's first length "
            f"({recorded['capped_for_rows']:,} rows drawn); the rows drawn from now on may take a folder past "
            f"{cfg.mixture_max_epochs:g} passes")
    return recorded["capped_for_rows"]


def record_mixture(run: Run) -> dict:
    """mixture.json in the run folder: each source's target share and the rows and tokens it has given so far (all
    ranks' micro batches drawn); returned too."""
    mixture = run.train
    realised = mixture.realised(run.sampler, run.consumed())
    rows, tokens = max(sum(realised["rows"]), 1), max(sum(realised["tokens"]), 1)
    found = {"step": run.step, "sources": [
        {"folder": str(d.dir), "target": round(float(p), 6), "slots_per_epoch": int(c), "training_rows": len(d),
         "rows": r, "tokens": t, "share_of_rows": round(r / rows, 6), "share_of_tokens": round(t / tokens, 6)}
        for d, p, c, r, t in zip(mixture.datasets, mixture.probabilities, mixture.slots, realised["rows"],
                                 realised["tokens"])]}
    if mixture.capped_for_rows:
        found["capped_for_rows"] = mixture.capped_for_rows
    atomic_write_json(run.run_dir / "mixture.json", found)
    return found


def start_run(cfg: PretrainConfig, manifest: InstancesManifest, rank: int, world: int, device) -> Run:
    """Settings, model, engine, run folder, resumed state and data: everything the loop needs, on every rank."""
    threads, budget, max_steps = threads_backend_schedule(cfg, rank, device)
    chosen = choose_checkpoint(Path(cfg.out), rank, say) if cfg.resume else None
    previous_run = prepare_run_dir(cfg, manifest, chosen)
    family = planned_family(cfg, manifest, previous_run)
    if family.splits_documents and not cfg.unpadded:
        cfg = replace(cfg, unpadded=True)  # its documents are cut apart in packed rows; padding would join them
        if rank == 0:
            say(f"{family.title} trains on packed batches (--unpadded): each document attends only to itself")
    on_cuda = device.type == "cuda"
    ds_config, settings = resolve_settings(cfg, world, rank, on_cuda)
    if cfg.ema is not None and settings.zero_stage == 3:
        raise ConfigError("--ema keeps the whole model beside training, but ZeRO stage 3 partitions it over the ranks; "
                          "use --zero-stage 2 or leave out --ema")
    objective = cfg.effective_objective(previous_run.objective if previous_run else manifest.objective)
    changes = [] if previous_run is None else \
        resume_changes(previous_run, cfg, settings, world, manifest, objective, chosen.marker and chosen.marker.step)
    if previous_run is not None:
        check_weights_format(previous_run, ds_config, cfg.out)
    if rank == 0:
        say_plan(cfg, manifest, objective, family)

    torch.manual_seed(cfg.seed)  # same initial weights on every rank
    model, bert_cfg, init_source = build_model(cfg, manifest, previous_run, objective)
    # logged with the run (the weights never depend on it); auto on a GPU is checked there first
    backend = resolve_guarded(device, kernel_uses(model, settings.precision, cfg.unpadded, manifest.max_seq_length,
                                                  settings.micro_batch),
                              say=say if rank == 0 else lambda m: m.startswith("warning") and say(m),
                              compiled=cfg.compile)
    engine, scheduler = build_engine(cfg, model, settings, ds_config, budget, max_steps, on_cuda)
    if rank == 0:
        write_run_folder(cfg, settings, ds_config, describe(model), init_source, manifest, world, backend, objective,
                         previous_run, changes, chosen.marker.step if changes and chosen.marker else None,
                         threads.record())
    torch.distributed.barrier()

    step, skipped, last_ckpt = resume_or_seed(cfg, engine, scheduler, chosen, changes, settings, ds_config, rank)
    train, holdout = training_data(cfg, manifest, capped_rows(cfg, max_steps * settings.global_batch if max_steps
                                                              else None, previous_run, rank))
    sampler = sampler_for(cfg, train, settings.micro_batch, rank, world)
    flops = functools.partial(training_flops, sum(p.numel() for p in model.parameters()), model.cfg.num_layers,
                              model.cfg.hidden_size)
    log = MetricsLog(Path(cfg.out), rank == 0, max_steps, step, cfg.progress, cfg.report_to or default_report_to(),
                     config={"pretrain": asdict(cfg), "resolved": asdict(settings), "model": bert_cfg.to_dict()})
    run = Run(cfg, rank, world, device, engine, settings, objective, backend, budget, max_steps, train, holdout,
              sampler, train.sep_id if family_of(model).splits_documents else None, log, Meter(device, train.mask_id),
              flops, step, skipped, last_ckpt)
    run.ema = moving_average(cfg, model, settings, rank, last_ckpt)
    begin(run, chosen, changes)
    return run


def moving_average(cfg: PretrainConfig, model, settings, rank: int, checkpoint: Path | None) -> EMA | None:
    """--ema's average on global rank 0: a resumed run's from its checkpoint (or from the weights, said, where the
    checkpoint holds none)."""
    if cfg.ema is None or rank != 0:
        return None
    ema = EMA(model, cfg.ema)
    if checkpoint is not None and not ema.load(checkpoint):
        say(f"--ema: {checkpoint.name} holds no moving average; it starts at the resumed weights")
    return ema


def begin(run: Run, chosen, changes: list) -> None:
    """The run's loader, generators, held-out plateau, signal handlers and clock (closed again if any fails)."""
    cfg, rank, budget = run.cfg, run.rank, run.budget
    try:
        if changes:
            run.log.write({"step": run.step, "resume_changes": {c.setting: [c.before, c.after] for c in changes}})
        run.reopen_loader()
        if cfg.resume:
            restore_rng(run.last_ckpt, rank)  # after the loader: making it draws from torch's generator
        run.divergence, run.eval_clock, run.stop = Divergence(cfg), EvalClock(budget, cfg.eval_every), StopFlag()
        run.plateau = Plateau.measure(run.holdout) if len(run.holdout) and cfg.eval_every and rank == 0 else None
        if not len(run.holdout) and cfg.eval_every and rank == 0:
            say(f"note: {cfg.instances} has no held-out split, so nothing is evaluated (--eval-every "
                f"{cfg.eval_every} has nothing to read); `bertkit make-instances --holdout 0.01` makes one")
        run.old_handlers = {s: signal.signal(s, run.stop) for s in (signal.SIGTERM, signal.SIGINT)}
    except BaseException:
        run.close()
        raise
    # a resumed run's clock goes on from its checkpoint's (a budget's time used is the same number)
    resumed_s = chosen.marker.elapsed_s if cfg.resume and chosen.marker else 0.0
    run.clock0 = time.perf_counter() - (budget.used_s if budget else resumed_s)
    run.interval_started()


def build_engine(cfg: PretrainConfig, model, settings, ds_config: dict, budget, max_steps: int, on_cuda: bool):
    """(DeepSpeed engine, scheduler or None): the optimizer over the model's groups, the schedule (the time budget's,
    the user's DeepSpeed config's, or the flags'), wrapped by DeepSpeed; --compile puts the model under
    torch.compile."""
    optimizer = build_optimizer(settings.optimizer, param_groups(model, settings.weight_decay), settings.lr,
                                cfg.betas, cfg.eps, on_cuda)
    scheduler = None if "scheduler" in ds_config else LambdaLR(optimizer, budget) if budget else \
        build_scheduler(optimizer, max_steps, cfg.warmup_steps(max_steps), cfg.schedule, cfg.decay)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=ds_config, dist_init_required=False)
    if cfg.compile:  # bertkit's kernels are custom ops in its graph
        engine.compile()
    return engine, scheduler


def resume_or_seed(cfg: PretrainConfig, engine, scheduler, chosen, changes, settings, ds_config: dict, rank: int):
    """(step, skipped, last checkpoint): a resumed run's state (the budget's time used too) with the settings it
    changes applied; a new run seeds this rank's generators."""
    if not cfg.resume:
        seed_rank(cfg.seed, rank)
        if cfg.init_optimizer:
            tag = carry_optimizer(engine, Path(cfg.init_from))
            if rank == 0:
                say(f"--init-optimizer: the optimizer state of {cfg.init_from} ({tag}); the schedule starts anew")
        return 0, 0, None
    step, skipped, last_ckpt = load_checkpoint(engine, Path(cfg.out), chosen)
    apply_resume_changes(changes, scheduler, settings, ds_config)
    if changes and rank == 0:
        say(f"--resume at step {step} changes {'; '.join(map(str, changes))} (from step {step + 1} on)")
    return step, skipped, last_ckpt


def resolve_settings(cfg: PretrainConfig, world: int, rank: int, on_cuda: bool):
    """(DeepSpeed config, DeepSpeedSettings): the flags merged with the user's DeepSpeed config."""
    ds_config, settings = resolve_deepspeed_config(cfg, world, read_user_deepspeed_config(cfg), on_cuda,
                                                   bf16_units("cuda" if on_cuda else "cpu"),
                                                   source=str(cfg.deepspeed_config))
    if settings.optimizer == "lamb" and settings.zero_stage >= 1 and rank == 0:
        print(f"warning: LAMB under ZeRO stage {settings.zero_stage} sees flat partitions, so its trust ratio is "
              "per partition, not per layer; use --zero-stage 0 for layer-wise LAMB, or --optimizer adamw",
              file=sys.stderr, flush=True)
    if cfg.precision in (None, "auto") and rank == 0 and (on_cuda or settings.precision == "bf16"):  # CPU fp32: as ever
        picked = {"bf16": "bf16 (this GPU has it)" if on_cuda else
                  "bf16 autocast over fp32 weights (this CPU has bf16 matrix units; --precision fp32 to turn it off)",
                  "fp16": "fp16 with dynamic loss scaling (this GPU has no bf16)"}[settings.precision]
        print(f"precision auto: {picked}", file=sys.stderr, flush=True)
    if not on_cuda and rank == 0 and (note := slow_bf16_note("cpu", settings.precision)):
        print(note, file=sys.stderr, flush=True)
    return ds_config, settings


def read_user_deepspeed_config(cfg: PretrainConfig) -> dict | None:
    """--deepspeed-config's JSON. The run's own copy (a --resume: the run folder may come from someone else) has
    every file or folder DeepSpeed would write moved inside the run (bertkit.pretrain.run.confine_outputs)."""
    if not cfg.deepspeed_config:
        return None
    path = Path(cfg.deepspeed_config)
    own = path.name == USER_DEEPSPEED_CONFIG and path.parent.resolve() == Path(cfg.out).resolve()
    try:
        config = json.loads((regular_file(path) if own else path).read_text())  # a file given is the user's
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--deepspeed-config {cfg.deepspeed_config}: cannot read it ({e})") from e
    if not isinstance(config, dict):
        raise ConfigError(f"--deepspeed-config {cfg.deepspeed_config}: not a JSON object of DeepSpeed settings")
    if own:
        config = confine_outputs(config, Path(cfg.out), say)
    return config


# DeepSpeed settings that name a file or folder it writes (profiler, monitors, autotuning, checkpoint engines)
OUTPUT_KEYS = ("output_file", "output_path", "results_dir", "exps_dir", "persistent_storage_path", "job_name_dir",
               "save_dir", "log_dir", "logdir", "path")


def confine_outputs(config, run_dir: Path, say=None, where: str = ""):
    """The DeepSpeed config with every output file or folder it names that lies outside run_dir moved to
    run_dir/deepspeed/ (its last name kept), each move said: a config that came with a folder writes nowhere else."""
    if isinstance(config, list):
        return [confine_outputs(v, run_dir, say, f"{where}[{i}]") for i, v in enumerate(config)]
    if not isinstance(config, dict):
        return config
    out = {}
    for key, value in config.items():
        here = f"{where}.{key}" if where else key
        if isinstance(value, str) and value and (key in OUTPUT_KEYS or key.endswith(("_file", "_path", "_dir"))):
            target = Path(value) if Path(value).is_absolute() else run_dir / value
            inside = run_dir.resolve() in (target.resolve(), *target.resolve().parents)
            if not inside:
                value = str(run_dir / "deepspeed" / (Path(value).name or "output"))
                if say:
                    say(f"{run_dir / USER_DEEPSPEED_CONFIG}: {here} named {config[key]}, outside the run; it writes "
                        f"to {value} instead (a config that comes with a run folder writes only inside it)")
        out[key] = confine_outputs(value, run_dir, say, here)
    return out


def threads_backend_schedule(cfg: PretrainConfig, rank: int, device):
    """(threads, budget schedule or None, step limit or None); a kernel backend this device cannot run, or a
    schedule that cannot be, stops here, before anything is loaded."""
    threads = choose_threads(cfg.threads)
    if rank == 0:
        say(threads.describe())
    kernels.use(cfg.kernels)
    try:
        kernels.resolve(device)
        return (threads, *plan_schedule(cfg))  # budget: --time-budget / --schedule-from, else None
    except (kernels.BackendError, ValueError) as e:
        raise ConfigError(str(e)) from None


def say_plan(cfg: PretrainConfig, manifest: InstancesManifest, objective: str, family: Family) -> None:
    """The recipe's settings (for the model's family), the ones the flags changed, instances made otherwise than it
    was measured on; what ELECTRA leaves unused."""
    if objective == "electra" and manifest.objective in ("nsp", "sop"):
        say(f"note: ELECTRA trains replaced-token detection only; the instances' {manifest.objective.upper()} "
            "labels are not used")
    if not cfg.recipe:
        return
    recipe, settings = RECIPES[cfg.recipe], recipe_settings(cfg.recipe, family)
    yours = {k: getattr(cfg, k) for k, v in settings.items() if getattr(cfg, k) not in (None, v)}
    say(f"recipe {cfg.recipe}: {as_flags(settings)}" + (f"; yours win: {as_flags(yours)}" if yours else ""))
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


class StopFlag:
    """SIGTERM / SIGINT handler: the loop saves a checkpoint at the end of the step and stops."""

    def __init__(self):
        self.signal = None

    def __call__(self, signum, frame):
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.signal = signum
