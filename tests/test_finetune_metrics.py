"""Fine-tuning metrics against cases computed by hand from the official definitions."""
import math

import pytest

from bertkit.finetune import metrics as M


def test_normalize_answer_official_rules():
    assert M.normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert M.normalize_answer("an apple, a pear") == "apple pear"
    assert M.normalize_answer("theatre") == "theatre"  # articles only as whole words
    assert M.normalize_answer("  ") == ""


def test_exact_match_and_f1_by_hand():
    assert M.exact_match("the Denver Broncos", "Denver Broncos.") == 1.0
    assert M.exact_match("Denver", "Denver Broncos") == 0.0
    # P = 1/1, R = 1/2 -> F1 = 2/3
    assert M.span_f1("Denver", "Denver Broncos") == pytest.approx(2 / 3)
    # pred "a b b c" vs gold "b b d": common b,b -> P = 2/4, R = 2/3 -> F1 = 4/7
    assert M.span_f1("x y y z", "y y w") == pytest.approx(4 / 7)
    assert M.span_f1("nothing", "in common") == 0.0
    assert M.span_f1("", "") == 1.0 and M.span_f1("", "x") == 0.0


def _data(questions):
    qas = [{"id": qid, "question": "?", "answers": [{"text": t, "answer_start": 0} for t in answers],
            **({"is_impossible": not answers} if any(not a for _, a in questions) else {})}
           for qid, answers in questions]
    return [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]


def test_squad_v1_scores_max_over_golds_and_missing_is_zero():
    data = _data([("q1", ["Denver Broncos", "Broncos"]), ("q2", ["Carolina Panthers"]), ("q3", ["1990"])])
    preds = {"q1": "Broncos", "q2": "the Panthers"}  # q3 unanswered
    out = M.squad_evaluate(data, preds)
    # q1: EM 1 (second gold), F1 1; q2: EM 0, F1 = 2*(1*0.5)/(1.5) = 2/3; q3: 0
    assert out["exact_match"] == pytest.approx(100 / 3)
    assert out["f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)


def test_squad_v2_hasans_noans_and_best_threshold():
    data = _data([("a", ["Paris"]), ("b", []), ("c", ["blue sky"]), ("d", [])])
    preds = {"a": "Paris", "b": "", "c": "sky", "d": "London"}
    out = M.squad_evaluate(data, preds)
    assert out["total"] == 4 and out["HasAns_total"] == 2 and out["NoAns_total"] == 2
    assert out["HasAns_exact"] == pytest.approx(50.0)
    assert out["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)
    assert out["NoAns_exact"] == pytest.approx(50.0)
    assert out["exact"] == pytest.approx(50.0)
    # null odds, as evaluate-v2.0.py: start from "everything null" (2 right), then open questions by rising odds
    odds = {"a": 3.0, "b": 1.0, "c": -1.0, "d": 2.0}
    out = M.squad_evaluate(data, preds, odds)
    # exact: c +0 (its EM is 0), b +0, d -1, a +1 -> never above 2: 50% at threshold 0
    assert out["best_exact"] == pytest.approx(50.0) and out["best_exact_thresh"] == 0.0
    # f1: c +2/3 -> 2.667 (best, at its odds -1.0), b +0, d -1, a +1 -> 2.667 (not above)
    assert out["best_f1"] == pytest.approx(100 * (2 + 2 / 3) / 4) and out["best_f1_thresh"] == -1.0

def test_classification_metrics_by_hand():
    preds, labels = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]
    # tp=2 fp=1 fn=1 tn=1 -> MCC = (2*1 - 1*1)/sqrt(3*3*2*2) = 1/6
    assert M.matthews_corrcoef(preds, labels) == pytest.approx(1 / 6)
    assert M.matthews_corrcoef([1, 1, 1], [1, 0, 1]) == 0.0  # an empty margin -> 0, as sklearn
    assert M.accuracy(preds, labels) == pytest.approx(3 / 5)
    assert M.binary_f1(preds, labels) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))


def test_pearson_and_spearman_by_hand():
    # dx = [-1.5,-.5,.5,1.5], dy = [-3,-1,0,4]: sxy = 11, sxx = 5, syy = 26
    assert M.pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(11 / math.sqrt(130))
    # ties share ranks: x -> [1, 2.5, 2.5, 4]; y -> [1, 3, 2, 4]: 4.5 / sqrt(4.5 * 5)
    assert M.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert M.spearman([1, 2, 3], [10, 200, 3000]) == pytest.approx(1.0)


def test_entities_like_seqeval():
    assert M.get_entities(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
    assert M.get_entities(["I-PER", "I-PER", "O"]) == [("PER", 0, 1)]            # I- after O opens an entity
    assert M.get_entities(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 2)]  # type change splits
    assert M.get_entities(["B-PER", "B-PER"]) == [("PER", 0, 0), ("PER", 1, 1)]
    # seqeval's README example: one of two entities right in each direction -> P = R = F1 = 0.5
    gold = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    pred = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    out = M.entity_scores(gold, pred)
    assert (out["precision"], out["recall"], out["f1"]) == pytest.approx((0.5, 0.5, 0.5))
    assert out["PER_f1"] == 1.0 and out["MISC_f1"] == 0.0
    assert out["accuracy"] == pytest.approx(8 / 10)  # tokens 2 and 3 of the first sentence differ
    # 3 gold, 2 predicted, 1 right: P = 1/2, R = 1/3, F1 = 0.4
    out = M.entity_scores([["B-A", "O", "B-B", "I-B", "B-C"]], [["B-A", "O", "B-B", "O", "O"]])
    assert (out["precision"], out["recall"], out["f1"]) == pytest.approx((0.5, 1 / 3, 0.4))
