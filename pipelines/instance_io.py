"""What both ways of making instances share (pipelines/make_instances.py, the default, and
pipelines/google_compat.py, `--compat google`): corpus text in as token ids, instance rows out as Arrow tables.

* `load_stage_tokenizer`, `word_encoder`: the tokenizer and a fast exact encoder, cached per process;
  `tokenize_documents` turns a corpus shard's `sentences` column into one flat token array with offsets;
* `masking_spec`: the MaskingSpec of a set of options, cached per process;
* `instances_table`, `pass_stats`: instance rows as an Arrow table of formats.instance_schema, and their statistics;
* `single_threaded_tokenizers`: one process = one core while a stage's own workers set the parallelism.
"""
import contextlib
import json
import os
from itertools import repeat

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from bertkit.formats import MaskingOptions, id_type, instance_schema
from bertkit.masking import KIND_KEPT, KIND_MASK, KIND_RANDOM, MaskingSpec, num_to_predict


@contextlib.contextmanager
def single_threaded_tokenizers():
    """TOKENIZERS_PARALLELISM=false for the block, restored after: a stage's --workers decide its parallelism."""
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


_TOKENIZERS = {}


def load_stage_tokenizer(tokenizer_dir):
    """The tokenizer (cached per process) and its vocabulary in id order."""
    from bertkit.tokenization import load_tokenizer, vocab_tokens

    key = str(tokenizer_dir)
    if key not in _TOKENIZERS:
        tok = load_tokenizer(tokenizer_dir)
        # a literal "[SEP]" in the text is text, as in google's tokenizer, never a special token
        tok.encode_special_tokens = True
        _TOKENIZERS[key] = (tok, vocab_tokens(tokenizer_dir))
    return _TOKENIZERS[key]


_SPECS = {}


def masking_spec(vocab: list[str], options: MaskingOptions) -> MaskingSpec:
    """MaskingSpec.from_vocab, cached per process (building it walks the vocabulary)."""
    key = (id(vocab), options)
    if key not in _SPECS:
        _SPECS[key] = MaskingSpec.from_vocab(vocab, options)
    return _SPECS[key]


class WordEncoder:
    """`tokenizer.encode(text, add_special_tokens=False).ids` for many texts, several times faster.

    BERT's pipeline (per-character normalizer, then a split on whitespace and punctuation, then WordPiece per
    word) never looks across an ASCII space, so a text's ids are the concatenation of the ids of its space-separated
    chunks. Arrow splits the texts and finds the distinct chunks in C++; only chunks this process has not seen go
    to the Rust tokenizer, joined a couple of thousand at a time around " [SEP] " so one call serves many (a chunk
    containing "[" is encoded alone, so text is never read as a special token). The ids of seen chunks stay in one
    flat array; tests check the result equals the tokenizer's on hard cases and on Wikipedia.
    """

    def __init__(self, tokenizer, sep_id: int, max_cached: int = 1_000_000, join: int = 2000):
        self.tokenizer, self.sep_id, self.max_cached, self.join = tokenizer, sep_id, max_cached, join
        self.by_words = splits_on_spaces(tokenizer)  # else (a non-BERT pipeline): whole sentences, the slow way
        self._reset()

    def _reset(self):
        self.slot: dict[str, int] = {}             # cached chunk -> slot
        self.ids = np.zeros(0, np.int32)           # the slots' ids, back to back
        self.start = np.zeros(0, np.int64)         # where slot s starts in self.ids
        self.length = np.zeros(0, np.int64)

    def _encode_new(self, words: list[str]):
        """(words in the order encoded, their ids back to back, the length of each)."""
        plain = [w for w in words if "[" not in w]
        alone = [w for w in words if "[" in w]
        tok, done, ids, lengths = self.tokenizer, [], [], []
        for k in range(0, len(plain), self.join):
            group = plain[k:k + self.join]
            tok.encode_special_tokens = False          # let " [SEP] " separate the words...
            try:
                got = np.array(tok.encode(" [SEP] ".join(group), add_special_tokens=False).ids, dtype=np.int32)
            finally:
                tok.encode_special_tokens = True       # ...and never anywhere else
            seps = np.flatnonzero(got == self.sep_id)
            if len(seps) != len(group) - 1:            # cannot happen without "[" in a word; stay exact anyway
                alone += group
                continue
            done += group
            lengths.append(np.diff(np.concatenate([[-1], seps, [len(got)]])) - 1)
            ids.append(got[got != self.sep_id])
        for w, e in zip(alone, tok.encode_batch_fast(alone, add_special_tokens=False) if alone else []):
            done.append(w)
            ids.append(np.array(e.ids, dtype=np.int32))
            lengths.append(np.array([len(e.ids)]))
        return (done, np.concatenate(ids) if ids else np.zeros(0, np.int32),
                np.concatenate(lengths).astype(np.int64) if lengths else np.zeros(0, np.int64))

    def encode(self, texts: pa.Array):
        """Ids of every text, concatenated, and each text's length."""
        if not self.by_words:
            ids = [e.ids for e in self.tokenizer.encode_batch_fast(texts.to_pylist(), add_special_tokens=False)]
            lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
            return np.fromiter((t for x in ids for t in x), np.int32, int(lengths.sum())), lengths
        chunks = pa.compute.split_pattern(texts, " ")
        chunk_off = chunks.offsets.to_numpy().astype(np.int64)
        chunk_off -= chunk_off[0]
        encoded = pa.compute.dictionary_encode(chunks.flatten())
        index = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        words = encoded.dictionary.to_pylist()
        slots = np.fromiter(map(self.slot.get, words, repeat(-1)), dtype=np.int64, count=len(words))
        new = np.flatnonzero(slots < 0)
        if len(new):
            if len(self.slot) + len(new) > self.max_cached:
                self._reset()                          # bounded memory; the ids never depend on the cache
                new = np.arange(len(words))
            done, ids, lengths = self._encode_new([words[i] for i in new])
            self.slot.update(zip(done, range(len(self.start), len(self.start) + len(done))))
            self.start = np.concatenate([self.start, len(self.ids) + np.cumsum(lengths) - lengths])
            self.length = np.concatenate([self.length, lengths])
            self.ids = np.concatenate([self.ids, ids])
            slots[new] = np.fromiter(map(self.slot.__getitem__, (words[i] for i in new)), np.int64, len(new))
        slots = slots[index]
        occurrence_len = self.length[slots]
        tokens = self.ids[ragged_arange(self.start[slots], occurrence_len)]
        cum = np.concatenate([[0], np.cumsum(occurrence_len)])
        return tokens, cum[chunk_off[1:]] - cum[chunk_off[:-1]]


def splits_on_spaces(tokenizer) -> bool:
    """True when the pipeline cannot look across an ASCII space: per-character normalizers, BERT's (or a
    whitespace) pre-tokenizer, no added token containing a space. Every bertkit and HF BERT tokenizer qualifies."""
    spec = json.loads(tokenizer.to_str())

    def normalizer_ok(n):
        if n is None:
            return True
        if n["type"] == "Sequence":
            return all(normalizer_ok(x) for x in n["normalizers"])
        if n["type"] == "Replace":
            pattern = json.dumps(n.get("pattern"))
            return " " not in pattern and "\\s" not in pattern and " " not in str(n.get("content"))
        return n["type"] in ("BertNormalizer", "NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents", "Strip")

    def pre_tokenizer_ok(p):
        if p is None or p["type"] == "Sequence":
            return p is not None and all(pre_tokenizer_ok(x) for x in p["pretokenizers"])
        return p["type"] in ("BertPreTokenizer", "Whitespace", "WhitespaceSplit", "Punctuation", "Digits")

    return (normalizer_ok(spec.get("normalizer")) and pre_tokenizer_ok(spec.get("pre_tokenizer"))
            and spec.get("model", {}).get("type") == "WordPiece"
            and not any(" " in t["content"] for t in spec.get("added_tokens", [])))


_ENCODERS = {}


def word_encoder(tokenizer_dir) -> WordEncoder:
    key = str(tokenizer_dir)
    if key not in _ENCODERS:
        tok, vocab = load_stage_tokenizer(tokenizer_dir)
        _ENCODERS[key] = WordEncoder(tok, vocab.index("[SEP]"))
    return _ENCODERS[key]


def tokenize_documents(encoder: WordEncoder, sentences: pa.Array):
    """A corpus shard's `sentences` column -> (tokens int32, seg_start, doc_seg).

    Segment s is tokens[seg_start[s]:seg_start[s+1]], document d is segments doc_seg[d]:doc_seg[d+1].
    Segments that tokenize to nothing and documents left empty are dropped, as the reference does.
    """
    sentences = sentences.combine_chunks() if isinstance(sentences, pa.ChunkedArray) else sentences
    doc_off = sentences.offsets.to_numpy().astype(np.int64)
    doc_off -= doc_off[0]
    tokens, lens = encoder.encode(sentences.flatten())
    keep = lens > 0
    kept_before = np.concatenate([[0], np.cumsum(keep)])
    doc_seg = np.unique(kept_before[doc_off])          # empty documents collapse into their neighbour's offset
    seg_start = np.concatenate([[0], np.cumsum(lens[keep])])
    return tokens, seg_start, doc_seg


def ragged_arange(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """concatenate([arange(s, s + n) for s, n in zip(starts, lengths)]) without the Python loop."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offsets = np.cumsum(lengths) - lengths
    return np.repeat(starts - offsets, lengths) + np.arange(total)


def instances_table(ids, offsets, b_start, not_next, vocab_size, masking=None) -> pa.Table:
    """Arrow table of instance_schema from flat arrays (masking = (positions_in_row, labels, pred_offsets))."""
    id_t = id_type(vocab_size)
    np_id = np.uint16 if id_t == pa.uint16() else np.int32

    def lists(values, offs, t):
        return pa.ListArray.from_arrays(pa.array(np.asarray(offs, dtype=np.int32)), pa.array(values, type=t))

    cols = [lists(ids.astype(np_id, copy=False), offsets, id_t), pa.array(b_start.astype(np.uint16)),
            pa.array(not_next.astype(np.int8))]
    if masking is not None:
        pos, labels, pred_off = masking
        cols += [lists(pos.astype(np.uint16), pred_off, pa.uint16()), lists(labels.astype(np_id), pred_off, id_t)]
    return pa.Table.from_arrays(cols, schema=instance_schema(vocab_size, masking is not None))


def empty_stats(max_seq_length: int) -> dict:
    return {"instances": 0, "not_next": 0, "tokens": 0, "candidates": 0, "selected": 0, "expected_selected": 0,
            "mask": 0, "random": 0, "kept": 0, "skipped_chunks": 0, "length_counts": [0] * (max_seq_length + 1)}


def pass_stats(offsets, b_start, not_next, max_seq_length, spec=None, masked=None, skipped=0, specials=3) -> dict:
    """specials: [CLS]/[SEP] tokens per row (3 for a pair; an array where rows differ)."""
    lengths = np.diff(offsets)
    s = empty_stats(max_seq_length)
    n_cand = lengths - specials
    s.update(instances=len(lengths), not_next=int(not_next.sum()), tokens=int(lengths.sum()),
             candidates=int(n_cand.sum()), skipped_chunks=int(skipped),
             length_counts=np.bincount(lengths, minlength=max_seq_length + 1).tolist())
    if masked is not None:
        kinds = masked
        s.update(selected=len(kinds), expected_selected=int(np.minimum(num_to_predict(lengths, spec), n_cand).sum()),
                 mask=int((kinds == KIND_MASK).sum()), random=int((kinds == KIND_RANDOM).sum()),
                 kept=int((kinds == KIND_KEPT).sum()))
    return s
