"""`bertkit pretrain` (also `deepspeed cli.py pretrain`) and `bertkit export`: flags onto bertkit.pretrain."""
import os

import click

from bertkit.commands import kernels_option, report_to_option


@click.command("pretrain")
@click.option("--instances", default="instances", show_default=True, type=click.Path(file_okay=False),
              help="make-instances output folder.")
@click.option("--out", default="runs/pretrain", show_default=True, type=click.Path(file_okay=False),
              help="Run folder (checkpoints, metrics).")
@click.option("--model", default="base", show_default=True,
              help="Preset (tiny mini small medium base large) or an HF config.json / model folder.")
@click.option("--max-steps", default=10000, show_default=True, type=int, help="Optimizer steps.")
@click.option("--micro-batch", type=int, help="Sequences per rank per forward  [default: 32].")
@click.option("--global-batch", type=int, help="Sequences per optimizer step (sets gradient accumulation) "
                                               "[default: micro batch x ranks].")
@click.option("--zero-stage", type=click.IntRange(0, 3),
              help="DeepSpeed ZeRO stage  [default: 0 with LAMB (per-layer trust ratios), 2 with AdamW].")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]),
              help="auto = bf16 on GPUs that have it, else fp16 (dynamic loss scaling); fp32 on the CPU.")
@click.option("--optimizer", type=click.Choice(["lamb", "adamw"]), help="[default: lamb]")
@click.option("--lr", type=float, help="Peak learning rate  [default: 1e-3].")
@click.option("--weight-decay", type=float, help="[default: 0.01; never on biases and LayerNorm]")
@click.option("--grad-clip", type=float, help="Global gradient-norm clipping  [default: 1.0].")
@click.option("--schedule", type=click.Choice(["linear", "poly"]), default="linear", show_default=True,
              help="Warmup then linear decay (BERT), or polynomial decay with power 0.5 (NVIDIA).")
@click.option("--warmup", type=float, default=0.01, show_default=True,
              help="Warmup: a fraction of --max-steps when < 1, else a number of steps.")
@click.option("--deepspeed-config", type=click.Path(dir_okay=False, exists=True),
              help="A DeepSpeed JSON config; it wins where the flags are silent, a contradiction is an error.")
@click.option("--init-from", type=click.Path(exists=True),
              help="Start from these weights (phase 2): an export folder or a run folder (its latest checkpoint).")
@click.option("--resume", is_flag=True, help="Continue the run in --out from its latest checkpoint, exactly.")
@click.option("--save-every", default=1000, show_default=True, type=int)
@click.option("--keep-last", default=3, show_default=True, type=int, help="Checkpoints kept.")
@click.option("--log-every", default=10, show_default=True, type=int)
@click.option("--eval-every", default=1000, show_default=True, type=int, help="Held-out evaluation; 0 = never.")
@click.option("--eval-batches", default=20, show_default=True, type=int)
@click.option("--seed", default=42, show_default=True, type=int)
@click.option("--num-workers", default=1, show_default=True, type=int, help="Loader processes per rank.")
@click.option("--dropout", type=float, help="Override the model's hidden and attention dropout.")
@click.option("--pad-vocab-to", type=click.IntRange(min=1), default=None, show_default="8",
              help="Round the embedding and decoder rows up to this multiple (64: MosaicBERT, ModernBERT); the extra "
                   "rows are never predicted and export trims them.")
@click.option("--unpadded", is_flag=True,
              help="Pack each micro batch end to end (varlen attention): no compute spent on padding.")
@click.option("--on-nonfinite", type=click.Choice(["stop", "rollback"]), default="stop", show_default=True,
              help="A NaN/inf loss: stop (saving nothing), or roll back to the last good checkpoint and skip the "
                   "data that led there.")
@click.option("--on-spike", type=click.Choice(["none", "stop", "rollback"]), default="none", show_default=True,
              help="A loss above --spike-factor x the median of the last --spike-window losses: ignore, stop or "
                   "roll back (PaLM's recipe).")
@click.option("--spike-factor", type=float, default=4.0, show_default=True)
@click.option("--spike-window", type=int, default=100, show_default=True)
@click.option("--max-rollbacks", type=int, default=3, show_default=True, help="Then the run stops.")
@kernels_option
@report_to_option
@click.option("--progress/--no-progress", default=True, show_default=True)
def pretrain(**flags):
    """Pretrain BERT (MLM + NSP) on an instances folder with DeepSpeed.

    \b
    Several ranks:  deepspeed --num_gpus 8 cli.py pretrain --instances DIR --model base --out RUN
    One process:    bertkit pretrain --instances DIR --model tiny --out RUN
    """
    from bertkit.fileio import FolderError
    from bertkit.formats import FormatError
    from bertkit.pretrain import ConfigError, PretrainConfig, TrainingError, pretrain as run

    try:
        result = run(PretrainConfig(**flags))
    except (FormatError, FolderError, ConfigError, TrainingError) as e:
        raise click.ClickException(str(e)) from e
    if result.get("checkpoint") and os.environ.get("RANK", "0") == "0":
        click.echo(f"step {result['step']}: checkpoint {result['checkpoint']}", err=True)


@click.command("export")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="HF model folder to write.")
@click.option("--checkpoint", "tag", help="Checkpoint tag (e.g. global_step1000)  [default: the latest].")
def export(run_dir, out, tag):
    """Write a pretrain run's checkpoint (any ZeRO stage) as an HF BertForPreTraining folder."""
    from bertkit.fileio import FolderError
    from bertkit.formats import FormatError
    from bertkit.pretrain import ConfigError, TrainingError, export as run

    try:
        path = run(run_dir, out, tag, say=lambda message: click.echo(message, err=True))
    except (FormatError, FolderError, ConfigError, TrainingError) as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"wrote {path}")
