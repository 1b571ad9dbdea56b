"""train-tokenizer's alphabet pass (pipelines/alphabet.py) against its reference, tokenizers' own WordPiece trainer
with no merges: the same characters and `##` forms for every normaliser setting, on text built to reach the
normaliser's corners (whitespace that is a control character, marks that compose or reorder, final sigma, CJK,
jamo that NFC joins into syllables, kana voicing marks, characters removed), by hand and at random. The pass leaves
pieces of characters the normaliser keeps as they are unnormalised: a wrong rule there shows here."""
import random

import pyarrow as pa
import pytest
from tokenizers.trainers import WordPieceTrainer

from bertkit.pipelines.alphabet import Alphabet
from bertkit.tokenization import CONTINUATION, SPECIAL_TOKENS, build_tokenizer

SETTINGS = [(True, "latin"), (True, "all"), (True, "none"), (False, "none")]
CORNERS = [
    "Hello, World! ΟΔΥΣΣΕΥΣ ὀδυσσεύς café CAFÉ naïve Ångström",
    "ж\x1fщ ю\x85я ф\x0bц п\u200bл ш\u2028э б\u00a0ъ г\u3000ь д\tё з\rы",  # controls join, spaces split
    "e\u0301 \u0301x x\u0301\u0327 \u1100\u1161\u11a8 가\u11a8 한국어는 좋다. 大韓民國의 수도",
    "ｆｕｌｌｗｉｄｔｈ ﬁ ß ẞ İstanbul ǅ \U0001F600x x\U0001F600 a\ufffdb \x00z \ud7a3 ＿x x＿ a-b a_b",
    "か\u3099 \u3099か が\u3099 ガ\u309a ｶﾞ \u0f73 \u0344x \u2126 \ufb01x Ǆ \u1e9b\u0323",
    "\u0e01\u0e48\u0e32 \u0915\u094d\u0937 \u05e9\u05c1 ٤٢ a\u0300\u0316b ° µ Ω K Å ﹏",
]


def trainer_alphabet(texts, lowercase, strip_accents) -> set[str]:
    tok = build_tokenizer(None, lowercase=lowercase, strip_accents=strip_accents)
    trainer = WordPieceTrainer(vocab_size=len(SPECIAL_TOKENS), special_tokens=list(SPECIAL_TOKENS),
                               continuing_subword_prefix=CONTINUATION, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return set(tok.get_vocab()) - set(SPECIAL_TOKENS)


def fast_alphabet(texts, lowercase, strip_accents) -> set[str]:
    tok = build_tokenizer(None, lowercase=lowercase, strip_accents=strip_accents)
    alphabet = Alphabet(tok.normalizer, tok.pre_tokenizer)
    alphabet.add(pa.array(texts))
    return alphabet.tokens()


@pytest.mark.parametrize("lowercase, strip_accents", SETTINGS)
def test_the_normalisers_corners(lowercase, strip_accents):
    expected = trainer_alphabet(CORNERS, lowercase, strip_accents)
    assert fast_alphabet(CORNERS, lowercase, strip_accents) == expected
    assert {CONTINUATION + c for c in "щяцл"} <= expected          # a control character removed joins two letters
    assert not {CONTINUATION + c for c in "эъьёы"} & expected       # whitespace becomes a space


@pytest.mark.parametrize("lowercase, strip_accents", SETTINGS)
def test_random_text_from_awkward_characters(lowercase, strip_accents):
    pool = "".join(CORNERS) + "  \n"
    rng = random.Random(7)
    texts = ["".join(rng.choice(pool) for _ in range(rng.randint(0, 40))) for _ in range(3000)]
    assert fast_alphabet(texts, lowercase, strip_accents) == trainer_alphabet(texts, lowercase, strip_accents)


def test_slices_give_the_same_alphabet(monkeypatch):
    """Text larger than one slice is read a slice at a time; where the cuts fall changes nothing."""
    import bertkit.pipelines.alphabet as alphabet_module

    texts = [f"{w}x{w[::-1]}ÿ" for w in CORNERS * 20]
    whole = fast_alphabet(texts, True, "latin")
    monkeypatch.setattr(alphabet_module, "SLICE_BYTES", 50)
    assert fast_alphabet(texts, True, "latin") == whole == trainer_alphabet(texts, True, "latin")


def test_a_real_corpus_shard(shared_data):
    """The Korean and English Wikipedia samples' first files, as prepare-corpus leaves them (sentences)."""
    texts = []
    for folder in ("wikipedia_ko_wikiextractor", "wikipedia_en_wikiextractor"):
        path = sorted(p for p in (shared_data / folder).rglob("wiki_*") if p.is_file())[0]
        texts += [line for line in path.read_text(encoding="utf-8").splitlines() if line and line[0] != "<"]
    for lowercase, strip_accents in SETTINGS[:2]:
        found = fast_alphabet(texts, lowercase, strip_accents)
        assert found == trainer_alphabet(texts, lowercase, strip_accents)
        assert len(found) > 1000
