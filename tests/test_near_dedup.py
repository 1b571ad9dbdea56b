"""prepare-corpus --near-dedup on a planted corpus: every planted pair at or above the threshold left as one
document, every pair below it and every distinct document kept (the truth from bertkit.planted's own Jaccard, not
bertkit's MinHash); the cluster-size column; the same bytes for any worker count and after a killed run; the LSH
arithmetic by hand."""
import json
import random

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.formats import CorpusColumns as C, corpus_shards, read_corpus_manifest
from bertkit.pipelines.near_dedup import (
    NearDedupSettings,
    batch_shingles,
    candidate_probability,
    choose_bands,
    clusters,
    pair_jaccard,
    shingles,
)
from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus
from bertkit.pipelines.words import word_hashes, words
from bertkit.planted import near_dedup_scores, true_jaccard, variant

SYLLABLES = "가나다라마바사아자차카타파하거너더러머버서어저처커터퍼허고노도로모보소오조초코토포호"


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """120 made-up Korean and English documents, 60 planted variants of them (edits, headers, format changes,
    cuts), a byte-identical copy, in a shuffled order; the truth by bertkit.planted's Jaccard."""
    root = tmp_path_factory.mktemp("planted")
    rng = random.Random(7)
    ko = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    en = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    rows, truth = [], {}
    for i in range(120):
        language, pool = ("ko", ko) if i % 2 else ("en", en)
        text = ". ".join(" ".join(rng.choice(pool) for _ in range(rng.randint(8, 20))) for _ in range(8)) + "."
        rows.append({"title": f"d{i}", "text": text})
        truth[f"d{i}"] = {"kind": "original", "of": None, "jaccard": None}
        if i < 60:
            kind = ("edit", "header", "format", "cut", "edit")[i % 5]
            other = variant(text, kind, language, rng, pool)
            rows.append({"title": f"d{i}-{kind}", "text": other})
            truth[f"d{i}-{kind}"] = {"kind": kind, "of": f"d{i}", "jaccard": true_jaccard(text, other)}
    rows.append({"title": "d0-copy", "text": rows[0]["text"]})
    truth["d0-copy"] = {"kind": "copy", "of": "d0", "jaccard": 1.0}
    rng.shuffle(rows)
    (root / "in.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return root, truth


def run(root, out, **options):
    return prepare_corpus([root / "in.jsonl"], out, CorpusConfig(holdout=0.1, progress=False, near_dedup=True,
                                                                 min_chars=10, **options))


def kept(out) -> dict:
    """title -> cluster size of every document kept (train and holdout)."""
    found = {}
    for split in ("train", "holdout"):
        for path in corpus_shards(out, split):
            table = pa.ipc.open_file(str(path)).read_all()
            found.update(zip(table.column(C.TITLE).to_pylist(), table.column(C.CLUSTER_SIZE).to_pylist()))
    return found


def shard_bytes(out) -> dict:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.arrow"))}


def test_planted_pairs_above_the_threshold_go_and_nothing_else(planted, tmp_path):
    root, truth = planted
    manifest = run(root, tmp_path / "out")
    found = kept(tmp_path / "out")
    scores = near_dedup_scores(truth, set(found))
    assert scores["pairs_at_or_above"] >= 30 and scores["recall"] == 1.0, scores
    assert scores["pairs_below"] >= 5 and scores["below_both_kept"] == scores["pairs_below"], scores
    assert scores["distinct_lost"] == 0, scores
    # each kept document carries its cluster's size; together they count every document read
    assert sum(found.values()) == len(truth)
    for title, size in found.items():
        members = 1 + sum(1 for t, v in truth.items() if v["of"] == title and v["jaccard"] >= 0.8)
        if truth[title]["of"] is None:
            assert size == members, title
    assert manifest.dropped["duplicate"] == 1   # the byte-identical copy, counted as before
    near = manifest.totals["near_dedup"]
    assert manifest.dropped["near_duplicate"] == near["removed"] - 1
    assert (near["bands"], near["rows"], near["threshold"]) == (18, 6, 0.8)
    assert read_corpus_manifest(tmp_path / "out").schema[C.CLUSTER_SIZE] == "int32"


def test_workers_and_a_killed_run_write_the_same_bytes(planted, tmp_path, monkeypatch):
    import bertkit.pipelines.near_dedup as near_dedup

    root, _ = planted
    run(root, tmp_path / "one", workers=1)
    run(root, tmp_path / "two", workers=2)
    assert shard_bytes(tmp_path / "one") == shard_bytes(tmp_path / "two")

    real = near_dedup.check_task

    def dies(*args, **kwargs):
        raise KeyboardInterrupt("killed while checking pairs")

    monkeypatch.setattr(near_dedup, "check_task", dies)
    with pytest.raises(KeyboardInterrupt):
        run(root, tmp_path / "killed", workers=1)
    assert (tmp_path / "killed" / ".work" / "near-dedup" / "signatures-00000.json").is_file()
    monkeypatch.setattr(near_dedup, "check_task", real)
    run(root, tmp_path / "killed", workers=1)
    assert shard_bytes(tmp_path / "killed") == shard_bytes(tmp_path / "one")
    assert not (tmp_path / "killed" / ".work").exists()   # the work folder goes whole, its near-dedup/ too
    run(root, tmp_path / "killed", workers=1, overwrite=True)   # and a rerun finds nothing in its way
    assert shard_bytes(tmp_path / "killed") == shard_bytes(tmp_path / "one")


def test_a_killed_runs_signatures_from_other_hash_functions_are_made_again(planted, tmp_path, monkeypatch):
    """Signatures whose record names other hash functions (HASHES: a killed run of an older bertkit) are redone on
    resume, not mixed with the new ones; those with the current record are kept as they are."""
    import json

    import numpy as np

    import bertkit.pipelines.near_dedup as near_dedup

    root, _ = planted

    def dies(*args, **kwargs):
        raise KeyboardInterrupt("killed while checking pairs")

    monkeypatch.setattr(near_dedup, "check_task", dies)
    with pytest.raises(KeyboardInterrupt):
        run(root, tmp_path / "k", workers=1)
    signatures = tmp_path / "k" / ".work" / "near-dedup" / "signatures-00000.npy"
    made = np.load(signatures)
    record = json.loads(signatures.with_suffix(".json").read_text())
    for hashes, expected in ((near_dedup.HASHES, np.zeros_like(made)), (near_dedup.HASHES - 1, made)):
        np.save(signatures, np.zeros_like(made))   # (not what these documents give)
        signatures.with_suffix(".json").write_text(json.dumps({**record, "hashes": hashes}))
        with pytest.raises(KeyboardInterrupt):
            run(root, tmp_path / "k", workers=1)
        assert np.array_equal(np.load(signatures), expected)


def test_the_corpus_report_draws_its_removals(planted, tmp_path):
    root, _ = planted
    run(root, tmp_path / "out")
    r = CliRunner().invoke(main, ["report", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    page = (tmp_path / "out" / "report.html").read_text()
    assert "documents removed by reason" in page and "cluster sizes" in page and "largest clusters" in page
    assert page.count("<img") == 2


def test_the_command_says_its_bands_and_refuses_a_bad_shape(planted, tmp_path):
    root, _ = planted
    r = CliRunner().invoke(main, ["prepare-corpus", str(root / "in.jsonl"), "--out", str(tmp_path / "o"),
                                  "--near-dedup", "--near-dedup-bands", "14x8", "--min-chars", "10", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "near_duplicate" in r.output
    near = read_corpus_manifest(tmp_path / "o").totals["near_dedup"]
    assert (near["bands"], near["rows"]) == (14, 8)
    bad = CliRunner().invoke(main, ["prepare-corpus", str(root / "in.jsonl"), "--out", str(tmp_path / "p"),
                                    "--near-dedup", "--near-dedup-bands", "14by8"])
    assert bad.exit_code == 2 and "BANDSxROWS" in bad.output and not (tmp_path / "p").exists()


def test_lsh_arithmetic_by_hand():
    assert candidate_probability(0.8, 14, 8) == pytest.approx(1 - (1 - 0.8 ** 8) ** 14)
    assert choose_bands(0.8) == (18, 6) and candidate_probability(0.8, 18, 6) > 0.995
    assert NearDedupSettings.for_threshold(0.8) == NearDedupSettings()
    # one word changed in 13: 5 of the 9 five-word shingles differ, so 4 / (9 + 9 - 4)
    assert jaccard("the quick brown fox jumps over the lazy dog and runs away fast",
                   "the quick brown fox jumps over the lazy cat and runs away fast") == pytest.approx(4 / 14)
    assert jaccard("A, b; C 1990.", "a b c 2024") == 1.0   # case, punctuation, digits
    assert jaccard("", "...") == 0.0   # no words on either side: not duplicates


def jaccard(first: str, second: str) -> float:
    owner, x = batch_shingles([first, second], 5)
    return pair_jaccard(owner, x, np.array([[0, 1]]), 2)[0]


def test_pair_jaccard_equals_python_sets_of_word_5grams():
    """A batch of pairs, sets of many sizes (short texts are one shingle), against sets of words() tuples."""
    rng = random.Random(5)
    texts = [" ".join(rng.choice("abcdefgh") for _ in range(rng.randint(0, 30))) for _ in range(40)]
    pairs = np.array([[rng.randrange(40), rng.randrange(40)] for _ in range(300)])
    owner, x = batch_shingles(texts, 5)
    found = pair_jaccard(owner, x, pairs, len(texts))

    def grams(text):
        w = words(text)
        return {tuple(w[i:i + 5]) for i in range(len(w) - 4)} or ({tuple(w)} if w else set())

    for (i, j), value in zip(pairs, found):
        a, b = grams(texts[i]), grams(texts[j])
        assert value == pytest.approx(len(a & b) / len(a | b) if a | b else 0.0), (texts[i], texts[j])


def test_character_classes_are_pythons_own():
    """The table words.py looks characters up in, against str's own predicates over every code point."""
    from bertkit.pipelines.words import HANGUL, LETTER, SPACE, WORD, _classes

    table = _classes()
    for c in list(range(0x40000)) + list(range(0x40000, 0x110000, 97)):
        ch = chr(c)
        expected = ((WORD if ch.isalnum() else 0) | (LETTER if ch.isalnum() and not ch.isdecimal() else 0)
                    | (SPACE if ch.isspace() else 0) | (HANGUL if "가" <= ch <= "힣" else 0))
        assert table[c] == expected, hex(c)


def test_word_hashes_split_as_words_do():
    for text in ("Hello, World! hello-world 2024년 “인용” 가·나 「다」", "대한민국의 수도는 서울이다.", "...", ""):
        hashed = word_hashes(text)
        assert len(hashed) == len(words(text)), text
        same = {w: h for w, h in zip(words(text), hashed.tolist())}
        assert all(same[w] == h for w, h in zip(words(text), hashed.tolist()))   # a word hashes one way


def test_a_word_hashes_as_the_polynomial_over_its_lower_cased_characters(monkeypatch):
    """Against the definition, word by word in Python: sum of (code point + 1) * 1,000,003**k mod 2**32 over the
    word as words() gives it (lower case, digits as 0), long words and characters str.lower lengthens included; the
    same when the batch is weighed in many spans (SPAN made small), but for a word longer than a span."""
    from bertkit.pipelines import words as module

    text = ("ΟΔΟΣ İstanbul Straße 2024년 ١٢٣ 𝐀𝐁 " + "가" * 70 + " x" + "y" * 200 + " KELVIN K " + "서울 " * 3000)

    def polynomial(word):
        return sum((ord(c) + 1) * pow(1_000_003, k, 2 ** 32) for k, c in enumerate(word)) % 2 ** 32

    expected = [polynomial(w) for w in words(text)]
    assert word_hashes(text).tolist() == expected
    assert words("ΟΔΟΣ İstanbul ١٢٣")[:3] == ["οδοσ", "istanbul", "000"]
    monkeypatch.setattr(module, "SPAN", 50)
    found = word_hashes(text).tolist()
    assert [w for w, h, e in zip(words(text), found, expected) if h != e] == ["가" * 70, "x" + "y" * 200]


def test_a_batch_of_texts_hashes_as_each_text_alone(planted):
    from bertkit.pipelines.near_dedup import band_hashes, batch_band_hashes, hash_functions

    root, _ = planted
    texts = [json.loads(line)["text"] for line in (root / "in.jsonl").read_text().splitlines()[:40]]
    texts += ["", "...", "one two", "a b c d e", "★★ ☆", "x " * 70_000, "대한민국 서울", "😀 ünïcode ÀB Ω_x", "٣ 3"]
    settings = NearDedupSettings()
    a, b = hash_functions(settings)
    alone = np.stack([band_hashes(shingles(text, 5), a, b, settings) for text in texts])
    assert np.array_equal(batch_band_hashes(texts, a, b, settings), alone)
    assert all(len(word_hashes(text)) == len(words(text)) for text in texts)   # the regex's words, on bytes


def test_minhash_is_the_minimum_of_each_permutation_and_estimates_jaccard():
    """Each signature value is min((a x + b) mod 2**32) over the shingles (Python's integers, one by one); over many
    pairs of shingle sets of known Jaccard (real word 5-grams) the share of equal values is the Jaccard: the 32-bit
    permutations are as good as MinHash needs."""
    from bertkit.pipelines.near_dedup import _minhash, hash_functions

    a, b = hash_functions(NearDedupSettings())
    rng = random.Random(0)
    vocabulary = ["".join(rng.choice("abcdefghij") for _ in range(6)) for _ in range(5000)]   # (digits: all "0")
    pool = shingles(" ".join(rng.choice(vocabulary) for _ in range(80_000)), 5).tolist()
    rng.shuffle(pool)
    few = pool[:300]
    assert _minhash(np.array(few), a, b).tolist() == [min((int(ai) * x + int(bi)) % 2 ** 32 for x in few)
                                                       for ai, bi in zip(a, b)]
    for jaccard, shared, own in ((0.5, 200, 100), (0.8, 400, 50)):
        agree = []
        for k in range(150):
            take = pool[k * (shared + 2 * own):(k + 1) * (shared + 2 * own)]
            first = np.array(take[:shared + own])
            second = np.array(take[:shared] + take[shared + own:])
            agree.append(np.mean(_minhash(first, a, b) == _minhash(second, a, b)))
        assert abs(np.mean(agree) - jaccard) < 0.02, (jaccard, np.mean(agree))


def test_clusters_keep_the_first_position_and_count_members():
    removed, heads, counts = clusters(np.array([[3, 5], [1, 3], [6, 7]], dtype=np.int64), 8)
    assert removed.tolist() == [3, 5, 7]
    assert heads.tolist() == [[1, 3], [6, 2]]   # (kept position, cluster size): every other position's size is 1
    assert counts == {"clusters": 2, "removed": 3, "largest_cluster": 3}
    removed, heads, counts = clusters(np.zeros((0, 2), np.int64), 4)
    assert len(removed) == len(heads) == 0 and counts == {"clusters": 0, "removed": 0, "largest_cluster": 1}


def test_clusters_are_the_components_of_a_union_find_over_every_position():
    """Random pairs over a large corpus against a plain union-find over every position; clusters() itself only
    holds the positions the pairs name (its memory is the pairs', not the corpus's)."""
    rng = np.random.default_rng(4)
    for _ in range(50):
        total = int(rng.integers(1, 10**9))
        named = np.sort(rng.choice(total, size=int(rng.integers(2, 40)), replace=False))
        edges = np.sort(named[rng.integers(0, len(named), size=(int(rng.integers(0, 30)), 2))], axis=1)
        edges = edges[edges[:, 0] != edges[:, 1]]
        parent = {int(x): int(x) for x in named}

        def root(x):
            while parent[x] != x:
                x = parent[x]
            return x

        for a, b in edges.tolist():
            ra, rb = root(a), root(b)
            parent[max(ra, rb)] = min(ra, rb)   # the earlier position roots its cluster
        members = {}
        for x in parent:
            members.setdefault(root(x), []).append(x)
        removed, heads, _ = clusters(edges, total)
        assert removed.tolist() == sorted(x for r, m in members.items() for x in m if x != r)
        assert heads.tolist() == sorted([r, len(m)] for r, m in members.items() if len(m) > 1)
