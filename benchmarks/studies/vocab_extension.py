"""Does extending a released English model's vocabulary pay when it continues pretraining on Korean? (issue 83's
measurement of `bertkit extend-vocab`; a study, run by hand)

Asks: all-MiniLM-L6-v2 (English, uncased WordPiece with original BERT's accent stripping, which spells Hangul as
jamo) continues pretraining on Korean Wikipedia for one fixed number of steps, as a decay phase; does growing its
vocabulary first by 8,000 Korean tokens (`bertkit extend-vocab`: its 994 unused slots, then appended, each new row
the mean of the rows of the pieces the old tokenizer spells it with) score better on a Korean task than continuing
with its own vocabulary?

Arms: `minilm` (the released model, no Korean pretraining), `extended` (its vocabulary grown, no pretraining: what the
initialisation alone gives), `minilm-decay` and `extended-decay` (each after --steps of MLM on Korean Wikipedia: AdamW
at --lr, 5 % warmup then a 1 - sqrt decay to 0, 128-token MLM-only rows), and each vocabulary's
`-merged` arm (`bertkit merge --method mean` of the decay exports of --merge-seeds, recorded under
`merged_from` and made again where the work folder lacks them: does the merge beat each seed alone?), and the
`-headfirst-decay` arms (--head-steps of `pretrain --train-only` first: MiniLM's random MLM head alone, or the
extended model's head and word embeddings, the encoder frozen; then the same decay: does the decay still cost
KorSTS once the head has learnt before its gradients reach the encoder?). Each
scored on KorSTS (Pearson on its dev set, the last of 3 epochs at 5e-5: MiniLM's better rate of two,
benchmarks/studies/korean_transfer.py), seeds 0 1 2 for both pretraining and fine-tuning. Beside them, each tokenizer on
the held-out Korean documents: [UNK] share of the words and tokens per word.

    python benchmarks/studies/vocab_extension.py --work /tmp/vocab-ext [--steps 300] [--seeds 0 1 2] [--arms ...]

Quality against steps: it may run beside other work; each cell is appended to results/vocab_extension.json as it
finishes and skipped when run again.
"""
import argparse
import json
import statistics
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import SHARED, done, masked_only_accuracy, say, trained_to_the_end
from record import read_result, run_info, write_result

from bertkit.testing import minilm_dir

NAME = "vocab_extension"
ARMS = ("minilm", "extended", "minilm-decay", "extended-decay", "extended-merged", "minilm-merged",
        "minilm-headfirst-decay", "extended-headfirst-decay")


def prepare(work: Path, max_new: int) -> dict:
    """Korean Wikipedia's corpus, a Korean tokenizer, the extended model, and MLM-only instances for each
    vocabulary."""
    from bertkit.extend_vocab import extend_vocab
    from bertkit.pipelines.make_instances import InstancesConfig, make_instances
    from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus
    from bertkit.pipelines.train_tokenizer import TokenizerConfig, train_tokenizer

    if not done(work / "corpus"):
        say("prepare-corpus: Korean Wikipedia")
        prepare_corpus([SHARED / "wikipedia_ko_wikiextractor"], work / "corpus",
                       CorpusConfig(workers=2, holdout=0.01, progress=False))
    if not done(work / "ko-tokenizer"):
        say("train-tokenizer (Korean, 16,000)")
        train_tokenizer(work / "corpus", work / "ko-tokenizer",
                        TokenizerConfig(vocab_size=16000, pretokenize="none", progress=False))
    if not done(work / "extended"):
        extend_vocab(minilm_dir(), work / "ko-tokenizer", work / "extended", max_new)
    for arm, model in (("minilm", minilm_dir()), ("extended", work / "extended")):
        if not done(work / f"{arm}-instances"):
            say(f"make-instances with {arm}'s vocabulary")
            make_instances(work / "corpus", model, work / f"{arm}-instances",
                           InstancesConfig(max_seq_length=128, objective="none", mode="dynamic", dupe=1, workers=2),
                           progress=False)
    return json.loads((work / "extended" / "manifest.json").read_text())["extension"]


def tokenizer_stats(work: Path) -> dict:
    """[UNK] share of the words and tokens per word of each vocabulary on the held-out documents."""
    from bertkit.fileio import read_arrow
    from bertkit.formats import read_corpus_manifest
    from bertkit.tokenization import load_tokenizer

    manifest = read_corpus_manifest(work / "corpus")
    texts = [" ".join(s) for shard in manifest.shards if shard.split == "holdout"
             for s in read_arrow(work / "corpus" / shard.file).column("sentences").to_pylist()]
    words = [w for t in texts for w in t.split()]
    found = {}
    for arm, model in (("minilm", minilm_dir()), ("extended", work / "extended")):
        tok = load_tokenizer(model)
        encoded = tok.encode_batch(words, add_special_tokens=False)
        found[arm] = {"unk_word_share": round(sum("[UNK]" in e.tokens for e in encoded) / len(words), 4),
                      "tokens_per_word": round(sum(len(e.ids) for e in encoded) / len(words), 3),
                      "words": len(words)}
    return found


def decayed(work: Path, arm: str, seed: int, steps: int, lr: float, head_steps: int = 0) -> Path:
    """The arm's model after --steps of Korean MLM from its start (exported); with head_steps, after that many steps
    of `--train-only` first (the MLM head, and an extended vocabulary's embeddings; the encoder frozen)."""
    from bertkit.pretrain import export

    start = minilm_dir() if arm == "minilm" else work / "extended"
    name = f"{arm}-headfirst" if head_steps else arm
    if head_steps:
        start = trained(work, work / f"run-{name}-head-{seed}", arm, start, seed, head_steps, lr,
                        train_only=("head",) if arm == "minilm" else ("head", "embeddings"))
    run, model = work / f"run-{name}-{seed}", work / f"model-{name}-decay-{seed}"
    exported = json.loads((model / "manifest.json").read_text()).get("checkpoint") if done(model) else None
    if exported != f"global_step{steps}":   # none yet, or one of a run stopped short (a signal saves and returns)
        export(trained(work, run, arm, start, seed, steps, lr), model)
    return model


def trained(work: Path, run: Path, arm: str, start: Path, seed: int, steps: int, lr: float,
            train_only: tuple = ()) -> Path:
    """`run` after `steps` of Korean MLM from `start` (resumed where it stopped): AdamW at lr, 5 % warmup, then a
    1 - sqrt decay to 0 over the whole run (train_only: no decay, the head's phase before one)."""
    from bertkit.pretrain import PretrainConfig, pretrain
    from bertkit.pretrain.checkpoints import find_checkpoint

    marker = find_checkpoint(run).marker if (run / "checkpoints").is_dir() else None
    if marker is None or marker.step < steps:
        say(f"pretrain {run.name}: {steps} steps{' training only ' + ','.join(train_only) if train_only else ''}")
        result = pretrain(PretrainConfig(
            instances=str(work / f"{arm}-instances"), out=str(run), init_from=str(start), objective="mlm",
            max_steps=steps, micro_batch=32, optimizer="adamw", lr=lr, schedule="wsd", warmup=0.05,
            decay=0.0 if train_only else 1.0, train_only=train_only, seed=seed, num_workers=1, progress=False,
            log_every=50, eval_every=250, save_every=250 if steps > 250 else steps, precision="fp32",
            report_to="none", resume=(run / "checkpoints").is_dir()))
        trained_to_the_end(result, steps, run)
    return run


def merged(work: Path, arm: str, seeds: list[int], steps: int, lr: float) -> Path:
    """The mean of the arm's decay exports of `seeds`, each made again where this work folder lacks it (a run is
    deterministic for its seed, so a folder made again merges the same models)."""
    from bertkit.merge import merge

    out = work / f"model-{arm}-merged-{'-'.join(map(str, seeds))}"
    if not (out / "model.safetensors").is_file():
        exports = [decayed(work, arm, seed, steps, lr) for seed in seeds]
        say(f"merge {arm}: the mean of seeds {seeds}")
        merge(exports, out, method="mean")
    return out


def arm_model(args, arm: str, seed: int, made: list[int] | None) -> Path:
    base = arm.split("-")[0]
    if arm == base:
        return minilm_dir() if base == "minilm" else args.work / "extended"
    if arm.endswith("-merged"):
        return merged(args.work, base, made, args.steps, args.lr)
    return decayed(args.work, base, seed, args.steps, args.lr, args.head_steps if "-headfirst" in arm else 0)


def held_out_mlm(args, base: str, made: list[int]) -> dict:
    """Every-chosen-token-masked accuracy and loss (benchlib.masked_only_accuracy, 400 held-out rows) of each decay
    seed's export and of their merge: the heads were drawn at random per seed, so a merge averages two heads."""
    models = {f"decay/{seed}": decayed(args.work, base, seed, args.steps, args.lr) for seed in made}
    models["merged"] = merged(args.work, base, made, args.steps, args.lr)
    return {name: {k: round(v, 4) for k, v in masked_only_accuracy(model, args.work / f"{base}-instances").items()
                   if k in ("masked_only_acc", "loss")} for name, model in models.items()}


def finetune_name(args, arm: str, seed: int, made: list[int] | None) -> str:
    """The fine-tune's folder, named by what it starts from (a decay's budget, a merge's seeds)."""
    if arm.endswith("-merged"):
        return f"korsts-{arm}-{'-'.join(map(str, made))}-{seed}"
    budget = (f"-{args.head_steps}head" if "-headfirst" in arm else "") + \
        (f"-{args.steps}steps" if arm.endswith("-decay") else "")
    return f"korsts-{arm}-{seed}{budget}"


def korsts(model: Path, out: Path, seed: int) -> float:
    from bertkit.finetune.korean import finetune_korean
    from bertkit.finetune.train import TrainConfig, finished_fine_tuning

    summary = finished_fine_tuning(out) or finetune_korean(
        "korsts", SHARED, model, TrainConfig(out_dir=str(out), epochs=3, batch_size=32, learning_rate=5e-5, seed=seed,
                                             save_model=False, report_to="none", precision="fp32"))
    return summary["best"]["pearson"]


def summary(cells: dict) -> dict:
    """arm: [mean, sd, seeds] of its KorSTS cells."""
    arms = dict.fromkeys(k.split("/")[0] for k in cells)
    return {a: [round(statistics.mean(v), 4), round(statistics.pstdev(v), 4), len(v)]
            for a in arms if (v := [c for k, c in cells.items() if k.split("/")[0] == a])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=300, help="the decay run's steps (about 22 minutes on 2 cores)")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--max-new", type=int, default=8000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="the arms to score, in this order")
    ap.add_argument("--head-steps", type=int, default=100,
                    help="the -headfirst arms: steps of --train-only before the decay (its --steps on top)")
    ap.add_argument("--merge-seeds", type=int, nargs="+", default=None,
                    help="the decay seeds each merged arm averages (default: those it recorded, else --seeds)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    extension = prepare(args.work, args.max_new)
    result = read_result(NAME)
    if result.get("extension", extension) != extension:
        raise SystemExit(f"{args.work}: its extended vocabulary differs from the one recorded in "
                         f"results/{NAME}.json ({extension} against {result['extension']}); its cells would mix two "
                         "models: start from a new --work folder and a new result")
    if result.get("steps") != args.steps or result.get("lr") != args.lr:   # another budget: its trained cells go
        result["cells"] = {k: v for k, v in result.get("cells", {}).items() if k.split("/")[0] in ARMS[:2]}
    if result.get("head_steps", args.head_steps) != args.head_steps:
        result["cells"] = {k: v for k, v in result["cells"].items() if "-headfirst" not in k}
    result.update(run_info(NAME), steps=args.steps, lr=args.lr, head_steps=args.head_steps, extension=extension,
                  tokenizers=result.get("tokenizers") or tokenizer_stats(args.work))
    write_result(NAME, result)
    cells = result.setdefault("cells", {})
    for arm in args.arms:
        base, made = arm.split("-")[0], None
        if arm.endswith("-merged"):   # each fine-tuning seed scores the one merged model
            made = args.merge_seeds or result.get("merged_from", {}).get(base) or args.seeds
            if result.setdefault("merged_from", {}).get(base) != made:   # another set of seeds merged: its cells go
                for key in [k for k in cells if k.split("/")[0] == arm]:
                    del cells[key]
                result["merged_from"][base], result["summary"] = made, summary(cells)
        if made and arm not in result.get("held_out_mlm", {}):   # the merge and its inputs on held-out Korean MLM
            result.setdefault("held_out_mlm", {})[arm] = held_out_mlm(args, base, made)
            write_result(NAME, result)
        for seed in args.seeds:
            if f"{arm}/{seed}" in cells:
                continue
            cells[f"{arm}/{seed}"] = korsts(arm_model(args, arm, seed, made), args.work / finetune_name(args, arm,
                                                                                                     seed, made), seed)
            result["summary"] = summary(cells)
            write_result(NAME, result)
            say(f"{arm} seed {seed}: KorSTS Pearson {cells[f'{arm}/{seed}']:.4f}")
    print(f"{'arm':16} {'KorSTS Pearson':>16} {'seeds':>6}")
    for arm, (mean, sd, n) in result.get("summary", {}).items():
        print(f"{arm:16} {mean:>9.4f} ± {sd:.4f} {n:>6}")


if __name__ == "__main__":
    main()
