"""`bertkit make-instances`: maps flags onto pipelines.make_instances.InstancesConfig and runs the stage."""
import click

from bertkit.commands import PROBABILITY, SEED, NumberList, Real, count, default_workers
from bertkit.pipelines.engine import ENGINE_HELP, ENGINES, RAY_ADDRESS_HELP
from bertkit.recipes import RECIPES, as_flags


@click.command("make-instances")
@click.argument("corpus_dir", default="corpus", required=False, type=click.Path(file_okay=False))
@click.option("--tokenizer", "tokenizer_dir", default="tokenizer", show_default=True, type=click.Path(),
              help="train-tokenizer output folder, HF model folder, or a vocab.txt.")
@click.option("--out", "-o", default="instances", show_default=True, type=click.Path(file_okay=False),
              help="Output folder (the default is where pretrain looks).")
@click.option("--max-seq-length", default=128, show_default=True, type=click.IntRange(8, 8192),
              help="Tokens per instance: 8..512 with NSP/SOP (BERT's positions); up to 8,192 with --objective none "
                   "(MLM only, for ModernBERT).")
@click.option("--max-predictions", default=None, type=count(1), show_default="20 at 0.15, else max-seq-length x rate",
              help="Most masked positions per instance.")
@click.option("--masked-lm-prob", default=0.15, show_default=True, type=Real(0, 1, min_open=True, max_open=True),
              help="Share of tokens to predict (BERT 0.15; 0.3-0.4 helped larger models in Wettig et al. 2023).")
@click.option("--mask-replace", default="0.8,0.1,0.1", show_default=True,
              type=NumberList(click.FLOAT, unique=False, example="0.8,0.1,0.1"),
              help="Shares of the chosen tokens replaced by [MASK], kept, replaced by a random token.")
@click.option("--objective", type=click.Choice(["nsp", "sop", "none"]), default="nsp", show_default=True,
              help="nsp: BERT's next-sentence pairs; sop: ALBERT's sentence order (same document, swapped for "
                   "the negative); none: RoBERTa's full sentences across documents, MLM only.")
@click.option("--short-seq-prob", default=0.1, show_default=True, type=PROBABILITY,
              help="Probability that a document's target length is drawn in [2, max-seq-length - 3].")
@click.option("--dupe", default=None, type=count(1), show_default="10 static, 1 dynamic",
              help="Passes over the corpus, each with new pairs and masks.")
@click.option("--seed", default=12345, show_default=True, type=SEED)
@click.option("--whole-word-mask", is_flag=True, help="Mask whole words (a ## piece joins the word before it).")
@click.option("--mode", type=click.Choice(["static", "dynamic"]), default="static", show_default=True,
              help="static: masked here; dynamic: unmasked pairs, masked by the pretraining loader each epoch.")
@click.option("--workers", "-j", default=default_workers(), show_default="CPUs, at most 8",
              type=click.IntRange(min=1), help="Processes; the output is byte-identical for any number.")
@click.option("--engine", type=click.Choice(ENGINES), default="local", show_default=True, help=ENGINE_HELP)
@click.option("--ray-address", default=None, metavar="HOST:PORT", help=RAY_ADDRESS_HELP)
@click.option("--compat", type=click.Choice(["google"]), default=None,
              help="Replay google-research/bert's create_pretraining_data.py exactly (single process, in memory).")
@click.option("--random-from-whole-vocab", is_flag=True,
              help="Reference behaviour: random replacements may be [PAD], [CLS], [unused..] and other specials.")
@click.option("--wwm-decide-per-piece", is_flag=True,
              help="Reference behaviour: whole-word masking draws [MASK]/random/kept per piece, not per word.")
@click.option("--same-doc-notnext", is_flag=True,
              help="Reference behaviour: a NotNext B may come from A's own document (always, in a one-document "
                   "corpus) and is still labelled NotNext.")
@click.option("--rehydrate", default=None, metavar="fineweb2|N:W,...",
              help="Repeat each training document by the size of its near-duplicate cluster (the cluster_size column "
                   "of prepare-corpus --near-dedup), each copy with its own pairs and masks. fineweb2: FineWeb2's "
                   "weights (a cluster of 1: once; 2: twice; 3-4: 3; 5-99: 5; 100-999: 8; 1,000 or more: once, "
                   "taken to be boilerplate); or your own bounds and appearances, as 1:1,2:2,5:4. The held-out "
                   "split is never repeated.")
@click.option("--recipe", type=click.Choice(sorted(RECIPES)),
              help="The instances a pretraining recipe was measured on; the flags you give win over it. budget: "
                   + as_flags(RECIPES["budget"]["make-instances"]) + " (then pretrain --recipe budget).")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="A progress bar; --no-progress: a plain line each minute or 5 % instead.")
def make_instances(corpus_dir, tokenizer_dir, out, progress, **flags):
    """Make MLM + NSP pretraining instances from a prepare-corpus folder (google-research/bert's rules).

    Re-running the same command resumes an interrupted run: finished files are kept, the rest redone.

    \b
    Examples:
      bertkit make-instances corpus/ --tokenizer tok/ --out instances/
      bertkit make-instances corpus/ --tokenizer tok/ --out inst-dyn/ --mode dynamic
      bertkit make-instances corpus/ --tokenizer vocab.txt --out inst-google/ --compat google
      bertkit make-instances /shared/corpus/ --tokenizer /shared/tok/ --out /shared/inst/ --engine ray
    """
    from bertkit.fileio import FolderError
    from bertkit.formats import FormatError
    from bertkit.pipelines.engine import EngineError
    from bertkit.pipelines.make_instances import InstancesConfig, make_instances as run

    if flags["ray_address"] and flags["engine"] != "ray":
        raise click.UsageError("--ray-address is for --engine ray")
    ctx = click.get_current_context()
    given = {k for k in flags if ctx.get_parameter_source(k) is not click.core.ParameterSource.DEFAULT}
    if flags["recipe"]:
        click.echo(f"recipe {flags['recipe']}: {as_flags(RECIPES[flags['recipe']]['make-instances'])}", err=True)
    try:
        config = InstancesConfig.from_flags(flags, given)   # a recipe fills the flags left at their defaults
        manifest = run(corpus_dir, tokenizer_dir, out, config, progress=progress)
    except (FormatError, FolderError, EngineError) as e:
        raise click.ClickException(str(e))
    s = manifest.stats
    line = (f"make-instances: {s['instances'].get('train', 0):,} train + {s['instances'].get('holdout', 0):,} "
            f"holdout instances ({manifest.mode}) in {len(manifest.shards)} file(s) -> {out}\n"
            + {"nsp": f"  NotNext {s['not_next_share']:.1%}, ", "sop": f"  swapped {s['not_next_share']:.1%}, ",
               "none": "  one segment each, "}[manifest.objective]
            + f"mean length {s['mean_length']:.1f}")
    if manifest.mode == "static":
        line += (f", selected {s['selected_fraction']:.2%} of tokens: [MASK] {s['mask_share']:.1%} / "
                 f"random {s['random_share']:.1%} / kept {s['kept_share']:.1%}")
    if "rehydrated" in s:
        r = s["rehydrated"]
        line += (f"\n  rehydrated: {r['documents']:,} training documents appear {r['appearances']:,} times a pass "
                 f"(--rehydrate {config.rehydrate})")
    click.echo(line, err=True)
    model = "tiny (or modernbert-tiny)" if manifest.objective == "none" else "tiny"
    click.echo(f"next: bertkit pretrain --instances {out} --model {model} --out runs/pretrain (one process), or "
               f"deepspeed --num_gpus N --module bertkit pretrain --instances {out} …", err=True)
