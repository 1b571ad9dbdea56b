"""`bertkit train-tokenizer`: flags -> pipelines.train_tokenizer.TokenizerConfig."""
import os

import click

from bertkit.commands import Size, count, default_workers
from bertkit.pipelines.engine import ENGINE_HELP, ENGINES, RAY_ADDRESS_HELP


@click.command("train-tokenizer")
@click.argument("corpus_dir", required=False, type=click.Path(file_okay=False))
@click.option("--out", default="tokenizer", show_default=True, type=click.Path(file_okay=False),
              help="Tokenizer folder to write (the default is where make-instances looks).")
@click.option("--vocab-size", default=30522, show_default=True, type=count(16),
              help="Target vocabulary size, special tokens included.")
@click.option("--uncased/--cased", "lowercase", default=None,
              help="Lower-case and strip Latin accents (default), or keep case and accents. "
                   "With --vocab, the default is guessed from the vocabulary (capitals in it mean cased).")
@click.option("--strip-accents", type=click.Choice(["auto", "latin", "all", "none"]), default="auto",
              show_default=True,
              help="Uncased only. latin: drop accents of Latin/Greek/Cyrillic letters, keep Hangul syllables and "
                   "kana voicing marks (used when training); all: original BERT (NFD, drop every combining mark; "
                   "splits Hangul into jamo); none: lower-case only. auto: latin when training; with --vocab, all "
                   "if the vocabulary was built that way (Hangul as jamo, kana without voicing marks), else latin.")
@click.option("--min-frequency", default=2, show_default=True, type=count(1),
              help="Least count of a pair to be merged.")
@click.option("--limit-alphabet", type=count(1), default=None,
              help="Keep only the N most frequent characters (others become [UNK]). Default: keep every "
                   "character of the corpus, so rare Hangul syllables and Hanja are not lost.")
@click.option("--vocab", "vocab_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Use this existing vocab.txt (e.g. bert-base-uncased's) instead of training; CORPUS_DIR is then "
                   "optional and only used for the held-out statistics.")
@click.option("--pretokenize", type=click.Choice(["auto", "none", "mecab", "kiwi"]), default="auto", show_default=True,
              help="Korean: cut words at morpheme boundaries (MeCab-ko or Kiwi) while training the vocabulary, as "
                   "KLUE-BERT did; the tokenizer still reads raw text. auto: kiwi when most of the corpus' words are "
                   "Korean (measured best on Korean tasks), else none. Needs pip install 'bertkit[korean]'.")
@click.option("--sample-bytes", default="auto", show_default=True, metavar="SIZE|all|auto", type=Size(("all", "auto")),
              help="Learn the merges on at most this much text (e.g. 10GB), documents chosen by a hash of their id; "
                   "the alphabet still comes from all of the text. all: every byte. auto: a 1GB sample of larger "
                   "corpora (256MB with a Korean morpheme analyser, --pretokenize), else all of it.")
@click.option("--stats-sentences", default=100_000, show_default=True, type=count(0),
              help="Held-out sentences measured for the [UNK] rate and pieces per word.")
@click.option("--workers", "-j", default=default_workers(), show_default="CPUs, at most 8", type=click.IntRange(min=1),
              help="Processes for the passes over every shard (the alphabet); the output is the same for any number.")
@click.option("--engine", type=click.Choice(ENGINES), default="local", show_default=True, help=ENGINE_HELP)
@click.option("--ray-address", default=None, metavar="HOST:PORT", help=RAY_ADDRESS_HELP)
@click.option("--overwrite", is_flag=True, help="Replace an OUT made from another corpus or with other settings.")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="A progress bar; --no-progress: a plain line each minute or 5 % instead.")
def train_tokenizer(corpus_dir, out, **flags):
    """Train a BERT WordPiece vocabulary on CORPUS_DIR (a prepare-corpus folder; default ./corpus).

    OUT gets vocab.txt, tokenizer.json, tokenizer_config.json, special_tokens_map.json and manifest.json;
    it loads in bertkit, in HF tokenizers (Tokenizer.from_file) and in transformers (AutoTokenizer).
    Re-running with the same corpus and settings is a no-op.

    \b
    Examples:
      bertkit train-tokenizer corpus/ --out tokenizer/
      bertkit train-tokenizer corpus/ --out tokenizer/ --cased --vocab-size 32000
      bertkit train-tokenizer corpus/ --out bbu/ --vocab bert-base-uncased/vocab.txt
      bertkit train-tokenizer /shared/corpus/ --out /shared/tok/ --sample-bytes 10GB --engine ray
    """
    from bertkit.fileio import FolderError
    from bertkit.formats import FormatError
    from bertkit.pipelines.engine import EngineError
    from bertkit.pipelines.train_tokenizer import TokenizerConfig, train_tokenizer as run
    from bertkit.tokenization import TokenizerError

    if corpus_dir is None and flags["vocab_file"] is None:
        corpus_dir = "corpus"  # prepare-corpus's default output
        if not os.path.isdir(corpus_dir):
            raise click.UsageError("give CORPUS_DIR to train on (./corpus, prepare-corpus's default, does not exist), "
                                   "or --vocab FILE to use an existing vocabulary")
    if flags["ray_address"] and flags["engine"] != "ray":
        raise click.UsageError("--ray-address is for --engine ray")
    if flags["sample_bytes"] == "all":
        flags["sample_bytes"] = None
    config = TokenizerConfig(**flags)   # the flags are named as its fields
    try:
        m = run(corpus_dir, out, config)
    except (TokenizerError, FormatError, FolderError, EngineError) as e:
        raise click.ClickException(str(e)) from None
    case = f"uncased, strip accents: {m.settings['strip_accents']}" if m.settings["lowercase"] else "cased"
    click.echo(f"{out}: {m.vocab_size} tokens ({m.source}, {case}), vocab sha256 {m.vocab_sha256[:12]}")
    for w in m.warnings:
        click.echo(f"warning: {w}", err=True)
    if m.stats:
        s = m.stats
        click.echo(f"  {s['split']}: {s['sentences']} sentences, [UNK] {100 * s['unk_word_rate']:.3f}% of words, "
                   f"{s['pieces_per_word']:.3f} pieces per word")
    click.echo(f"next: bertkit make-instances {corpus_dir} --tokenizer {out} --out instances/", err=True)
