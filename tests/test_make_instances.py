"""make-instances: rules 1-6 on hand-built documents, the improvements and their reference switches, --compat google
call for call, the Arrow output, determinism, workers, resuming, bad inputs and statistics on English Wikipedia."""
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

from bertkit.fileio import FolderNotOwnedError, checksum_file, read_arrow, sha256_file
from bertkit.formats import InstancesError, MaskingOptions, instance_schema
from bertkit.pipelines import google_compat
from bertkit.pipelines.make_instances import InstancesConfig, assemble, build_pairs, make_instances, truncation_amounts
from tests.helpers import doc_of, layout, write_corpus

VOCAB_FILE = "vocab/bert-base-uncased/vocab.txt"


# ---------------------------------------------------------------------------------------------------------------
# helpers


WORDS = ("the cat sat on a mat while the dog ran after a red ball in the park near old trees and "
         "children played games under bright summer light before evening rain came down hard").split()


def synthetic_docs(n_docs, seed=0, max_sentences=30):
    rng = random.Random(seed)
    return [[" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 25))) + "."
             for _ in range(rng.randint(2, max_sentences))] for _ in range(n_docs)]


@pytest.fixture(scope="module")
def vocab(shared_data):
    return str(shared_data / VOCAB_FILE)


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"), [synthetic_docs(40, 1), synthetic_docs(25, 2)],
                        holdout=[synthetic_docs(5, 3)])


def files_bytes(folder: Path):
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.arrow"))}


# ---------------------------------------------------------------------------------------------------------------
# tokenization: the word-cached encoder equals the tokenizer


HARD_TEXTS = ["", " ", "Hello,  world!", "a\tb\nc", "lead space", "trail space ", "[SEP] is text, [MASK]ed too",
              "x[CLS]y [PAD] [UNK] [unused3]", "caf\u00e9 na\u0131ve \u00c5ngstr\u00f6m", "e \u0301acute after a space",
              "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4.", "\u304c\u304e\u3050 \u6f22\u5b57\u6587",
              "w" * 150 + " short", "emoji \U0001f600 and \u00a0nbsp", "ctrl\x1cchar \x00nul", "zero\u200bwidth",
              "##hash ##", "UPPER lower MiXeD", "don't stop-believing (1999) [ref]"]


@pytest.mark.parametrize("join", [3, 2000])
def test_word_encoder_equals_the_tokenizer(vocab, join):
    from bertkit.pipelines.instance_io import WordEncoder, load_stage_tokenizer

    tok, words = load_stage_tokenizer(vocab)
    encoder = WordEncoder(tok, words.index("[SEP]"), join=join)
    expected = [tok.encode(t, add_special_tokens=False).ids for t in HARD_TEXTS]
    for _ in range(2):                                                # cold, then from the cache
        ids, lengths = encoder.encode(pa.array(HARD_TEXTS * 3))
        assert lengths.tolist() == [len(e) for e in expected] * 3
        assert ids.tolist() == [t for e in expected for t in e] * 3
    assert 102 not in ids.tolist() and 103 not in ids.tolist()       # "[SEP]"/"[MASK]" in text are not specials


def test_word_encoder_falls_back_for_pipelines_that_see_across_spaces(vocab):
    from tokenizers import pre_tokenizers

    from bertkit.pipelines.instance_io import WordEncoder, splits_on_spaces
    from bertkit.tokenization import load_tokenizer

    tok = load_tokenizer(vocab)
    tok.encode_special_tokens = True
    assert splits_on_spaces(tok)
    tok.pre_tokenizer = pre_tokenizers.Metaspace()        # "▁" marks word starts: not per-chunk any more
    assert not splits_on_spaces(tok)
    ids, lengths = WordEncoder(tok, 102).encode(pa.array(HARD_TEXTS))
    expected = [tok.encode(t, add_special_tokens=False).ids for t in HARD_TEXTS]
    assert lengths.tolist() == [len(e) for e in expected] and ids.tolist() == [t for e in expected for t in e]


def test_word_encoder_on_wikipedia(vocab, shared_data):
    from bertkit.pipelines.instance_io import WordEncoder, load_stage_tokenizer

    tok, words = load_stage_tokenizer(vocab)
    text = (shared_data / "wikipedia_en_wikiextractor" / "text" / "AA" / "wiki_00").read_text(encoding="utf-8")
    lines = [line for line in text.split("\n") if line and not line.startswith("<")][:1500]
    ids, lengths = WordEncoder(tok, words.index("[SEP]"), max_cached=5000).encode(pa.array(lines))
    expected = [e.ids for e in tok.encode_batch(lines, add_special_tokens=False)]
    assert lengths.tolist() == [len(e) for e in expected] and ids.tolist() == [t for e in expected for t in e]


# ---------------------------------------------------------------------------------------------------------------
# rules 1-3 in the default mode, on token ranges


def test_rule2_chunks_fill_to_target_and_one_document_pool_is_isnext():
    # one document of 40 one-token segments, target 13 (short_seq_prob 0): chunks 0-12, 13-25, 26-38 and the last
    # segment alone. With nothing else to draw B from, B is A's continuation (IsNext); a one-token chunk is skipped.
    tokens, seg_start, doc_seg = layout([[1] * 40])
    cfg = InstancesConfig(max_seq_length=16, short_seq_prob=0.0)
    for seed in range(20):
        pairs, skipped = build_pairs(seg_start, doc_seg, np.random.default_rng(seed), cfg)
        assert skipped == 1 and not pairs["not_next"].any()
        assert pairs["a_lo"].tolist() == [0, 13, 26] and pairs["b_hi"].tolist() == [13, 26, 39]
        assert np.all(pairs["a_hi"] == pairs["b_lo"])                      # B follows A
        assert np.all((pairs["a_hi"] > pairs["a_lo"]) & (pairs["b_hi"] > pairs["b_lo"]))


def test_one_document_single_segment_chunk_splits_inside_the_segment():
    # segments longer than the target: each chunk is one segment; IsNext pairs cut it at a point in [1, len-1]
    tokens, seg_start, doc_seg = layout([[20, 30]])
    pairs, skipped = build_pairs(seg_start, doc_seg, np.random.default_rng(0), InstancesConfig(max_seq_length=16,
                                                                                              short_seq_prob=0.0))
    assert skipped == 0 and not pairs["not_next"].any()
    assert pairs["a_lo"].tolist() == [0, 20] and pairs["b_hi"].tolist() == [20, 50]
    assert np.all(pairs["a_hi"] == pairs["b_lo"]) and np.all(pairs["a_lo"] < pairs["a_hi"])


def test_same_doc_notnext_restores_reference_on_one_document():
    # the reference: B comes from the same document (10 draws all land on it) and is still labelled NotNext
    tokens, seg_start, doc_seg = layout([[20, 30]])
    cfg = InstancesConfig(max_seq_length=16, short_seq_prob=0.0, same_doc_notnext=True)
    pairs, skipped = build_pairs(seg_start, doc_seg, np.random.default_rng(0), cfg)
    assert pairs["not_next"].all() and skipped == 0
    assert pairs["a_lo"].tolist() == [0, 20]                          # A: each (one-segment) chunk
    assert set(pairs["b_lo"].tolist()) <= {0, 20}                     # B: from a segment start of the same document


def test_rule1_short_target_drawn_once_per_document_and_pass():
    # one-token segments and a one-document pool: every chunk but the last has exactly the target's length
    tokens, seg_start, doc_seg = layout([[1] * 200])
    cfg = InstancesConfig(max_seq_length=16, short_seq_prob=1.0)
    targets = []
    for seed in range(300):
        pairs, _ = build_pairs(seg_start, doc_seg, np.random.default_rng(seed), cfg)
        lengths = (pairs["b_hi"] - pairs["a_lo"])[:-1]
        assert len(set(lengths.tolist())) == 1
        targets.append(int(lengths[0]))
    counts = np.bincount(targets, minlength=14)
    assert counts[:2].sum() == 0                                     # uniform over [2, 13]: 25 each expected
    assert counts[2:].min() >= 10 and counts[2:].max() <= 45


def test_rule3_notnext_from_another_document_put_back_and_nothing_lost():
    docs = [[3, 4, 2, 5, 1, 6, 2, 2, 3], [1, 1, 7], [9], [4, 4, 4, 4]]
    tokens, seg_start, doc_seg = layout(docs)
    cfg = InstancesConfig(max_seq_length=12, short_seq_prob=0.3)        # target 9 or shorter
    seg_starts = set(seg_start.tolist())
    not_next = n_pairs = 0
    for seed in range(200):
        pairs, skipped = build_pairs(seg_start, doc_seg, np.random.default_rng(seed), cfg)
        assert skipped == 0
        for d in range(len(docs)):
            lo, hi = seg_start[doc_seg[d]], seg_start[doc_seg[d + 1]]
            mine = np.flatnonzero((pairs["a_lo"] >= lo) & (pairs["a_lo"] < hi))
            covered = []
            for k in mine:
                a_lo, a_hi, b_lo, b_hi = (int(pairs[x][k]) for x in ("a_lo", "a_hi", "b_lo", "b_hi"))
                assert a_lo in seg_starts and a_hi in seg_starts          # A is whole segments
                covered.append((a_lo, a_hi))
                if pairs["not_next"][k]:
                    assert doc_of(b_lo, seg_start, doc_seg) != d        # improvement: never A's own document
                    assert b_lo in seg_starts and b_hi in seg_starts
                    assert doc_of(b_hi - 1, seg_start, doc_seg) == doc_of(b_lo, seg_start, doc_seg)
                else:
                    assert b_lo == a_hi and b_hi in seg_starts and b_hi <= hi
                    covered.append((b_lo, b_hi))
            # the document's text, in order, exactly once: unused segments were put back
            assert covered[0][0] == lo and covered[-1][1] == hi
            assert all(x[1] == y[0] for x, y in zip(covered, covered[1:]))
        # the single-segment document [9] always gets NotNext
        d2 = int(seg_start[doc_seg[2]])
        assert pairs["not_next"][pairs["a_lo"] == d2].all()
        not_next += int(pairs["not_next"].sum())
        n_pairs += len(pairs["not_next"])
    assert 0.4 < not_next / n_pairs < 0.8


def test_rule3_random_b_fills_to_target_minus_a():
    # doc 0 = segments of 3 and 20 tokens, target 13: one chunk of both, A = the 3-token segment. NotNext: B from
    # doc 1 (segments 2 3 4 5 6 = tokens 23..43) from a random start segment until 13 - 3 = 10 tokens or its end.
    tokens, seg_start, doc_seg = layout([[3, 20], [2, 3, 4, 5, 6]])
    cfg = InstancesConfig(max_seq_length=16, short_seq_prob=0.0)
    seen = set()
    for seed in range(200):
        pairs, _ = build_pairs(seg_start, doc_seg, np.random.default_rng(seed), cfg)
        assert (pairs["a_lo"][0], pairs["a_hi"][0]) == (0, 3)
        b = (int(pairs["b_lo"][0]), int(pairs["b_hi"][0]))
        if pairs["not_next"][0]:
            assert b in {(23, 37), (25, 37), (28, 43), (32, 43), (37, 43)}
            # the 20-token segment was put back: it is the next chunk, alone, hence NotNext with B of one segment
            # (13 - 20 < 0)
            assert (pairs["a_lo"][1], pairs["a_hi"][1]) == (3, 23) and pairs["not_next"][1]
            assert (int(pairs["b_lo"][1]), int(pairs["b_hi"][1])) in {(23, 25), (25, 28), (28, 32), (32, 37),
                                                                     (37, 43)}
        else:
            assert b == (3, 23)
        seen.add(b)
    assert len(seen) == 6


# ---------------------------------------------------------------------------------------------------------------
# rules 4-5


def simulate_truncation(la, lb, max_num):
    trim_a = trim_b = 0
    while la + lb > max_num:
        if la > lb:
            la, trim_a = la - 1, trim_a + 1
        else:
            lb, trim_b = lb - 1, trim_b + 1
    return trim_a, trim_b


def test_rule4_truncation_amounts_equal_the_trimming_loop():
    la, lb = np.meshgrid(np.arange(1, 60), np.arange(1, 60))
    la, lb = la.ravel(), lb.ravel()
    for max_num in (2, 5, 13, 40):
        ta, tb = truncation_amounts(la, lb, max_num)
        expected = [simulate_truncation(a, b, max_num) for a, b in zip(la.tolist(), lb.tolist())]
        assert list(zip(ta.tolist(), tb.tolist())) == expected


def test_rule4_and_5_assembly_trims_both_ends_evenly_and_builds_cls_a_sep_b_sep():
    # A = 20 tokens, B = 5, max_seq_length 16 -> 13 tokens: A alone loses 12, each from its front or back
    tokens = np.arange(1000, 1100)
    n = 4000
    pairs = {"a_lo": np.zeros(n, np.int64), "a_hi": np.full(n, 20), "b_lo": np.full(n, 50), "b_hi": np.full(n, 55)}
    ids, offsets, b_start = assemble(tokens, pairs, np.random.default_rng(0), 16, 1, 2, np.int64)
    assert np.all(np.diff(offsets) == 16) and np.all(b_start == 10)
    rows = ids.reshape(n, 16)
    assert np.all(rows[:, 0] == 1) and np.all(rows[:, 9] == 2) and np.all(rows[:, 15] == 2)
    a, b = rows[:, 1:9] - 1000, rows[:, 10:15] - 1000
    assert np.all(np.diff(a, axis=1) == 1) and np.all(b == np.arange(50, 55))
    first = a[:, 0]                                                   # front trims ~ Binomial(12, 0.5)
    assert abs(first.mean() - 6) < 0.15 and abs(first.var() - 3) < 0.3 and first.max() <= 12


# ---------------------------------------------------------------------------------------------------------------
# --compat google: the reference's calls, scripted


class ScriptedRandom(random.Random):
    """Answers each call from a script and checks it is the call the reference makes next."""

    def __init__(self, script):
        super().__init__(0)
        self.script = list(script)

    def _next(self, call, *args):
        want = self.script.pop(0)
        assert want[0] == call and tuple(want[1:-1]) == args, f"expected {want[:-1]}, got {(call, *args)}"
        return want[-1]

    def random(self):
        return self._next("random")

    def randint(self, a, b):
        return self._next("randint", a, b)

    def shuffle(self, x):
        order = self._next("shuffle", len(x))
        x[:] = [x[i] for i in order]


CLS, SEP, MASK, V = 101, 102, 103, 30522
VOCAB_INFO = {"size": V, "cls": CLS, "sep": SEP, "mask": MASK, "is_continuation": [False] * V}


def run_scripted(documents, script, **cfg):
    config = InstancesConfig(compat="google", **cfg)
    rng = ScriptedRandom(script)
    docs = list(documents)
    rng.shuffle(docs)
    instances = []
    for d in range(len(docs)):
        instances += google_compat.instances_from_document(docs, d, rng, config, VOCAB_INFO)
    rng.shuffle(instances)
    assert rng.script == [], "the reference makes more calls"
    return [(list(i[0]), i[1], i[2], list(i[3]), list(i[4])) for i in instances]


def test_compat_isnext_short_target_notnext_retry_and_random_word():
    docs = [[[10, 11, 12], [13, 14]], [[20]]]
    script = [
        ("shuffle", 2, [0, 1]),
        # doc 0: not short; target 5; chunk of 2 segments -> a_end = randint(1, 1); coin 0.7 -> IsNext
        ("random", 0.5), ("randint", 1, 1, 1), ("random", 0.7),
        # masking [CLS] 10 11 12 [SEP] 13 14 [SEP]: round(8 * .15) = 1; first candidate kept (0.85, then 0.3)
        ("shuffle", 5, [0, 1, 2, 3, 4]), ("random", 0.85), ("random", 0.3),
        # doc 1: short (0.05 < 0.1) -> target randint(2, 5) = 2; one segment -> NotNext without a coin;
        # first try lands on doc 1 itself, the second on doc 0; start segment 1 of doc 0
        ("random", 0.05), ("randint", 2, 5, 2), ("randint", 0, 1, 1), ("randint", 0, 1, 0), ("randint", 0, 1, 1),
        # masking [CLS] 20 [SEP] 13 14 [SEP]: round(0.9) = 1; random word: randint over the whole vocab
        ("shuffle", 3, [0, 1, 2]), ("random", 0.95), ("random", 0.9), ("randint", 0, V - 1, 7),
        ("shuffle", 2, [0, 1]),
    ]
    got = run_scripted(docs, script, max_seq_length=8)
    assert got == [([CLS, 10, 11, 12, SEP, 13, 14, SEP], 5, False, [1], [10]),
                   ([CLS, 7, SEP, 13, 14, SEP], 3, True, [1], [20])]


def test_compat_truncation_and_put_back():
    docs = [[[1, 2, 3, 4], [5, 6], [7]], [[8, 9, 10, 11, 12, 13]]]
    script = [
        ("shuffle", 2, [0, 1]),
        # doc 0, target 5: chunk [1 2 3 4][5 6] -> A = [1 2 3 4], coin 0.2 -> NotNext from doc 1 (its one segment)
        ("random", 0.5), ("randint", 1, 1, 1), ("random", 0.2), ("randint", 0, 1, 1), ("randint", 0, 0, 0),
        # truncate 4 + 6 to 5: B front, B back, tie -> B front, A back, tie -> B back
        ("random", 0.3), ("random", 0.7), ("random", 0.1), ("random", 0.6), ("random", 0.6),
        ("shuffle", 5, [0, 1, 2, 3, 4]), ("random", 0.1),
        # [5 6] was put back: chunk [5 6][7] ends the document -> A = [5 6], coin 0.9 -> IsNext B = [7]
        ("randint", 1, 1, 1), ("random", 0.9), ("shuffle", 3, [0, 1, 2]), ("random", 0.5),
        # doc 1: one 6-token segment -> NotNext, B from doc 0 segment 2; truncate A front then back
        ("random", 0.5), ("randint", 0, 1, 0), ("randint", 0, 2, 2), ("random", 0.2), ("random", 0.8),
        ("shuffle", 5, [0, 1, 2, 3, 4]), ("random", 0.5),
        ("shuffle", 3, [2, 0, 1]),
    ]
    got = run_scripted(docs, script, max_seq_length=8)
    assert got == [([CLS, MASK, 10, 11, 12, SEP, 7, SEP], 6, True, [1], [9]),
                   ([CLS, MASK, 2, 3, SEP, 10, 11, SEP], 5, True, [1], [1]),
                   ([CLS, MASK, 6, SEP, 7, SEP], 4, False, [1], [5])]


def test_compat_whole_word_masking_reference_quirks():
    # [CLS] a ##b [SEP] ##c d [SEP]: the reference glues ##c (start of B) onto a##b; k = round(7 * .43) = 3;
    # the 3-piece group decides per piece: kept, [MASK], random word (which may be [PAD]: whole vocabulary)
    is_cont = [False] * 10
    is_cont[6] = is_cont[7] = True
    a, b, c, d = 5, 6, 7, 8
    rng = ScriptedRandom([("shuffle", 2, [0, 1]), ("random", 0.9), ("random", 0.2), ("random", 0.1),
                          ("random", 0.95), ("random", 0.7), ("randint", 0, 9, 0)])
    out, pos, labels, kinds = google_compat.mask_google([CLS, a, b, SEP, c, d, SEP], rng, 10, CLS, SEP, MASK,
                                                        is_cont, 0.43, 20, True)
    assert out == [CLS, a, MASK, SEP, 0, d, SEP] and pos == [1, 2, 4] and labels == [a, b, c]
    # a group that would exceed the number is skipped, the next one that fits is taken
    rng = ScriptedRandom([("shuffle", 2, [0, 1]), ("random", 0.1)])
    out, pos, labels, _ = google_compat.mask_google([CLS, a, b, SEP, c, d, SEP], rng, 10, CLS, SEP, MASK,
                                                    is_cont, 0.3, 20, True)       # k = round(2.1) = 2
    assert pos == [5] and out[5] == MASK


def test_compat_end_to_end_deterministic(tmp_path, vocab):
    corpus = write_corpus(tmp_path / "c", [synthetic_docs(12, 4)])
    cfg = InstancesConfig(compat="google", dupe=2, max_seq_length=32)
    m1 = make_instances(corpus, vocab, tmp_path / "o1", cfg, progress=False)
    m2 = make_instances(corpus, vocab, tmp_path / "o2", InstancesConfig(compat="google", dupe=2, max_seq_length=32),
                        progress=False)
    assert files_bytes(tmp_path / "o1") == files_bytes(tmp_path / "o2")
    t = read_arrow(tmp_path / "o1" / "instances-00000.arrow")
    assert t.schema.equals(instance_schema(30522, True)) and t.num_rows == sum(m1.stats["instances_per_pass"])
    assert m1.masking.random_from_whole_vocab and m1.masking.wwm_decide_per_piece and m1.same_doc_notnext
    assert m2.stats["train_counts"]["selected"] == m2.stats["train_counts"]["expected_selected"]


# ---------------------------------------------------------------------------------------------------------------
# the stage end to end


def test_static_output_round_trip_and_contract(tmp_path, small_corpus, vocab, shared_data):
    out = tmp_path / "inst"
    m = make_instances(small_corpus, vocab, out, InstancesConfig(dupe=2, max_seq_length=64, workers=1),
                       progress=False)
    assert m.stage == "make-instances" and m.complete and m.mode == "static"
    assert m.vocab_size == 30522 and m.vocab_sha256 == sha256_file(shared_data / VOCAB_FILE)
    assert (out / "vocab.txt").read_bytes() == (shared_data / VOCAB_FILE).read_bytes()
    assert (out / "tokenizer.json").is_file()
    names = sorted(p.name for p in out.glob("*.arrow"))
    assert names == sorted(s.file for s in m.shards)
    assert any(n.startswith("holdout-") for n in names)
    vocab_tokens = (shared_data / VOCAB_FILE).read_text().split("\n")
    n_rows = 0
    for s in m.shards:
        t = read_arrow(out / s.file)
        assert t.schema.equals(instance_schema(30522, True)) and s.rows == t.num_rows
        assert s.checksum == checksum_file(out / s.file)
        d = t.to_pydict()
        for ids, b, nsp, pos, lab in zip(d["input_ids"], d["b_start"], d["next_sentence_label"],
                                         d["masked_positions"], d["masked_ids"]):
            assert len(ids) <= 64 and ids[0] == CLS and ids[b - 1] == SEP and ids[-1] == SEP
            assert SEP not in ids[1:b - 1] + ids[b:-1] and nsp in (0, 1)
            assert pos == sorted(set(pos)) and len(pos) == min(20, max(1, round(len(ids) * 0.15)))
            assert all(0 < p < len(ids) and p != b - 1 for p in pos) and len(lab) == len(pos)
            for p, label in zip(pos, lab):
                if ids[p] not in (MASK, label):     # a random replacement: never a special or [unused] token
                    assert not (vocab_tokens[ids[p]].startswith("[") and vocab_tokens[ids[p]].endswith("]"))
        n_rows += t.num_rows if s.split == "train" else 0
    assert n_rows == m.stats["instances"]["train"] == sum(m.stats["instances_per_pass"])
    assert len(m.stats["instances_per_pass"]) == 2


def test_isnext_pairs_are_contiguous_text_of_one_document(tmp_path, vocab):
    from bertkit.tokenization import load_tokenizer

    docs = synthetic_docs(6, 9, max_sentences=8)                      # no chunk reaches 509 tokens: no truncation
    corpus = write_corpus(tmp_path / "c", [docs])
    out = tmp_path / "o"
    make_instances(corpus, vocab, out, InstancesConfig(mode="dynamic", max_seq_length=512, short_seq_prob=0.0),
                   progress=False)
    tok = load_tokenizer(vocab)
    doc_ids = [[t for s in d for t in tok.encode(s, add_special_tokens=False).ids] for d in docs]
    t = read_arrow(out / "instances-00000.arrow").to_pydict()
    seen_isnext = 0
    for ids, b, nsp in zip(t["input_ids"], t["b_start"], t["next_sentence_label"]):
        a_tokens, b_tokens = ids[1:b - 1], ids[b:-1]
        owners_a = [k for k, d in enumerate(doc_ids) if _contains(d, a_tokens)]
        assert owners_a
        if nsp == 0:
            seen_isnext += 1
            assert any(_contains(doc_ids[k], a_tokens + b_tokens) for k in owners_a)
    assert seen_isnext > 0


def _contains(seq, sub):
    n = len(sub)
    return any(seq[i:i + n] == sub for i in range(len(seq) - n + 1))


def test_one_document_corpus_end_to_end(tmp_path, vocab):
    # NVIDIA/DeepLearningExamples#421: with one document the reference labels pairs from it NotNext
    corpus = write_corpus(tmp_path / "c", [synthetic_docs(1, 5, max_sentences=40)])
    fixed = make_instances(corpus, vocab, tmp_path / "fixed", InstancesConfig(dupe=3, max_seq_length=32),
                           progress=False)
    ref = make_instances(corpus, vocab, tmp_path / "ref", InstancesConfig(dupe=3, max_seq_length=32,
                                                                          same_doc_notnext=True), progress=False)
    assert fixed.stats["train_counts"]["not_next"] == 0 and fixed.stats["instances"]["train"] > 10
    assert ref.stats["not_next_share"] > 0.3


def test_dynamic_mode_is_static_before_masking(tmp_path, small_corpus, vocab):
    cfg = dict(dupe=1, max_seq_length=48, workers=1)
    make_instances(small_corpus, vocab, tmp_path / "s", InstancesConfig(**cfg), progress=False)
    m = make_instances(small_corpus, vocab, tmp_path / "d", InstancesConfig(mode="dynamic", **cfg), progress=False)
    assert m.mode == "dynamic" and "mask_share" not in m.stats
    s = read_arrow(tmp_path / "s" / "instances-00000.arrow").to_pydict()
    d = read_arrow(tmp_path / "d" / "instances-00000.arrow")
    assert d.schema.equals(instance_schema(30522, False))
    d = d.to_pydict()
    for ids_s, pos, lab, ids_d in zip(s["input_ids"], s["masked_positions"], s["masked_ids"], d["input_ids"]):
        restored = list(ids_s)
        for p, label in zip(pos, lab):
            restored[p] = label
        assert restored == ids_d
    assert s["b_start"] == d["b_start"] and s["next_sentence_label"] == d["next_sentence_label"]
    # the dynamic default is one pass; static is 10
    assert InstancesConfig(mode="dynamic").passes == 1 and InstancesConfig().passes == 10


def test_deterministic_and_identical_for_1_and_2_workers(tmp_path, small_corpus, vocab):
    cfg = dict(dupe=2, max_seq_length=64, unit_mb=0.002)          # several work units per shard
    m1 = make_instances(small_corpus, vocab, tmp_path / "w1", InstancesConfig(workers=1, **cfg), progress=False)
    make_instances(small_corpus, vocab, tmp_path / "w2", InstancesConfig(workers=2, **cfg), progress=False)
    assert len(m1.shards) > 4
    assert files_bytes(tmp_path / "w1") == files_bytes(tmp_path / "w2")
    assert (tmp_path / "w1" / "manifest.json").read_bytes() == (tmp_path / "w2" / "manifest.json").read_bytes()
    make_instances(small_corpus, vocab, tmp_path / "seed", InstancesConfig(workers=1, seed=7, **cfg), progress=False)
    assert files_bytes(tmp_path / "seed") != files_bytes(tmp_path / "w1")


def test_resume_redoes_only_unfinished_files(tmp_path, small_corpus, vocab):
    out = tmp_path / "o"
    cfg = InstancesConfig(dupe=3, max_seq_length=64, workers=1)
    make_instances(small_corpus, vocab, out, cfg, progress=False)
    before = files_bytes(out)
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.glob("*.arrow")}
    # a killed run: one file never written, one written but without its record, a temp file left behind
    (out / "instances-00001.arrow").unlink()
    (out / ".parts" / "instances-00004.arrow.json").unlink()
    (out / ".instances-00002.arrow.abc.tmp").write_bytes(b"partial")
    (out / "manifest.json").unlink()
    make_instances(small_corpus, vocab, out, InstancesConfig(dupe=3, max_seq_length=64, workers=1), progress=False)
    assert files_bytes(out) == before
    assert not list(out.glob(".*.tmp"))
    for name, t in mtimes.items():
        if name not in ("instances-00001.arrow", "instances-00004.arrow"):
            assert (out / name).stat().st_mtime_ns == t, f"{name} was redone"
    # other settings into the same folder: refused, not mixed
    with pytest.raises(InstancesError, match="different settings.*seed"):
        make_instances(small_corpus, vocab, out, InstancesConfig(dupe=3, max_seq_length=64, seed=1), progress=False)


def test_bad_inputs_are_clear_errors(tmp_path, small_corpus, vocab, shared_data):
    from bertkit.formats import CorpusError

    (tmp_path / "nomanifest").mkdir()
    with pytest.raises(CorpusError, match="no manifest.json"):
        make_instances(tmp_path / "nomanifest", vocab, tmp_path / "o1")
    for bad in (7, 513):
        with pytest.raises(InstancesError, match="--max-seq-length"):
            make_instances(small_corpus, vocab, tmp_path / "o2", InstancesConfig(max_seq_length=bad))
    tokens = (shared_data / VOCAB_FILE).read_text().split("\n")
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "vocab.txt").write_text("\n".join(t for t in tokens if t != "[MASK]"))
    with pytest.raises(InstancesError, match=r"\[MASK\]"):
        make_instances(small_corpus, tmp_path / "tok", tmp_path / "o3")
    empty = write_corpus(tmp_path / "empty", [[["  ", "\t"], []]])
    with pytest.raises(InstancesError, match="no non-empty document"):
        make_instances(empty, vocab, tmp_path / "o4", InstancesConfig(workers=1))
    (tmp_path / "occupied").mkdir()
    (tmp_path / "occupied" / "x.txt").write_text("x")
    with pytest.raises(FolderNotOwnedError, match=r"holds files no bertkit command wrote there \(x.txt\)"):
        make_instances(small_corpus, vocab, tmp_path / "occupied")


def test_cli(tmp_path, small_corpus, vocab):
    from bertkit.cli import main

    r = CliRunner().invoke(main, ["make-instances", str(small_corpus), "--tokenizer", vocab, "--out",
                                  str(tmp_path / "o"), "--dupe", "1", "--workers", "1", "--max-seq-length", "32",
                                  "--whole-word-mask", "--no-progress"])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert m["masking"] == {"masked_lm_prob": 0.15, "max_predictions": 20, "whole_word_mask": True,
                            "mask_replace": [0.8, 0.1, 0.1], "random_from_whole_vocab": False,
                            "wwm_decide_per_piece": False}
    assert m["max_seq_length"] == 32 and not m["same_doc_notnext"] and "NotNext" in r.output
    r = CliRunner().invoke(main, ["make-instances", str(small_corpus), "--tokenizer", vocab, "--out",
                                  str(tmp_path / "ref"), "--dupe", "1", "--workers", "1", "--max-seq-length", "32",
                                  "--random-from-whole-vocab", "--wwm-decide-per-piece", "--same-doc-notnext",
                                  "--mode", "dynamic", "--seed", "3", "--no-progress"])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "ref" / "manifest.json").read_text())
    assert m["masking"]["random_from_whole_vocab"] and m["masking"]["wwm_decide_per_piece"]
    assert m["same_doc_notnext"] and m["mode"] == "dynamic" and m["seed"] == 3
    r = CliRunner().invoke(main, ["make-instances", str(tmp_path / "missing"), "--tokenizer", vocab,
                                  "--out", str(tmp_path / "o2")])
    assert r.exit_code != 0 and "prepare-corpus" in r.output


# ---------------------------------------------------------------------------------------------------------------
# statistics on the English Wikipedia sample


def test_every_masking_option_is_one_flag_that_reaches_the_manifest_and_the_loader(tmp_path, small_corpus, vocab):
    """A masking option is a MaskingOptions field and a make-instances flag of the same name, nothing else: given on
    the command line it lands in the manifest's "masking" and in the dynamic loader's spec unchanged."""
    from dataclasses import fields

    from bertkit.cli import main
    from bertkit.data import InstanceDataset

    flags = {p.name: p for p in main.commands["make-instances"].params}
    chosen = {"masked_lm_prob": 0.2, "max_predictions": 9, "whole_word_mask": True, "mask_replace": (0.6, 0.3, 0.1),
              "random_from_whole_vocab": True, "wwm_decide_per_piece": True}
    assert {f.name for f in fields(MaskingOptions)} == set(chosen) <= set(flags)   # a new field needs a value here
    args = []
    for name, value in chosen.items():
        flag = flags[name].opts[0]
        args += [flag] if value is True else [flag, ",".join(map(str, value)) if isinstance(value, tuple) else
                                              str(value)]
    r = CliRunner().invoke(main, ["make-instances", str(small_corpus), "--tokenizer", vocab, "--out",
                                  str(tmp_path / "o"), "--dupe", "1", "--workers", "1", "--max-seq-length", "32",
                                  "--mode", "dynamic", "--no-progress", *args])
    assert r.exit_code == 0, r.output
    expected = MaskingOptions(**chosen)
    assert MaskingOptions(**json.loads((tmp_path / "o" / "manifest.json").read_text())["masking"]) == expected
    assert InstanceDataset(tmp_path / "o", "train").spec.options == expected


def test_a_folder_begun_by_an_older_version_resumes_and_other_settings_are_named(tmp_path, small_corpus, vocab):
    """Older resume records kept the masking options flat: read so, the same settings resume (a lost file is
    redone), and a changed option is named by its flag's name."""
    cfg = InstancesConfig(dupe=1, max_seq_length=32)
    make_instances(small_corpus, vocab, tmp_path / "o", cfg, progress=False)
    record = tmp_path / "o" / ".parts" / "run.json"
    old = json.loads(record.read_text())
    old["config"].update(old["config"].pop("masking"))
    record.write_text(json.dumps(old))
    before = files_bytes(tmp_path / "o")
    (tmp_path / "o" / "instances-00000.arrow").unlink()
    make_instances(small_corpus, vocab, tmp_path / "o", cfg, progress=False)
    assert files_bytes(tmp_path / "o") == before
    with pytest.raises(InstancesError, match=r"different settings \(whole_word_mask\)"):
        make_instances(small_corpus, vocab, tmp_path / "o",
                       InstancesConfig(dupe=1, max_seq_length=32, masking=MaskingOptions(whole_word_mask=True)),
                       progress=False)


@pytest.fixture(scope="module")
def english_instances(shared_data, tmp_path_factory, vocab):
    from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus

    root = tmp_path_factory.mktemp("en")
    files = sorted((shared_data / "wikipedia_en_wikiextractor" / "text" / "AA").glob("wiki_*"))[:3]
    prepare_corpus([str(f) for f in files], root / "corpus", CorpusConfig(progress=False, holdout=0.0))
    m = make_instances(root / "corpus", vocab, root / "inst", InstancesConfig(workers=1), progress=False)
    return root / "inst", m


def test_english_statistics_match_the_rules(english_instances):
    out, m = english_instances
    n_sel = n_expected = n_cand = n_mask = n_kept = n_random = n_notnext = n_rows = 0
    for s in m.shards:
        d = read_arrow(out / s.file).to_pydict()
        for ids, pos, lab in zip(d["input_ids"], d["masked_positions"], d["masked_ids"]):
            n_expected += min(20, max(1, int(round(len(ids) * 0.15))))
            n_cand += len(ids) - 3
            n_sel += len(pos)
            for p, label in zip(pos, lab):
                n_mask += ids[p] == MASK
                n_kept += ids[p] == label
                n_random += ids[p] not in (MASK, label)
        n_notnext += sum(d["next_sentence_label"])
        n_rows += len(d["input_ids"])
    assert n_rows > 50_000
    assert n_sel == n_expected                                   # the rounding rule, row by row
    assert abs(n_sel / n_cand - m.stats["selected_fraction"]) < 1e-12
    assert abs(n_mask / n_sel - 0.8) < 0.01 and abs(n_kept / n_sel - 0.1) < 0.01 and abs(n_random / n_sel - 0.1) < 0.01
    assert 0.50 <= n_notnext / n_rows <= 0.56
    st = m.stats
    assert abs(st["not_next_share"] - n_notnext / n_rows) < 1e-12 and abs(st["mask_share"] - n_mask / n_sel) < 2e-4
    assert sum(st["length_histogram"]["counts"]) == n_rows and len(st["instances_per_pass"]) == 10


def test_a_length_with_no_room_for_two_segments_is_warned_about(tmp_path, small_corpus, vocab, capsys):
    """--max-seq-length 8 leaves 5 tokens for A and B: most pairs come out NotNext, which make-instances says."""
    m = make_instances(small_corpus, vocab, tmp_path / "short", InstancesConfig(max_seq_length=8, workers=1),
                       progress=False)
    assert m.stats["not_next_share"] > 0.6
    assert "of the pairs are NotNext" in capsys.readouterr().err
    make_instances(small_corpus, vocab, tmp_path / "long", InstancesConfig(max_seq_length=128, workers=1),
                   progress=False)
    assert "NotNext" not in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# --rehydrate: documents repeated by their near-duplicate cluster's size

def test_rehydrate_repeats_each_training_document_by_its_cluster_size(tmp_path):
    """FineWeb2's table (its README: a cluster of 1 once, 2 and 3 that many times, 4 three, 5-99 five, 100-999
    eight, 1,000 or more once), counted by each document's own word in the instances; the held-out split once."""
    from bertkit.testing import toy_vocab

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(toy_vocab()) + "\n")
    sizes = [1, 2, 3, 4, 5, 99, 100, 999, 1000, 5000]
    by_hand = [1, 2, 3, 3, 5, 5, 8, 8, 1, 1]
    docs = [[" ".join([f"w{d}"] * 5) + ".", " ".join([f"w{d}"] * 5) + "."] for d in range(len(sizes))]
    corpus = write_corpus(tmp_path / "corpus", [docs[:6], docs[6:]], holdout=[[["w50 w50 w50 w50."]]],
                          cluster_sizes=[sizes[:6], sizes[6:], [7]])
    cfg = dict(mode="dynamic", objective="none", max_seq_length=64, unit_mb=0.0001)

    def marker_counts(folder, split):
        ids = np.concatenate([read_arrow(folder / s["file"]).column("input_ids").combine_chunks().flatten().to_numpy()
                              for s in json_manifest(folder)["shards"] if s["split"] == split])
        return np.bincount(ids.astype(np.int64), minlength=len(toy_vocab()))[5:5 + 51]

    make_instances(corpus, vocab, tmp_path / "plain", InstancesConfig(**cfg), progress=False)
    m = make_instances(corpus, vocab, tmp_path / "r1", InstancesConfig(rehydrate="fineweb2", workers=1, **cfg),
                       progress=False)
    make_instances(corpus, vocab, tmp_path / "r2", InstancesConfig(rehydrate="fineweb2", workers=2, **cfg),
                   progress=False)
    assert list(marker_counts(tmp_path / "plain", "train")[:10]) == [10] * 10     # the control: each word 10 times
    assert list(marker_counts(tmp_path / "r1", "train")[:10]) == [10 * n for n in by_hand]
    assert marker_counts(tmp_path / "r1", "holdout")[50] == 4                      # held out: once
    assert m.stats["rehydrated"] == {"weights": [[1, 1], [2, 2], [3, 3], [5, 5], [100, 8], [1000, 1]],
                                     "documents": 10, "appearances": sum(by_hand)}
    assert files_bytes(tmp_path / "r1") == files_bytes(tmp_path / "r2")            # any number of workers
    own = make_instances(corpus, vocab, tmp_path / "own", InstancesConfig(rehydrate="1:1,3:2", **cfg), progress=False)
    assert own.stats["rehydrated"]["appearances"] == 2 + 2 * 8                      # sizes 1, 2 once; 3 and up twice
    with pytest.raises(InstancesError, match="different settings \\(rehydrate\\)"):
        make_instances(corpus, vocab, tmp_path / "r1", InstancesConfig(**cfg), progress=False)
    from bertkit.cli import main

    r = CliRunner().invoke(main, ["make-instances", str(corpus), "--tokenizer", str(vocab), "--out",
                                  str(tmp_path / "cli"), "--mode", "dynamic", "--objective", "none",
                                  "--max-seq-length", "64", "--rehydrate", "fineweb2", "--no-progress"])
    assert r.exit_code == 0 and "rehydrated: 10 training documents appear 37 times a pass" in r.output, r.output


def test_rehydrate_refuses_a_corpus_without_cluster_sizes_and_a_bad_table(tmp_path, small_corpus):
    from bertkit.testing import toy_vocab

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(toy_vocab()) + "\n")
    with pytest.raises(InstancesError, match="run prepare-corpus --near-dedup, or leave out --rehydrate"):
        make_instances(small_corpus, vocab, tmp_path / "out", InstancesConfig(rehydrate="fineweb2"), progress=False)
    assert not (tmp_path / "out").exists()
    for bad in ("2:2", "1:1,5:2,3:1", "1:0", "1:x", "fineweb3"):
        with pytest.raises(InstancesError, match="--rehydrate"):
            InstancesConfig(rehydrate=bad).check()
    with pytest.raises(InstancesError, match="--compat google"):
        InstancesConfig(rehydrate="fineweb2", compat="google").check()


def json_manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())
