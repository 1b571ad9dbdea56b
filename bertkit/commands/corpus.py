"""`bertkit prepare-corpus`: maps flags onto pipelines.prepare_corpus.CorpusConfig and runs the stage."""
import click

from bertkit.commands import Real, Size, default_workers
from bertkit.pipelines.engine import ENGINE_HELP, ENGINES, RAY_ADDRESS_HELP


@click.command("prepare-corpus")
@click.argument("inputs", nargs=-1, metavar="INPUT...")
@click.option("--out", "-o", default="corpus", show_default=True, type=click.Path(file_okay=False),
              help="Output folder (the default is where train-tokenizer and make-instances look).")
@click.option("--format", default="auto", show_default=True,
              type=click.Choice(["auto", "wikiextractor", "lines", "paragraphs", "jsonl", "csv", "tsv", "parquet",
                                 "arrow"]),
              help="Input format for every file; auto detects per file (.csv/.tsv by name, each row a document; plain "
                   "text counts as paragraphs).")
@click.option("--text-field", default="text", show_default=True,
              help="JSON Lines field / CSV-TSV column (named by the header row) / Parquet-Arrow column with the text.")
@click.option("--split", default="train", show_default=True,
              help="An INPUT that is a 🤗 DatasetDict saved with save_to_disk: the split read (a saved Dataset's "
                   "Arrow files are read as they are, its metadata files never as text).")
@click.option("--hf-dataset", metavar="NAME",
              help="A 🤗 dataset by its Hub name (or a folder of its data files), read from the cache load_dataset "
                   "keeps (made there first if need be; HF_DATASETS_OFFLINE=1: the cache alone), --split and "
                   "--text-field as for any input; with or without INPUT.")
@click.option("--hf-config", metavar="NAME", help="--hf-dataset's configuration (a language, a subset).")
@click.option("--language", default="auto", show_default=True,
              help="sentencex language code (en, ko, ja, de, ...); auto: Hangul -> ko, kana -> ja, else en, "
                   "per document.")
@click.option("--splitter", type=click.Choice(["sentencex", "kss", "kiwi"]), default="sentencex", show_default=True,
              help="Sentence splitter for Korean documents (others always use sentencex): kss (MeCab) is the most "
                   "accurate on Korean and ~800x slower; kiwi in between (pipelines/README.md).")
@click.option("--min-chars", default=50, show_default=True, type=click.IntRange(min=0), help="Drop shorter documents.")
@click.option("--min-sentences", default=1, show_default=True, type=click.IntRange(min=0),
              help="Drop documents with fewer sentences.")
@click.option("--holdout", default=0.01, show_default=True, type=Real(0, 1, max_open=True),
              help="Fraction of documents held out (chosen by a hash of the text: stable across runs).")
@click.option("--shard-size", default="64MB", show_default=True, type=Size(),
              help="Text bytes per shard, e.g. 64MB, 512KB.")
@click.option("--near-dedup", is_flag=True,
              help="Also remove near-duplicates: documents whose word 5-gram sets reach --near-dedup-threshold "
                   "Jaccard (MinHash-LSH, every candidate pair checked by its true Jaccard). The first of each "
                   "cluster in input order is kept, with a cluster_size column.")
@click.option("--near-dedup-threshold", default=0.8, show_default=True, type=Real(0, 1, min_open=True),
              help="Jaccard at which two documents are one (the bands x rows are chosen for it and recorded).")
@click.option("--near-dedup-bands", metavar="BxR", default=None,
              help="MinHash bands x rows instead of the ones chosen for the threshold (datatrove's: 14x8).")
@click.option("--filters", default="none", show_default=True, metavar="PRESET|FILE",
              help="Quality rules over each document's signals: none, gopher (Gopher's rules), fineweb (FineWeb's "
                   "English: Gopher's and its line rules), fineweb2 (FineWeb2's per-language thresholds: Korean's for "
                   "Korean documents, FineWeb's for the rest; the choice for a crawl), or a TOML/JSON file of "
                   "{signal: {min, max}} (by language: [ko], [en]). Each drop is counted by the rule it broke; the "
                   "signals are stored, so a corpus made with --keep-removed, given as INPUT, is judged again by "
                   "other rules without its raw text.")
@click.option("--languages", default="", metavar="ko,en,...",
              help="Keep only documents in these languages (ISO 639-1), identified offline (py3langid, on each "
                   "document's first 2,000 characters); each document's language goes in a `language` column. "
                   "[default: every language, none identified]")
@click.option("--language-score", default=0.5, show_default=True, type=Real(0, 1),
              help="With --languages: the least probability of the language identified for a document kept.")
@click.option("--keep-removed", is_flag=True,
              help="Write the documents the steps took out, each with its reason (the manifest's names), to "
                   "OUT/removed/ (Arrow, as the shards; no stage reads them): to look at, or to take back.")
@click.option("--pii", type=click.Choice(["keep", "redact", "drop"]), default="keep", show_default=True,
              help="Personal data (e-mail and IP addresses, phone numbers, Korean resident registration numbers, "
                   "Luhn-checked card numbers): redact puts [EMAIL], [PHONE], [RRN], [CARD], [IP] in their place, "
                   "drop removes the document; either way a document with more than 5 is dropped (dolma's rule).")
@click.option("--decontaminate", multiple=True, type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="An evaluation file as published (SQuAD/KorQuAD or KLUE JSON, JSON lines, TSV/CSV, text; "
                   "repeatable): corpus text sharing a word 13-gram with it (a text of 8-12 words: the whole text) "
                   "is removed, and each file's matches are counted.")
@click.option("--decontaminate-mode", type=click.Choice(["sentences", "documents"]), default="sentences",
              show_default=True, help="What goes where a match is found: its sentences, or the whole document.")
@click.option("--decontaminate-max-docs", default=10, show_default=True, type=click.IntRange(min=1),
              help="An n-gram found in more corpus documents than this is a common phrase, not a leak: kept.")
@click.option("--workers", "-j", default=default_workers(), show_default="CPUs, at most 8", type=click.IntRange(min=1),
              help="Processes; the output is byte-identical for any number.")
@click.option("--engine", type=click.Choice(ENGINES), default="local", show_default=True, help=ENGINE_HELP)
@click.option("--ray-address", default=None, metavar="HOST:PORT", help=RAY_ADDRESS_HELP)
@click.option("--overwrite", is_flag=True,
              help="Replace an existing output or an unfinished run made with other options.")
@click.option("--strict", is_flag=True, help="Exit non-zero if any input had a problem (the output is still written).")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="A progress bar; --no-progress: a plain line each minute or 5 % instead.")
def prepare_corpus(inputs, out, **flags):
    """Clean, sentence-split and deduplicate raw text into Arrow shards (the input of every later stage).

    INPUT may be files, folders (walked recursively, sorted) or globs; formats: WikiExtractor output, plain text
    (paragraphs, or one sentence per line with --format lines), JSON Lines, Parquet, Arrow; any of them may be
    .gz/.bz2/.xz/.zst compressed. Re-running the same command resumes an interrupted run.

    \b
    Examples:
      bertkit prepare-corpus wiki/ --out corpus/
      bertkit prepare-corpus 'dumps/*.jsonl.zst' --text-field content --out corpus/ --workers 8
      bertkit prepare-corpus books.txt --format lines --holdout 0.05 --out corpus/
      bertkit prepare-corpus --hf-dataset HAERAE-HUB/KOREAN-WEBTEXT --out corpus/
      bertkit prepare-corpus /shared/wiki/ --out /shared/corpus/ --engine ray --ray-address 10.0.0.1:6379
    """
    from bertkit.fileio import FolderError
    from bertkit.formats import FormatError
    from bertkit.pipelines.corpus_readers import InputError, hub_dataset_files
    from bertkit.pipelines.engine import EngineError
    from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus as run

    hf_dataset, hf_config = flags.pop("hf_dataset"), flags.pop("hf_config")
    if not inputs and not hf_dataset:
        raise click.UsageError("give INPUT files or folders, or --hf-dataset NAME")
    if hf_config and not hf_dataset:
        raise click.UsageError("--hf-config goes with --hf-dataset")
    if hf_dataset:
        try:
            inputs = (*inputs, *map(str, hub_dataset_files(hf_dataset, hf_config, flags["split"])))
        except InputError as e:
            raise click.ClickException(str(e)) from None
    try:
        config = CorpusConfig(**flags)   # the flags are named as its fields
    except ValueError as e:
        raise click.BadParameter(str(e))
    if config.ray_address and config.engine != "ray":
        raise click.UsageError("--ray-address is for --engine ray")
    try:
        run(list(inputs), out, config)
    except (FormatError, FolderError, EngineError) as e:
        raise click.ClickException(str(e))
    click.echo(f"next: bertkit train-tokenizer {out} --out tokenizer/", err=True)
