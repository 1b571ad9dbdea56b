"""GLUE tasks from the standard TSV layout (DATA_DIR/<Task>/train.tsv, dev.tsv), each with its official metric."""
from dataclasses import dataclass
from pathlib import Path

from bertkit.errors import DataError
from bertkit.finetune import metrics as M
from bertkit.finetune.classify import read_table, run_classification


@dataclass(frozen=True)
class GlueTask:
    folder: str
    text_a: object          # column name, or index for header-less files
    text_b: object
    label: object
    metric: str             # the metric that picks the epoch under --select validation
    header: bool = True
    dev_file: str = "dev.tsv"
    regression: bool = False
    labels: tuple = ("0", "1")  # the task's classes, sorted as label_list sorts them; regression: (low, high)


GLUE_TASKS = {
    "cola": GlueTask("CoLA", 3, None, 1, "matthews", header=False),
    "sst2": GlueTask("SST-2", "sentence", None, "label", "accuracy"),
    "mrpc": GlueTask("MRPC", "#1 String", "#2 String", "Quality", "f1"),
    "qqp": GlueTask("QQP", "question1", "question2", "is_duplicate", "f1"),
    "stsb": GlueTask("STS-B", "sentence1", "sentence2", "score", "pearson", regression=True, labels=(0.0, 5.0)),
    "mnli": GlueTask("MNLI", "sentence1", "sentence2", "gold_label", "accuracy", dev_file="dev_matched.tsv",
                     labels=("contradiction", "entailment", "neutral")),
    "qnli": GlueTask("QNLI", "question", "sentence", "label", "accuracy", labels=("entailment", "not_entailment")),
    "rte": GlueTask("RTE", "sentence1", "sentence2", "label", "accuracy", labels=("entailment", "not_entailment")),
    "wnli": GlueTask("WNLI", "sentence1", "sentence2", "label", "accuracy"),
}


def glue_metrics(task: str, preds, golds, labels) -> dict:
    """CoLA: Matthews; MRPC/QQP: F1 (of label "1") and accuracy; STS-B: Pearson/Spearman; others: accuracy."""
    if task == "stsb":
        return {"pearson": M.pearson(preds, golds), "spearman": M.spearman(preds, golds)}
    out = {"accuracy": M.accuracy(preds, golds)}
    if task == "cola":
        out["matthews"] = M.matthews_corrcoef(preds, golds)
    if task in ("mrpc", "qqp"):
        out["f1"] = M.binary_f1(preds, golds, positive=labels.index("1"))
    return out


def task_dir(data_dir, task: str) -> Path:
    """DATA_DIR may be the GLUE root (holding CoLA/, MRPC/, ...) or the task's own folder."""
    data_dir, spec = Path(data_dir), GLUE_TASKS[task]
    for candidate in (data_dir / spec.folder, data_dir):
        if (candidate / "train.tsv").is_file() or (candidate / spec.dev_file).is_file():
            return candidate
    raise DataError(f"{data_dir}: no {spec.folder}/train.tsv or {spec.dev_file} here; pass the GLUE folder "
                    f"(with {spec.folder}/ inside) or the {spec.folder} folder itself")


def read_glue(task: str, data_dir, split: str) -> tuple:
    """(examples, path); a label outside the task's set stops naming the file, line and label."""
    spec = GLUE_TASKS[task]
    path = task_dir(data_dir, task) / ("train.tsv" if split == "train" else spec.dev_file)
    examples = read_table(path, spec.text_a, spec.text_b, spec.label, header=spec.header)
    for ex in examples:
        if spec.regression:
            try:
                ok = spec.labels[0] <= float(ex.label) <= spec.labels[1]
            except ValueError:
                ok = False
        else:
            ok = ex.label in spec.labels
        if not ok:
            expected = f"a score from {spec.labels[0]:g} to {spec.labels[1]:g}" if spec.regression else \
                " or ".join(map(repr, spec.labels))
            raise DataError(f"{path}:{ex.line}: label {ex.label!r} is not one of {spec.folder}'s ({expected}); "
                            f"is this the {spec.folder} file?")
    return examples, path


def finetune_glue(task: str, data_dir, model_path, cfg, max_seq_length: int = 128) -> dict:
    if task not in GLUE_TASKS:
        raise DataError(f"unknown GLUE task {task!r}; one of {sorted(GLUE_TASKS)}")
    spec = GLUE_TASKS[task]
    train_examples, train_path = read_glue(task, data_dir, "train")
    dev_examples, dev_path = read_glue(task, data_dir, "dev")
    labels = None if spec.regression else list(spec.labels)
    return run_classification(model_path, train_examples, dev_examples, labels, cfg, task=task,
                              metric_fn=lambda p, g: glue_metrics(task, p, g, labels), best_metric=spec.metric,
                              max_seq_length=max_seq_length, train_file=train_path, dev_file=dev_path,
                              settings={"glue_task": task})
