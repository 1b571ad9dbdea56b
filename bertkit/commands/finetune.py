"""`bertkit finetune squad|glue|classify|ner`: fine-tune a BERT checkpoint (HF folder or bertkit export).

Each sub-command writes OUT/metrics.json (settings, per-epoch metrics, the kept epoch), OUT/best/ (the kept epoch's
model in HF format, with the tokenizer files) and the kept epoch's predictions. Under `deepspeed cli.py finetune`
or torchrun (WORLD_SIZE > 1) training is data-parallel through torch.distributed; --batch-size stays global.
"""
import functools
from pathlib import Path

import click

from bertkit.commands import (
    NON_NEGATIVE,
    POSITIVE,
    PROBABILITY,
    SEED,
    NumberList,
    Real,
    RowsSource,
    count,
    kernels_option,
    report_to_option,
)
from bertkit.threads import MAX_THREADS

select_option = click.option(
    "--select", type=click.Choice(["last", "validation"]), default="last", show_default=True,
    help="Which epoch's model is kept (OUT/best/) and its scores reported: the last, or the best on a held-out tenth "
         "of the training rows (stratified by label; classification and regression tasks). The scored file never "
         "chooses: its best epoch would be a maximum over noisy scores.")


def common_options(default_lr: float, default_epochs: float, default_batch: int, default_max_len: int):
    def wrap(f):
        options = [
            click.option("--model", "model_path", required=True, type=click.Path(exists=True, file_okay=False),
                         help="An HF BERT, ModernBERT or WordPiece RoBERTa (KLUE's) folder, or a `bertkit export` "
                              "folder (weights + vocab/tokenizer)."),
            click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
                         help="Output folder: metrics.json, best/ (HF model), predictions."),
            click.option("--epochs", default=default_epochs, show_default=True, type=POSITIVE),
            click.option("--batch-size", default=default_batch, show_default=True, type=count(1),
                         help="Global train batch."),
            click.option("--eval-batch-size", default=64, show_default=True, type=count(1)),
            click.option("--learning-rate", "--lr", "learning_rate", default=default_lr, type=POSITIVE,
                         help=f"[default: {default_lr:g} for models 768 wide or wider; narrower models more, up "
                              "to 1e-3 at 128 wide (tiny): bertkit.finetune.train.rate_for_width]"),
            click.option("--weight-decay", default=0.01, show_default=True, type=NON_NEGATIVE),
            click.option("--adam-eps", default=1e-8, show_default=True, type=POSITIVE,
                         help="AdamW's epsilon (transformers' Trainer's; BERT used 1e-6)."),
            click.option("--warmup-ratio", default=0.1, show_default=True, type=PROBABILITY,
                         help="Fraction of steps with linear warmup; linear decay to 0 after."),
            click.option("--max-grad-norm", default=1.0, show_default=True, type=NON_NEGATIVE, help="0: no clipping."),
            click.option("--seed", default=42, show_default=True, type=SEED),
            click.option("--max-seq-length", default=default_max_len, show_default=True, type=click.IntRange(8, 512)),
            click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N."),
            kernels_option,
            report_to_option,
            click.option("--log-every", default=10, show_default=True, type=count(1),
                         help="Steps between OUT/metrics.jsonl records."),
            click.option("--unpadded/--padded", default=True, show_default=True,
                         help="Pack each training batch end to end (varlen attention): no compute on padding, "
                              "the same losses as padded batches (--padded: pad each batch to its longest row)."),
            click.option("--compile", is_flag=True,
                         help="Run the model under torch.compile (its first batches compile; the losses equal the "
                              "eager run's)."),
            click.option("--precision", type=click.Choice(["fp32", "bf16", "auto"]), default="auto",
                         show_default=True,
                         help="bf16: training's matrix products in bf16 (autocast), weights and optimizer in fp32; "
                              "faster on a GPU and on a CPU with bf16 units (Intel AMX). auto: bf16 where the device "
                              "has them, else fp32 (metrics.json records which). Evaluation always runs in fp32."),
            click.option("--dropout", type=Real(0, 1, max_open=True),
                         help="Hidden and attention dropout while fine-tuning  [default: the model's config.json; "
                              "BERT's is 0.1]."),
            select_option,
            click.option("--no-save-model", is_flag=True, help="Skip writing OUT/best/ (metrics only)."),
            click.option("--overwrite", is_flag=True, help="Replace an earlier fine-tuning of another task in OUT "
                                                                "(or start afresh over an unfinished one)."),
            click.option("--checkpoint-minutes", default=10.0, show_default=True, type=NON_NEGATIVE,
                         help="Save the training state to OUT/resume/ this often and between epochs; the same "
                              "command run again after a kill continues from it (0: never)."),
            click.option("--threads", type=click.IntRange(1, MAX_THREADS),
                         help="Torch threads  [default: the cores other processes leave free; OMP_NUM_THREADS also "
                              "sets it]."),
        ]
        for option in reversed(options):
            f = option(f)
        return f
    return wrap


pooling_option = click.option(
    "--pooling", type=click.Choice(["cls", "mean"]), default=None,
    help="What the classifier reads: cls (BERT's pooled [CLS]) or mean (the mean over the tokens; for a model "
         "pretrained without a sentence task)  [default: the model's config.json, else cls].")


def _train_config(kw: dict, pooling: str | None = None):
    from bertkit.finetune.train import TrainConfig

    rate = kw.pop("learning_rate")  # not given: chosen by the model's width from the command's base rate
    given = kw.pop("lr_given", False) or lr_given_by_flag()
    return TrainConfig(out_dir=kw.pop("out_dir"), epochs=kw.pop("epochs"), batch_size=kw.pop("batch_size"),
                       eval_batch_size=kw.pop("eval_batch_size"), learning_rate=rate if given else None,
                       base_learning_rate=rate,
                       weight_decay=kw.pop("weight_decay"), adam_eps=kw.pop("adam_eps"),
                       warmup_ratio=kw.pop("warmup_ratio"),
                       max_grad_norm=kw.pop("max_grad_norm"), seed=kw.pop("seed"), device=kw.pop("device"),
                       kernels=kw.pop("kernels"), report_to=kw.pop("report_to"), log_every=kw.pop("log_every"),
                       unpadded=kw.pop("unpadded"), compile=kw.pop("compile"), precision=kw.pop("precision"),
                       save_model=not kw.pop("no_save_model"),
                       dropout=kw.pop("dropout"), pooling=pooling, overwrite=kw.pop("overwrite"),
                       threads=kw.pop("threads"), checkpoint_minutes=kw.pop("checkpoint_minutes"),
                       select=kw.pop("select"))


def lr_given_by_flag() -> bool:
    return click.get_current_context().get_parameter_source("learning_rate") is not click.core.ParameterSource.DEFAULT


def _report(summary: dict) -> None:
    import json

    best = summary.get("best", {})
    click.echo(json.dumps({"best_epoch": summary.get("best_epoch"), **best}, indent=2))


def friendly_errors(f):
    """Data errors and an unavailable --kernels are the user's to fix: print them without a traceback; so is
    torch.compile failing (the fix: leave --compile out)."""
    @functools.wraps(f)
    def run(*args, **kwargs):
        from bertkit.errors import DataError, compile_failure
        from bertkit.fileio import FolderError
        from bertkit.finetune.squad import SquadFormatError
        from bertkit.formats import FormatError
        from bertkit.kernels import BackendError
        from bertkit.runlog import ReportError
        from bertkit.tokenization import TokenizerError

        try:
            return f(*args, **kwargs)
        except (DataError, SquadFormatError, BackendError, ReportError, FolderError, FormatError,
                TokenizerError) as e:  # FormatError: a model folder that cannot be loaded (bertkit.models)
            raise click.ClickException(str(e)) from None
        except RuntimeError as e:
            fix = "run the same command without --compile (a fine-tuning goes on from its last saved state)"
            if message := compile_failure(e, fix):
                raise click.ClickException(message) from None
            raise
    return run


@click.group("finetune")
def finetune():
    """Fine-tune on SQuAD, GLUE, the Korean benchmarks, any classification file, or CoNLL tagging; compare two
    Korean sweeps."""


@finetune.command("squad")
@common_options(default_lr=5e-5, default_epochs=2.0, default_batch=32, default_max_len=384)
@click.option("--train-file", type=click.Path(exists=True, dir_okay=False),
              help="SQuAD JSON to train on; leave out to only predict.")
@click.option("--predict-file", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--version-2", is_flag=True, help="SQuAD 2.0: unanswerable questions, null answers.")
@click.option("--window-step", default=128, show_default=True, type=count(1),
              help="Tokens between the starts of consecutive context windows (run_squad.py's doc_stride; "
                   "NOT HF's `stride`, which is the overlap = window length - step).")
@click.option("--window-overlap", default=None, type=count(0),
              help="Instead of --window-step: consecutive windows share this many context tokens (HF's `stride`, "
                   "run_qa.py's --doc_stride), so the step depends on each question's length.")
@click.option("--max-query-length", default=64, show_default=True, type=count(1))
@click.option("--n-best-size", default=20, show_default=True, type=count(1))
@click.option("--max-answer-length", default=30, show_default=True, type=count(1), help="In tokens.")
@click.option("--null-score-diff-threshold", default=0.0, show_default=True, type=Real(),
              help="v2: answer \"\" when null score - best span score exceeds this.")
@click.option("--train-articles", default=None, help="Article range of --train-file to use, e.g. 0:24.")
@click.option("--predict-articles", default=None, help="Article range of --predict-file, e.g. 24:.")
@click.option("--every-nth-train-question", default=1, show_default=True, type=count(1),
              help="Train on every n-th question only (a quick deterministic subset).")
@click.option("--every-nth-predict-question", default=1, show_default=True, type=count(1),
              help="Predict and score every n-th question only.")
@friendly_errors
def squad(**kw):
    """SQuAD v1.1 / v2.0 span extraction; writes predictions.json, nbest_predictions.json (and null_odds.json)."""
    from bertkit.finetune.squad import finetune_squad, parse_articles

    source = click.get_current_context().get_parameter_source("window_step")
    step_given = source is not click.core.ParameterSource.DEFAULT
    if kw["window_overlap"] is not None and step_given:
        raise click.UsageError("--window-step and --window-overlap are two ways to place windows: give one")
    cfg = _train_config(kw)
    summary = finetune_squad(kw["model_path"], kw["train_file"], kw["predict_file"], cfg,
                             version_2=kw["version_2"], max_seq_length=kw["max_seq_length"],
                             window_step=kw["window_step"] if step_given else None,
                             window_overlap=kw["window_overlap"],
                             max_query_length=kw["max_query_length"],
                             n_best_size=kw["n_best_size"], max_answer_length=kw["max_answer_length"],
                             null_score_diff_threshold=kw["null_score_diff_threshold"],
                             train_articles=parse_articles(kw["train_articles"]),
                             predict_articles=parse_articles(kw["predict_articles"]),
                             every_nth_train_question=kw["every_nth_train_question"],
                             every_nth_predict_question=kw["every_nth_predict_question"])
    _report(summary)


@finetune.command("glue")
@common_options(default_lr=2e-5, default_epochs=3.0, default_batch=32, default_max_len=128)
@click.option("--task", required=True,
              type=click.Choice(["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"]))
@click.option("--data-dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="GLUE folder (holding RTE/, MRPC/, ...) or the task's folder with train.tsv and dev.tsv.")
@pooling_option
@friendly_errors
def glue(**kw):
    """A GLUE task, scored with its official metric (Matthews, F1/acc, Pearson/Spearman or accuracy)."""
    from bertkit.finetune.glue import finetune_glue

    cfg = _train_config(kw, pooling=kw.pop("pooling"))
    _report(finetune_glue(kw["task"], kw["data_dir"], kw["model_path"], cfg, max_seq_length=kw["max_seq_length"]))


KOREAN_TASKS = ("nsmc", "klue-nli", "kornli", "korsts", "klue-sts", "klue-ner", "korquad")
# settings that do not change a fine-tuning's scores: a kept task may differ in these
SCORE_NEUTRAL = ("out_dir", "overwrite", "threads", "report_to", "log_every", "no_save_model", "device", "kernels",
                 "compile", "checkpoint_minutes")


@finetune.command("korean")
@common_options(default_lr=2e-5, default_epochs=3.0, default_batch=32, default_max_len=128)
@click.option("--task", "tasks", required=True, multiple=True, type=click.Choice([*KOREAN_TASKS, "all"]),
              help="Repeat for several (or `all`): each goes to OUT/TASK/, and OUT/manifest.json and a table gather "
                   "their scores; a task whose OUT/TASK/ holds a finished fine-tuning is kept, not redone.")
@click.option("--data-dir", type=click.Path(exists=True, file_okay=False),
              help="Your folder holding klue/, kornlu/, nsmc/ and korquad_v1.0/ as their publishers lay them out; "
                   "not needed where --train-file and --dev-file give both files.")
@click.option("--train-file", type=click.Path(exists=True, dir_okay=False),
              help="Instead of the task's training file (e.g. the official train set where you have it); the "
                   "published file the task split in two (NSMC, KLUE-NER, KorQuAD) is then scored whole.")
@click.option("--dev-file", type=click.Path(exists=True, dir_okay=False),
              help="Instead of the task's scored file; a published file the task split in two then trains whole.")
@click.option("--max-train-rows", type=count(1),
              help="Train on the first N rows (KorQuAD: questions) only (a quick look).")
@click.option("--max-dev-rows", type=count(1),
              help="Score the first N rows (KorQuAD: questions) only (a quick look, not a score).")
@click.option("--lrs", type=NumberList(POSITIVE),
              help="A sweep: comma-separated rates, e.g. 1e-4,3e-4,1e-3; each task fine-tunes at every rate x seed "
                   "(--seeds) in OUT/TASK/lrRATE-seedSEED/, and the table gives each rate's mean and range over the "
                   "seeds and the best rate (a sweep may grow: the cells already run are kept).")
@click.option("--seeds", type=NumberList(SEED),
              help="A sweep: comma-separated seeds, e.g. 0,1,2 (with --lrs, or alone at --lr or its default).")
@pooling_option
@friendly_errors
def korean(**kw):
    """A Korean benchmark from its official files, with its official metric: KLUE-NLI, KorNLI, NSMC (accuracy);
    KorSTS, KLUE-STS (Pearson, Spearman; KLUE-STS also binary F1); KLUE-NER (entity and character macro F1);
    KorQuAD 1.0 (its own EM and character F1).
    Where a task's published files hold no training split (NSMC's test file alone, KLUE-NER's and KorQuAD's dev),
    the task trains on one part of what is there and scores the other (bertkit/finetune/README.md says which).
    korquad takes SQuAD's defaults (384 tokens, lr 5e-5, 2 epochs) unless given."""
    from bertkit.fileio import folder_kind
    from bertkit.finetune.korean import SettingsChanged, evaluate, task_files
    from bertkit.finetune.tables import korean_table, sweep_table

    tasks = list(dict.fromkeys(t for name in kw.pop("tasks") for t in (KOREAN_TASKS if name == "all" else [name])))
    rates, seeds = kw.pop("lrs"), kw.pop("seeds")
    sweep = bool(rates or seeds)
    if sweep and not rates and lr_given_by_flag():
        rates = (kw["learning_rate"],)
    if kw["data_dir"] is None and not (kw["train_file"] and kw["dev_file"]):
        raise click.UsageError("--data-dir: give your folder holding klue/, kornlu/, nsmc/ and korquad_v1.0/ as "
                               "published, or both --train-file and --dev-file")
    if (kw["train_file"] or kw["dev_file"]) and len(tasks) > 1:
        raise click.UsageError("--train-file and --dev-file name one task's files: give one --task with them")
    for task in tasks:  # a missing file stops now, not after hours of the tasks before it
        task_files(task, kw["data_dir"], kw["train_file"], kw["dev_file"])
    if len(tasks) == 1 and not sweep and folder_kind(kw["out_dir"]) != "finetune-korean":  # OUT is its fine-tuning
        _report(_korean_task(tasks[0], dict(kw)))
        return
    # what the scores depend on (a sweep's cells are named by their rate and seed: a sweep may add more)
    settings = {k: v for k, v in kw.items() if k not in SCORE_NEUTRAL and not (sweep and k in ("learning_rate",
                                                                                               "seed"))}
    settings["model_path"] = str(Path(kw["model_path"]).resolve())

    def fine_tune(task, folder, rate, seed):
        cell = {"seed": seed} if seed is not None else {}
        if rate is not None:
            cell.update(learning_rate=rate, lr_given=True)
        return _korean_task(task, {**kw, **cell, "out_dir": str(folder)})

    try:
        summary = evaluate(kw["out_dir"], tasks, fine_tune, settings, rates, seeds or (kw["seed"],) if sweep else (),
                           kw["overwrite"], say=click.echo)
    except SettingsChanged as e:
        raise click.UsageError(str(e)) from None
    click.echo(sweep_table(summary) if sweep else korean_table(summary))


@finetune.command("compare")
@click.argument("first", type=click.Path(exists=True, file_okay=False))
@click.argument("second", type=click.Path(exists=True, file_okay=False))
def compare(first, second):
    """Two Korean sweeps side by side, task by task (folders of `finetune korean --lrs ... --seeds ...`, e.g. random
    weights, then the pretrained model): each at its best rate, its mean and seeds' range, the difference and a
    verdict from the seeds both ran (a seed-paired 95 % t-interval; no verdict below 3 seeds)."""
    from bertkit.errors import DataError
    from bertkit.finetune.korean import compare_sweeps
    from bertkit.finetune.tables import comparison_table, read_sweep

    try:
        sweeps = [read_sweep(folder) for folder in (first, second)]
    except DataError as e:
        raise click.ClickException(str(e)) from None
    rows = compare_sweeps(*sweeps)
    if not rows:
        raise click.ClickException(f"{first} and {second} share no task")
    click.echo(comparison_table(first, second, rows))
    for task in [t for t in (*sweeps[0], *sweeps[1]) if not all(t in s for s in sweeps)]:
        click.echo(f"{task}: in one folder only", err=True)


def _korean_task(task: str, kw: dict) -> dict:
    from bertkit.finetune.korean import finetune_klue_ner, finetune_korean, finetune_korquad

    ctx = click.get_current_context()
    if task == "korquad":
        defaults = {"max_seq_length": 384, "learning_rate": 5e-5, "epochs": 2.0}
        for name, value in defaults.items():
            if ctx.get_parameter_source(name) is click.core.ParameterSource.DEFAULT and not (
                    name == "learning_rate" and kw.get("lr_given")):
                kw[name] = value
        kw.pop("pooling")
        cfg = _train_config(kw)
        return finetune_korquad(kw["data_dir"], kw["model_path"], cfg, kw["train_file"], kw["dev_file"],
                                kw["max_train_rows"], kw["max_dev_rows"], max_seq_length=kw["max_seq_length"])
    if task == "klue-ner":
        kw.pop("pooling")
        return finetune_klue_ner(kw["data_dir"], kw["model_path"], _train_config(kw), kw["max_seq_length"],
                                 kw["train_file"], kw["dev_file"], kw["max_train_rows"], kw["max_dev_rows"])
    cfg = _train_config(kw, pooling=kw.pop("pooling"))
    return finetune_korean(task, kw["data_dir"], kw["model_path"], cfg, max_seq_length=kw["max_seq_length"],
                           train_file=kw["train_file"], dev_file=kw["dev_file"], max_train_rows=kw["max_train_rows"],
                           max_dev_rows=kw["max_dev_rows"])


@finetune.command("classify")
@common_options(default_lr=2e-5, default_epochs=3.0, default_batch=32, default_max_len=128)
@click.option("--train-file", required=True, type=RowsSource(),
              help=".csv, .tsv or .jsonl, or a 🤗 dataset: a save_to_disk folder (a DatasetDict's split: its "
                   "subfolder) or hf:NAME:SPLIT (hf:NAME:CONFIG:SPLIT), from the cache load_dataset keeps")
@click.option("--dev-file", required=True, type=RowsSource())
@click.option("--text-a", required=True, help="Column (header name or 0-based index) or JSON key of the text.")
@click.option("--text-b", default=None, help="Second text, for sentence pairs.")
@click.option("--label", default="label", show_default=True)
@click.option("--regression", is_flag=True, help="Numeric target (MSE loss, Pearson/Spearman).")
@click.option("--no-header", is_flag=True, help="CSV/TSV without a header row (columns by index).")
@pooling_option
@friendly_errors
def classify(**kw):
    """Any single-sentence or pair classification data (CSV/TSV/JSONL)."""
    from bertkit.finetune.classify import finetune_classify

    cfg = _train_config(kw, pooling=kw.pop("pooling"))
    _report(finetune_classify(kw["model_path"], kw["train_file"], kw["dev_file"], cfg, text_a=kw["text_a"],
                              text_b=kw["text_b"], label=kw["label"], regression=kw["regression"],
                              max_seq_length=kw["max_seq_length"], header=not kw["no_header"]))


@finetune.command("ner")
@common_options(default_lr=5e-5, default_epochs=3.0, default_batch=32, default_max_len=128)
@click.option("--train-file", required=True, type=click.Path(exists=True, dir_okay=False),
              help="CoNLL format: `word ... tag` per line, blank line between sentences.")
@click.option("--dev-file", required=True, type=click.Path(exists=True, dir_okay=False))
@friendly_errors
def ner(**kw):
    """Token tagging; entity-level precision/recall/F1 over IOB2 spans (seqeval's default mode)."""
    from bertkit.finetune.ner import finetune_ner

    cfg = _train_config(kw)
    _report(finetune_ner(kw["model_path"], kw["train_file"], kw["dev_file"], cfg, max_seq_length=kw["max_seq_length"]))
