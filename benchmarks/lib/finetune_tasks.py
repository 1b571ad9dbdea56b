"""What the fine-tuning parity studies share (finetune_parity, finetune_lockstep, finetune_memory): the tasks at the
issue's settings (given to bertkit and transformers alike), their data read with bertkit's readers, the model both
fine-tune, and bertkit's side of one cell."""
from pathlib import Path

from benchlib import SHARED

from bertkit.testing import minilm_dir

# the settings: bertkit's defaults for each command, given to both systems
SQUAD = dict(max_seq_length=384, doc_stride=128, max_query_length=64, batch_size=32, lr=5e-5, weight_decay=0.01,
             warmup_ratio=0.1, epochs=2, max_grad_norm=1.0, n_best_size=20, max_answer_length=30)
GLUE = dict(max_seq_length=128, batch_size=32, lr=2e-5, weight_decay=0.01, warmup_ratio=0.1, epochs=3,
            max_grad_norm=1.0)
TASKS = {
    "squad": dict(kind="squad", file="squad_v1.1/dev-v1.1.json", train=(0, 6), predict=(40, 42), **SQUAD),
    "squad-large": dict(kind="squad", file="squad_v1.1/dev-v1.1.json", train=(0, 24), predict=(24, 30), **SQUAD),
    "squad2": dict(kind="squad", file="squad_v2.0_partial/dev-v2.0.cs224n-dev-half.json", train=(0, 8),
                   predict=(8, 12), version_2=True, **SQUAD),
    "mrpc": dict(kind="glue", **GLUE),
    "rte": dict(kind="glue", **GLUE),
    "sst2": dict(kind="glue", train_rows=4000, **GLUE),
    "conll": dict(kind="ner", train_rows=3000, **{**GLUE, "lr": 5e-5}),
}
METRIC = {"squad": "f1", "squad-large": "f1", "squad2": "f1", "mrpc": "f1", "rte": "accuracy", "sst2": "accuracy",
          "conll": "f1"}


model_dir = minilm_dir   # the model both systems fine-tune


def data(task: str, work: Path):
    """Training and dev data for a task, read with bertkit's readers (the same examples for both systems)."""
    t = TASKS[task]
    if t["kind"] == "squad":
        from bertkit.finetune.squad import read_squad

        path = SHARED / t["file"]
        v2 = t.get("version_2", False)
        train, _ = read_squad(path, True, v2, slice(*t["train"]))
        dev, dataset = read_squad(path, False, v2, slice(*t["predict"]))
        return train, dev, dataset
    if t["kind"] == "glue":
        from bertkit.finetune.glue import GLUE_TASKS, read_glue

        folder = glue_folder(task, work)
        train, _ = read_glue(task, folder, "train")
        dev, _ = read_glue(task, folder, "dev")
        return train, dev, list(GLUE_TASKS[task].labels)
    from bertkit.finetune.ner import read_conll, tag_list

    train = read_conll(conll_file(work))
    return train, read_conll(SHARED / "conll2003" / "valid.txt"), tag_list(train)


def glue_folder(task: str, work: Path) -> Path:
    """The GLUE folder, or for a subsetted task (SST-2) a copy of it with the first train_rows training rows."""
    from bertkit.finetune.glue import GLUE_TASKS

    n = TASKS[task].get("train_rows")
    if not n:
        return SHARED / "glue"
    folder = work / "glue" / GLUE_TASKS[task].folder
    if not (folder / "dev.tsv").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        src = SHARED / "glue" / GLUE_TASKS[task].folder
        lines = (src / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
        (folder / "train.tsv").write_text("".join(lines[:n + 1]), encoding="utf-8")
        (folder / "dev.tsv").write_text((src / "dev.tsv").read_text(encoding="utf-8"), encoding="utf-8")
    return work / "glue"


def conll_file(work: Path) -> Path:
    """The first train_rows sentences of CoNLL-2003's train.txt, in --work (outside the repository)."""
    out = work / "conll_train_subset.txt"
    if not out.is_file():
        n, kept, blocks = TASKS["conll"]["train_rows"], [], 0
        for line in (SHARED / "conll2003" / "train.txt").read_text(encoding="utf-8").splitlines(keepends=True):
            if not line.strip():
                blocks += 1
                if blocks > n:
                    break
            kept.append(line)
        out.write_text("".join(kept), encoding="utf-8")
    return out


# ---------------------------------------------------------------- one cell, in its own process

def run_bertkit(task: str, seed: int, work: Path, out: Path, flags: dict) -> dict:
    from bertkit.finetune.train import TrainConfig

    t, model = TASKS[task], model_dir()
    cfg = TrainConfig(out_dir=str(out), epochs=t["epochs"], batch_size=t["batch_size"], learning_rate=t["lr"],
                      weight_decay=t["weight_decay"], warmup_ratio=t["warmup_ratio"], max_grad_norm=t["max_grad_norm"],
                      seed=seed, save_model=False, report_to="none", unpadded=bool(flags.get("unpadded")),
                      adam_eps=float(flags.get("adam_eps", TrainConfig.adam_eps)),
                      precision=flags.get("precision", "fp32"))
    if t["kind"] == "squad":
        from bertkit.finetune.squad import finetune_squad

        path = SHARED / t["file"]
        overlap = int(flags["window_overlap"]) if "window_overlap" in flags else None  # instead of the step
        step = None if overlap is not None else int(flags.get("window_step", t["doc_stride"]))
        summary = finetune_squad(model, path, path, cfg, version_2=t.get("version_2", False),
                                 max_seq_length=t["max_seq_length"],
                                 window_step=step,
                                 window_overlap=overlap,
                                 max_query_length=t["max_query_length"], n_best_size=t["n_best_size"],
                                 max_answer_length=t["max_answer_length"], train_articles=slice(*t["train"]),
                                 predict_articles=slice(*t["predict"]))
    elif t["kind"] == "glue":
        from bertkit.finetune.glue import finetune_glue

        summary = finetune_glue(task, glue_folder(task, work), model, cfg, max_seq_length=t["max_seq_length"])
    else:
        from bertkit.finetune.ner import finetune_ner

        summary = finetune_ner(model, conll_file(work), SHARED / "conll2003" / "valid.txt", cfg,
                               max_seq_length=t["max_seq_length"])
    last = summary["epochs"][-1]
    return {k: v for k, v in last.items() if isinstance(v, (int, float)) and k != "epoch"}
