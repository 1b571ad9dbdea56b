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
`merged_from` and made again where the work folder lacks them: does the merge beat each seed alone?). Each
scored on KorSTS (Pearson on its dev set, the last of 3 epochs at 5e-5: MiniLM's better rate of two,
benchmarks/studies/korean_transfer.py), seeds 0 1 2 for both pretraining and fine-tuning. Beside them, each tokenizer on
the held-out Korean documents: [UNK] share of the words and tokens per word.

    python benchmarks/studies/vocab_extension.py --work /tmp/vocab-ext [--steps 300] [--seeds 0 1 2]

Quality against steps: it may run beside other work; each cell is appended to results/vocab_extension.json as it
finishes and skipped when run again.
"""
import argparse
import json
import statistics
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import SHARED, done, say, trained_to_the_end
from record import read_result, run_info, write_result

from bertkit.testing import minilm_dir

NAME = "vocab_extension"
ARMS = ("minilm", "extended", "minilm-decay", "extended-decay")


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


def decayed(work: Path, arm: str, seed: int, steps: int, lr: float) -> Path:
    """The arm's model after --steps of Korean MLM from its start (exported)."""
    from bertkit.pretrain import PretrainConfig, export, pretrain

    start = minilm_dir() if arm == "minilm" else work / "extended"
    run, model = work / f"run-{arm}-{seed}", work / f"model-{arm}-decay-{seed}"
    exported = json.loads((model / "manifest.json").read_text()).get("checkpoint") if done(model) else None
    if exported != f"global_step{steps}":   # none yet, or one of a run stopped short (a signal saves and returns)
        say(f"pretrain {arm}, seed {seed}: {steps} steps")
        result = pretrain(PretrainConfig(
            instances=str(work / f"{arm}-instances"), out=str(run), init_from=str(start), objective="mlm",
            max_steps=steps, micro_batch=32, optimizer="adamw", lr=lr, schedule="wsd", warmup=0.05, decay=1.0,
            seed=seed, num_workers=1, progress=False, log_every=50, eval_every=250, save_every=250,
            precision="fp32", report_to="none", resume=(run / "checkpoints").is_dir()))
        trained_to_the_end(result, steps, run)
        export(run, model)
    return model


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
    result.update(run_info(NAME), steps=args.steps, lr=args.lr, extension=extension,
                  tokenizers=result.get("tokenizers") or tokenizer_stats(args.work))
    write_result(NAME, result)
    cells = result.setdefault("cells", {})
    for seed in args.seeds:
        for arm in ARMS:
            if f"{arm}/{seed}" in cells:
                continue
            base = arm.removesuffix("-decay")
            model = decayed(args.work, base, seed, args.steps, args.lr) if arm.endswith("-decay") else \
                (minilm_dir() if base == "minilm" else args.work / "extended")
            tag = f"-{args.steps}steps" if arm.endswith("-decay") else ""   # a fine-tune of this budget's model only
            cells[f"{arm}/{seed}"] = korsts(model, args.work / f"korsts-{arm}-{seed}{tag}", seed)
            result["summary"] = summary(cells)
            write_result(NAME, result)
            say(f"{arm} seed {seed}: KorSTS Pearson {cells[f'{arm}/{seed}']:.4f}")
    for arm in ("extended", "minilm"):   # each fine-tuning seed scores the one merged model
        made = args.merge_seeds or result.get("merged_from", {}).get(arm) or args.seeds
        if result.setdefault("merged_from", {}).get(arm) != made:   # another set of seeds merged: its cells go
            for key in [k for k in cells if k.split("/")[0] == f"{arm}-merged"]:
                del cells[key]
            result["merged_from"][arm], result["summary"] = made, summary(cells)
        for seed in args.seeds:
            if f"{arm}-merged/{seed}" not in cells:
                model = merged(args.work, arm, made, args.steps, args.lr)
                out = args.work / f"korsts-{arm}-merged-{'-'.join(map(str, made))}-{seed}"
                cells[f"{arm}-merged/{seed}"] = korsts(model, out, seed)
                result["summary"] = summary(cells)
                write_result(NAME, result)
                say(f"{arm}-merged seed {seed}: KorSTS Pearson {cells[f'{arm}-merged/{seed}']:.4f}")
    print(f"{'arm':16} {'KorSTS Pearson':>16} {'seeds':>6}")
    for arm, (mean, sd, n) in result.get("summary", {}).items():
        print(f"{arm:16} {mean:>9.4f} ± {sd:.4f} {n:>6}")


if __name__ == "__main__":
    main()
