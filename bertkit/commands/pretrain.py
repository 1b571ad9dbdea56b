"""`bertkit pretrain` (also `deepspeed cli.py pretrain`) and `bertkit export`: flags onto bertkit.pretrain."""
import os
from pathlib import Path

import click

from bertkit.commands import NON_NEGATIVE, POSITIVE, SEED, Real, count, kernels_option, report_to_option
from bertkit.models.bert_config import SIZE_LIMITS
from bertkit.recipes import DEFAULTS, RECIPES, as_flags
from bertkit.threads import MAX_THREADS


class Duration(click.ParamType):
    """A length of time as 2h, 30m, 1h30m or 90s; the value is in seconds."""
    name = "duration"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        from bertkit.pretrain.budget import parse_duration

        try:
            return parse_duration(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


@click.command("pretrain")
@click.option("--instances", default="instances", show_default=True, type=click.Path(file_okay=False),
              help="make-instances output folder.")
@click.option("--plan", default=None,
              help="A run in phases from one TOML file (bertkit/pretrain/plans.md), or a shipped plan by name "
                   "(modernbert, bert, budget): each phase its own instances or mixture, length, schedule, masking "
                   "rate, rope theta...; the second and later from the one before; RUN/NN-NAME per phase, "
                   "RUN/plan.json; run again to resume. Settings go in the file.")
@click.option("--plan-scale", type=Real(0, min_open=True), default=1.0, show_default=True,
              help="--plan: every phase's length (tokens, steps, seconds) times this.")
@click.option("--plan-set", multiple=True, metavar="KEY=VALUE",
              help="--plan: a setting for every phase (a TOML value: model=\"modernbert-tiny\", "
                   "batch_tokens=4096), over the plan's own, in every phase. Repeatable.")
@click.option("--mixture", type=str, default=None,
              help="Several instance folders trained on as one, in proportions: DIR=WEIGHT,DIR=WEIGHT (weights "
                   "relative), or DIR,DIR with --mixture-temperature. One vocabulary, --max-seq-length and objective; "
                   "every epoch holds each in its share; the shares drawn so far go to RUN/mixture.json.")
@click.option("--masked-lm-prob", type=Real(0, 1, min_open=True, max_open=True),
              help="Mask this share of tokens in training (dynamic instances; ModernBERT's 0.3), in place of the "
                   "instances' rate; the held-out split keeps theirs, so held-out curves compare across runs and "
                   "phases  [default: the instances' rate].")
@click.option("--batch-warmup-from", type=Real(0, 1, min_open=True, max_open=True),
              help="Start each step at this share of --global-batch (more gradient accumulation as it grows; "
                   "ModernBERT: 768 of 4,608 sequences, 0.167) ...")
@click.option("--batch-warmup-steps", type=click.IntRange(min=1),
              help="... growing linearly to the whole batch over these steps.")
@click.option("--ema", type=Real(0, 1, min_open=True, max_open=True),
              help="Keep a moving average of the weights at this decay (0.999: about the last 1,000 steps) in every "
                   "checkpoint; `bertkit export RUN --ema` writes it as the model. Not with ZeRO stage 3.")
@click.option("--masked-lm-prob-end", type=Real(0, 1, min_open=True, max_open=True),
              help="Move the training rate linearly from --masked-lm-prob at the first step to this at the last "
                   "(mmBERT lowers it: 0.3 to 0.15 to 0.05 over its phases); the held-out split keeps its own.")
@click.option("--train-only", default="", metavar="PARTS",
              help="Train only these, the rest frozen: head (the modules beside the encoder: a released model "
                   "without an MLM head gets a random one), embeddings (the word embeddings, tied to the decoder: "
                   "an extended vocabulary's new rows), or head,embeddings. A later phase then trains all of it.")
@click.option("--mixture-max-epochs", type=Real(0, min_open=True),
              help="--mixture: draw no folder more than this many passes over its rows in the run (its share held "
                   "there, the others' raised in their proportions; a small source repeated less).")
@click.option("--mixture-temperature", type=Real(0),
              help="--mixture without weights: each folder sampled in proportion to its rows raised to this (1: by "
                   "size, 0: evenly; multilingual encoders take 0.3-0.7)  [default: 1].")
@click.option("--out", default="runs/pretrain", show_default=True, type=click.Path(file_okay=False),
              help="Run folder (checkpoints, metrics).")
@click.option("--model", default=None,
              help="Preset (tiny mini small medium base large, modernbert-tiny ... modernbert-base) or an HF "
                   "config.json / model folder  [default: base; with --recipe budget modernbert-tiny; with --resume "
                   "the run's own].")
@click.option("--max-steps", type=click.IntRange(min=1),
              help="Optimizer steps  [default: 10000; with --time-budget: until the time is spent; with "
                   "--schedule-from: the steps recorded there].")
@click.option("--max-tokens", type=POSITIVE, metavar="TOKENS",
              help="The run's length in tokens (2e9): steps = tokens / (sequences a step x the mean tokens of the "
                   "data's rows), rounded up; --warmup-tokens, --save-every-tokens, --eval-every-tokens and "
                   "--batch-warmup-tokens likewise.")
@click.option("--warmup-tokens", type=POSITIVE, metavar="TOKENS", help="--warmup in tokens.")
@click.option("--save-every-tokens", type=POSITIVE, metavar="TOKENS", help="--save-every in tokens.")
@click.option("--eval-every-tokens", type=POSITIVE, metavar="TOKENS", help="--eval-every in tokens.")
@click.option("--batch-warmup-tokens", type=POSITIVE, metavar="TOKENS", help="--batch-warmup-steps in tokens.")
@click.option("--time-budget", type=Duration(),
              help="Train for this long (2h, 30m, 1h30m): warmup and decay follow the clock, then save and stop. "
                   "The run records its schedule, and --resume counts the time already used.")
@click.option("--schedule-from", type=click.Path(exists=True, file_okay=False),
              help="Replay the schedule a --time-budget run recorded (RUN/schedule.json), step for step.")
@click.option("--micro-batch", type=count(1), help="Sequences per rank per forward  [default: 32].")
@click.option("--global-batch", type=count(1), help="Sequences per optimizer step (sets gradient accumulation) "
                                               "[default: micro batch x ranks].")
@click.option("--zero-stage", type=click.IntRange(0, 3),
              help="DeepSpeed ZeRO stage  [default: 0 with LAMB (per-layer trust ratios), 2 with AdamW].")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]),
              help="auto = bf16 on GPUs that have it, else fp16 (dynamic loss scaling); on a CPU bf16 where it has "
                   "bf16 units (Intel AMX, AVX-512 BF16), else fp32. bf16 on the CPU: autocast over fp32 weights. "
                   "A resumed run keeps the precision it began with.")
@click.option("--optimizer", type=click.Choice(["lamb", "adamw", "stableadamw"]),
              help="stableadamw: AdamW with update clipping (ModernBERT's)  [default: lamb]")
@click.option("--lr", type=POSITIVE, help=f"Peak learning rate  [default: {DEFAULTS['lr']:g}].")
@click.option("--weight-decay", type=NON_NEGATIVE, help="[default: 0.01; never on biases and LayerNorm]")
@click.option("--grad-clip", type=NON_NEGATIVE, help="Global gradient-norm clipping; 0: none  [default: 1.0].")
@click.option("--schedule", type=click.Choice(["linear", "poly", "cosine", "wsd", "wsd-linear", "wsd-cosine"]),
              default="linear", show_default=True,
              help="Warmup then linear decay (BERT), polynomial decay with power 0.5 (NVIDIA), half a cosine, or "
                   "warmup-stable-decay (ModernBERT: the peak rate until the last --decay of the run, then 1 - sqrt "
                   "down to 0; wsd-linear and wsd-cosine decay in a line or half a cosine; extend a run in its stable "
                   "phase with --resume --max-steps, and it decays at the new end).")
@click.option("--decay", type=Real(0, 1), default=0.1, show_default=True,
              help="wsd, wsd-linear, wsd-cosine: the fraction of the run the decay takes.")
@click.option("--warmup", type=NON_NEGATIVE, show_default=False,
              help="Warmup: a fraction of --max-steps (or of --time-budget) when < 1, else a number of steps  "
                   f"[default: {DEFAULTS['warmup']:g}, or the recipe's].")
@click.option("--recipe", type=click.Choice(sorted(RECIPES)),
              help="A measured set of settings; the flags you give win over it. budget: the most useful model from "
                   "a short budget on a small machine (" + as_flags(RECIPES["budget"]["pretrain"]) + "; a family may "
                   "take its own measured rate, said at the start; on instances from make-instances --recipe budget; "
                   "see docs/studies/2026-11-24-budget.md).")
@click.option("--deepspeed-config", type=click.Path(dir_okay=False, exists=True),
              help="A DeepSpeed JSON config; it wins where the flags are silent, a contradiction is an error.")
@click.option("--init-from", type=click.Path(exists=True),
              help="Start from these weights (phase 2): an export folder or a run folder (its latest checkpoint).")
@click.option("--init-optimizer", is_flag=True,
              help="With --init-from a run folder: its optimizer state too (Adam's moments; ModernBERT's phases "
                   "carry it), the schedule's clock starting anew at this run's settings.")
@click.option("--resume", is_flag=True, help="Continue the run in --out from its latest checkpoint, exactly.")
@click.option("--save-every", default=1000, show_default=True, type=count(1))
@click.option("--keep-last", default=3, show_default=True, type=count(1), help="Checkpoints kept.")
@click.option("--log-every", default=10, show_default=True, type=count(1))
@click.option("--eval-every", default=1000, show_default=True, type=count(0), help="Held-out evaluation; 0 = never.")
@click.option("--eval-batches", default=20, show_default=True, type=count(1))
@click.option("--seed", default=42, show_default=True, type=SEED)
@click.option("--num-workers", default=1, show_default=True, type=count(0), help="Loader processes per rank.")
@click.option("--dropout", type=Real(0, 1, max_open=True),
              help="Override the model's hidden and attention dropout.")
@click.option("--objective", type=click.Choice(["mlm", "electra"]),
              help="mlm: masked LM alone (the instances' NSP/SOP labels unused); electra: replaced-token detection "
                   "(Clark et al. 2020: a small generator fills the masked positions, the discriminator labels every "
                   "token; exported as ElectraForPreTraining + generator/ ElectraForMaskedLM)  [default: the "
                   "instances' objective].")
@click.option("--generator-size", type=Real(0, 1, min_open=True), default=0.25, show_default=True,
              help="ELECTRA: the generator's width as a fraction of the discriminator's (the paper: 1/4 to 1/3).")
@click.option("--disc-weight", type=POSITIVE, default=50.0, show_default=True,
              help="ELECTRA: loss = generator MLM + this x discriminator loss (the paper's lambda).")
@click.option("--norm", type=click.Choice(["post", "pre"]),
              help="LayerNorm after each residual add (post, BERT's) or before each sub-layer (pre, MegatronBERT's: "
                   "stable with less warmup; exported as MegatronBertForPreTraining)  [default: the model's, post].")
@click.option("--rope-theta", type=POSITIVE,
              help="ModernBERT: the global layers' RoPE base; a second phase at a longer length (--init-from the "
                   "first) raises it  [default: the model's, 160,000].")
@click.option("--rope-theta-local", type=POSITIVE,
              help="ModernBERT: the local (sliding-window) layers' RoPE base  [default: the model's, 10,000].")
@click.option("--pad-vocab-to", type=click.IntRange(1, SIZE_LIMITS["vocab_pad_multiple"]), default=None,
              show_default="8",
              help="Round the embedding and decoder rows up to this multiple (64: MosaicBERT, ModernBERT); the extra "
                   "rows are never predicted and export trims them.")
@click.option("--unpadded", is_flag=True,
              help="Pack each micro batch end to end (varlen attention): no compute spent on padding.")
@click.option("--compile/--no-compile", default=False,
              help="Run the model under torch.compile, bertkit's kernels as custom ops inside its graph (the first "
                   "steps compile: minutes on a CPU; the losses equal the eager run's). A --resume keeps the run's "
                   "own unless given.")
@click.option("--token-budget", type=click.IntRange(min=8),
              help="Fill each packed micro batch to this many tokens by best fit instead of --micro-batch sequences, "
                   "so a step costs the same whatever the documents' lengths (ModernBERT's recipe; needs packed "
                   "batches, at least the instances' --max-seq-length).")
@click.option("--on-nonfinite", type=click.Choice(["stop", "rollback"]), default="stop", show_default=True,
              help="A NaN/inf loss: stop (saving nothing), or roll back to the last good checkpoint and skip the "
                   "data that led there.")
@click.option("--on-spike", type=click.Choice(["none", "stop", "rollback"]), default="none", show_default=True,
              help="A loss above --spike-factor x the median of the last --spike-window losses: ignore, stop or "
                   "roll back (PaLM's recipe).")
@click.option("--spike-factor", type=Real(1, min_open=True), default=4.0, show_default=True)
@click.option("--spike-window", type=count(2), default=100, show_default=True)
@click.option("--max-rollbacks", type=count(0), default=3, show_default=True, help="Then the run stops.")
@kernels_option
@report_to_option
@click.option("--threads", type=click.IntRange(1, MAX_THREADS),
              help="Torch threads per rank  [default: the cores other processes leave free, divided among the "
                   "ranks; OMP_NUM_THREADS also sets it].")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="A progress bar; --no-progress: a plain line each minute or 5 % instead.")
def pretrain(**flags):
    """Pretrain BERT (MLM + NSP) or ModernBERT (MLM) on an instances folder with DeepSpeed.

    \b
    Several ranks:  deepspeed --num_gpus 8 cli.py pretrain --instances DIR --model base --out RUN
    One process:    bertkit pretrain --instances DIR --model tiny --out RUN
    """
    from bertkit.errors import compile_failure
    from bertkit.fileio import FolderError
    from bertkit.formats import FormatError
    from bertkit.pretrain import ConfigError, PretrainConfig, TrainingError, pretrain as run

    ctx = click.get_current_context()
    given = {k for k in flags if ctx.get_parameter_source(k) is not click.core.ParameterSource.DEFAULT}
    if flags.get("plan"):
        return _run_plan(flags, given)
    if given & {"plan_scale", "plan_set"}:
        raise click.UsageError("--plan-scale and --plan-set go with --plan")
    for name in ("plan", "plan_scale", "plan_set"):
        flags.pop(name)
    for name in ("mixture", "train_only"):
        flags[name] = tuple(x.strip() for x in flags[name].split(",") if x.strip()) if flags[name] else ()
    try:
        flags = flags_in_steps(flags, given)
        result = run(PretrainConfig(**flags), given=given)  # on --resume, a flag not given is the run's own
    except (FormatError, FolderError, ConfigError, TrainingError) as e:
        raise click.ClickException(str(e)) from e
    except RuntimeError as e:
        fix = "run it with --no-compile (with --resume it goes on from the run's last checkpoint)"
        if message := compile_failure(e, fix):
            raise click.ClickException(message) from None
        raise
    if result.get("checkpoint") and os.environ.get("RANK", "0") == "0":
        click.echo(closing_summary(result), err=True)
        click.echo(f"step {result['step']}: checkpoint {result['checkpoint']}", err=True)
        if not result.get("stopped_by_signal"):
            click.echo(f"next: bertkit export {flags['out']} --out model/", err=True)
    if result.get("stopped_by_signal"):  # saved, but not finished: 130 / 143 as shells expect, so `&& export` waits
        raise SystemExit(128 + int(result["stopped_by_signal"]))


def flags_in_steps(flags: dict, given: set) -> dict:
    """--max-tokens and the other lengths in tokens as the step flags they stand for (added to `given`)."""
    from bertkit.pretrain.plan import IN_TOKENS, in_steps

    in_tokens = {name: flags.pop(name) for name in ("max_tokens", *IN_TOKENS)}
    named = {"max_tokens": "max_steps", **IN_TOKENS}
    for name in (n for n, value in in_tokens.items() if value is not None):
        if named[name] in given:
            raise click.UsageError(f"--{name.replace('_', '-')} and --{named[name].replace('_', '-')}: give one")
        given.add(named[name])
    tokens = in_tokens.pop("max_tokens")
    settings = in_steps({**flags, **{k: v for k, v in in_tokens.items() if v is not None}}, tokens)
    return {k: v for k, v in settings.items() if k in flags or k in named.values()}


def _run_plan(flags: dict, given: set) -> None:
    from bertkit.fileio import FolderError
    from bertkit.formats import FormatError
    from bertkit.pretrain import ConfigError, TrainingError
    from bertkit.pretrain.plan import run_plan

    extra = sorted(given - {"plan", "out", "progress", "plan_scale", "plan_set"})
    if extra:
        raise click.UsageError(f"--{extra[0].replace('_', '-')} with --plan: put the setting in the plan (for every "
                               "phase at its top level, or in a [[phase]]), or give it with --plan-set")
    try:
        record = run_plan(flags["plan"], flags["out"], flags["progress"], flags["plan_scale"],
                          plan_settings(flags["plan_set"]))
    except (FormatError, FolderError, ConfigError, TrainingError) as e:
        raise click.ClickException(str(e)) from e
    for phase in record["phases"]:
        click.echo(f"phase {phase['name']}: step {phase['step']}, {'done' if phase['done'] else 'stopped'}: "
                   f"{phase['checkpoint']}", err=True)
    if record.get("stopped_by_signal"):
        raise SystemExit(128 + int(record["stopped_by_signal"]))
    click.echo(f"next: bertkit export {Path(flags['out']) / record['phases'][-1]['folder']} --out model/", err=True)


def plan_settings(pairs) -> dict:
    """--plan-set KEY=VALUE ...: each value read as TOML (numbers, true, "text", [lists]), else as plain text."""
    import tomllib

    settings = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.UsageError(f"--plan-set {pair}: give KEY=VALUE (e.g. model=modernbert-tiny)")
        try:
            settings[key.strip()] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            settings[key.strip()] = value
    return settings


def closing_summary(result: dict) -> str:
    """What a finished run says last: steps and time, the last training loss, the last held-out loss and
    masked-token accuracy (or that none was measured), and how to learn whether it beats its own random start."""
    said = [f"pretrained {result['step']} steps in {result.get('elapsed_s', 0) / 60:.1f} min"]
    if isinstance(result.get("loss"), float):
        said.append(f"training loss {result['loss']:.3f}")
    held = result.get("held_out")
    if held:
        accuracy = held.get("eval_mlm_mask_acc", held.get("eval_mlm_acc"))
        said.append(f"held-out loss {held['eval_loss']:.3f} and masked-token accuracy {100 * accuracy:.1f} % at step "
                    f"{held['step']}")
    else:
        said.append("no held-out score (no held-out instances, or --eval-every 0)")
    measured = ""
    if result.get("elapsed_s", 0) < 2 * 3600:   # what the recorded study says of such a run
        measured = (" In bertkit's recorded measurement (docs/studies/2026-11-25-korean-transfer.md, 2 CPU cores), "
                    "2 hours of modernbert-tiny were needed to beat its random start on five Korean tasks; a "
                    "shorter run may not")
    return "; ".join(said) + (". Whether it beats its own random start: export it with and without --random-weights, "
                              "then `bertkit finetune compare` two sweeps of each (bertkit/finetune/README.md)." +
                              measured)


@click.command("export")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="HF model folder to write.")
@click.option("--checkpoint", "tag", help="Checkpoint tag (e.g. global_step1000)  [default: the latest].")
@click.option("--overwrite", is_flag=True, help="Replace an earlier export of another run in --out.")
@click.option("--random-weights", is_flag=True,
              help="The run's architecture and tokenizer with fresh weights instead of a checkpoint's: the random "
                   "start its pretraining is judged against (fine-tune both, e.g. `finetune korean --lrs ...`).")
@click.option("--seed", type=SEED,
              help="With --random-weights  [default: the run's own seed: the weights a run begun from random "
                   "started from].")
@click.option("--ema", is_flag=True,
              help="The checkpoint's moving average of the weights (a run trained with --ema) as the model.")
def export(run_dir, out, tag, overwrite, random_weights, seed, ema):
    """Write a pretrain run's checkpoint (any ZeRO stage) as a folder transformers loads: BertForPreTraining
    (BertForMaskedLM for an MLM-only run, MegatronBert* for pre-LN, ElectraForPreTraining with generator/ for ELECTRA,
    ModernBertForMaskedLM for ModernBERT)."""
    from bertkit.fileio import FolderError
    from bertkit.formats import FormatError
    from bertkit.pretrain import ConfigError, TrainingError, export as run
    from bertkit.pretrain.checkpoints import read_run_config

    if seed is not None and not random_weights:
        raise click.UsageError("--seed goes with --random-weights")
    if random_weights and ema:
        raise click.UsageError("--random-weights reads no checkpoint, --ema a checkpoint's average: give one")
    if random_weights and tag:
        raise click.UsageError("--random-weights reads no checkpoint: leave out --checkpoint")
    try:
        if random_weights and seed is None:
            seed = read_run_config(run_dir).pretrain["seed"]
        path = run(run_dir, out, tag, say=lambda message: click.echo(message, err=True), overwrite=overwrite,
                   random_seed=seed if random_weights else None, ema=ema)
    except (FormatError, FolderError, ConfigError, TrainingError) as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"wrote {path}")
    click.echo(f"next: bertkit fill-mask --model {path} \"… [MASK] …\"  or  bertkit finetune glue|korean|squad "
               f"--model {path} …", err=True)
