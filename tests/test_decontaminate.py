"""prepare-corpus --decontaminate: evaluation text planted in a corpus (whole passages, a 13-word stretch, a short
review whole) is found and removed, sentence or document; shorter overlaps and phrases common across the corpus
stay; every evaluation file's matches counted; the same bytes for any worker count."""
import json

import pyarrow as pa
import pytest

from bertkit.formats import corpus_shards
from bertkit.pipelines.decontaminate import evaluation_texts, text_ngrams
from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus

PASSAGE = ("세종대왕은 조선의 제4대 왕으로 훈민정음을 창제하여 백성들이 쉽게 글을 읽고 쓸 수 "
           "있도록 하였으며 과학과 음악 발전에도 힘썼다")
REVIEW = "이 영화 정말 최고였어요 배우들 연기가 너무 좋고 음악도 좋아요"          # 11 words: matched whole
SHORT = "배우들 연기가 너무 좋고 음악도"                                          # 5 words: too short to mean a leak
COMMON = "this sentence is a very common phrase that every page of the site repeats at its end"
FILLER = ["평범한 위키 문장이 여기에 있다.", "다른 내용의 문장이 이어진다 전혀 관계없이.",
          "마지막 문장도 깨끗하다 정말로."]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("decon")
    squad = {"data": [{"title": "t", "paragraphs": [{"context": PASSAGE + ". " + COMMON, "qas": [
        {"id": "1", "question": "훈민정음을 만든 왕은 누구인가", "answers": []}]}]}]}
    (root / "korquad.json").write_text(json.dumps(squad, ensure_ascii=False))
    (root / "ratings.txt").write_text(f"id\tdocument\tlabel\n1\t{REVIEW}\t1\n2\t{SHORT}\t1\n")
    docs = {"passage": f"{FILLER[0]} {PASSAGE}. {FILLER[1]}",
            "stretch": f"{FILLER[1]} 그는 " + " ".join(PASSAGE.split()[2:15]) + f" 라고 적었다. {FILLER[2]}",
            "review": f"{FILLER[2]} {REVIEW}. {FILLER[0]}",
            "short": f"{FILLER[0]} {SHORT} 이라는 말. {FILLER[2]}",
            "clean": " ".join(FILLER)}
    rows = [{"title": k, "text": v} for k, v in docs.items()]
    rows += [{"title": f"common{i}", "text": f"{FILLER[i % 3]} 문서 {i}번. {COMMON}."} for i in range(12)]
    (root / "in.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return root


def run(root, out, **options):
    return prepare_corpus([root / "in.jsonl"], out, CorpusConfig(
        holdout=0, min_chars=10, progress=False, decontaminate=(root / "korquad.json", root / "ratings.txt"),
        **options))


def documents(out) -> dict:
    table = pa.concat_tables([pa.ipc.open_file(str(p)).read_all() for p in corpus_shards(out)])
    return dict(zip(table.column("title").to_pylist(), table.column("sentences").to_pylist()))


def test_sentences_holding_evaluation_text_go_and_nothing_else(corpus, tmp_path):
    manifest = run(corpus, tmp_path / "s")
    kept = documents(tmp_path / "s")
    assert kept["passage"] == [FILLER[0], FILLER[1]]                  # the passage's sentence went
    assert not any("훈민정음" in s for s in kept["stretch"])            # 13 words of it inside another sentence
    assert kept["review"] == [FILLER[2], FILLER[0]]                    # a short review, whole
    assert any(SHORT in s for s in kept["short"]) and kept["clean"] == FILLER
    assert sum(1 for t in kept if t.startswith("common")) == 12       # a phrase in 12 > 10 documents stays
    report = manifest.totals["decontamination"]
    assert report["files"] == {"korquad.json": {"documents": 2, "sentences": 2},
                               "ratings.txt": {"documents": 1, "sentences": 1}}
    assert report["ngrams_too_common"] > 0 and manifest.dropped["contaminated"] == 0
    whole = prepare_corpus([corpus / "in.jsonl"], tmp_path / "w", CorpusConfig(holdout=0, min_chars=10, progress=False))
    gone = [s for title, sentences in documents(tmp_path / "w").items() for s in sentences if s not in kept[title]]
    assert len(gone) == 3   # the sentences' bytes (4 a sentence, as nbytes counts them) taken off the corpus's
    assert report["sentence_bytes_removed"] == sum(len(s.encode("utf-8")) + 4 for s in gone) == \
        whole.totals["text_bytes"] - manifest.totals["text_bytes"]


def test_documents_mode_and_workers(corpus, tmp_path):
    manifest = run(corpus, tmp_path / "d", decontaminate_mode="documents", workers=2)
    kept = documents(tmp_path / "d")
    assert {"passage", "stretch", "review"}.isdisjoint(kept) and {"short", "clean"} <= set(kept)
    assert manifest.dropped["contaminated"] == 3
    one = run(corpus, tmp_path / "d1", decontaminate_mode="documents", workers=1)
    assert one.shards == manifest.shards   # the same files, byte for byte (checksums)


def test_evaluation_files_are_read_as_published(tmp_path):
    (tmp_path / "nli.json").write_text(json.dumps([{"guid": "x", "premise": "a b", "hypothesis": "c"}]))
    (tmp_path / "lines.jsonl").write_text('{"q": "one", "a": {"t": ["two"]}}\n{"q": "three"}\n')
    (tmp_path / "t.tsv").write_text("id\ttext\n1\tfour five\n")
    assert evaluation_texts(tmp_path / "nli.json") == ["x", "a b", "c"]
    assert evaluation_texts(tmp_path / "lines.jsonl") == ["one", "two", "three"]
    assert "four five" in evaluation_texts(tmp_path / "t.tsv")
    seven, eight, twenty = "one two three four five six seven", "one two three four five six seven eight", \
        " ".join(f"w{i}" for i in range(20))
    grams, n, _ = text_ngrams([seven, eight, twenty, eight + " nine"])
    assert list(n) == [13] * 8 + [8, 9]    # 7 words: nothing; 8-12: the whole text; 20: eight 13-grams
    one = lambda text: list(text_ngrams([text])[0])   # noqa: E731
    assert list(grams) == one(twenty) + one(eight) + one(eight + " nine") and one(seven) == []


def test_a_corpus_made_before_the_quality_steps_keeps_its_fingerprint():
    """Options at their defaults are left out of the fingerprint: the same command on a corpus made before
    --near-dedup, --pii and --decontaminate existed finds it complete, as it did."""
    assert sorted(CorpusConfig().output_options()) == ["format", "holdout", "language", "min_chars", "min_sentences",
                                                       "shard_size", "splitter", "text_field"]
    on = CorpusConfig(near_dedup=True, pii="redact", decontaminate=["x.json"]).output_options()
    assert {"near_dedup", "near_dedup_threshold", "pii", "decontaminate", "decontaminate_mode"} <= set(on)


def test_a_score_says_whether_pretraining_saw_its_file(tmp_path):
    from bertkit.finetune.train import pretraining_corpus

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))   # not a bertkit export
    unknown = pretraining_corpus(tmp_path, {"dev_file": "/data/ratings_test.txt"})
    assert unknown["decontaminated_against"] is None and unknown["scored_file"] == "ratings_test.txt"
    record = {"bertkit": {"decontaminated_against": ["KorQuAD_v1.0_dev.json"]}}
    (tmp_path / "config.json").write_text(json.dumps(record))
    assert pretraining_corpus(tmp_path, {"predict_file": "x/KorQuAD_v1.0_dev.json"})["scored_file_decontaminated"]
    assert pretraining_corpus(tmp_path, {"dev_file": "ratings_test.txt"})["scored_file_decontaminated"] is False


def test_bad_evaluation_and_rules_files_are_said_before_anything_is_written(tmp_path):
    from click.testing import CliRunner

    from bertkit.cli import main

    (tmp_path / "in.jsonl").write_text(json.dumps({"text": " ".join(FILLER)}, ensure_ascii=False) + "\n")
    (tmp_path / "bad.json").write_text('{"data": [1, 2')
    (tmp_path / "legacy.txt").write_bytes("평가 문장".encode("cp949"))
    (tmp_path / "rules.json").write_text('{"words": {"min": "many"}}')
    for flags, said in ((["--decontaminate", "bad.json"], "bad.json:1: neither one JSON document nor JSON lines"),
                        (["--decontaminate", "legacy.txt"], "legacy.txt: not UTF-8 text"),
                        (["--filters", "rules.json"], "a rule is {min = NUMBER, max = NUMBER}")):
        args = [str(tmp_path / f) if f.endswith((".json", ".txt")) else f for f in flags]
        r = CliRunner().invoke(main, ["prepare-corpus", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "out"),
                                      "--no-progress", *args])
        assert r.exit_code != 0 and said in r.output and "Traceback" not in r.output, r.output
        assert not (tmp_path / "out").exists()


def test_with_near_dedup_each_part_is_read_once_for_the_same_task_files(corpus, tmp_path, monkeypatch):
    """--near-dedup with --decontaminate: one task finds a part's words once and writes the band hashes and the
    matches each step's own task writes, byte for byte; the steps then find them done (their tasks never run)."""
    import numpy as np

    from bertkit.pipelines import decontaminate as decon, kept_words, near_dedup as near, prepare_corpus as pc

    monkeypatch.setattr(pc, "PART_BATCH_ROWS", 4)   # several Arrow batches a part
    rows = [json.loads(line) for line in (corpus / "in.jsonl").read_text().splitlines()]
    parts = []
    for k in range(2):
        writer = pc._PartWriter(tmp_path / f"part-{k}.arrow")
        for i, row in enumerate(rows[k::2] + [{"text": ""}]):   # a document without a word too
            writer.add(f"{k}{i}", "s", None, [s for s in row["text"].split(". ") if s] or ["…"], None, None, 10)
        writer.close()
        parts.append(tmp_path / f"part-{k}.arrow")
    settings = near.NearDedupSettings()
    decon.save_evaluation(decon.load_evaluation([corpus / "korquad.json", corpus / "ratings.txt"]), tmp_path / "e.npz")
    for k, part in enumerate(parts):
        alone = [near.signature_task(str(part), near.asdict(settings), str(tmp_path / f"s{k}.npy")),
                 decon.match_task(str(part), str(tmp_path / "e.npz"), str(tmp_path / f"m{k}.npy"))]
        kept_words.both_task(str(part), near.asdict(settings), str(tmp_path / "e.npz"), str(tmp_path / f"bs{k}.npy"),
                             str(tmp_path / f"bm{k}.npy"))
        for name in ("s", "m"):
            assert (tmp_path / f"b{name}{k}.npy").read_bytes() == (tmp_path / f"{name}{k}.npy").read_bytes()
            assert json.loads((tmp_path / f"b{name}{k}.json").read_text()) == alone[name == "m"]
    assert len(np.load(tmp_path / "m0.npy")) + len(np.load(tmp_path / "m1.npy")) > 0   # the planted text found

    def never(*args):
        raise AssertionError("a step read the parts again")

    monkeypatch.setattr(near, "signature_task", never)
    monkeypatch.setattr(decon, "match_task", never)
    manifest = run(corpus, tmp_path / "both", near_dedup=True)
    assert manifest.totals["decontamination"]["files"]["korquad.json"] == {"documents": 2, "sentences": 2}
    assert "near_dedup" in manifest.totals


def test_matches_are_the_word_windows_equal_to_an_evaluation_ngram(tmp_path):
    """word_matches against plain Python over words(): every window of 13 words (or of a short text's 8-12) inside one
    document that equals an evaluation n-gram, with its document, first and last sentence and n-gram, across
    sentence boundaries, none across documents."""
    import random

    from bertkit.pipelines import decontaminate as decon
    from bertkit.pipelines.words import batch_words, words

    rng = random.Random(3)
    vocabulary = ["가나", "다라", "마바", "the", "of", "Seoul", "사", "아자"]
    evaluation = [" ".join(rng.choice(vocabulary) for _ in range(rng.choice([5, 8, 9, 10, 12, 13, 20])))
                  for _ in range(60)]
    (tmp_path / "eval.txt").write_text("\n".join(evaluation))
    ev = decon.load_evaluation([tmp_path / "eval.txt"])
    decon.save_evaluation(ev, tmp_path / "e.npz")
    pieces = evaluation + [" ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 15))) for _ in range(200)]
    docs = [[rng.choice(pieces) + rng.choice(["", ".", " 끝."]) for _ in range(rng.randint(1, 6))] for _ in range(120)]
    long = [w for w in evaluation if len(w.split()) >= 13][0].split()
    docs += [[" ".join(long[:6]), " ".join(long[6:])], [" ".join(long[:6])], [" ".join(long[6:])]]   # a sentence
    found = decon.word_matches(batch_words([s for d in docs for s in d]), docs,    # apart: found; a document: not
                               decon.EvalLookup(str(tmp_path / "e.npz")), 7)
    grams = {}
    for text in evaluation:
        w = words(text)
        for i in range(len(w) - 12) if len(w) >= 13 else ([0] if len(w) >= 8 else []):
            grams.setdefault(tuple(w[i:i + 13] if len(w) >= 13 else w), None)
    expected = set()
    for d, sentences in enumerate(docs):
        w = [(word, k) for k, s in enumerate(sentences) for word in words(s)]
        for n in range(8, 14):
            for i in range(len(w) - n + 1):
                if tuple(x for x, _ in w[i:i + n]) in grams:
                    expected.add((d + 7, w[i][1], w[i + n - 1][1], tuple(x for x, _ in w[i:i + n])))
    index = {}
    for gram in grams:   # each evaluation n-gram's row in the saved hashes, found by its own hash
        index[int(decon.text_ngrams([" ".join(gram)])[0][0])] = gram
    got = {(int(r[0]), int(r[1]), int(r[2]), index[int(ev.hashes[r[3]])]) for r in found}
    assert len(found) == len(got) and got == expected and len(expected) > 50
