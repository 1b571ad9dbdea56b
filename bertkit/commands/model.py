"""`bertkit fill-mask` (the top-k predictions of a model's MLM head at each [MASK]: a quick sanity check),
`bertkit predict` and `bertkit merge`."""
import unicodedata

import click

from bertkit.commands import POSITIVE, NumberList, Real, kernels_option


@click.command("fill-mask")
@click.option("--model", "model_dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="An HF-format BERT folder with an MLM head (e.g. from `bertkit export`), with its tokenizer files.")
@click.option("--top-k", default=5, show_default=True, type=click.IntRange(min=1), help="Predictions per [MASK].")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, or auto (cuda when available).")
@kernels_option
@click.argument("texts", nargs=-1, required=True)
def fill_mask(model_dir, top_k, device, kernels, texts):
    """Print the top-k tokens (with probabilities) for each [MASK] in TEXTS.

    Example: bertkit fill-mask --model out/export "The capital of France is [MASK]."
    """
    import torch

    from bertkit import kernels as backends
    from bertkit.fill_mask import fill_mask_predictions
    from bertkit.models import load_pretrained
    from bertkit.tokenization import TokenizerError, load_tokenizer

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    backends.use(kernels)
    try:
        backends.resolve(device)
    except backends.BackendError as e:
        raise click.ClickException(str(e)) from None
    try:
        model = load_pretrained(model_dir, head="pretraining", require_head=True)
    except ValueError as e:  # ModelFolderError, DamagedFileError: the file and what is wrong
        hint = ("; fill-mask needs a model pretrained with masked-LM, not an encoder-only or fine-tuned checkpoint"
                if " head: it lacks" in str(e) or "has no trained" in str(e) else "")
        raise click.ClickException(f"{e}{hint}") from None
    try:
        tokenizer = load_tokenizer(model_dir)
    except TokenizerError as e:
        raise click.ClickException(
            f"{model_dir}: its tokenizer cannot be read ({e}). fill-mask reads the tokenizer from the model folder: "
            "`bertkit export` puts vocab.txt and tokenizer.json there; for another model, copy its tokenizer "
            "files in") from None
    model.to(device)
    from bertkit.kernel_guard import kernel_uses, resolve_guarded

    resolve_guarded(device, kernel_uses(model, "fp32", False), say=lambda m: click.echo(m, err=True))
    try:
        predictions = fill_mask_predictions(model, tokenizer, texts, top_k, device)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    for text, masks in zip(texts, predictions):
        click.echo(text)
        for n, predictions in enumerate(masks, 1):
            if len(masks) > 1:
                click.echo(f"  [MASK] {n}:")
            for rank, (token, prob) in enumerate(predictions, 1):
                shown = token if token and token.strip() == token else f"'{token}'"   # a BPE's ' word' shows its space
                click.echo(f"  {rank:>2}. {padded(shown, 20)} {prob:.4f}")


def padded(text: str, columns: int) -> str:
    """`text` padded to `columns` terminal columns: a Hangul syllable (or any wide character) takes two, so the
    probabilities of Korean guesses line up."""
    wide = sum(unicodedata.east_asian_width(c) in "WF" for c in text)
    return text + " " * max(0, columns - len(text) - wide)


@click.command("predict")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="File to write, in FILE's format: a classifier's rows (TSV, CSV, JSON lines) with `prediction` "
                   "and each label's probability (`p_LABEL`) added; a tagger's CoNLL lines with the tag and its "
                   "probability added; a reader's SQuAD predictions (and OUT.nbest.json with probabilities).")
@click.option("--text-a", help="Column (name or 0-based index) of the text  [default: the one the model was "
                               "trained on].")
@click.option("--text-b", help="Column of the second text, for a pair classifier  [default: as trained].")
@click.option("--no-header", is_flag=True, help="FILE has no header row (columns are then 0-based indices).")
@click.option("--max-seq-length", type=click.IntRange(min=8), help="[default: the length it was trained at].")
@click.option("--batch-size", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--overwrite", is_flag=True, help="Replace an existing --out file.")
def predict(model_dir, file, out, text_a, text_b, no_header, max_seq_length, batch_size, overwrite):
    """Label an unlabelled FILE with a fine-tuned model (MODEL_DIR: a fine-tuning's OUT/best/).

    Example: bertkit predict runs/nsmc/best test.no_label.tsv --out predictions.tsv
    """
    from pathlib import Path

    from bertkit.errors import DataError
    from bertkit.finetune.predict import predict_file

    if Path(out).exists() and not overwrite:
        raise click.ClickException(f"{out}: exists; pass --overwrite to replace it, or give another --out")
    try:
        result = predict_file(model_dir, file, out, text_a=text_a, text_b=text_b, header=not no_header,
                              max_seq_length=max_seq_length, batch_size=batch_size)
    except (DataError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    counts = ", ".join(f"{label} {n:,}" for label, n in result["counts"].items())
    if result.get("words_cut"):
        click.echo(f"{result['words_cut']:,} words lay past --max-seq-length: tagged O without a probability")
    click.echo(f"predicted {result['rows']:,} {'words' if 'words_cut' in result else 'rows'}"
               f"{f' ({counts})' if counts else ''}: {out}" + (f" (n-best: {result['nbest']})" if "nbest" in result
                                                               else ""))


@click.command("merge")
@click.argument("models", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="A new (or empty) folder to write.")
@click.option("--method", type=click.Choice(["mean", "ties"]), default="mean", show_default=True,
              help="mean: the (weighted) mean of the weights; ties: TIES-merging of their differences from --base.")
@click.option("--weights", type=NumberList(POSITIVE, unique=False, example="0.5,0.3,0.2"),
              help="--method mean: one weight per model, relative  [default: equal].")
@click.option("--base", type=click.Path(exists=True, file_okay=False),
              help="--method ties: the model the others were trained from (a pre-decay export, the pretrained one).")
@click.option("--density", default=0.2, show_default=True, type=Real(0, 1, min_open=True),
              help="--method ties: the share of each model's largest differences kept.")
def merge(models, out, method, weights, base, density):
    """Merge exports of one architecture and vocabulary into one model transformers loads (decay variants, model
    soups). Score it before use: a merge is not trained."""
    from bertkit.merge import MergeError, merge as run

    try:
        path = run(models, out, method, list(weights) if weights else None, base, density)
    except MergeError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote {path}")
    click.echo(f"next: bertkit finetune ... --model {path}, or compare it with its inputs", err=True)


@click.command("extend-vocab")
@click.argument("model", type=click.Path(exists=True, file_okay=False))
@click.option("--tokenizer", required=True, type=click.Path(exists=True),
              help="A tokenizer trained on the new text (train-tokenizer's folder, a model folder or a vocab.txt): "
                   "its tokens that MODEL lacks are added, in its order.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="A new (or empty) folder to write.")
@click.option("--max-new", type=click.IntRange(min=1), help="Add at most this many tokens  [default: all].")
def extend_vocab(model, tokenizer, out, max_new):
    """Grow a model's WordPiece vocabulary for a new language or domain: new tokens into its unused slots, then
    appended, to a multiple of 64; each new token's rows the mean of the rows of the pieces MODEL spells it with.
    Continue pretraining from OUT (`pretrain --init-from OUT`, instances made with OUT's tokenizer)."""
    from bertkit.extend_vocab import ExtendError, extend_vocab as run
    from bertkit.tokenization import TokenizerError

    try:
        found = run(model, tokenizer, out, max_new)
    except (ExtendError, TokenizerError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote {out}: {found.old_size:,} -> {found.new_size:,} tokens; {found.added:,} new "
               f"({found.into_unused:,} into unused slots, {found.appended:,} appended), {found.padding:,} [unused] "
               f"to a multiple of 64; new rows from the pieces that spell them: {found.from_pieces:,}, from the mean "
               f"of all rows (only [UNK] before): {found.from_mean:,}; normalisation: strip accents "
               f"{found.strip_accents}")
    click.echo(f"next: bertkit make-instances CORPUS --tokenizer {out} ...; bertkit pretrain --init-from {out} ...",
               err=True)
