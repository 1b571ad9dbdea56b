"""prepare-corpus --pii: each kind of personal datum found (Korean formats included) and nothing that only looks
like one (dates, ISBNs, prices, versions, ranges, coordinates); redact, drop and keep end to end, every hit and
every dropped document counted."""
import json

import pyarrow as pa
import pytest

from bertkit.formats import corpus_shards
from bertkit.pipelines.pii import _QUICK, MANY, find, luhn, places_worth_a_look, redact, worth_a_look
from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus

PERSONAL = [
    ("연락처는 010-1234-5678입니다.", "phone"), ("대표번호 02-123-4567로", "phone"), ("전화 031) 123-4567", "phone"),
    ("+82 10 1234 5678 로 연락", "phone"), ("+82-2-312-4567", "phone"), ("01012345678", "phone"),
    ("010.1234.5678", "phone"), ("(02) 123-4567", "phone"), ("+1 555 123 4567", "phone"),
    ("+44 20 7946 0958", "phone"), ("이메일 hong.gildong@example.co.kr 로", "email"),
    ("john_doe+tag@mail.example.com", "email"), ("서버 192.168.0.12 에 접속", "ip"), ("10.0.0.1.", "ip"),
    ("주민번호 900101-1234567", "rrn"), ("880229-2345678 (1988 is a leap year)", "rrn"), ("0203044123456", "rrn"),
    ("카드 4111 1111 1111 1111", "card"), ("5500-0000-0000-0004.", "card"), ("378282246310005", "card"),
]
BENIGN = [
    "2024-03-05에 발표", "2024.03.05.", "1990년 3월 5일", "ISBN 978-89-7282-985-9", "ISBN-13: 9780306406157",
    "가격은 1,234,000원", "버전 3.10.2", "version 1.2.3.4 released", "v2.0.0.1", "1998–2002", "전화 1588-1234",
    "인구 9,776,000명", "좌표 37.5665, 126.9780", "123-45-67890 사업자", "2019-2020 시즌", "10-20-30",
    "3.14159265358979", "850229-2345678 (1985 had no 29 February)", "시속 100 km", "1234567890123",
    "참조 [12] 123-456", "010-1234-5678-9", "1 2 3 4 5 6 7 8 9 10 11 12 13", "ISBN 89-7282-985-3",
    # what Korean Wikipedia holds that looks like personal data (found by --pii redact on its 115 MB)
    "헥소키네이스(EC 2.7.1.1)에서", "효소(EC number 3.6.3.9)의 기능", "Server: Apache/1.3.3.7 (Unix)",
    "파이어폭스 1.5.0.4 버전에 기반한", "최신 버전은 2.0.0.13 및", "정사각형 테셀레이션은 4.4.4.4 또는",
    "내부 네트워크 대역인 10.0.0.0, 172.16.0.0",
    "쿨롱은 6.24150962915265개의 전자가", "https://web.archive.org/web/20171223160453/https://app.example.org",
    "칩 표면에 \"KONAMI 051649 2212P003\"로", "127.49562978744508,",
]


@pytest.mark.parametrize("text, kind", PERSONAL)
def test_each_personal_datum_is_found(text, kind):
    assert [k for _, _, k in find(text)] == [kind], find(text)


@pytest.mark.parametrize("text", BENIGN)
def test_numbers_that_are_not_personal_stay(text):
    assert find(text) == []


def test_luhn_and_redaction_by_hand():
    assert luhn("4111111111111111") and luhn("79927398713") and not luhn("79927398710")
    out, counts = redact(["Mail a@b.com or 010-1234-5678.", "주민번호는 900101-1234567.", "2024-03-05."])
    assert out == ["Mail [EMAIL] or [PHONE].", "주민번호는 [RRN].", "2024-03-05."]
    assert counts == {"email": 1, "phone": 1, "rrn": 1}


def test_a_document_is_redacted_as_its_sentences_one_by_one():
    """redact looks only at the sentences one scan of the whole document flags: the same as find() on every one,
    and nothing found across two sentences (010-1234 | 5678 is no phone)."""
    sentences = [text for text, _ in PERSONAL] + BENIGN + ["연락처 010-1234", "5678 입니다", "a@", "b.com", "1.2",
                                                            ".3.4", "", "@ 홀로", "9001011", "234567"]
    expected = []
    for sentence in sentences:
        for start, end, kind in reversed(find(sentence)):
            sentence = sentence[:start] + f"[{kind.upper()}]" + sentence[end:]
        expected.append(sentence)
    out, counts = redact(sentences)
    assert out == expected
    assert sum(counts.values()) == len(PERSONAL)


def test_the_numpy_quick_test_flags_every_place_the_regex_matches():
    """places_worth_a_look against _QUICK.match tried at every place of random strings of digits (ASCII, Arabic-Indic,
    full-width, mathematical), separators, dots, @, Hangul and Latin; worth_a_look's sentences against the places."""
    import random

    import numpy as np

    rng = random.Random(5)
    alphabet = list("0123456789 .()+-@가a\t") + ["\u0663", "\uff13", "\U0001d7d8", ".", ".", " ", "1", "1"]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) + "\n"
        expected = [p for p in range(len(text)) if _QUICK.match(text, p)]
        found = places_worth_a_look(np.frombuffer(text.encode("utf-32-le"), np.uint32))
        assert sorted(set(found.tolist())) == expected, text
    documents = [["".join(rng.choice(alphabet[:-6]) for _ in range(rng.randint(0, 20)))
                  for _ in range(rng.randint(0, 4))] for _ in range(300)]
    assert worth_a_look(documents) == [{i for i, s in enumerate(d) if _QUICK.search(s)} for d in documents]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("pii")
    docs = ["연락처는 010-1234-5678입니다. 메일은 a.b@example.com 으로 주세요. 이 문서는 충분히 깁니다.",
            "ISBN 978-89-7282-985-9 는 2024-03-05에 나왔고 가격은 12,000원입니다. 버전 3.10.2 입니다.",
            " ".join(f"user{i}@example.com" for i in range(MANY + 1)) + " 주소만 늘어놓은 목록입니다."]
    (root / "in.jsonl").write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs))
    return root


def sentences(out) -> list:
    return [s for p in corpus_shards(out) for s in pa.ipc.open_file(str(p)).read_all().column("sentences").to_pylist()]


@pytest.mark.parametrize("mode", ["keep", "redact", "drop"])
def test_the_modes_end_to_end(corpus, tmp_path, mode):
    manifest = prepare_corpus([corpus / "in.jsonl"], tmp_path / mode,
                              CorpusConfig(pii=mode, holdout=0, min_chars=10, progress=False))
    kept = sentences(tmp_path / mode)
    benign = ["ISBN 978-89-7282-985-9 는 2024-03-05에 나왔고 가격은 12,000원입니다.", "버전 3.10.2 입니다."]
    assert benign in kept   # never touched
    if mode == "keep":
        assert len(kept) == 3 and "pii_found" not in manifest.totals
        return
    assert manifest.totals["pii_found"] == {"email": 1 + MANY + 1, "phone": 1}
    assert manifest.dropped["pii_many"] == 1 if mode == "redact" else manifest.dropped["pii"] == 2
    if mode == "redact":
        assert kept[0] == ["연락처는 [PHONE]입니다.", "메일은 [EMAIL] 으로 주세요.", "이 문서는 충분히 깁니다."]
    else:
        assert kept == [benign]


def test_planted_personal_data_all_go_and_benign_numbers_all_stay(tmp_path):
    """bertkit.planted's made-up personal data (every Korean phone shape, e-mails, IPs, resident registration and
    card numbers) and benign numbers put into real-looking documents: --pii redact leaves none of the first and
    every one of the second."""
    from bertkit.planted import plant_scores, planted_corpus

    wiki = tmp_path / "wiki" / "AA"
    wiki.mkdir(parents=True)
    words = "서울 부산 대구 인천 광주 대전 울산 세종 경기 강원 충북 충남 전북 전남 경북 경남 제주 하늘 바다 산".split()
    docs = "".join(f'<doc id="{i}" title="t{i}">\nt{i}\n' + ". ".join(
        " ".join(words[(i * 7 + j * 3 + k) % len(words)] for k in range(9)) for j in range(12)) + ".\n</doc>\n"
        for i in range(40))
    (wiki / "wiki_00").write_text(docs, encoding="utf-8")
    planted_corpus(tmp_path / "planted", {"ko": tmp_path / "wiki"}, 40, share=0.0, personal=30, benign=30)
    plants = json.loads((tmp_path / "planted" / "plants.json").read_text(encoding="utf-8"))
    out = tmp_path / "out"
    prepare_corpus([tmp_path / "planted" / "corpus.jsonl"], out, CorpusConfig(pii="redact", holdout=0,
                                                                              progress=False))
    table = pa.concat_tables([pa.ipc.open_file(str(p)).read_all() for p in corpus_shards(out)])
    kept = {t: " ".join(s) for t, s in zip(table.column("title").to_pylist(), table.column("sentences").to_pylist())}
    scores = plant_scores(plants, kept)
    assert scores["personal"] == 30 and scores["personal_left"] == 0, scores
    assert scores["benign"] == 30 and scores["benign_kept"] == 30, scores


def test_the_placeholders_are_tokens_the_vocabulary_keeps_whole(tmp_path):
    """A corpus made with --pii redact gives train-tokenizer a vocabulary where [EMAIL], [PHONE] ... are one token
    each (to bertkit and to transformers alike), in place of the rarest merges; without it nothing changes."""
    import transformers

    from bertkit.formats import read_tokenizer_manifest
    from bertkit.pipelines.train_tokenizer import TokenizerConfig, train_tokenizer
    from bertkit.tokenization import load_tokenizer

    docs = [f"연락처는 010-1234-{i:04d}입니다. 메일은 user{i}@example.com 으로. 서울의 날씨는 맑다." for i in range(30)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs))
    for mode in ("redact", "keep"):
        prepare_corpus([tmp_path / "in.jsonl"], tmp_path / f"c-{mode}", CorpusConfig(pii=mode, holdout=0,
                                                                                     min_chars=10, progress=False))
        train_tokenizer(tmp_path / f"c-{mode}", tmp_path / f"t-{mode}",
                        TokenizerConfig(vocab_size=300, pretokenize="none", progress=False))
    text = "메일은 [EMAIL] 으로, 전화는 [PHONE]입니다"
    assert {"[EMAIL]", "[PHONE]"} <= set(load_tokenizer(tmp_path / "t-redact").encode(text).tokens)
    assert {"[EMAIL]", "[PHONE]"} <= set(transformers.AutoTokenizer.from_pretrained(str(tmp_path / "t-redact"))
                                         .tokenize(text))
    settings = read_tokenizer_manifest(tmp_path / "t-redact").settings
    assert settings["placeholders"] == ["[EMAIL]", "[RRN]", "[CARD]", "[PHONE]", "[IP]"]
    assert "placeholders" not in read_tokenizer_manifest(tmp_path / "t-keep").settings
    assert "[EMAIL]" not in load_tokenizer(tmp_path / "t-keep").encode(text).tokens
