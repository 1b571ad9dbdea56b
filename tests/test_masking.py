"""bertkit.masking: rule 6 of make-instances, checked on hand-built rows whose outcome can be computed by hand."""
import numpy as np
import pytest

from bertkit.formats import MaskingOptions
from bertkit.masking import KIND_KEPT, KIND_MASK, KIND_RANDOM, MaskingSpec, mask_batch, mask_instance, num_to_predict

# a tiny BERT-ordered vocabulary: ids 0..4 specials, 5..9 [unused], then words and pieces
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"[unused{i}]" for i in range(5)] + [
    "a", "##b", "##c", "d", "e", "##f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p"]
ID = {t: i for i, t in enumerate(VOCAB)}
CLS, SEP, MASK = ID["[CLS]"], ID["[SEP]"], ID["[MASK]"]


def row(*tokens):
    return np.array([ID[t] for t in tokens], dtype=np.int64)


def ragged(rows):
    return np.concatenate(rows), np.concatenate([[0], np.cumsum([len(r) for r in rows])])


def test_num_to_predict_matches_python_round_half_even():
    spec = MaskingSpec.from_vocab(VOCAB, MaskingOptions(masked_lm_prob=0.15, max_predictions=20))
    n = np.arange(1, 513)
    expected = [min(20, max(1, int(round(x * 0.15)))) for x in n]
    assert num_to_predict(n, spec).tolist() == expected
    # the half-even cases by hand: 30*0.15 = 4.5 -> 4, 50*0.15 = 7.5 -> 8, 3*0.15 = 0.45 -> 0 -> at least 1
    assert num_to_predict([30, 50, 3, 1000], spec).tolist() == [4, 8, 1, 20]


def test_selection_count_candidates_labels_and_order():
    spec = MaskingSpec.from_vocab(VOCAB, MaskingOptions(masked_lm_prob=0.3, max_predictions=5))
    rows = [row("[CLS]", "g", "h", "i", "[SEP]", "j", "k", "l", "m", "n", "[SEP]"),   # len 11 -> round(3.3)=3
            row("[CLS]", "o", "[SEP]", "p", "[SEP]"),                                  # len 5 -> round(1.5)=2
            row("[CLS]", *["g"] * 40, "[SEP]", "h", "[SEP]")]                          # len 44 -> 13 -> cap 5
    ids, offsets = ragged(rows)
    rng = np.random.default_rng(0)
    for _ in range(50):
        masked, pos, labels, pred_off, kinds = mask_batch(ids, offsets, rng, spec)
        assert np.diff(pred_off).tolist() == [3, 2, 5]
        assert np.all(np.diff(pos) > 0)  # ascending, no repeats
        assert not np.isin(ids[pos], [CLS, SEP]).any()                                         # never [CLS]/[SEP]
        assert np.array_equal(labels, ids[pos])
        untouched = np.setdiff1d(np.arange(len(ids)), pos)
        assert np.array_equal(masked[untouched], ids[untouched])
        assert np.all(masked[pos[kinds == KIND_MASK]] == MASK)
        assert np.array_equal(masked[pos[kinds == KIND_KEPT]], ids[pos[kinds == KIND_KEPT]])


def test_fewer_candidates_than_the_number_takes_them_all():
    spec = MaskingSpec.from_vocab(VOCAB, MaskingOptions(masked_lm_prob=0.5, max_predictions=20))
    r = row("[CLS]", "g", "[SEP]", "h", "[SEP]")  # round(2.5) = 2 = both candidates
    _, pos, labels = mask_instance(r, np.random.default_rng(1), spec)
    assert pos.tolist() == [1, 3] and labels.tolist() == [ID["g"], ID["h"]]


def test_80_10_10_split_uniform_positions_and_random_tokens_avoid_specials():
    spec = MaskingSpec.from_vocab(VOCAB, MaskingOptions(masked_lm_prob=0.15, max_predictions=20))
    rows = [row("[CLS]", *"ghijklmnop", "[SEP]", *"ghijklmnop", "[SEP]")] * 4000  # len 23 -> 3 predictions each
    ids, offsets = ragged(rows)
    masked, pos, labels, pred_off, kinds = mask_batch(ids, offsets, np.random.default_rng(2), spec)
    assert len(pos) == 12000
    share = np.bincount(kinds, minlength=3) / len(kinds)
    assert abs(share[KIND_MASK] - 0.8) < 0.015 and abs(share[KIND_KEPT] - 0.1) < 0.01
    assert abs(share[KIND_RANDOM] - 0.1) < 0.01
    # every candidate position of the row is equally likely: 20 candidates, 3 picks -> 3/20 each
    local = pos - np.repeat(offsets[:-1], np.diff(pred_off))
    counts = np.bincount(local, minlength=23)
    assert counts[[0, 11, 22]].sum() == 0
    assert np.all(np.abs(counts[np.r_[1:11, 12:22]] / 4000 - 3 / 20) < 0.025)
    # improvement: a random replacement is never a special or [unused] token
    replaced = masked[pos[kinds == KIND_RANDOM]]
    assert replaced.min() >= ID["a"] and len(np.unique(replaced)) > 10


def test_mask_instance_one_row_path_has_the_same_rule_and_split():
    spec = MaskingSpec.from_vocab(VOCAB, MaskingOptions(masked_lm_prob=0.15, max_predictions=20))
    r = row("[CLS]", *"ghijklmnop", "[SEP]", *"ghijklmnop", "[SEP]")      # len 23 -> 3 of 20 candidates
    rng = np.random.default_rng(12)
    counts, kinds = np.zeros(len(r), int), np.zeros(3, int)
    for _ in range(4000):
        masked, pos, labels = mask_instance(r, rng, spec)
        assert len(pos) == 3 and np.all(np.diff(pos) > 0) and np.array_equal(labels, r[pos])
        counts[pos] += 1
        kinds[KIND_MASK] += int((masked[pos] == MASK).sum())
        kinds[KIND_KEPT] += int((masked[pos] == r[pos]).sum())
        other = masked[pos][(masked[pos] != MASK) & (masked[pos] != r[pos])]
        kinds[KIND_RANDOM] += len(other)
        assert np.all(other >= ID["a"])                                     # never a special or [unused]
    assert counts[[0, 11, 22]].sum() == 0
    assert np.all(np.abs(counts[np.r_[1:11, 12:22]] / 4000 - 3 / 20) < 0.025)
    share = kinds / kinds.sum()       # a random draw equal to the original counts as kept: 1/16 of 10 %
    assert abs(share[KIND_MASK] - 0.8) < 0.015 and abs(share[KIND_KEPT] - (0.1 + 0.1 / 16)) < 0.012


def test_random_from_whole_vocab_restores_reference_draws():
    spec = MaskingSpec.from_vocab(VOCAB, MaskingOptions(random_from_whole_vocab=True))
    assert spec.random_ids.tolist() == list(range(len(VOCAB)))
    rows = [row("[CLS]", *"ghijklmnop", "[SEP]", *"ghijklmnop", "[SEP]")] * 3000
    ids, offsets = ragged(rows)
    masked, pos, _, _, kinds = mask_batch(ids, offsets, np.random.default_rng(3), spec)
    replaced = masked[pos[kinds == KIND_RANDOM]]
    assert (replaced < ID["a"]).any()   # specials and [unused] appear (10 of 26 ids)
    default = MaskingSpec.from_vocab(VOCAB)
    assert sorted(set(default.random_ids.tolist())) == list(range(ID["a"], len(VOCAB)))


def test_whole_word_greedy_outcome_probabilities():
    # words {a ##b ##c} (3 pieces), {d} (1), {e ##f} (2); 9 tokens * p -> k = 3 predictions.
    # Visiting orders (6, equally likely): the 3-piece word first -> it alone (2 orders); otherwise it no longer
    # fits and d + e##f are taken (4 orders). So P({a,##b,##c}) = 1/3, P({d,e,##f}) = 2/3, nothing else.
    spec = MaskingSpec.from_vocab(VOCAB, MaskingOptions(masked_lm_prob=3 / 9, max_predictions=20,
                                                        whole_word_mask=True))
    r = row("[CLS]", "a", "##b", "##c", "d", "[SEP]", "e", "##f", "[SEP]")
    ids, offsets = ragged([r] * 3000)
    _, pos, _, pred_off, _ = mask_batch(ids, offsets, np.random.default_rng(4), spec)
    local = pos - np.repeat(offsets[:-1], np.diff(pred_off))
    outcomes = {}
    for i in range(3000):
        key = tuple(local[pred_off[i]:pred_off[i + 1]].tolist())
        outcomes[key] = outcomes.get(key, 0) + 1
    assert set(outcomes) == {(1, 2, 3), (4, 6, 7)}
    assert abs(outcomes[(1, 2, 3)] / 3000 - 1 / 3) < 0.04


def test_whole_word_skips_words_that_overflow_and_never_leaves_a_fitting_word():
    spec = MaskingSpec.from_vocab(VOCAB, MaskingOptions(masked_lm_prob=0.25, max_predictions=20,
                                                        whole_word_mask=True))
    words = [["a", "##b", "##c"], ["e", "##f"], ["g"], ["h"], ["a", "##b"], ["i"], ["e", "##f", "##c"]]
    rng = np.random.default_rng(5)
    rows = []
    for _ in range(500):   # rows of different lengths and word counts
        order = rng.permutation(len(words))[: rng.integers(2, len(words) + 1)]
        cut = rng.integers(1, len(order))
        rows.append(row("[CLS]", *[t for w in order[:cut] for t in words[w]], "[SEP]",
                        *[t for w in order[cut:] for t in words[w]], "[SEP]"))
    ids, offsets = ragged(rows)
    _, pos, _, pred_off, _ = mask_batch(ids, offsets, rng, spec)
    k = num_to_predict(np.diff(offsets), spec)
    for i in range(len(rows)):
        r = ids[offsets[i]:offsets[i + 1]]
        # words of this row as position lists
        spans, cur = [], None
        for j, t in enumerate(r):
            if t in (CLS, SEP):
                cur = None
                continue
            if VOCAB[t].startswith("##") and cur is not None:
                cur.append(j)
            else:
                cur = [j]
                spans.append(cur)
        chosen = set((pos[pred_off[i]:pred_off[i + 1]] - offsets[i]).tolist())
        assert len(chosen) <= k[i]
        for s in spans:
            inside = [j in chosen for j in s]
            assert all(inside) or not any(inside), "a word is masked whole or not at all"
            if not any(inside):
                assert len(s) > k[i] - len(chosen), "greedy never leaves a word that still fits"


def test_piece_after_sep_starts_its_own_word():
    # B starting with ##f (after truncation) must not join A's last word across [SEP]
    spec = MaskingSpec.from_vocab(VOCAB, MaskingOptions(masked_lm_prob=1 / 6, max_predictions=20,
                                                        whole_word_mask=True))
    r = row("[CLS]", "d", "[SEP]", "##f", "g", "[SEP]")  # k = 1: one single-piece word per row
    ids, offsets = ragged([r] * 300)
    _, pos, _, pred_off, _ = mask_batch(ids, offsets, np.random.default_rng(6), spec)
    assert np.all(np.diff(pred_off) == 1)
    local = pos - offsets[:-1]
    assert set(local.tolist()) == {1, 3, 4}


def test_whole_word_decision_once_per_word_vs_per_piece():
    r = row("[CLS]", "a", "##b", "##c", "[SEP]", "g", "[SEP]")  # k = round(7 * 3/7) = 3 -> the 3-piece word or g+?
    def mixed_share(decide_per_piece):
        options = MaskingOptions(masked_lm_prob=3 / 7, max_predictions=20, whole_word_mask=True,
                                 wwm_decide_per_piece=decide_per_piece)
        spec = MaskingSpec.from_vocab(VOCAB, options)
        ids, offsets = ragged([r] * 2000)
        masked, pos, _, pred_off, kinds = mask_batch(ids, offsets, np.random.default_rng(7), spec)
        n_words = n_mixed = 0
        for i in range(2000):
            local = pos[pred_off[i]:pred_off[i + 1]] - offsets[i]
            if local.tolist()[:3] == [1, 2, 3]:
                n_words += 1
                n_mixed += len(set(kinds[pred_off[i]:pred_off[i] + 3].tolist())) > 1
        return n_words, n_mixed / n_words
    n_words, share = mixed_share(False)
    assert n_words > 500 and share == 0.0
    # per piece: P(all three the same kind) = .8^3 + .1^3 + .1^3 = 0.514
    _, share = mixed_share(True)
    assert abs(share - 0.486) < 0.06


def test_mask_instance_is_deterministic_and_copies():
    spec = MaskingSpec.from_vocab(VOCAB)
    r = row("[CLS]", *"ghijklmnop", "[SEP]", *"ghijk", "[SEP]").astype(np.uint16)
    a = mask_instance(r, np.random.default_rng(11), spec)
    b = mask_instance(r, np.random.default_rng(11), spec)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert a[0].dtype == np.uint16 and a[2].dtype == np.uint16
    assert r[1] == ID["g"] and not np.shares_memory(a[0], r)


def test_missing_special_token_is_a_clear_error():
    with pytest.raises(ValueError, match=r"\[MASK\]"):
        MaskingSpec.from_vocab([t for t in VOCAB if t != "[MASK]"])
