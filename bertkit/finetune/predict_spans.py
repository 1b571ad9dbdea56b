"""`bertkit predict` for the span tasks: a tagger over an unlabelled CoNLL file (each word line gets its tag and that
tag's probability), a reader over a SQuAD/KorQuAD JSON file without answers (SQuAD's predictions file, and the
n-best answers with their probabilities beside it)."""
from pathlib import Path

import numpy as np

from bertkit.errors import DataError
from bertkit.finetune.classify import read_utf8
from bertkit.finetune.ner import TaggedSentence, encode


def _softmax(logits) -> np.ndarray:
    logits = np.asarray(logits, dtype=np.float64)
    exp = np.exp(logits - logits.max(-1, keepdims=True))
    return exp / exp.sum(-1, keepdims=True)


def conll_words(lines: list[str], path: Path) -> tuple[list, list]:
    """(sentences, where): the words of each sentence (a line's first field; blank and -DOCSTART- lines divide) and
    the line index of each word."""
    sentences, where, words, lines_of = [], [], [], []
    for n, raw in enumerate(lines + [""]):
        fields = raw.split()
        if fields and fields[0] != "-DOCSTART-":
            words.append(fields[0])
            lines_of.append(n)
        elif words:
            sentences.append(TaggedSentence(lines_of[0] + 1, words, []))
            where.append(lines_of)
            words, lines_of = [], []
    if not sentences:
        raise DataError(f"{path}: no words (an empty file, or not CoNLL: one word per line, a blank line between "
                        "sentences)")
    return sentences, where


def predict_tags(model_dir: Path, config: dict, in_file: Path, out_file: Path, *, max_seq_length=None,
                 batch_size: int = 64) -> dict:
    from bertkit.fileio import atomic_write_bytes
    from bertkit.finetune.train import predict
    from bertkit.models import load_pretrained
    from bertkit.tokenization import load_tokenizer

    tags = [config["id2label"][str(i)] for i in range(len(config["id2label"]))]
    length = max_seq_length or (config.get("bertkit_inputs") or {}).get("max_seq_length", 128)
    lines = read_utf8(in_file).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    sentences, where = conll_words(lines, in_file)
    rows, firsts = encode(sentences, load_tokenizer(model_dir), length)
    model = load_pretrained(model_dir, head="token_classification", require_head=True)
    logits = predict(model, rows, batch_size, per_token=True, desc="predict")["logits"]
    counts, cut = {}, 0
    for k, positions in enumerate(firsts):
        probs = _softmax(logits[k])
        for w, pos in enumerate(positions):
            if pos is None:   # cut by the length: said, and tagged O as the scorer does
                tag, p, cut = "O", "", cut + 1
            else:
                tag, p = tags[int(probs[pos].argmax())], f"{probs[pos].max():.6f}"
            line = lines[where[k][w]].rstrip()
            gap = "\t" if "\t" in line else " "
            lines[where[k][w]] = f"{line}{gap}{tag}{gap}{p}" if p else f"{line}{gap}{tag}"
            counts[tag] = counts.get(tag, 0) + 1
    atomic_write_bytes(out_file, ("\n".join(lines) + "\n").encode())
    return {"rows": sum(map(len, firsts)), "labels": tags, "counts": counts, "words_cut": cut}


def predict_answers(model_dir: Path, config: dict, in_file: Path, out_file: Path, *, max_seq_length=None,
                    batch_size: int = 64) -> dict:
    import json

    from bertkit.fileio import atomic_write_bytes
    from bertkit.finetune.squad import feature_dicts, make_features, postprocess, read_squad
    from bertkit.finetune.train import predict
    from bertkit.models import load_pretrained
    from bertkit.tokenization import load_tokenizer

    inputs = config.get("bertkit_inputs") or {}
    version_2 = bool(inputs.get("version_2", False))
    window = {"max_seq_length": max_seq_length or inputs.get("max_seq_length", 384),
              "window_step": inputs.get("window_step"), "window_overlap": inputs.get("window_overlap"),
              "max_query_length": inputs.get("max_query_length", 64)}
    examples, _ = read_squad(in_file, training=False, version_2=version_2)
    features = make_features(examples, load_tokenizer(model_dir), False, **window)
    model = load_pretrained(model_dir, head="question_answering", require_head=True)
    out = predict(model, feature_dicts(features, False), batch_size, outputs=("start_logits", "end_logits"),
                  per_token=True, desc="predict")
    answers, nbest, _ = postprocess(examples, features, out["start_logits"], out["end_logits"],
                                    inputs.get("n_best_size", 20), inputs.get("max_answer_length", 30), version_2,
                                    inputs.get("null_score_diff_threshold", 0.0))
    atomic_write_bytes(out_file, (json.dumps(answers, ensure_ascii=False, indent=1) + "\n").encode())
    beside = out_file.with_name(out_file.stem + ".nbest.json")
    atomic_write_bytes(beside, (json.dumps(nbest, ensure_ascii=False, indent=1) + "\n").encode())
    return {"rows": len(answers), "labels": None, "counts": {}, "nbest": str(beside)}
