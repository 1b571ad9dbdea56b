"""The unigram plateau, named (issue 40, item 5): a run whose held-out [MASK] accuracy is not above always guessing
the most frequent token, a quarter of the way in, says so once in its log, with what usually moves it."""
import json
from collections import Counter

import pytest

from bertkit.data import InstanceDataset
from bertkit.pretrain.plateau import Plateau
from tests.helpers import make_instances_dir, tiny_run


def test_the_baseline_is_the_most_frequent_masked_token(tmp_path):
    inst = make_instances_dir(tmp_path / "inst", n=16, holdout=64, max_len=32)
    holdout = InstanceDataset(inst, "holdout", 0)
    labels = Counter(int(t) for i in range(len(holdout)) for t in holdout[(0, i)]["mlm_labels"] if t >= 0)
    token, count = labels.most_common(1)[0]
    p = Plateau.measure(holdout)
    assert p.baseline == pytest.approx(count / sum(labels.values()))
    assert p.token == (inst / "vocab.txt").read_text().split("\n")[token]


def test_check_says_it_once_and_only_past_a_quarter():
    p = Plateau(0.05, "w0")
    assert p.check({"eval_mlm_mask_acc": 0.04}, 10, 0.2) is None  # too early
    assert p.check({"eval_mlm_mask_acc": 0.30}, 50, 0.5) is None  # left the plateau
    note = p.check({"eval_mlm_mask_acc": 0.06}, 60, 0.6)
    assert note and "not above the unigram baseline (5.0 %, always guessing 'w0')" in note and "--recipe budget" in note
    assert p.check({"eval_mlm_mask_acc": 0.06}, 70, 0.7) is None  # once


def test_a_run_that_does_not_learn_is_told(tmp_path, capfd):
    """In its log once, and on its report page, which names the baseline the log recorded."""
    from bertkit.report import pretrain_report

    _, run = tiny_run(tmp_path, max_steps=8, eval_every=2, eval_batches=1, lr=1e-9, warmup=0)
    assert "has not left the plateau" in capfd.readouterr().err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    plateau = [r for r in records if "plateau" in r]
    assert len(plateau) == 1
    page = pretrain_report(run)
    assert f"{100 * plateau[0]['plateau']['baseline']:.1f} %" in page and "had not left the plateau" in page
