"""Sentence and sentence-pair classification (and regression) from CSV, TSV or JSON-lines files.

`finetune_classify` is `bertkit finetune classify`; GLUE (glue.py) reuses `read_table` and `run_classification`.
Labels are the set seen in the training file; a dev label outside it is an error (file and line), never a
silent drop. Pairs are encoded with the tokenizer's BERT template ([CLS] a [SEP] b [SEP], type ids 0/1) and
cut longest-first to --max-seq-length.
"""
import csv
import io
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from bertkit.errors import DataError
from bertkit.fileio import not_utf8_message
from bertkit.finetune import metrics as M

log = logging.getLogger(__name__)


@dataclass
class TextExample:
    line: int          # 1-based line in the source file (for messages)
    text_a: str
    text_b: str | None
    label: str | None
    binary: int | None = None  # KLUE-STS: the binarised similarity label it is also scored on


def _column(header: list | None, col, path: Path):
    """Column given by name (needs a header) or 0-based index -> index."""
    if isinstance(col, int) or (isinstance(col, str) and col.isdigit() and (header is None or col not in header)):
        return int(col)
    if header is None:
        raise DataError(f"{path}: column {col!r} given by name but the file has no header row")
    if col not in header:
        raise DataError(f"{path}:1: no column {col!r}; the header has {header}. Pass one of those "
                        f"(or a 0-based column index)")
    return header.index(col)


def read_utf8(path) -> str:
    """A task file's text, a byte-order mark dropped (GLUE's MRPC files start with one); a file that is missing or
    not UTF-8 is a DataError naming it, the line, and the legacy encoding it reads as."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: {not_utf8_message(data, path.name)}") from None


def text_lines(text: str) -> list[str]:
    """A file's lines, split on \\n (a \\r before it dropped) and nothing else: str.splitlines also splits on form
    feeds, U+2028 and lone carriage returns, which sit inside real texts."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def table_rows(text: str, fmt: str, path=None) -> list[list[str]]:
    """Each line's fields: split on tabs (.tsv as GLUE's, no quoting) or read as RFC 4180 .csv (a quoted field may
    hold line breaks; a record's number is then not its line's)."""
    if fmt == "tsv":
        return [line.split("\t") for line in text_lines(text)]
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return list(reader)
    except csv.Error as e:
        raise DataError(f"{path}:{reader.line_num}: not CSV as RFC 4180 writes it ({e})") from None


def read_table(path, text_a, text_b=None, label=None, header: bool = True, fmt: str | None = None) -> list:
    """Read TextExamples from .tsv (tab-separated, no quoting, as GLUE), .csv (RFC 4180 quoting) or .jsonl, or a 🤗
    dataset (bertkit.hf_rows: a save_to_disk folder, hf:NAME:SPLIT). Columns are header names or 0-based indices
    (a dataset's and a JSON line's: names); label=None reads unlabeled rows."""
    from bertkit.hf_rows import dataset_records, is_dataset

    if is_dataset(path):
        return _from_records(path, dataset_records(path), text_a, text_b, label)
    path = Path(path)
    fmt = fmt or {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}.get(path.suffix.lower(), "tsv")
    text = read_utf8(path)
    if not text.strip():
        raise DataError(f"{path}: the file is empty")
    if fmt == "jsonl":
        return _read_jsonl(path, text, text_a, text_b, label)
    rows = table_rows(text, fmt, path)
    head = rows[0] if header else None
    first = 1 if header else 0
    cols = [_column(head, c, path) if c is not None else None for c in (text_a, text_b, label)]
    need = max(c for c in cols if c is not None) + 1
    examples = []
    for i in range(first, len(rows)):
        row, line = rows[i], i + 1
        if not any(field.strip() for field in row):
            continue  # blank line
        if len(row) < need:
            names = [c for c in (text_a, text_b, label) if c is not None]
            raise DataError(f"{path}:{line}: {len(row)} fields but columns {names} need {need} "
                            f"({'tab' if fmt == 'tsv' else 'comma'}-separated); fix or remove this row")
        a = row[cols[0]]
        b = row[cols[1]] if cols[1] is not None else None
        y = row[cols[2]].strip() if cols[2] is not None else None
        if y == "":
            raise DataError(f"{path}:{line}: empty label")
        examples.append(TextExample(line, a, b, y))
    if not examples:
        raise DataError(f"{path}: no data rows (only a header?)")
    return examples


def jsonl_objects(path: Path, text: str, shape: str):
    """(line number, object) of each non-blank line of a JSON-lines file; a line that is not a JSON object is a
    DataError naming the file and line (`shape`: what a line should look like)."""
    for i, raw in enumerate(text_lines(text), 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{i}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{i}: a JSON {type(obj).__name__}, not an object; each line of a JSON-lines "
                            f"file is {shape}")
        yield i, obj


def _read_jsonl(path: Path, text: str, text_a, text_b, label) -> list:
    return _from_records(path, jsonl_objects(path, text, f"one example's {{\"{text_a}\": ..., ...}}"), text_a,
                         text_b, label)


def _from_records(path, records, text_a, text_b, label) -> list:
    """TextExamples from (line, {key: value}) records: a JSON-lines file's, or a dataset's rows."""
    examples = []
    for i, obj in records:
        for key in (text_a, text_b, label):
            if key is not None and key not in obj:
                raise DataError(f"{path}:{i}: no key {key!r}; this line has {sorted(obj)}")
        for key in (text_a, text_b):
            if key is not None and not isinstance(obj[key], str):
                raise DataError(f"{path}:{i}: {key!r} is {json.dumps(obj[key])[:40]}, not a text; each text is a "
                                "JSON string")
        y = obj[label] if label is not None else None
        examples.append(TextExample(i, obj[text_a], None if text_b is None else obj[text_b],
                                    None if y is None else str(y).strip()))
    if not examples:
        raise DataError(f"{path}: no data rows")
    return examples


def label_list(examples: list) -> list:
    """Sorted label strings seen in training (numerically when they are all integers)."""
    labels = {ex.label for ex in examples}
    if all(lab.lstrip("-").isdigit() for lab in labels):
        return sorted(labels, key=int)
    return sorted(labels)


def label_ids(examples: list, labels: list | None, path) -> list:
    """Class ids (or floats when labels is None: regression); an unseen label names the file and line."""
    if labels is None:
        out = []
        for ex in examples:
            try:
                out.append(float(ex.label))
            except ValueError:
                raise DataError(f"{path}:{ex.line}: label {ex.label!r} is not a number (regression task)") from None
        return out
    index = {lab: i for i, lab in enumerate(labels)}
    for ex in examples:
        if ex.label not in index:
            raise DataError(f"{path}:{ex.line}: label {ex.label!r} never appears in the training file "
                            f"(training labels: {labels})")
    return [index[ex.label] for ex in examples]


def encode(examples: list, tokenizer, max_seq_length: int, targets: list | None = None) -> list:
    """Feature dicts: input_ids, token_type_ids (+ labels)."""
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_seq_length, strategy="longest_first")
    pairs = examples[0].text_b is not None
    inputs = [(ex.text_a, ex.text_b) if pairs else ex.text_a for ex in examples]
    encodings = tokenizer.encode_batch(inputs, add_special_tokens=True)
    tokenizer.no_truncation()
    rows = []
    for i, enc in enumerate(encodings):
        row = {"input_ids": enc.ids, "token_type_ids": enc.type_ids}
        if targets is not None:
            row["labels"] = targets[i]
        rows.append(row)
    return rows


def classification_metrics(preds, golds, labels: list | None) -> dict:
    """Accuracy and macro F1 for classes; Pearson/Spearman for regression."""
    if labels is None:
        return {"pearson": M.pearson(preds, golds), "spearman": M.spearman(preds, golds)}
    out = {"accuracy": M.accuracy(preds, golds)}
    out["macro_f1"] = sum(M.binary_f1(preds, golds, positive=c) for c in range(len(labels))) / len(labels)
    return out


def run_classification(model_path, train_examples, dev_examples, labels, cfg, *, task: str, metric_fn,
                       best_metric: str, max_seq_length: int = 128, train_file=None, dev_file=None,
                       settings: dict | None = None, columns: tuple = (None, None)) -> dict:
    """Encode, load the model with a fresh head, and train with evaluation on dev each epoch. columns: the text
    columns' names, recorded in the saved model for `bertkit predict`."""
    import numpy as np

    from bertkit.finetune.train import predict, set_seed, train
    from bertkit.models import family_of, load_pretrained
    from bertkit.tokenization import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    validation = []
    if cfg.select == "validation" and train_examples:   # chosen on training rows held out, never on dev
        train_examples, validation = validation_split(train_examples, labels, cfg.validation_share, train_file)
    train_rows = encode(train_examples, tokenizer, max_seq_length, label_ids(train_examples, labels, train_file)) \
        if train_examples else []
    dev_targets = label_ids(dev_examples, labels, dev_file)
    dev_rows = encode(dev_examples, tokenizer, max_seq_length)
    num_labels = 1 if labels is None else len(labels)
    set_seed(cfg.seed)  # the new head's initial weights come from the seed too
    model = load_pretrained(model_path, head="sequence_classification", num_labels=num_labels)
    if cfg.pooling is not None:  # saved with best/ (config.json classifier_pooling)
        model.cfg.set_pooling(cfg.pooling)
    if model.cfg.classifier_pooling == "mean" and (unread := family_of(model).mean_pooling_unused(model)):
        unread.requires_grad_(False)  # (BERT's pooler) data-parallel training would wait for its gradients
        if cfg.save_model:
            log.warning("mean pooling: load OUT/best/ with bertkit; transformers' BertForSequenceClassification "
                        "reads [CLS] and ignores config.json's classifier_pooling")

    def predictions(m, rows):
        logits = np.stack(predict(m, rows, cfg.eval_batch_size)["logits"])
        return logits[:, 0].tolist() if labels is None else logits.argmax(-1).tolist()

    def evaluate(m):
        preds = predictions(m, dev_rows)
        files = {"dev_predictions.json": [p if labels is None else labels[p] for p in preds]}
        if labels is not None:   # the kept epoch's per-class scores and confusion matrix (bertkit report draws them)
            files["dev_classes.json"] = M.class_report(preds, dev_targets, labels)
        return metric_fn(preds, dev_targets), files

    validate = None
    if validation:
        validation_rows = encode(validation, tokenizer, max_seq_length)
        validation_targets = label_ids(validation, labels, train_file)

        def validate(m):
            return metric_fn(predictions(m, validation_rows), validation_targets)

    extra = {"finetuning_task": task, "bertkit_inputs": {
        "text_a": columns[0], "text_b": columns[1], "pairs": dev_examples[0].text_b is not None, "labels": labels,
        "regression": labels is None, "max_seq_length": max_seq_length}}
    if labels is not None:
        extra["id2label"] = {str(i): lab for i, lab in enumerate(labels)}
        extra["label2id"] = {lab: i for i, lab in enumerate(labels)}
    settings = {"model": str(model_path), "max_seq_length": max_seq_length, "labels": labels,
                "train_file": str(train_file), "dev_file": str(dev_file), "validation_rows": len(validation),
                **(settings or {})}
    return train(model, train_rows, evaluate, best_metric, cfg, task=task, settings=settings,
                 tokenizer_dir=model_path, extra_config=extra, validate=validate)


def validation_split(examples: list, labels, share: float, path=None) -> tuple[list, list]:
    """(training, validation): `share` of the rows of each label (at least one where a label has two or more rows;
    regression: of all rows) held out for choosing the epoch, drawn by a fixed seed (0) so that every run's seed
    changes its own initialisation and order, never the split; rows keep their file order."""
    import numpy as np

    groups: dict = {}
    for i, e in enumerate(examples):
        groups.setdefault(None if labels is None else e.label, []).append(i)
    rng, held = np.random.default_rng(0), set()
    for key in sorted(groups, key=str):
        rows = groups[key]
        take = max(1, round(share * len(rows))) if len(rows) >= 2 else 0
        held.update(rng.permutation(rows)[:take].tolist())
    if not held or len(held) == len(examples):
        raise DataError(f"{path}: {len(examples)} training rows leave no validation split of {share:.0%}; give "
                        "--select last")
    return [e for i, e in enumerate(examples) if i not in held], [e for i, e in enumerate(examples) if i in held]


def finetune_classify(model_path, train_file, dev_file, cfg, *, text_a, text_b=None, label="label",
                      regression: bool = False, max_seq_length: int = 128, header: bool = True) -> dict:
    """`bertkit finetune classify`: any CSV/TSV/JSONL classification (or regression) data."""
    train_examples = read_table(train_file, text_a, text_b, label, header=header)
    dev_examples = read_table(dev_file, text_a, text_b, label, header=header)
    labels = None if regression else label_list(train_examples)
    if labels is not None and len(labels) < 2:
        raise DataError(f"{train_file}: only one label ({labels}) in the training file; nothing to classify")
    best = "pearson" if regression else "accuracy"
    return run_classification(model_path, train_examples, dev_examples, labels, cfg, task="classify",
                              metric_fn=lambda p, g: classification_metrics(p, g, labels), best_metric=best,
                              max_seq_length=max_seq_length, train_file=train_file, dev_file=dev_file,
                              columns=(text_a, text_b))
