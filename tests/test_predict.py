"""`bertkit predict` labels an unlabelled file with a fine-tuned classifier, in that file's own format, and every
classification result records per-class scores and the confusion matrix that `bertkit report` draws."""
import csv
import json

import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.finetune.metrics import class_report
from tests.helpers import tiny_model_folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny classifier fine-tuned on three classes of word pairs, with its dev file and its run folder."""
    root = tmp_path_factory.mktemp("predict")
    model = tiny_model_folder(root)
    rows = ["first\tsecond\tlabel"] + [f"w{i % 9} w{(i * 5) % 9}\tw{(i * 3) % 7}\t{'abc'[i % 3]}" for i in range(60)]
    (root / "train.tsv").write_text("\n".join(rows) + "\n")
    (root / "dev.tsv").write_text("\n".join(rows[:1] + rows[1:25]) + "\n")
    r = CliRunner().invoke(main, ["finetune", "classify", "--model", str(model), "--train-file",
                                  str(root / "train.tsv"), "--dev-file", str(root / "dev.tsv"), "--text-a", "first",
                                  "--text-b", "second", "--label", "label", "--epochs", "2", "--lr", "1e-3",
                                  "--max-seq-length", "16", "--out", str(root / "run")])
    assert r.exit_code == 0, r.output
    return root


def test_predict_gives_the_kept_models_dev_predictions_in_the_files_format(trained):
    root = trained
    unlabelled = root / "test.no_label.tsv"
    unlabelled.write_text("".join("\t".join(line.split("\t")[:2]) + "\n"
                                  for line in (root / "dev.tsv").read_text().splitlines()))
    r = CliRunner().invoke(main, ["predict", str(root / "run" / "best"), str(unlabelled), "--out",
                                  str(root / "preds.tsv")])
    assert r.exit_code == 0, r.output
    lines = (root / "preds.tsv").read_text().splitlines()
    assert lines[0].split("\t") == ["first", "second", "prediction", "p_a", "p_b", "p_c"]
    got = [line.split("\t") for line in lines[1:]]
    assert [g[:2] for g in got] == [line.split("\t") for line in unlabelled.read_text().splitlines()[1:]]
    expected = json.loads((root / "run" / "dev_predictions.json").read_text())   # the kept epoch's, from training
    assert [g[2] for g in got] == expected
    for g in got:
        probs = [float(p) for p in g[3:]]
        assert sum(probs) == pytest.approx(1, abs=1e-5) and g[2] == "abc"[probs.index(max(probs))]
    assert f"predicted {len(got)} rows" in r.output
    again = CliRunner().invoke(main, ["predict", str(root / "run" / "best"), str(unlabelled), "--out",
                                      str(root / "preds.tsv")])
    assert again.exit_code == 1 and "--overwrite" in again.output


def test_predict_reads_and_writes_csv_and_json_lines(trained):
    root = trained
    dev = [line.split("\t") for line in (root / "dev.tsv").read_text().splitlines()[1:]]
    with open(root / "in.csv", "w", newline="") as f:
        csv.writer(f).writerows([["id", "first", "second"]] + [[str(i), a, b] for i, (a, b, _) in enumerate(dev)])
    (root / "in.jsonl").write_text("".join(json.dumps({"first": a, "second": b, "id": i}) + "\n"
                                           for i, (a, b, _) in enumerate(dev)))
    expected = json.loads((root / "run" / "dev_predictions.json").read_text())
    assert CliRunner().invoke(main, ["predict", str(root / "run" / "best"), str(root / "in.csv"), "--out",
                                     str(root / "out.csv")]).exit_code == 0
    with open(root / "out.csv", newline="") as f:
        table = list(csv.reader(f))
    assert table[0][:4] == ["id", "first", "second", "prediction"] and [r[3] for r in table[1:]] == expected
    assert CliRunner().invoke(main, ["predict", str(root / "run" / "best"), str(root / "in.jsonl"), "--out",
                                     str(root / "out.jsonl")]).exit_code == 0
    objects = [json.loads(line) for line in (root / "out.jsonl").read_text().splitlines()]
    assert [o["prediction"] for o in objects] == expected and [o["id"] for o in objects] == list(range(len(dev)))
    assert all(set(o["probabilities"]) == {"a", "b", "c"} for o in objects)


def test_predict_refuses_what_it_cannot_read(trained, tmp_path):
    root = trained
    (tmp_path / "x.tsv").write_text("other\tcolumns\nw1\tw2\n")
    r = CliRunner().invoke(main, ["predict", str(root / "run" / "best"), str(tmp_path / "x.tsv"), "--out",
                                  str(tmp_path / "y.tsv")])
    assert r.exit_code == 1 and "no column 'first'" in r.output and "Traceback" not in r.output
    model = tiny_model_folder(tmp_path, "pretrained")
    r = CliRunner().invoke(main, ["predict", str(model), str(tmp_path / "x.tsv"), "--out", str(tmp_path / "y.tsv")])
    assert r.exit_code == 1 and "a BertForPreTraining, not a fine-tuned model" in r.output


def test_the_kept_epochs_classes_are_recorded_and_drawn(trained):
    root = trained
    classes = json.loads((root / "run" / "dev_classes.json").read_text())
    expected = json.loads((root / "run" / "dev_predictions.json").read_text())
    gold = [line.split("\t")[2] for line in (root / "dev.tsv").read_text().splitlines()[1:]]
    assert classes["labels"] == ["a", "b", "c"]
    for i, g in enumerate("abc"):
        assert classes["confusion"][i] == [sum(1 for y, p in zip(gold, expected) if y == g and p == q) for q in "abc"]
    r = CliRunner().invoke(main, ["report", str(root / "run")])
    assert r.exit_code == 0, r.output
    page = (root / "run" / "report.html").read_text()
    assert "confusion matrix" in page and "per class" in page


def test_class_report_by_hand():
    report = class_report([0, 0, 1, 1, 2, 0], [0, 1, 1, 1, 2, 2], ["x", "y", "z"])
    assert report["confusion"] == [[1, 0, 0], [1, 2, 0], [1, 0, 1]]
    assert report["per_class"]["x"] == {"precision": 1 / 3, "recall": 1.0, "f1": 0.5, "support": 1}
    assert report["per_class"]["y"]["precision"] == 1.0 and report["per_class"]["y"]["recall"] == 2 / 3
    assert report["per_class"]["z"]["f1"] == pytest.approx(2 * 1 * 0.5 / 1.5)
    assert class_report([1], [0], ["x", "y"])["per_class"]["x"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0,
                                                                      "support": 1}


def test_a_tagger_tags_an_unlabelled_conll_file_as_it_tagged_dev(tmp_path):
    from bertkit.finetune.ner import finetune_ner
    from bertkit.finetune.train import TrainConfig

    model = tiny_model_folder(tmp_path)
    sentences = [[(f"w{(i * 3 + j) % 20}", ["O", "B-X", "I-X"][(i + j) % 3]) for j in range(3 + i % 5)]
                 for i in range(24)]
    conll = "-DOCSTART- O\n\n" + "\n".join("\n".join(f"{w} {t}" for w, t in s) + "\n" for s in sentences)
    (tmp_path / "train.txt").write_text(conll)
    finetune_ner(model, tmp_path / "train.txt", tmp_path / "train.txt",
                 TrainConfig(out_dir=str(tmp_path / "run"), epochs=1, batch_size=8, learning_rate=1e-3,
                             report_to="none"), max_seq_length=16)
    words_only = "".join((line.split()[0] if line.split() and line.split()[0] != "-DOCSTART-" else line) + "\n"
                         for line in conll.splitlines())
    (tmp_path / "test.txt").write_text(words_only)
    r = CliRunner().invoke(main, ["predict", str(tmp_path / "run" / "best"), str(tmp_path / "test.txt"), "--out",
                                  str(tmp_path / "tags.txt")])
    assert r.exit_code == 0, r.output
    expected = [tag for s in json.loads((tmp_path / "run" / "dev_predictions.json").read_text())
                for tag in s["predicted"]]
    out = (tmp_path / "tags.txt").read_text().splitlines()
    word_lines = [line.split() for line in out if line.split() and line.split()[0] != "-DOCSTART-"]
    assert [w[0] for w in word_lines] == [w for s in sentences for w, _ in s]   # every word, in order
    assert [w[1] for w in word_lines if len(w) == 3] == [t for t, w in zip(expected, word_lines) if len(w) == 3]
    assert all(0 < float(w[2]) <= 1 for w in word_lines if len(w) == 3)
    assert out == [line if not line.split() or line.startswith("-DOCSTART-") else out[i]
                   for i, line in enumerate(words_only.splitlines())]   # the file's layout kept


def test_a_reader_answers_an_unanswered_squad_file_as_it_answered_dev(tmp_path):
    import random

    from bertkit.finetune.squad import finetune_squad
    from bertkit.finetune.train import TrainConfig

    model = tiny_model_folder(tmp_path)
    rng, paragraphs = random.Random(0), []
    for i in range(12):
        words = [f"w{rng.randrange(27)}" for _ in range(rng.randint(4, 20))]
        a = rng.randrange(len(words) - 1)
        paragraphs.append({"context": " ".join(words), "qas": [{"id": str(i), "question": f"w{i} w{i + 1}", "answers": [
            {"text": " ".join(words[a:a + 2]), "answer_start": len(" ".join(words[:a] + [""]))}]}]})
    data = {"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}
    (tmp_path / "dev.json").write_text(json.dumps(data))
    finetune_squad(model, tmp_path / "dev.json", tmp_path / "dev.json",
                   TrainConfig(out_dir=str(tmp_path / "run"), epochs=1, batch_size=4, learning_rate=1e-3,
                               report_to="none"), max_seq_length=24, window_step=8, max_query_length=4)
    for p in paragraphs:
        for qa in p["qas"]:
            qa.pop("answers")
    (tmp_path / "test.json").write_text(json.dumps(data))
    r = CliRunner().invoke(main, ["predict", str(tmp_path / "run" / "best"), str(tmp_path / "test.json"), "--out",
                                  str(tmp_path / "answers.json")])
    assert r.exit_code == 0, r.output
    got = json.loads((tmp_path / "answers.json").read_text())
    assert got == json.loads((tmp_path / "run" / "predictions.json").read_text())
    nbest = json.loads((tmp_path / "answers.nbest.json").read_text())
    assert set(nbest) == set(got) and all(abs(sum(c["probability"] for c in v) - 1) < 1e-6 for v in nbest.values())
