"""Does cleaning a crawl pay at a fixed pretraining budget? (issue 82's last measurement; a study, run by hand)

Asks: a team has a Korean crawl holding near-duplicates and junk at a crawl's rates; at one fixed number of
pretraining steps, does a model pretrained on the corpus `prepare-corpus --near-dedup --filters fineweb2 --pii redact`
keeps score better on clean Korean text than one pretrained on the corpus as plain prepare-corpus keeps it?

The crawl is made here: real Korean Wikipedia documents (both extracts in ../shared/data, at least 80 words each), a
share of them repeated as crawls repeat pages (1 to 10 near-duplicate copies each: word edits, boilerplate headers,
punctuation and case changes, cuts; bertkit.planted), and junk documents of the kinds crawls hold (keyword lists,
ㅋㅋㅋ comments, menus, lorem ipsum, number tables, repeated lines). Two per cent of the real documents are held out
before any of this: they are in neither corpus.

Arms: `dirty` (plain prepare-corpus: byte-identical duplicates only) and `cleaned` (all the steps). One tokenizer,
trained on the dirty corpus (what a team has before it cleans; `--pretokenize none` for time), serves both, so the
scores compare. Instances by `make-instances --recipe budget`; modernbert-tiny by `pretrain --recipe budget` for
--steps optimizer steps (the same compute for both), seeds 0 1 2. Scored on the held-out documents' rows: masked-token
loss and accuracy with 15 % of each row's tokens all [MASK] (the unigram baseline beside them); then on Korean tasks
(--tasks: KorSTS Pearson, NSMC accuracy on its first 10,000 training rows; `finetune korean`'s splits, 3 epochs at
the rate finetune gives the model's width, the last epoch's model, the pretraining seed), scored on their dev splits.

    python benchmarks/studies/cleaning_pays.py --work /tmp/pays [--steps 1500] [--seeds 0 1 2] [--tasks korsts nsmc]

Pretraining is a quality-against-steps run: it may go on beside other work; a killed run resumes from its last
checkpoint (run the same command again), and each finished (arm, seed) is appended to results/cleaning_pays.json.
"""
import argparse
import json
import random
import statistics
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from benchlib import SHARED, done, masked_only_accuracy, say, trained_to_the_end
from record import read_result, run_info, write_result

from bertkit.fileio import atomic_write_bytes
from bertkit.planted import junk, variant, wiki_documents

KO_WIKI = ["wikipedia_ko_wikiextractor", "wikipedia_ko_wikiextractor_more"]
COPIES = (1, 1, 2, 2, 3, 4, 6, 10)   # a repeated page's near-duplicate copies: most few, some many
NAME = "cleaning_pays"


def make_crawl(work: Path, documents: int, repeated: float, junk_share: float, seed: int = 0) -> dict:
    """WORK/crawl.jsonl (real documents, their copies and junk, in a seeded order) and WORK/heldout.jsonl (held-out
    real documents); returns the counts."""
    if (work / "crawl.json").is_file():
        return json.loads((work / "crawl.json").read_text())
    real = [d for folder in KO_WIKI for d in wiki_documents(SHARED / folder, documents)][:documents]
    rng = random.Random(seed)
    rng.shuffle(real)
    held, train = real[:len(real) // 50], real[len(real) // 50:]
    pool = [w for d in train[:50] for w in d.split(" ")]
    rows = [{"text": t} for t in train]
    for text in rng.sample(train, int(repeated * len(train))):
        rows += [{"text": variant(text, rng.choice(("edit", "edit", "header", "format", "cut")), "ko", rng, pool)}
                 for _ in range(rng.choice(COPIES))]
    copies = len(rows) - len(train)
    rows += [{"text": junk(rng, pool)[1]} for _ in range(int(junk_share * len(train)))]
    rng.shuffle(rows)
    for name, items in (("crawl.jsonl", rows), ("heldout.jsonl", [{"text": t} for t in held])):
        atomic_write_bytes(work / name, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in items).encode())
    counts = {"real": len(train), "copies": copies, "junk": len(rows) - len(train) - copies, "held_out": len(held),
              "documents": len(rows), "megabytes": round((work / "crawl.jsonl").stat().st_size / 1e6, 1)}
    (work / "crawl.json").write_text(json.dumps(counts))
    return counts


def prepare(work: Path) -> dict:
    """The two corpora, the tokenizer (of the dirty one), each arm's instances and the held-out rows."""
    from bertkit.pipelines.make_instances import InstancesConfig, make_instances
    from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus
    from bertkit.pipelines.train_tokenizer import TokenizerConfig, train_tokenizer
    from bertkit.recipes import RECIPES

    steps = {"dirty": {}, "cleaned": {"near_dedup": True, "filters": "fineweb2", "pii": "redact"}}
    for arm, flags in steps.items():
        if not done(work / f"{arm}-corpus"):
            say(f"prepare-corpus: {arm}")
            prepare_corpus([work / "crawl.jsonl"], work / f"{arm}-corpus",
                           CorpusConfig(workers=2, holdout=0.0, progress=False, **flags))
    if not done(work / "heldout-corpus"):
        prepare_corpus([work / "heldout.jsonl"], work / "heldout-corpus", CorpusConfig(holdout=0.0, progress=False))
    if not done(work / "tokenizer"):
        say("train-tokenizer (on the dirty corpus)")
        train_tokenizer(work / "dirty-corpus", work / "tokenizer",
                        TokenizerConfig(vocab_size=16000, pretokenize="none", progress=False))
    recipe = {**RECIPES["budget"]["make-instances"], "dupe": 1, "workers": 2}
    for arm in ("dirty", "cleaned", "heldout"):
        if not done(work / f"{arm}-instances"):
            say(f"make-instances: {arm}")
            make_instances(work / f"{arm}-corpus", work / "tokenizer", work / f"{arm}-instances",
                           InstancesConfig(**recipe), progress=False)
    manifests = {arm: json.loads((work / f"{arm}-corpus" / "manifest.json").read_text())
                 for arm in ("dirty", "cleaned")}
    return {arm: {"documents": m["totals"].get("documents"), "dropped": m.get("dropped")}
            for arm, m in manifests.items()}


def pretrain_and_score(work: Path, arm: str, seed: int, steps: int) -> dict:
    """modernbert-tiny --recipe budget on the arm's instances for `steps`, exported, scored on the held-out rows."""
    from bertkit.pretrain import PretrainConfig, export, pretrain

    run, model = work / f"run-{arm}-{seed}", work / f"model-{arm}-{seed}"
    if not done(model):
        say(f"pretrain {arm}, seed {seed}: {steps} steps")
        result = pretrain(PretrainConfig(instances=str(work / f"{arm}-instances"), out=str(run),
                                         model="modernbert-tiny", recipe="budget", max_steps=steps, seed=seed,
                                         num_workers=1, progress=False, log_every=50, eval_every=10 ** 9,
                                         save_every=250, precision="fp32", resume=(run / "checkpoints").is_dir(),
                                         report_to="none"))
        trained_to_the_end(result, steps, run)
        export(run, model)
    return masked_only_accuracy(model, work / "heldout-instances", rows=1000, split="train")


TASKS = {"korsts": ("pearson", None), "nsmc": ("accuracy", 10_000)}   # metric, training rows kept (None: all)


def task_score(work: Path, arm: str, seed: int, task: str) -> float:
    """The arm's model fine-tuned on a Korean task; its metrics.json is the cache."""
    from bertkit.finetune.korean import finetune_korean
    from bertkit.finetune.train import TrainConfig, finished_fine_tuning

    metric, rows = TASKS[task]
    out = work / f"{task}-{arm}-{seed}"
    summary = finished_fine_tuning(out)
    if summary is None:
        say(f"finetune {task}: {arm}, seed {seed}")
        summary = finetune_korean(task, SHARED, work / f"model-{arm}-{seed}", TrainConfig(
            out_dir=str(out), epochs=3, batch_size=32, learning_rate=None, seed=seed, save_model=False,
            report_to="none", precision="fp32"), max_train_rows=rows)
    return summary["best"][metric]


def summary(cells: dict) -> dict:
    by_arm = {}
    for key, cell in cells.items():
        by_arm.setdefault(key.split("/")[0], []).append(cell)
    return {arm: {k: [round(statistics.mean(c[k] for c in got), 4), round(statistics.pstdev(c[k] for c in got), 4)]
                  for k in ("loss", "masked_only_acc", *TASKS) if all(k in c for c in got)} | {"seeds": len(got)}
            for arm, got in by_arm.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--documents", type=int, default=12000, help="real Korean documents read (2 %% held out)")
    ap.add_argument("--repeated", type=float, default=0.15, help="share of real documents given copies")
    ap.add_argument("--junk", type=float, default=0.1, help="junk documents per real one")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tasks", nargs="*", choices=list(TASKS), default=list(TASKS))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    crawl = make_crawl(args.work, args.documents, args.repeated, args.junk)
    say(f"crawl: {crawl}")
    corpora = prepare(args.work)
    result = read_result(NAME)
    if result.get("steps") != args.steps or result.get("crawl") != crawl:
        result = {}   # another budget or crawl: its cells do not compare
    if result.get("cells") and "pretrained_at" not in result:   # the header is this run's; the models' stays known
        result["pretrained_at"] = {k: result[k] for k in ("date", "commit", "load_average_1_5_15min") if k in result}
    result.update(run_info(NAME), crawl=crawl, corpora=corpora, steps=args.steps)
    cells = result.setdefault("cells", {})
    for seed in args.seeds:
        for arm in ("dirty", "cleaned"):
            if f"{arm}/{seed}" not in cells:
                cells[f"{arm}/{seed}"] = pretrain_and_score(args.work, arm, seed, args.steps)
                result["summary"] = summary(cells)
                write_result(NAME, result)
                say(f"{arm} seed {seed}: {cells[f'{arm}/{seed}']}")
    for task in args.tasks:   # after every pretraining: the tasks never hold up the held-out scores
        for seed in args.seeds:
            for arm in ("dirty", "cleaned"):
                if task not in cells[f"{arm}/{seed}"]:
                    cells[f"{arm}/{seed}"][task] = task_score(args.work, arm, seed, task)
                    result["summary"] = summary(cells)
                    write_result(NAME, result)
    print(f"{'arm':10} {'seeds':>5} {'held-out loss':>16} {'masked-token acc':>18}"
          + "".join(f" {t:>16}" for t in args.tasks))
    for arm, s in summary(cells).items():
        print(f"{arm:10} {s['seeds']:>5} {s['loss'][0]:>9.4f} ± {s['loss'][1]:.4f} "
              f"{s['masked_only_acc'][0]:>10.4f} ± {s['masked_only_acc'][1]:.4f}"
              + "".join(f" {s[t][0]:>9.4f} ± {s[t][1]:.4f}" for t in args.tasks if t in s))


if __name__ == "__main__":
    main()
