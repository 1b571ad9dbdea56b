"""prepare-corpus --filters: the quality signals by hand, the presets on junk a crawl holds (keyword lists, ㅋㅋㅋ
comments, menus, lorem ipsum, number tables, repeated lines) and on real prose, a user's rules file, and every drop
counted by the rule it broke."""
import json

import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus
from bertkit.pipelines.quality import PRESETS, failed_rule, load_rules, signals

KOREAN = ("세종대왕은 조선의 제4대 왕으로 훈민정음을 창제하였다. 그는 백성들이 글을 쉽게 읽고 쓸 수 있도록 하였으며, "
          "과학과 음악의 발전에도 힘썼다. 측우기와 해시계가 그의 시대에 만들어졌고, 집현전에서는 많은 학자들이 "
          "연구를 이어 갔다. 그의 업적은 오늘날까지도 높이 평가받으며, 한글날은 그가 남긴 문자를 기념하는 날이다. "
          "이 시기에는 농업 기술을 정리한 책도 편찬되었고, 여러 제도가 새로 마련되었다.")
ENGLISH = ("The river rises in the northern hills and flows south through three towns before it reaches the sea. "
           "Farmers along its banks grow wheat and barley, and in spring the water often floods the lower fields. "
           "A stone bridge was built in the twelfth century, and it still carries traffic across the narrowest point "
           "of the valley, where the old road meets the new one that was laid with the railway in the last century.")
JUNK = {"keywords": "노트북 추천 노트북 가격 노트북 할인 최저가 노트북 게이밍 노트북 " * 20,
        "laughter": "ㅋㅋㅋㅋㅋㅋ ㅋㅋㅋ ㅋㅋㅋㅋㅋ\n" * 10,
        "menu": "\n".join(["홈", "뉴스", "스포츠", "연예", "로그인", "회원가입", "고객센터", "이용약관"] * 5),
        "lorem": "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor. " * 12,
        "numbers": "\n".join(" ".join(str(i * j) for j in range(10)) for i in range(30)),
        "repeated": (KOREAN.split(". ")[0] + ".\n") * 12}


def judge(text: str, preset: str = "fineweb2") -> str | None:
    lines = [line for line in text.split("\n") if line.strip()]
    return failed_rule(signals(lines), PRESETS[preset])


def test_signals_by_hand():
    s = signals(["a b a b", "a b a b", "end."])
    assert s["dup_line_frac"] == pytest.approx(1 / 3) and s["line_punct"] == pytest.approx(1 / 3)
    assert s["words"] == 9 and s["mean_word_length"] == pytest.approx((8 + 3) / 9)
    # "a b" is 4 of the 8 two-word windows: 4 x 2 characters of the 11
    assert s["top_2gram"] == pytest.approx(8 / 11)
    assert s["short_lines"] == 1.0 and s["new_line_ratio"] == pytest.approx(2 / 9)
    assert signals(["the cat and the dog"])["stop_words"] == 3
    assert signals(["서울의 봄은 왔다"])["stop_words"] == 3 and \
        signals(["서울의 봄은 왔다"])["language"] == "ko"
    assert signals(["2024 -- 3.5% ok"])["alpha_words"] == pytest.approx(1 / 4)


def reference_signals(lines: list[str]) -> dict:
    """The word signals by plain Python over words() (datatrove's way: a Counter's most common n-gram, the first
    of equally frequent ones; the words of n-grams seen before), independent of the numpy batch."""
    import collections
    import re

    from bertkit.pipelines.words import words

    text = "\n".join(lines)
    w = words(text)
    total = sum(map(len, w))
    found = {"words": len(w), "mean_word_length": total / len(w) if w else 0.0,
             "alpha_words": sum(bool(re.search(r"[^\W\d_]", t)) for t in text.split()) / max(len(text.split()), 1),
             "language": "ko" if len(re.findall("[가-힣]", text)) > len(re.findall("[A-Za-z]", text)) else "en"}
    for n in range(2, 11):
        grams = [tuple(w[i:i + n]) for i in range(len(w) - n + 1)]
        if n < 5:
            top = collections.Counter(grams).most_common(1)
            found[f"top_{n}gram"] = sum(map(len, top[0][0])) * top[0][1] / total if top and top[0][1] > 1 else 0.0
            continue
        seen, covered = set(), set()
        for i, gram in enumerate(grams):
            if gram in seen:
                covered.update(range(i, i + n))
            seen.add(gram)
        found[f"dup_{n}gram"] = sum(len(w[i]) for i in covered) / total if total else 0.0
    return found


def test_the_batched_signals_equal_plain_pythons_over_words():
    """Texts of few distinct words (many repeats and ties among the most frequent n-grams), Korean and English, one
    batch and one at a time."""
    import random

    from bertkit.pipelines.quality import batch_signals

    rng = random.Random(3)
    vocabulary = ["the", "cat", "sat", "on", "mat", "서울의", "봄은", "왔다", "2024", "3.5%", "e-mail", "ㅋㅋ"]
    documents = [[" ".join(rng.choice(vocabulary[:rng.randint(3, 12)]) for _ in range(rng.randint(0, 14)))
                  for _ in range(rng.randint(1, 6))] for _ in range(60)] + [[KOREAN], [ENGLISH], ["a"], [""]]
    together = batch_signals(documents)
    for lines, found in zip(documents, together):
        assert found == signals(lines)
        for name, value in reference_signals(lines).items():
            assert found[name] == (value if name == "language" else pytest.approx(value)), (lines, name)


@pytest.mark.parametrize("kind", sorted(JUNK))
def test_junk_is_dropped(kind):
    assert judge(JUNK[kind]) is not None


@pytest.mark.parametrize("preset", ["fineweb2", "fineweb", "gopher"])
def test_prose_is_kept(preset):
    assert judge(ENGLISH, preset) is None
    assert judge(KOREAN, preset) is None   # stop words are counted in the document's language, under every preset


def test_a_rules_file_and_its_errors(tmp_path):
    (tmp_path / "rules.toml").write_text('[ko]\nwords = {min = 500}\n')
    rules = load_rules(str(tmp_path / "rules.toml"))
    assert rules == {"ko": {"words": (500, None)}}
    lines = [KOREAN]
    assert failed_rule(signals(lines), rules) == "words"
    assert failed_rule(signals([ENGLISH]), rules) is None   # no [en] section: no rule
    (tmp_path / "bad.json").write_text(json.dumps({"wordz": {"min": 1}}))
    with pytest.raises(ValueError, match="no signal 'wordz'"):
        load_rules(str(tmp_path / "bad.json"))
    r = CliRunner().invoke(main, ["prepare-corpus", str(tmp_path), "--out", str(tmp_path / "o"), "--filters", "c4"])
    assert r.exit_code == 2 and "neither a preset" in r.output


def test_prepare_corpus_counts_each_drop_by_its_rule(tmp_path):
    docs = [KOREAN, ENGLISH] + list(JUNK.values())
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs))
    manifest = prepare_corpus([tmp_path / "in.jsonl"], tmp_path / "out",
                              CorpusConfig(filters="fineweb2", holdout=0, min_chars=10, progress=False))
    quality = {k: v for k, v in manifest.dropped.items() if k.startswith("quality_")}
    assert sum(quality.values()) == len(JUNK) and manifest.totals["documents"] == 2
    assert manifest.options["filters"] == "fineweb2"


def test_keep_removed_holds_every_document_taken_out_with_its_reason(tmp_path):
    import pyarrow as pa

    from bertkit.formats import corpus_shards, read_corpus_manifest

    docs = [KOREAN, ENGLISH, KOREAN] + list(JUNK.values())   # a duplicate, and junk
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs))
    runs = {}
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        manifest = prepare_corpus([tmp_path / "in.jsonl"], out, CorpusConfig(
            filters="fineweb2", keep_removed=True, holdout=0, min_chars=10, workers=workers, progress=False))
        removed = pa.concat_tables([pa.ipc.open_file(str(p)).read_all() for p in corpus_shards(out, "removed")])
        reasons = removed.column("reason").to_pylist()
        assert sorted(set(reasons)) == sorted(k for k, v in manifest.dropped.items() if v)
        assert all(reasons.count(k) == v for k, v in manifest.dropped.items() if v)
        assert "".join(removed.column("sentences")[reasons.index("duplicate")].as_py()).replace(" ", "") == \
            KOREAN.replace(" ", "")
        assert len(corpus_shards(out, "train")) == 1 and (out / "removed").is_dir()
        runs[workers] = {p.name: p.read_bytes() for p in sorted(out.rglob("*.arrow"))}
    assert runs[1] == runs[2]
    r = CliRunner().invoke(main, ["report", str(tmp_path / "out1")])
    page = (tmp_path / "out1" / "report.html").read_text()
    assert r.exit_code == 0 and "three of each reason" in page and "quality_" in page and page.count("<img") == 7
    again = prepare_corpus([tmp_path / "in.jsonl"], tmp_path / "out1", CorpusConfig(
        filters="fineweb2", holdout=0, min_chars=10, progress=False, overwrite=True))
    assert not (tmp_path / "out1" / "removed").exists() and "removed" not in {s.split for s in again.shards}
    assert read_corpus_manifest(tmp_path / "out1").totals["documents"] == 2


def test_a_corpus_is_judged_again_by_other_rules_without_its_raw_text(tmp_path):
    """--filters stores each document's signals; the corpus (with --keep-removed) given as INPUT is judged again:
    the same rules keep the same documents, looser ones take some back, and the raw text is not needed."""
    import pyarrow as pa

    from bertkit.formats import corpus_shards

    docs = [KOREAN, ENGLISH, KOREAN.replace("세종대왕", "태종")] + list(JUNK.values())
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs))

    def kept(out):
        return sorted(i for p in corpus_shards(out) for i in pa.ipc.open_file(str(p)).read_all().column("id")
                      .to_pylist())

    config = dict(holdout=0, min_chars=10, progress=False)
    first = prepare_corpus([tmp_path / "in.jsonl"], tmp_path / "first", CorpusConfig(filters="fineweb2",
                                                                                     keep_removed=True, **config))
    (tmp_path / "in.jsonl").unlink()   # what follows reads the corpus alone
    same = prepare_corpus([tmp_path / "first"], tmp_path / "same", CorpusConfig(filters="fineweb2", **config))
    assert kept(tmp_path / "same") == kept(tmp_path / "first") and same.dropped == first.dropped
    assert same.totals["input_files"] == 2   # the shard and the removed/ one; never the manifest
    (tmp_path / "loose.json").write_text(json.dumps({"words": {"min": 1}}))   # one rule, nothing else
    loose = prepare_corpus([tmp_path / "first"], tmp_path / "loose", CorpusConfig(
        filters=str(tmp_path / "loose.json"), **config))
    assert loose.totals["documents"] > first.totals["documents"] and not any(
        k.startswith("quality_") and v for k, v in loose.dropped.items())
