"""Masked-LM masking (rule 6 of make-instances), shared by `make-instances` (static) and the pretraining loader (dynamic).

The rule is google-research/bert's `create_masked_lm_predictions`:
  * candidates are all positions except [CLS] and [SEP]; with whole-word masking a `##` piece joins the word before it;
  * number to predict = min(max_predictions, max(1, round(len(tokens) * masked_lm_prob))), Python/numpy round-half-even,
    len counting the special tokens;
  * candidate groups are visited in random order, a group that would exceed the number is skipped;
  * each chosen position becomes [MASK] (80%), stays itself (10%) or a random token (10%); labels are the original ids.

Two improvements over the reference, each on by default with a switch restoring it:
  * random replacements never draw special tokens or [unused...] slots (`random_from_whole_vocab=True` restores);
  * whole-word masking makes the 80/10/10 decision once per word, not per piece (google-research/bert#910;
    `decide_per_piece=True` restores).
One deliberate detail: a `##` piece joins only the word at the position right before it, so a word never spans a [SEP]
(the reference glues a `##` that starts segment B onto A's last word).

`mask_batch` masks many rows at once with numpy (what make-instances uses); `mask_instance` is one row.
"""
import re
from dataclasses import dataclass

import numpy as np

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_BRACKETED = re.compile(r"^\[[^\[\]\s]+\]$")  # [PAD] [UNK] [CLS] [SEP] [MASK] [unused17] ...

# how a chosen position was changed (returned by mask_batch for statistics)
KIND_MASK, KIND_KEPT, KIND_RANDOM = 0, 1, 2


@dataclass(frozen=True, eq=False)
class MaskingSpec:
    vocab_size: int
    mask_id: int
    cls_id: int
    sep_id: int
    random_ids: np.ndarray        # ids a random replacement draws from (uniformly)
    is_continuation: np.ndarray   # bool per id: the token starts with '##'
    masked_lm_prob: float = 0.15
    max_predictions: int = 20
    whole_word_mask: bool = False
    decide_per_piece: bool = False

    @classmethod
    def from_vocab(cls, vocab_tokens, masked_lm_prob: float = 0.15, max_predictions: int = 20,
                   whole_word_mask: bool = False, seed_free: bool = True,
                   random_from_whole_vocab: bool = False, decide_per_piece: bool = False) -> "MaskingSpec":
        """Build the spec from the vocabulary in id order (vocab.txt lines).

        seed_free: the spec holds no random state; all randomness comes from the rng given to mask_instance/mask_batch
        (kept as an explicit, always-true argument of the shared contract).
        """
        if not seed_free:
            raise ValueError("MaskingSpec never holds random state: pass the generator to mask_instance instead")
        tokens = list(vocab_tokens)
        index = {t: i for i, t in enumerate(tokens)}
        missing = [t for t in ("[CLS]", "[SEP]", "[MASK]") if t not in index]
        if missing:
            raise ValueError(f"vocabulary lacks the special token(s) {', '.join(missing)}; "
                             "use a BERT vocabulary (train one with `bertkit train-tokenizer`)")
        if not 0.0 < masked_lm_prob < 1.0:
            raise ValueError(f"masked_lm_prob must be in (0, 1), got {masked_lm_prob}")
        if max_predictions < 1:
            raise ValueError(f"max_predictions must be >= 1, got {max_predictions}")
        if random_from_whole_vocab:
            random_ids = np.arange(len(tokens), dtype=np.int64)
        else:
            random_ids = np.array([i for i, t in enumerate(tokens) if not _BRACKETED.match(t)], dtype=np.int64)
            if len(random_ids) == 0:
                raise ValueError("vocabulary has no ordinary token to use as a random replacement")
        return cls(vocab_size=len(tokens), mask_id=index["[MASK]"], cls_id=index["[CLS]"], sep_id=index["[SEP]"],
                   random_ids=random_ids,
                   is_continuation=np.array([t.startswith("##") for t in tokens], dtype=bool),
                   masked_lm_prob=float(masked_lm_prob), max_predictions=int(max_predictions),
                   whole_word_mask=bool(whole_word_mask), decide_per_piece=bool(decide_per_piece))


def num_to_predict(lengths, spec: MaskingSpec) -> np.ndarray:
    """min(max_predictions, max(1, round(len * p))) per row; np.rint rounds half to even like Python's round."""
    lengths = np.asarray(lengths, dtype=np.float64)
    return np.minimum(spec.max_predictions, np.maximum(1, np.rint(lengths * spec.masked_lm_prob))).astype(np.int64)


def _segmented_rank(row: np.ndarray, key: np.ndarray, row_start: np.ndarray) -> np.ndarray:
    """Rank of each element by key within its row (rows are contiguous runs of `row`)."""
    order = np.lexsort((key, row))
    rank = np.empty(len(row), dtype=np.int64)
    rank[order] = np.arange(len(row)) - row_start[row[order]]
    return rank


def _choose_words(group_row, group_size, k_row, rng):
    """Greedy of the reference over whole words: visit words in random order, take one unless it would exceed k.

    Vectorised: words taken before the first overflow are a prefix of the visiting order; after it the remaining
    capacity is smaller than a word, so a few rounds of "first word after the pointer that still fits" finish it.
    """
    n_groups = len(group_row)
    order = np.lexsort((rng.random(n_groups), group_row))          # visiting order, grouped by row
    g_row, g_size = group_row[order], group_size[order]
    n_rows = len(k_row)
    row_first = np.searchsorted(g_row, np.arange(n_rows))
    cum = np.cumsum(g_size)
    before_row = np.concatenate([[0], cum])[row_first]
    cum_in_row = cum - before_row[g_row]
    taken = cum_in_row <= k_row[g_row]
    # capacity left and pointer (last visited index) per row after the prefix
    taken_count = np.bincount(g_row, weights=g_size * taken, minlength=n_rows).astype(np.int64)
    capacity = k_row - taken_count
    pointer = row_first + np.bincount(g_row, weights=taken, minlength=n_rows).astype(np.int64)  # first not-taken
    idx = np.arange(n_groups)
    while True:
        eligible = (~taken) & (idx > pointer[g_row]) & (g_size <= capacity[g_row])
        if not eligible.any():
            break
        cand = idx[eligible]
        first = cand[np.r_[True, g_row[cand][1:] != g_row[cand][:-1]]]   # first eligible word of each row
        taken[first] = True
        capacity[g_row[first]] -= g_size[first]
        pointer[g_row[first]] = first
    chosen = np.zeros(n_groups, dtype=bool)
    chosen[order] = taken
    return chosen


def mask_batch(ids: np.ndarray, offsets: np.ndarray, rng: np.random.Generator, spec: MaskingSpec):
    """Mask every row of a ragged batch: row r is ids[offsets[r]:offsets[r+1]] (unpadded, with [CLS]/[SEP]).

    Returns (masked_ids, positions, labels, pred_offsets, kinds): masked_ids is a copy of ids with the replacements;
    positions are global indices into ids, ascending, row r's being positions[pred_offsets[r]:pred_offsets[r+1]];
    labels the original ids there; kinds KIND_MASK / KIND_KEPT / KIND_RANDOM per prediction.
    """
    ids = np.asarray(ids)
    offsets = np.asarray(offsets, dtype=np.int64)
    n, n_rows = len(ids), len(offsets) - 1
    lengths = np.diff(offsets)
    row = np.repeat(np.arange(n_rows), lengths)
    k_row = num_to_predict(lengths, spec)
    cand = (ids != spec.cls_id) & (ids != spec.sep_id)

    if not spec.whole_word_mask:
        key = rng.random(n)
        key[~cand] = 2.0  # never ahead of a candidate
        selected = cand & (_segmented_rank(row, key, offsets[:-1]) < k_row[row])
        group_of = None
    else:
        cand_idx = np.flatnonzero(cand)
        ids_c = ids[cand_idx]
        prev_is_cand = np.zeros(len(cand_idx), dtype=bool)
        prev_is_cand[1:] = (cand_idx[1:] - cand_idx[:-1] == 1) & (row[cand_idx[1:]] == row[cand_idx[:-1]])
        starts = ~(spec.is_continuation[ids_c] & prev_is_cand)
        group_id = np.cumsum(starts) - 1
        group_row = row[cand_idx[starts]]
        group_size = np.bincount(group_id, minlength=len(group_row)).astype(np.int64)
        chosen = _choose_words(group_row, group_size, k_row, rng)
        selected = np.zeros(n, dtype=bool)
        selected[cand_idx[chosen[group_id]]] = True
        group_of = np.full(n, -1, dtype=np.int64)
        group_of[cand_idx] = group_id

    positions = np.flatnonzero(selected)
    labels = ids[positions]
    if spec.whole_word_mask and not spec.decide_per_piece:
        g = group_of[positions]
        new_word = np.r_[True, g[1:] != g[:-1]]
        u = np.repeat(rng.random(int(new_word.sum())), np.diff(np.r_[np.flatnonzero(new_word), len(g)]))
    else:
        u = rng.random(len(positions))
    kinds = np.where(u < 0.8, KIND_MASK, np.where(u < 0.9, KIND_KEPT, KIND_RANDOM)).astype(np.int8)
    masked = ids.copy()
    masked[positions[kinds == KIND_MASK]] = spec.mask_id
    rand_pos = positions[kinds == KIND_RANDOM]
    masked[rand_pos] = spec.random_ids[rng.integers(0, len(spec.random_ids), size=len(rand_pos))]
    pred_offsets = np.concatenate([[0], np.cumsum(np.bincount(row[positions], minlength=n_rows))]).astype(np.int64)
    return masked, positions, labels, pred_offsets, kinds


def mask_instance(input_ids: np.ndarray, rng: np.random.Generator, spec: MaskingSpec):
    """Mask one unpadded row. Returns (masked_ids, positions, labels): positions ascending, labels the original ids."""
    input_ids = np.asarray(input_ids)
    masked, positions, labels, _, _ = mask_batch(input_ids, np.array([0, len(input_ids)]), rng, spec)
    return masked, positions, labels
