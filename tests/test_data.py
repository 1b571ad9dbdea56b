"""The pretraining loader: memory-mapped instances, per-epoch permutation per rank, resume skip, padding, masking."""
import json

import numpy as np
import pytest

from bertkit.data import EpochBatches, InstanceDataset, TokenBudgetBatches, best_fit, collate
from bertkit.fileio import atomic_write_json
from bertkit.formats import DamagedFileError, InstancesError, MaskingOptions, read_instances_manifest
from bertkit.masking import MaskingSpec, mask_instance
from tests.helpers import make_instances_dir, toy_vocab


def test_static_rows_come_back_exactly(tmp_path):
    d = make_instances_dir(tmp_path / "inst", n=230, holdout=10, mode="static", rows_per_shard=100)
    ds = InstanceDataset(d, "train")
    assert len(ds) == 230 and len(InstanceDataset(d, "holdout")) == 10
    import pyarrow.ipc as ipc

    table = ipc.open_file(str(d / "instances-00002.arrow")).read_all()  # rows 200..229
    for j in (0, 17, 29):
        row = ds[(0, 200 + j)]
        assert row["input_ids"].tolist() == table["input_ids"][j].as_py()
        assert row["mlm_positions"].tolist() == table["masked_positions"][j].as_py()
        assert row["mlm_labels"].tolist() == table["masked_ids"][j].as_py()
        b = table["b_start"][j].as_py()
        assert row["token_type_ids"].tolist() == [0] * b + [1] * (len(row["input_ids"]) - b)
        assert row["next_sentence_label"] == table["next_sentence_label"][j].as_py()
    # static masking does not depend on the epoch
    assert ds[(3, 5)]["input_ids"].tolist() == ds[(0, 5)]["input_ids"].tolist()


def test_dynamic_masking_is_keyed_by_seed_epoch_index(tmp_path):
    d = make_instances_dir(tmp_path / "inst", n=64, holdout=4)
    ds = InstanceDataset(d, "train", seed=3)
    a, again, other_epoch = ds[(0, 7)], ds[(0, 7)], ds[(1, 7)]
    assert a["input_ids"].tolist() == again["input_ids"].tolist()
    assert a["mlm_positions"].tolist() == again["mlm_positions"].tolist()
    assert a["mlm_positions"].tolist() != other_epoch["mlm_positions"].tolist()
    # the same function make-instances uses, with the documented seed
    raw = InstanceDataset(d, "train", seed=3).input_ids.get(0, 7).astype(np.int64)
    spec = MaskingSpec.from_vocab(toy_vocab(), MaskingOptions(max_predictions=10))
    ids, pos, lab = mask_instance(raw, np.random.default_rng([3, 0, 7]), spec)
    assert a["input_ids"].tolist() == ids.tolist() and a["mlm_positions"].tolist() == pos.tolist()
    assert (raw[a["mlm_positions"]] == a["mlm_labels"]).all()


def test_dynamic_masking_statistics(tmp_path):
    """Over many rows and epochs: 15% of tokens chosen (capped), never [CLS]/[SEP]; 80/10/10 mask/keep/random."""
    d = make_instances_dir(tmp_path / "inst", n=400, holdout=4, max_predictions=64)
    ds = InstanceDataset(d, "train", seed=11)
    chosen = total = n_mask = n_keep = n_random = 0
    expected_chosen = 0
    for epoch in range(3):
        for i in range(len(ds)):
            r = ds[(epoch, i)]
            raw = ds.input_ids.get(*ds._locate(i)).astype(np.int64)
            pos = r["mlm_positions"]
            assert (np.diff(pos) > 0).all()
            assert not np.isin(raw[pos], [2, 3]).any()
            new = r["input_ids"][pos]
            n_mask += int((new == 4).sum())
            n_keep += int((new == raw[pos]).sum())
            n_random += int(((new != 4) & (new != raw[pos])).sum())
            chosen += len(pos)
            total += len(raw)
            expected_chosen += min(64, max(1, round(len(raw) * 0.15)))
            # unchosen positions are untouched
            rest = np.setdiff1d(np.arange(len(raw)), pos)
            assert (r["input_ids"][rest] == raw[rest]).all()
    assert chosen == expected_chosen
    # a random replacement may draw the original token (1/120), counted as kept: tolerance covers it
    sd = np.sqrt(chosen * 0.1 * 0.9)
    assert abs(n_mask / chosen - 0.8) < 4 * np.sqrt(0.16 / chosen)
    assert abs(n_keep - 0.1 * chosen) < 4 * sd + chosen / 120
    assert abs(n_random - 0.1 * chosen) < 4 * sd + chosen / 120


def test_epoch_batches_partition_and_resume():
    n, micro, world = 103, 4, 3
    samplers = [EpochBatches(n, micro, seed=5, rank=r, world_size=world) for r in range(world)]
    per_epoch = samplers[0].per_epoch
    assert per_epoch == 103 // 12
    for epoch in range(2):
        seen = np.concatenate([s.epoch_indices(epoch).ravel() for s in samplers])
        assert len(seen) == len(set(seen.tolist())) == per_epoch * micro * world  # disjoint across ranks
    assert not np.array_equal(samplers[0].epoch_indices(0), samplers[0].epoch_indices(1))
    # resume at micro batch 11 (epoch 1, batch 3) yields exactly what the uninterrupted stream yields from there
    full = samplers[1].__iter__()
    stream = [next(full) for _ in range(20)]
    resumed = EpochBatches(n, micro, seed=5, rank=1, world_size=world, start_epoch=11 // per_epoch,
                           start=11 % per_epoch).__iter__()
    assert [next(resumed) for _ in range(9)] == stream[11:]
    assert all(e == (i // per_epoch) for i, b in enumerate(stream) for e, _ in b)


def test_collate_pads_to_multiple_of_8():
    rows = [{"input_ids": np.array([2, 10, 11, 3]), "token_type_ids": np.array([0, 0, 0, 0]),
             "mlm_positions": np.array([1]), "mlm_labels": np.array([9]), "next_sentence_label": 0},
            {"input_ids": np.arange(2, 13), "token_type_ids": np.array([0] * 5 + [1] * 6),
             "mlm_positions": np.array([2, 5, 7]), "mlm_labels": np.array([20, 21, 22]), "next_sentence_label": 1}]
    b = collate(rows)
    assert b["input_ids"].shape == (2, 16) and b["mlm_positions"].shape == (2, 8)
    assert b["attention_mask"].sum(1).tolist() == [4, 11]
    assert b["input_ids"][0, 4:].eq(0).all() and b["token_type_ids"][1, 5:11].eq(1).all()
    assert b["mlm_labels"][0].tolist() == [9] + [-100] * 7
    assert b["next_sentence_label"].tolist() == [0, 1]


def test_bad_instances_folders(tmp_path):
    with pytest.raises(InstancesError, match="no such instances folder"):
        read_instances_manifest(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InstancesError, match="no manifest.json.*make-instances"):
        read_instances_manifest(tmp_path / "empty")
    d = make_instances_dir(tmp_path / "inst", n=16, holdout=2)
    m = json.loads((d / "manifest.json").read_text())
    m["complete"] = False
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(InstancesError, match="did not finish"):
        read_instances_manifest(d)
    m["complete"] = True
    (d / "manifest.json").write_text(json.dumps(m | {"shards": [s for s in m["shards"] if s["split"] != "train"]}))
    with pytest.raises(InstancesError, match="no training instances"):
        read_instances_manifest(d)
    (d / "manifest.json").write_text(json.dumps(m))
    (d / "instances-00000.arrow").unlink()
    with pytest.raises(DamagedFileError, match="instances-00000.arrow: listed in .* but missing.*bertkit verify"):
        read_instances_manifest(d)
    with pytest.raises(InstancesError, match="cannot fill one micro batch"):
        next(iter(EpochBatches(5, 4, seed=0, world_size=2)))


def test_dynamic_loader_keeps_the_reference_flags_of_make_instances(tmp_path):
    """A dynamic folder made with --random-from-whole-vocab / --wwm-decide-per-piece is masked the same way, and an
    older manifest (the masking options flat, two switches under "reference_behaviour") is read as it was meant."""
    d = make_instances_dir(tmp_path / "inst", n=8, holdout=2)
    assert not np.isin(InstanceDataset(d, "train").spec.random_ids, [0, 1, 2, 3, 4]).any()
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["masking"].update(random_from_whole_vocab=True, wwm_decide_per_piece=True)
    atomic_write_json(d / "manifest.json", manifest)
    spec = InstanceDataset(d, "train").spec
    assert spec.random_ids.tolist() == list(range(len(toy_vocab()))) and spec.options.wwm_decide_per_piece

    older = {k: v for k, v in manifest.items() if k not in ("masking", "same_doc_notnext")}
    older.update(max_predictions=7, masked_lm_prob=0.2, whole_word_mask=True, mask_replace=[0.6, 0.2, 0.2],
                 reference_behaviour={"random_from_whole_vocab": False, "wwm_decide_per_piece": True,
                                      "same_doc_notnext": True})
    atomic_write_json(d / "manifest.json", older)
    m = read_instances_manifest(d)
    assert m.masking == MaskingOptions(masked_lm_prob=0.2, max_predictions=7, whole_word_mask=True,
                                       mask_replace=(0.6, 0.2, 0.2), wwm_decide_per_piece=True)
    assert m.same_doc_notnext
    older["mask_replace"] = [0.6, 0.6, 0.2]
    atomic_write_json(d / "manifest.json", older)
    with pytest.raises(InstancesError, match=r"manifest.json: its masking options are not usable \(--mask-replace"):
        read_instances_manifest(d)


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_mask_id_comes_from_the_copied_vocabulary(tmp_path, mode):
    path = make_instances_dir(tmp_path / mode, n=16, holdout=4, mode=mode)
    assert InstanceDataset(path, "train").mask_id == toy_vocab().index("[MASK]")
    if mode == "static":  # static rows need no vocabulary: without one there is no [MASK] accuracy, not an error
        (path / "vocab.txt").unlink()
        assert InstanceDataset(path, "train").mask_id is None


def test_best_fit_packs_every_row_once_within_the_budget():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 65, 500)
    bins = best_fit(lengths, rng.permutation(500), 64)
    rows = sorted(r for b in bins for r in b)
    assert rows == list(range(500))
    assert all(lengths[b].sum() <= 64 for b in bins)
    # best fit is close to the bound no packing can beat (the tokens over the budget)
    assert len(bins) <= 1.1 * np.ceil(lengths.sum() / 64)
    # the fullest bin that fits, not the first: a row of 10 goes to the bin with 12 left, not the one with 30
    assert best_fit(np.array([34, 52, 10]), np.arange(3), 64) == [[0], [1, 2]]


def test_token_budget_batches_are_the_same_count_on_every_rank_and_resume_in_place():
    lengths = np.random.default_rng(1).integers(8, 100, 700)
    ranks = [TokenBudgetBatches(lengths, 128, seed=3, rank=r, world_size=2) for r in range(2)]
    per_epoch = ranks[0].per_epoch
    assert per_epoch == lengths.sum() // (128 * 2)
    for epoch in (0, 1):
        bins = [s.epoch_bins(epoch) for s in ranks]
        assert [len(b) for b in bins] == [per_epoch, per_epoch]
        seen = [r for b in bins for batch in b for r in batch]
        assert len(seen) == len(set(seen))                                    # no row twice in an epoch
        assert all(lengths[batch].sum() <= 128 for b in bins for batch in b)
    assert ranks[0].epoch_bins(0) != ranks[0].epoch_bins(1)                   # a new packing each epoch

    def take(sampler, n):
        it = iter(sampler)
        return [next(it) for _ in range(n)]

    whole = take(TokenBudgetBatches(lengths, 128, seed=3), per_epoch * 2 + 5)
    consumed = per_epoch + 7
    start_epoch, start = divmod(consumed, TokenBudgetBatches(lengths, 128, seed=3).per_epoch)
    resumed = take(TokenBudgetBatches(lengths, 128, seed=3, start_epoch=start_epoch, start=start), 10)
    assert resumed == whole[consumed:consumed + 10]
    with pytest.raises(InstancesError, match="--token-budget 64: an instance has 99 tokens"):
        TokenBudgetBatches(np.array([10, 99]), 64, seed=0)


@pytest.mark.parametrize("kind", ["sequences", "token budget"])
def test_tokens_drawn_are_the_tokens_every_rank_s_micro_batches_held(kind):
    """Over an epoch's end, on two ranks: the count equals the lengths of the rows each rank's iterator gave."""
    import itertools

    from bertkit.data import tokens_drawn

    lengths = np.random.default_rng(0).integers(5, 40, size=53)
    total = 0
    for rank in (0, 1):
        sampler = EpochBatches(53, 4, 7, rank, 2) if kind == "sequences" else \
            TokenBudgetBatches(lengths, 64, 7, rank, 2)
        batches = list(itertools.islice(iter(sampler), sampler.per_epoch + 2))   # into the second epoch
        total += sum(int(lengths[row]) for batch in batches for _, row in batch)
    assert tokens_drawn(sampler, lengths, sampler.per_epoch + 2) == total
