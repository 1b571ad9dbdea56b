"""Masked-LM masking (rule 6 of make-instances), shared by `make-instances` (static) and the pretraining loader
(dynamic).

The rule is google-research/bert's `create_masked_lm_predictions`:
  * candidates are all positions except [CLS] and [SEP]; with whole-word masking a `##` piece joins the word before it;
  * number to predict = min(max_predictions, max(1, round(len(tokens) * masked_lm_prob))), Python/numpy round-half-even,
    len counting the special tokens;
  * candidate groups are visited in random order, a group that would exceed the number is skipped;
  * each chosen position becomes [MASK] (80%), stays itself (10%) or a random token (10%); labels are the original ids
    (the shares are MaskingOptions.mask_replace: make-instances --mask-replace).

Two improvements over the reference, each on by default with a switch restoring it:
  * random replacements never draw special tokens or [unused...] slots (`random_from_whole_vocab=True` restores);
  * whole-word masking makes the 80/10/10 decision once per word, not per piece (google-research/bert#910;
    `wwm_decide_per_piece=True` restores).
One deliberate detail: a `##` piece joins only the word at the position right before it, so a word never spans a [SEP]
(the reference glues a `##` that starts segment B onto A's last word).

`mask_batch` masks many rows at once with numpy (what make-instances uses); `mask_instance` is one row.
"""
import re
from dataclasses import dataclass

import numpy as np

from bertkit.formats import MaskingOptions
from bertkit.tokenization import CLS, MASK, SEP

_BRACKETED = re.compile(r"^\[[^\[\]\s]+\]$")  # [PAD] [UNK] [CLS] [SEP] [MASK] [unused17] ...

# how a chosen position was changed (returned by mask_batch for statistics)
KIND_MASK, KIND_KEPT, KIND_RANDOM = 0, 1, 2


@dataclass(frozen=True, eq=False)
class MaskingSpec:
    """MaskingOptions resolved against a vocabulary: the ids the rule needs."""
    vocab_size: int
    mask_id: int
    cls_id: int
    sep_id: int
    random_ids: np.ndarray        # ids a random replacement draws from (uniformly)
    is_continuation: np.ndarray   # bool per id: the token starts with '##'
    options: MaskingOptions

    @property
    def thresholds(self) -> tuple[float, float]:
        """u < first: [MASK]; u < second: kept; else random (BERT's 0.8 / 0.9)."""
        mask, _, random = self.options.mask_replace
        return mask, 1.0 - random  # 1 - 0.1 is exactly 0.9 (0.8 + 0.1 is not)

    @classmethod
    def from_vocab(cls, vocab_tokens, options: MaskingOptions = MaskingOptions()) -> "MaskingSpec":
        """Build the spec from the vocabulary in id order (vocab.txt lines). The spec holds no random state: all
        randomness comes from the generator given to mask_instance / mask_batch."""
        tokens = list(vocab_tokens)
        index = {t: i for i, t in enumerate(tokens)}
        missing = [t for t in (CLS, SEP, MASK) if t not in index]
        if missing:
            raise ValueError(f"vocabulary lacks the special token(s) {', '.join(missing)}; "
                             "use a BERT vocabulary (train one with `bertkit train-tokenizer`)")
        if options.problem():
            raise ValueError(options.problem())
        options = options.for_length(None)
        if options.random_from_whole_vocab:
            random_ids = np.arange(len(tokens), dtype=np.int64)
        else:
            random_ids = np.array([i for i, t in enumerate(tokens) if not _BRACKETED.match(t)], dtype=np.int64)
            if len(random_ids) == 0:
                raise ValueError("vocabulary has no ordinary token to use as a random replacement")
        return cls(vocab_size=len(tokens), mask_id=index[MASK], cls_id=index[CLS], sep_id=index[SEP],
                   random_ids=random_ids,
                   is_continuation=np.array([t.startswith("##") for t in tokens], dtype=bool), options=options)


def num_to_predict(lengths, spec: MaskingSpec) -> np.ndarray:
    """min(max_predictions, max(1, round(len * p))) per row; np.rint rounds half to even like Python's round."""
    lengths = np.asarray(lengths, dtype=np.float64)
    share = np.rint(lengths * spec.options.masked_lm_prob)
    return np.minimum(spec.options.max_predictions, np.maximum(1, share)).astype(np.int64)


def _choose_words(group_key: np.ndarray, group_size: np.ndarray, k_row: np.ndarray) -> np.ndarray:
    """Greedy of the reference over whole words, all rows at once on (R, G) arrays.

    group_key: random keys of each row's words (2.0 = padding), group_size: their piece counts. Words are visited
    in key order and taken unless they would exceed k. Words taken before the first overflow are a prefix of the
    visiting order; after it the capacity left is smaller than a word, so a few rounds of "first word after the
    pointer that still fits" finish the greedy exactly. Returns a boolean (R, G) mask of chosen words.
    """
    n_rows, n_cols = group_key.shape
    order = np.argsort(group_key, axis=1)                                 # keys are distinct; padding last
    rows = np.arange(n_rows)[:, None]
    never_fits = int(k_row.max(initial=0)) + 1                            # padding: small enough to sum safely
    size = np.where(group_key[rows, order] < 2.0, group_size[rows, order], never_fits)
    taken = np.cumsum(size, axis=1) <= k_row[:, None]
    capacity = k_row - np.where(taken, size, 0).sum(axis=1)
    pointer = taken.sum(axis=1)            # first visited word not taken
    cols = np.arange(n_cols)[None, :]
    while True:
        eligible = (cols > pointer[:, None]) & (size <= capacity[:, None])
        has = eligible.any(axis=1)
        if not has.any():
            break
        r = np.flatnonzero(has)
        first = eligible[r].argmax(axis=1)
        taken[r, first] = True
        capacity[r] -= size[r, first]
        pointer[r] = first
    chosen = np.zeros_like(taken)
    chosen[rows, order] = taken
    return chosen


def _choose_positions(ids, offsets, lengths, cand, k_row, rng):
    """Without whole words: k_row[r] candidates of each row, uniformly; returns (row, column) of each, row-major.

    Random keys live in a padded (rows, width) grid, so numpy sorts many short rows (fast) instead of one long
    ragged array; the k-th smallest key of a row is its threshold. The float64 keys tie at a threshold once in
    ~1e12 rows; such a row is still resolved exactly, by stable order.
    """
    n_rows, width = len(lengths), int(lengths.max())
    keys = rng.random((n_rows, width))
    keys[np.arange(width)[None, :] >= lengths[:, None]] = 2.0             # padding
    special = np.flatnonzero(~cand)
    special_row = np.searchsorted(offsets, special, side="right") - 1
    keys[special_row, special - offsets[special_row]] = 2.0               # [CLS], [SEP]
    threshold = np.sort(keys, axis=1)[np.arange(n_rows), np.clip(k_row - 1, 0, width - 1)]
    chosen = (keys <= threshold[:, None]) & (keys < 2.0)
    for r in np.flatnonzero(chosen.sum(axis=1) > k_row):
        first = np.argsort(keys[r], kind="stable")[: k_row[r]]
        chosen[r] = False
        chosen[r, first] = keys[r, first] < 2.0
    return np.nonzero(chosen)


def _choose_whole_words(ids, offsets, lengths, cand, k_row, rng, spec):
    """Whole words: returns (row, column) of the chosen pieces, row-major, and each chosen piece's word number."""
    n_rows = len(lengths)
    cand_idx = np.flatnonzero(cand)
    cand_row = np.repeat(np.arange(n_rows), lengths)[cand_idx]
    prev_is_cand = np.zeros(len(cand_idx), dtype=bool)
    prev_is_cand[1:] = (cand_idx[1:] - cand_idx[:-1] == 1) & (cand_row[1:] == cand_row[:-1])
    starts = ~(spec.is_continuation[ids[cand_idx]] & prev_is_cand)   # a '##' piece right after a word joins it
    group_id = np.cumsum(starts) - 1                                   # word of each candidate, over the batch
    group_row = cand_row[starts]
    group_size = np.bincount(group_id, minlength=len(group_row)).astype(np.int64)
    group_col = np.arange(len(group_row)) - np.searchsorted(group_row, np.arange(n_rows))[group_row]
    g_width = int(group_col.max()) + 1 if len(group_row) else 0
    keys = np.full((n_rows, g_width), 2.0)
    keys[group_row, group_col] = rng.random(len(group_row))
    sizes = np.zeros((n_rows, g_width), dtype=np.int64)
    sizes[group_row, group_col] = group_size
    chosen = _choose_words(keys, sizes, k_row)[group_row, group_col][group_id]
    picked = cand_idx[chosen]
    row = cand_row[chosen]
    return row, picked - offsets[row], group_id[chosen]


def mask_batch(ids: np.ndarray, offsets: np.ndarray, rng: np.random.Generator, spec: MaskingSpec):
    """Mask every row of a ragged batch: row r is ids[offsets[r]:offsets[r+1]] (unpadded, with [CLS]/[SEP]).

    Returns (masked_ids, positions, labels, pred_offsets, kinds): masked_ids is a copy of ids with the replacements;
    positions are global indices into ids, ascending, row r's being positions[pred_offsets[r]:pred_offsets[r+1]];
    labels the original ids there; kinds KIND_MASK / KIND_KEPT / KIND_RANDOM per prediction.
    """
    ids = np.asarray(ids)
    offsets = np.asarray(offsets, dtype=np.int64)
    n_rows = len(offsets) - 1
    lengths = np.diff(offsets)
    k_row = num_to_predict(lengths, spec)
    cand = (ids != spec.cls_id) & (ids != spec.sep_id)
    if n_rows == 0:
        row = col = np.zeros(0, np.int64)
    elif not spec.options.whole_word_mask:
        row, col = _choose_positions(ids, offsets, lengths, cand, k_row, rng)
    else:
        row, col, word = _choose_whole_words(ids, offsets, lengths, cand, k_row, rng, spec)
    positions = offsets[row] + col
    labels = ids[positions]
    if spec.options.whole_word_mask and not spec.options.wwm_decide_per_piece:
        new_word = np.r_[True, word[1:] != word[:-1]]                    # one 80/10/10 draw per word
        u = np.repeat(rng.random(int(new_word.sum())), np.diff(np.r_[np.flatnonzero(new_word), len(word)]))
    else:
        u = rng.random(len(positions))
    to_mask, to_keep = spec.thresholds
    kinds = np.where(u < to_mask, KIND_MASK, np.where(u < to_keep, KIND_KEPT, KIND_RANDOM)).astype(np.int8)
    masked = ids.copy()
    masked[positions[kinds == KIND_MASK]] = spec.mask_id
    rand_pos = positions[kinds == KIND_RANDOM]
    masked[rand_pos] = spec.random_ids[rng.integers(0, len(spec.random_ids), size=len(rand_pos))]
    pred_offsets = np.concatenate([[0], np.cumsum(np.bincount(row, minlength=n_rows))]).astype(np.int64)
    return masked, positions, labels, pred_offsets, kinds


def mask_instance(input_ids: np.ndarray, rng: np.random.Generator, spec: MaskingSpec):
    """Mask one unpadded row. Returns (masked_ids, positions, labels): positions ascending, labels the original ids."""
    input_ids = np.asarray(input_ids)
    if not spec.options.whole_word_mask:   # one row: a uniform k-subset of the candidates directly (~3x faster)
        cand = np.flatnonzero((input_ids != spec.cls_id) & (input_ids != spec.sep_id))
        k = min(int(num_to_predict([len(input_ids)], spec)[0]), len(cand))
        positions = np.sort(cand[rng.choice(len(cand), size=k, replace=False)])
        u = rng.random(k)
        masked = input_ids.copy()
        to_mask, to_keep = spec.thresholds
        masked[positions[u < to_mask]] = spec.mask_id
        rand_pos = positions[u >= to_keep]
        masked[rand_pos] = spec.random_ids[rng.integers(0, len(spec.random_ids), size=len(rand_pos))]
        return masked, positions, input_ids[positions]
    masked, positions, labels, _, _ = mask_batch(input_ids, np.array([0, len(input_ids)]), rng, spec)
    return masked, positions, labels
