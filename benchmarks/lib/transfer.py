"""What the transfer studies share (pretrain_transfer, recipes, budget, korean_vocab, korean_transfer): the budgets,
a language's corpus, tokenizer and instances, a pretraining run and its export, fine-tuning an export on a task and its
score, training curves, and the plots' set-up."""
import json
import random
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from benchlib import SHARED, done, say


@dataclass
class Budget:
    preset: str
    steps: int
    micro_batch: int
    lr: float
    vocab_size: int
    eval_every: int
    ko_steps: int
    finetune_lr: float
    sst2_train: int
    conll_train: int
    long_steps: int = 0        # a longer dynamic run, fine-tuned on LONG_TASKS: does more pretraining help?


# CPU: tiny (2 layers, 128 hidden). On the 2-core CPU mini (4 x 256) runs 25 sequences/s and tiny 90, and the whole
# benchmark (7 pretrainings with recipes.py and korean_vocab.py, ~80 fine-tunes) must fit in about 100 minutes: tiny
# sees 3.5x the data per minute, and mini at 2000 steps (lr 5e-4) had only reached 13% held-out MLM accuracy.
# CUDA: small, 10x the sequences.
BUDGETS = {
    "cpu": Budget("tiny", steps=1500, micro_batch=32, lr=1e-3, vocab_size=16000, eval_every=250, ko_steps=1000,
                  finetune_lr=1e-4, sst2_train=8000, conll_train=4000, long_steps=4500),
    "cuda": Budget("small", steps=10000, micro_batch=64, lr=5e-4, vocab_size=30522, eval_every=500, ko_steps=5000,
                   finetune_lr=1e-4, sst2_train=67349, conll_train=14041),
}
FINETUNE_DROPOUT = 0.1  # BERT's, for every start: a model pretrained without dropout fine-tunes with it too
GLUE = {"sst2": "accuracy", "mrpc": "f1", "rte": "accuracy", "cola": "matthews", "stsb": "pearson"}
KO_FILL_MASK = ["대한민국의 수도는 [MASK]이다.", "세종대왕은 [MASK]을 창제하였다.", "한국어는 [MASK] 언어이다.",
                "서울은 한국의 가장 큰 [MASK]이다."]


# ---------------------------------------------------------------- pretraining side

def prepare(work: Path, lang: str, budget: Budget) -> dict:
    """Corpus, tokenizer, static and dynamic instances for one language; returns their folders."""
    from bertkit.pipelines.make_instances import InstancesConfig, make_instances
    from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus
    from bertkit.pipelines.train_tokenizer import TokenizerConfig, train_tokenizer

    d = {name: work / f"{lang}-{name}" for name in ("corpus", "tokenizer", "static", "dynamic")}
    inputs = [SHARED / "wikipedia_en_wikiextractor", SHARED / "gutenberg"] if lang == "en" else \
        [SHARED / "wikipedia_ko_wikiextractor"]
    if not done(d["corpus"]):
        say(f"prepare-corpus {lang}")
        prepare_corpus(inputs, d["corpus"], CorpusConfig(workers=2, holdout=0.02, progress=False))
    if not done(d["tokenizer"]):
        say(f"train-tokenizer {lang}")
        vocab = budget.vocab_size if lang == "en" else 12000
        # plain WordPiece, as the recorded arms were made (auto would pick kiwi for the Korean corpus)
        train_tokenizer(d["corpus"], d["tokenizer"], TokenizerConfig(vocab_size=vocab, progress=False,
                                                                     pretokenize="none"))
    for mode, dupe in (("static", 2), ("dynamic", 1)):
        if lang == "ko" and mode == "static":
            continue
        if not done(d[mode]):
            say(f"make-instances {lang} {mode}")
            make_instances(d["corpus"], d["tokenizer"], d[mode],
                           InstancesConfig(max_seq_length=128, mode=mode, dupe=dupe, workers=2), progress=False)
    return d


def pretrain_run(instances: Path, run: Path, budget: Budget, steps: int, device: str) -> Path:
    """Pretrain (resuming a killed run) and export; returns the export folder."""
    from bertkit.pretrain import PretrainConfig, export, pretrain

    export_dir = run.parent / f"{run.name}-export"
    if (export_dir / "model.safetensors").is_file():
        return export_dir
    resume = (run / "checkpoints" / "latest").is_file()
    say(f"pretrain {run.name}: {budget.preset}, {steps} steps" + (" (resumed)" if resume else ""))
    # fp32 on the CPU as every recorded arm (pretrain's auto is bf16 on a CPU with bf16 units since 2026-11-27)
    cfg = PretrainConfig(instances=str(instances), out=str(run), model=budget.preset, max_steps=steps,
                         micro_batch=budget.micro_batch, optimizer="adamw", lr=budget.lr, warmup=0.05,
                         eval_every=budget.eval_every, eval_batches=20, save_every=budget.eval_every, keep_last=1,
                         log_every=20, resume=resume, num_workers=1, progress=False, report_to="tensorboard",
                         precision="bf16" if device == "cuda" else "fp32")
    result = pretrain(cfg)
    if result["step"] < steps:  # stopped by a signal: the next run of this script resumes it
        raise SystemExit(f"{run.name} stopped at step {result['step']}; run the benchmark again to resume")
    export(run, export_dir)
    return export_dir


def random_init(pretrained: Path, out: Path) -> Path:
    """The pretrained export's architecture and tokenizer at random (seed 0): BERT's initialisation for a BERT, the
    family's own for another (ModernBERT)."""
    import torch

    from bertkit.models import build_pretraining, describe, load_pretrained, save_pretrained
    from bertkit.models.bert import BertForPreTraining

    if not (out / "model.safetensors").is_file():
        model = load_pretrained(pretrained, head="pretraining")
        torch.manual_seed(0)
        fresh = (BertForPreTraining(model.cfg) if isinstance(model, BertForPreTraining)
                 else build_pretraining(describe(model), "mlm"))
        save_pretrained(fresh, out, tokenizer_dir=pretrained)
    return out


def curves(run: Path) -> dict:
    """Held-out MLM/NSP accuracy and train loss against steps, from metrics.jsonl (a resumed run's later lines win)."""
    by_step = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        by_step.setdefault(r["step"], {}).update(r)
    steps = sorted(by_step)
    return {"steps": [s for s in steps if "eval_mlm_acc" in by_step[s]],
            "eval_mlm_acc": [by_step[s]["eval_mlm_acc"] for s in steps if "eval_mlm_acc" in by_step[s]],
            "eval_nsp_acc": [by_step[s]["eval_nsp_acc"] for s in steps if "eval_nsp_acc" in by_step[s]],
            "eval_sop_acc": [by_step[s]["eval_sop_acc"] for s in steps if "eval_sop_acc" in by_step[s]],
            # [MASK] positions only (runs from before the trainer logged it have none)
            "eval_mlm_mask_acc": [by_step[s].get("eval_mlm_mask_acc") for s in steps if "eval_mlm_acc" in by_step[s]],
            "train_steps": [s for s in steps if "loss" in by_step[s]],
            "train_loss": [by_step[s]["loss"] for s in steps if "loss" in by_step[s]],
            "seq_per_s": statistics.median(by_step[s]["seq_per_s"] for s in steps if "seq_per_s" in by_step[s])}


def fill_mask(model_dir: Path, texts: list[str]) -> list:
    from bertkit.fill_mask import fill_mask_predictions
    from bertkit.models import load_pretrained
    from bertkit.tokenization import load_tokenizer

    model = load_pretrained(model_dir, head="pretraining")
    out = fill_mask_predictions(model, load_tokenizer(model_dir), texts, top_k=5)
    return [{"text": t, "top5": [[tok for tok, _ in m] for m in masks]} for t, masks in zip(texts, out)]


# ---------------------------------------------------------------- fine-tuning side

def finetune_one(task: str, model: Path, out: Path, seed: int, budget: Budget, work: Path,
                 pooling: str | None = None) -> dict:
    """One fine-tune; its metrics.json is the cache. pooling: the GLUE classifiers' (None: the model's own)."""
    from bertkit.finetune.classify import label_list, run_classification
    from bertkit.finetune.glue import GLUE_TASKS, glue_metrics, read_glue
    from bertkit.finetune.ner import finetune_ner
    from bertkit.finetune.train import TrainConfig

    if (out / "metrics.json").is_file():
        summary = json.loads((out / "metrics.json").read_text())
        if "train_seconds" in summary:
            return summary
    cfg = TrainConfig(out_dir=str(out), epochs=3, batch_size=32, learning_rate=budget.finetune_lr, seed=seed,
                      save_model=False, dropout=FINETUNE_DROPOUT, pooling=pooling,
                      precision="fp32")  # every recorded score is fp32's
    if task == "ner":
        return finetune_ner(model, conll_subsample(work, budget.conll_train), SHARED / "conll2003" / "valid.txt",
                            cfg)
    train, _ = read_glue(task, SHARED / "glue", "train")
    dev, _ = read_glue(task, SHARED / "glue", "dev")
    if task == "sst2" and len(train) > budget.sst2_train:
        train = random.Random(0).sample(train, budget.sst2_train)
    labels = None if GLUE_TASKS[task].regression else label_list(train)
    return run_classification(model, train, dev, labels, cfg, task=task,
                              metric_fn=lambda p, g: glue_metrics(task, p, g, labels), best_metric=GLUE[task],
                              max_seq_length=128)


def conll_subsample(work: Path, n: int) -> Path:
    """The first n sentences of CoNLL-2003 train, written to the work folder (never into the repository)."""
    path = work / f"conll-train-{n}.txt"
    if not path.is_file():
        blocks = (SHARED / "conll2003" / "train.txt").read_text(encoding="utf-8").split("\n\n")
        path.write_text("\n\n".join(blocks[:n]) + "\n", encoding="utf-8")
    return path


def finetune_rate(budget: Budget, lr: float | None) -> tuple[Budget, str, str]:
    """The budget to fine-tune with at `lr` (None: the budget's own), and the tags that keep another rate's results
    apart: " lr 0.0005" on table rows, "-lr0.0005" on fine-tuning folders (both empty at the budget's rate)."""
    tuned = replace(budget, finetune_lr=lr or budget.finetune_lr)
    row_tag = "" if tuned.finetune_lr == budget.finetune_lr else f" lr {tuned.finetune_lr:g}"
    return tuned, row_tag, row_tag.replace(" lr ", "-lr")


def task_metric(task: str) -> str:
    task = task.split()[0]  # "sst2 lr 0.0005": a row fine-tuned at another learning rate
    return "f1" if task == "ner" else GLUE[task]


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def finish(fig, axes, path: Path, legend_size=None):
    for ax in axes:
        ax.legend(fontsize=legend_size)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def best_rate(by_lr: dict) -> dict:
    """{lr: {seed: score}} -> the rate with the best mean over seeds, its mean, sd and scores, and every rate's."""
    rates = {lr: {"mean": statistics.mean(scores.values()), "seeds": list(scores.values()),
                  "sd": statistics.stdev(scores.values()) if len(scores) > 1 else 0.0}
             for lr, scores in by_lr.items() if scores}
    # where some rates ran more seeds than others, choose on the seeds all of them ran (a one-seed mean against a
    # three-seed mean is luck against an average)
    shared = set.intersection(*(set(by_lr[k]) for k in rates))
    lr = max(rates, key=lambda k: statistics.mean(by_lr[k][s] for s in shared) if shared else rates[k]["mean"])
    return {"lr": float(lr), **rates[lr], "rates": rates, "by_seed": dict(by_lr[lr])}


def seed_verdict(first: dict, second: dict) -> dict:
    """second against first (best_rate summaries) as `finetune compare` judges: the seed-paired difference's 95 %
    interval, no verdict under 3 shared seeds. "shown": the interval excludes 0 (what "apart" said before, when two
    ranges of one seed each were always apart)."""
    from bertkit.finetune.verdict import paired_verdict

    v = paired_verdict(first.get("by_seed", {}), second.get("by_seed", {}))
    return {"shown": v["verdict"] in ("first higher", "second higher"), "verdict": v["verdict"], "seeds": v["seeds"]}


def plot_by_hours(rows: list[dict], path: Path):
    """Transfer against CPU-hours: each task's pretrained-minus-random difference at every budget (filled where the
    seed-paired interval shows a difference); 0 hours is random initialisation itself."""
    fig, axes = pyplot().subplots(1, 1, figsize=(8, 4.5))
    for task in dict.fromkeys(t for r in rows for t in r["tasks"]):
        points = [(r["hours"], r["tasks"][task]) for r in rows if task in r["tasks"]]
        line, = axes.plot([0] + [h for h, _ in points], [0] + [100 * c["difference"] for _, c in points], label=task)
        axes.scatter([h for h, _ in points], [100 * c["difference"] for _, c in points], color=line.get_color(),
                     facecolors=[line.get_color() if c["shown"] else "none" for _, c in points], zorder=3)
    axes.axhline(0, color="gray", lw=0.8)
    axes.set(title="pretrained minus random (filled: a seed-paired difference shown)",
             xlabel="hours of pretraining on 2 CPU cores", ylabel="points (each start at its best rate)")
    finish(fig, [axes], path)


CURVE_KEYS = ("step", "elapsed_s", "eval_mlm_loss", "eval_mlm_mask_acc", "eval_disc_loss", "eval_rtd_acc",
              "eval_rtd_f1")


def timed_curve(run: Path) -> list[dict]:
    """The held-out evaluations against the run's clock (from metrics.jsonl; a resumed run's later lines win)."""
    by_step = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "eval_mlm_loss" in r:
            by_step[r["step"]] = {k: r[k] for k in CURVE_KEYS if k in r}
    return [by_step[s] for s in sorted(by_step)]


def steps_per_second(elapsed_at: dict[int, float], skip: int = 100) -> dict:
    """A pace from a run's (step -> elapsed seconds) readings: the steps after `skip` (the first ones warm up the
    allocator and the loader) over their time."""
    a, b = min(s for s in elapsed_at if s >= skip), max(elapsed_at)
    return {"steps_per_s": (b - a) / (elapsed_at[b] - elapsed_at[a]), "over_steps": [a, b]}


def run_pace(run: Path) -> dict:
    """steps_per_second over a pretraining run's logged training steps (RUN/metrics.jsonl)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return steps_per_second({r["step"]: r["elapsed_s"] for r in rows if "loss" in r and "elapsed_s" in r})
