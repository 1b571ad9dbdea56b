"""`bertkit finetune embed` (a model folder -> a sentence-transformers model), `bertkit evaluate-embeddings` (STS
and retrieval scores beside their floors) and `bertkit encode` (a text file's vectors to Arrow)."""
import json
from pathlib import Path

import click

from bertkit.commands import PROBABILITY, SEED, Real, RowsSource, count
from bertkit.commands.finetune import friendly_errors
from bertkit.embeddings import LEARNING_RATE, TEMPERATURE, WEIGHT_DECAY

STS_HELP = ("An STS file (sentence1, sentence2, score: KorSTS/STS-B .tsv, KLUE-STS .json) or a published set by name "
            "under --data-dir: korsts-dev, korsts-test, klue-sts-dev, stsb-dev. Repeat for several.")
RETRIEVAL_HELP = ("A SQuAD-format file (each question against every paragraph of the file) or korquad-dev / "
                  "squad-dev under --data-dir. Repeat for several.")


def evaluation_options(f):
    for option in reversed([
            click.option("--sts", multiple=True, help=STS_HELP),
            click.option("--retrieval", multiple=True, help=RETRIEVAL_HELP),
            click.option("--data-dir", type=click.Path(exists=True, file_okay=False),
                         help="The folder holding the published sets named by --sts / --retrieval."),
            click.option("--eval-batch-size", default=64, show_default=True, type=count(1))]):
        f = option(f)
    return f


def refuse_to_replace(path: Path, ours) -> None:
    """An --out file that exists is replaced only when it is this command's own output (`ours(path)`), never a
    file of the user's that a mistyped path names."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise click.ClickException(f"{path}: not a plain file; give --out a new file's path")
    if path.exists():
        try:
            mine = ours(path)
        except Exception:
            mine = False
        if not mine:
            raise click.ClickException(f"{path}: exists and is not an output of this command; bertkit replaces only "
                                       "its own files. Give --out a new path, or remove the file first")


def _is_scores(path: Path) -> bool:
    d = json.loads(path.read_text(encoding="utf-8"))
    return isinstance(d, dict) and set(d) == {"sts", "retrieval"}


def _is_embeddings(path: Path) -> bool:
    from bertkit.fileio import read_arrow

    return read_arrow(path).schema.names == ["text", "embedding"]


@click.command("embed")
@click.option("--model", "model_path", required=True, type=click.Path(exists=True, file_okay=False),
              help="A bertkit export, or a transformers BERT / RoBERTa / ModernBERT folder.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Writes OUT/model/ (transformers + sentence-transformers), metrics.jsonl, summary.json.")
@click.option("--pairs", type=RowsSource(),
              help="Training rows: .csv (quoted as RFC 4180), .tsv (no quoting: a text holds no tab), .jsonl "
                   "(texts as JSON strings) or a 🤗 dataset (a save_to_disk folder, hf:NAME:SPLIT) with an anchor "
                   "and a positive column (and a hard negative).")
@click.option("--nli", help="Or an NLI file (KLUE-NLI .json, KorNLI-style .tsv) or klue-nli under --data-dir: "
                            "each premise, its entailment the positive, its contradiction the hard negative "
                            "(KoSimCSE's supervised recipe).")
@click.option("--corpus", type=click.Path(exists=True, file_okay=False),
              help="Unsupervised SimCSE instead: sentences of a bertkit corpus folder, each its own positive "
                   "(dropout makes the two views differ).")
@click.option("--ict", is_flag=True,
              help="With --corpus: the Inverse Cloze Task instead of SimCSE, retrieval's pairs from text alone: a "
                   "sentence against the passage of --passage-sentences around it (without it 9 times in 10).")
@click.option("--passage-sentences", default=6, show_default=True, type=count(2), help="With --ict.")
@click.option("--sentences", default=100_000, show_default=True, type=count(2),
              help="With --corpus: this many distinct sentences (--ict: passages), drawn by --seed.")
@click.option("--anchor", default="anchor", show_default=True, help="The anchor column's name.")
@click.option("--positive", default="positive", show_default=True, help="The positive column's name.")
@click.option("--negative", default=None, help="The hard negative column's name (none: in-batch negatives only).")
@click.option("--pooling", type=click.Choice(["mean", "cls", "last"]), default="mean", show_default=True)
@click.option("--max-seq-length", default=128, show_default=True, type=click.IntRange(8, 8192))
@click.option("--normalize", is_flag=True, help="Write a Normalize module: the folder's vectors have unit length.")
@click.option("--batch-size", default=256, show_default=True, type=count(2),
              help="Pairs a step; every other pair's positive is each anchor's negative.")
@click.option("--mini-batch", default=32, show_default=True, type=count(1),
              help="Rows embedded at once (gradient caching): memory follows this, the gradient is --batch-size's.")
@click.option("--epochs", default=1, show_default=True, type=count(1))
@click.option("--max-steps", type=count(1), help="Stop after this many steps.")
@click.option("--learning-rate", "--lr", "learning_rate", type=Real(*LEARNING_RATE),
              help="Default: 5e-5 for models 768 wide, more for narrower ones (up to 1e-3 at 128).")
@click.option("--warmup-ratio", default=0.1, show_default=True, type=PROBABILITY)
@click.option("--weight-decay", default=0.01, show_default=True, type=Real(*WEIGHT_DECAY),
              help="AdamW's decoupled decay (0 to 1; more only makes NaN weights).")
@click.option("--temperature", default=0.05, show_default=True, type=Real(*TEMPERATURE),
              help="Of the cosine similarities, 0.001 to 100 (sentence-transformers' scale is its inverse: 20).")
@click.option("--symmetric", is_flag=True, help="Also each positive against every anchor (both directions).")
@click.option("--seed", default=0, show_default=True, type=SEED)
@click.option("--precision", type=click.Choice(["fp32", "bf16", "auto"]), default="fp32", show_default=True)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--save-every", default=200, show_default=True, type=count(1),
              help="Steps between checkpoints; run the same command again to resume a killed run.")
@evaluation_options
@friendly_errors
def embed(**kw):
    """Train a model folder as a sentence encoder (in-batch negatives, gradient caching); writes OUT/model/, a
    folder SentenceTransformer(OUT/model) loads, then scores it on --sts / --retrieval.

    \b
      bertkit finetune embed --model export/ --nli klue-nli --out emb/ \\
          --sts korsts-dev --retrieval korquad-dev --data-dir data/
      bertkit finetune embed --model export/ --pairs pairs.jsonl --negative hard_negative --out emb/
      bertkit finetune embed --model export/ --corpus corpus/ --out simcse/ --batch-size 64
      bertkit finetune embed --model export/ --corpus corpus/ --ict --out ict/
    """
    from bertkit.embeddings.data import NLI_SETS, corpus_passages, corpus_sentences, nli_triplets, read_pairs
    from bertkit.embeddings.encoder import EncoderConfig
    from bertkit.embeddings.evaluate import resolve_set, score
    from bertkit.embeddings.train import EmbedConfig, train_embeddings

    if sum(bool(kw[k]) for k in ("pairs", "nli", "corpus")) != 1:
        raise click.UsageError("give one of --pairs FILE, --nli FILE|klue-nli (supervised) or --corpus DIR "
                               "(unsupervised SimCSE; with --ict, the Inverse Cloze Task)")
    if kw["ict"] and not kw["corpus"]:
        raise click.UsageError("--ict makes pairs from a corpus folder: give --corpus DIR with it")
    if kw["pairs"]:
        rows = read_pairs(kw["pairs"], kw["anchor"], kw["positive"], kw["negative"])
    elif kw["nli"]:
        rows = nli_triplets(resolve_set(kw["nli"], NLI_SETS, kw["data_dir"]))
    elif kw["ict"]:
        rows = corpus_passages(kw["corpus"], kw["sentences"], kw["seed"], kw["passage_sentences"])
    else:
        rows = corpus_sentences(kw["corpus"], kw["sentences"], kw["seed"])
    cfg = EmbedConfig(
        out_dir=kw["out_dir"], encoder=EncoderConfig(kw["pooling"], kw["max_seq_length"], kw["normalize"]),
        batch_size=kw["batch_size"], mini_batch=kw["mini_batch"], epochs=kw["epochs"], max_steps=kw["max_steps"],
        learning_rate=kw["learning_rate"], warmup=kw["warmup_ratio"], weight_decay=kw["weight_decay"],
        scale=1 / kw["temperature"], symmetric=kw["symmetric"], seed=kw["seed"], precision=kw["precision"],
        device=kw["device"], save_every=kw["save_every"])

    def evaluate(encoder):
        return score(encoder, kw["sts"], kw["retrieval"], kw["data_dir"], batch_size=kw["eval_batch_size"])

    summary = train_embeddings(kw["model_path"], rows, cfg, evaluate if kw["sts"] or kw["retrieval"] else None)
    click.echo(json.dumps({"model": str(Path(kw["out_dir"]) / "model"), "steps": summary["steps"],
                           "seconds": summary["seconds"], **summary["scores"]}, indent=1))


def _encoder(model_path, max_seq_length: int | None):
    """The folder's encoder, cut at `max_seq_length` tokens when given (as sentence-transformers' max_seq_length)."""
    from bertkit.embeddings.encoder import SentenceEncoder

    return SentenceEncoder.from_folder(model_path, max_seq_length=max_seq_length)


@click.command("evaluate-embeddings")
@click.argument("model_path", required=False, type=click.Path(exists=True, file_okay=False))
@evaluation_options
@click.option("--max-seq-length", type=click.IntRange(8, 8192),
              help="Cut each text to this many tokens (default: as the folder records, else 128).")
@click.option("--floors-only", is_flag=True, help="No model: the character-overlap and BM25 floors alone.")
@click.option("--out", "out_file", type=click.Path(dir_okay=False), help="Also write the scores to this JSON file.")
@friendly_errors
def evaluate_embeddings(model_path, sts, retrieval, data_dir, eval_batch_size, max_seq_length, floors_only,
                        out_file):
    """Score a sentence encoder (any model folder; a sentence-transformers folder's pooling is read) on STS
    (cosine Spearman / Pearson) and retrieval (Recall@1/5/10, MRR@10, nDCG@10, exact search), each beside its
    floors: character overlap (STS), BM25 over words and over character bigrams (retrieval)."""
    from bertkit.embeddings.evaluate import score
    from bertkit.fileio import atomic_write_json, disk_errors

    if not sts and not retrieval:
        raise click.UsageError("name at least one --sts or --retrieval set")
    if (model_path is None) != floors_only:
        raise click.UsageError("give MODEL_PATH, or --floors-only without one")
    if out_file:
        refuse_to_replace(Path(out_file), _is_scores)
    encoder = None if floors_only else _encoder(model_path, max_seq_length)
    scores = score(encoder, sts, retrieval, data_dir, batch_size=eval_batch_size)
    if out_file:
        with disk_errors(Path(out_file).parent, "free space, then run the same command again"):
            atomic_write_json(Path(out_file), scores)
    click.echo(json.dumps(scores, indent=1))


@click.command("encode")
@click.argument("model_path", type=click.Path(exists=True, file_okay=False))
@click.argument("text_file", type=RowsSource())
@click.option("--out", "out_file", required=True, type=click.Path(dir_okay=False),
              help="An Arrow file: columns text and embedding (float32), one row per line of TEXT_FILE.")
@click.option("--text-field", default="text", show_default=True,
              help="TEXT_FILE as a 🤗 dataset (a save_to_disk folder, hf:NAME:SPLIT): the column of texts.")
@click.option("--batch-size", default=64, show_default=True, type=count(1))
@click.option("--normalize/--no-normalize", default=None, help="Unit-length vectors (default: as the folder says).")
@click.option("--max-seq-length", type=click.IntRange(8, 8192),
              help="Cut each text to this many tokens (default: as the folder records, else 128).")
@friendly_errors
def encode(model_path, text_file, out_file, batch_size, normalize, max_seq_length, text_field):
    """Embed each line of TEXT_FILE (UTF-8, lines end at \\n or \\r\\n only; empty lines kept as empty texts), or
    each row's --text-field of a 🤗 dataset, with MODEL_PATH."""
    from bertkit.embeddings.encoder import write_embeddings
    from bertkit.fileio import disk_errors
    from bertkit.finetune.classify import read_utf8, text_lines
    from bertkit.hf_rows import dataset_texts, is_dataset
    from bertkit.progress import tqdm

    if Path(out_file).resolve() == Path(text_file).resolve():
        raise click.UsageError("--out names TEXT_FILE itself; give the vectors another file")
    refuse_to_replace(Path(out_file), _is_embeddings)
    texts = dataset_texts(text_file, text_field) if is_dataset(text_file) else text_lines(read_utf8(text_file))
    encoder = _encoder(model_path, max_seq_length)
    with tqdm(total=len(texts), desc="encode", unit="text") as bar:
        vectors = encoder.encode(texts, batch_size, normalize, progress=bar.update)
    with disk_errors(Path(out_file).parent, "free space, then run the same command again"):
        write_embeddings(Path(out_file), texts, vectors)
    click.echo(f"{len(texts):,} vectors of {vectors.shape[1]} -> {out_file}")
