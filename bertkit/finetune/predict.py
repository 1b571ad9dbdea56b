"""`bertkit predict`: a fine-tuned model over an unlabelled file, written back in the format it was trained on, with
probabilities: a sentence or pair classifier (or regressor) over TSV/CSV/JSON lines, a tagger over CoNLL, a reader
over SQuAD JSON."""
import csv
import io
import json
from pathlib import Path

from bertkit.errors import DataError
from bertkit.finetune.classify import encode, jsonl_objects, read_table, read_utf8, table_rows

KINDS = {"ForSequenceClassification": "classify", "ForTokenClassification": "ner", "ForQuestionAnswering": "qa"}


def model_config(model_dir: Path) -> tuple[str, dict]:
    """(kind: classify | ner | qa, config.json) of a fine-tuned model folder; anything else is a DataError saying
    what the folder is and what predict reads."""
    path = model_dir / "config.json"
    if not path.is_file():
        raise DataError(f"{model_dir}: no config.json; give the model folder a fine-tuning saved (OUT/best/)")
    config = json.loads(read_utf8(path))
    architecture = str((config.get("architectures") or ["?"])[0])
    kind = next((k for suffix, k in KINDS.items() if architecture.endswith(suffix)), None)
    if kind is None:
        raise DataError(f"{path}: a {architecture}, not a fine-tuned model; predict reads what `bertkit finetune` "
                        "saved in OUT/best/ (classify, glue, the Korean sentence tasks, ner, squad, korquad)")
    if config.get("finetuning_task") == "klue-ner":
        raise DataError(f"{path}: a KLUE-NER tagger (character tags); predict tags CoNLL words (`finetune ner`)")
    return kind, config


def classifier_inputs(config: dict) -> dict:
    """What a classifier's config.json says of its task: labels (None: regression), its text columns, its length."""
    inputs = config.get("bertkit_inputs") or {}
    labels = inputs.get("labels", [config["id2label"][str(i)] for i in range(len(config.get("id2label", {})))])
    if config.get("num_labels", len(labels)) == 1 or inputs.get("regression"):
        labels = None
    return {"labels": labels, "text_a": inputs.get("text_a"), "text_b": inputs.get("text_b"),
            "max_seq_length": inputs.get("max_seq_length", 128)}


def predict_file(model_dir, in_file, out_file, *, text_a=None, text_b=None, header: bool = True,
                 max_seq_length: int | None = None, batch_size: int = 64) -> dict:
    """Predict every row of in_file (TSV, CSV or JSON lines) and write out_file in the same format: each row as it
    was, then `prediction` and, for classes, `p_LABEL` per label (JSON lines: "prediction", "probabilities").
    Columns default to those the model was trained on. Returns {"rows", "labels", "counts"}."""
    import numpy as np
    import torch

    from bertkit.finetune.train import predict
    from bertkit.models import load_pretrained
    from bertkit.tokenization import load_tokenizer

    model_dir, in_file, out_file = Path(model_dir), Path(in_file), Path(out_file)
    if out_file.resolve() == in_file.resolve():
        raise DataError(f"{out_file}: is the input file; give another --out")
    kind, config = model_config(model_dir)
    if kind != "classify":
        from bertkit.finetune.predict_spans import predict_answers, predict_tags

        run = predict_tags if kind == "ner" else predict_answers
        return run(model_dir, config, in_file, out_file, max_seq_length=max_seq_length, batch_size=batch_size)
    task = classifier_inputs(config)
    text_a, text_b = text_a or task["text_a"], text_b or task["text_b"]
    if text_a is None:
        raise DataError(f"{model_dir}: records no text column; give --text-a (and --text-b for pairs)")
    examples = read_table(in_file, text_a, text_b, None, header=header)
    rows = encode(examples, load_tokenizer(model_dir), max_seq_length or task["max_seq_length"])
    model = load_pretrained(model_dir, head="sequence_classification", require_head=True)
    with torch.no_grad():
        logits = np.stack(predict(model, rows, batch_size, desc="predict")["logits"]).astype(np.float64)
    labels = task["labels"]
    if labels is None:
        values, probs = logits[:, 0].tolist(), None
    else:
        exp = np.exp(logits - logits.max(-1, keepdims=True))
        probs = exp / exp.sum(-1, keepdims=True)
        values = [labels[i] for i in probs.argmax(-1)]
    _write_like(in_file, out_file, examples, values, probs, labels, header)
    counts = {lab: values.count(lab) for lab in labels} if labels else {}
    return {"rows": len(values), "labels": labels, "counts": counts}


def _write_like(in_file: Path, out_file: Path, examples: list, values: list, probs, labels, header: bool) -> None:
    from bertkit.fileio import atomic_write_bytes

    fmt = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}.get(in_file.suffix.lower(), "tsv")
    text = read_utf8(in_file)
    extra = ["prediction"] + ([f"p_{lab}" for lab in labels] if labels else [])

    def added(k):
        return [str(values[k])] + ([f"{p:.6f}" for p in probs[k]] if labels else [])

    if fmt == "jsonl":
        objects = dict(jsonl_objects(in_file, text, "one example's object"))
        lines = []
        for k, ex in enumerate(examples):
            obj = {**objects[ex.line], "prediction": values[k]}
            if labels:
                obj["probabilities"] = {lab: round(float(p), 6) for lab, p in zip(labels, probs[k])}
            lines.append(json.dumps(obj, ensure_ascii=False))
        atomic_write_bytes(out_file, ("\n".join(lines) + "\n").encode())
        return
    table = table_rows(text, fmt, in_file)
    out = [table[0] + extra] if header else []
    out += [table[ex.line - 1] + added(k) for k, ex in enumerate(examples)]
    if fmt == "tsv":
        data = "".join("\t".join(row) + "\n" for row in out)
    else:
        buffer = io.StringIO(newline="")
        csv.writer(buffer, lineterminator="\n").writerows(out)
        data = buffer.getvalue()
    atomic_write_bytes(out_file, data.encode())
