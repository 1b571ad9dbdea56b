"""Morpheme-aware vocabularies for Korean (KLUE-BERT's recipe): while a WordPiece vocabulary is trained, Korean
words are cut at morpheme boundaries found by a morphological analyser, so that learned pieces follow morphemes
(대한민국 + ##의, 창제 + ##하 + ##였 + ##다) rather than frequent but arbitrary syllable runs. Only training sees the
analyser: the tokenizer written still tokenizes raw text with plain WordPiece, in tokenizers and transformers alike.

Analysers (the `korean` extra installs both; both are maintained and install from PyPI with their dictionaries):
  mecab  python-mecab-ko with python-mecab-ko-dic: MeCab-ko, the analyser KLUE used;
  kiwi   kiwipiepy: Kiwi, a newer analyser with its own model.

How a cut becomes a continuation piece: after BERT's own normalisation and punctuation split (so words are exactly
what WordPiece will see), a word's morphemes after the first are given to the trainer as separate words spelled
"##morpheme"; BPE then merges "#", "#" and the morpheme into the token "##morpheme", which vocab.txt holds as
WordPiece's continuation piece of that morpheme.
"""
import functools
import re

from bertkit.tokenization import TokenizerError

HANGUL = re.compile(r"[\uac00-\ud7a3]")
PRETOKENIZERS = ("none", "mecab", "kiwi")
# `--pretokenize auto`: a corpus whose words are mostly Korean gets kiwi, the vocabulary that fine-tuned best on the
# Korean tasks at equal budget (docs/studies/2026-11-25-korean-transfer.md: KLUE-NER and KorQuAD well ahead of plain
# WordPiece, no task behind beyond the seeds' spread); other corpora none
KOREAN_DEFAULT, KOREAN_SHARE = "kiwi", 0.5


def korean_word_share(sentences) -> float:
    """The share of whitespace-separated words holding a Hangul syllable."""
    words = [w for s in sentences for w in s.split()]
    return sum(bool(HANGUL.search(w)) for w in words) / len(words) if words else 0.0


class KoreanError(TokenizerError):
    pass


@functools.lru_cache(maxsize=None)
def analyser(name: str):
    """word -> sorted cut offsets (0 < cut < len(word)) at morpheme boundaries. Each word is analysed alone, so its
    cuts never depend on its sentence and are cached: a corpus repeats its words (the Korean benchmark's 10.1 M
    Hangul words are 1.66 M distinct ones), and the analyser is most of a morpheme-aware vocabulary's time."""
    return functools.lru_cache(maxsize=1 << 20)(_analyser(name))


def _analyser(name: str):
    if name == "mecab":
        try:
            import mecab
        except ImportError as e:
            raise KoreanError("--pretokenize mecab needs MeCab-ko: pip install 'bertkit[korean]' "
                              "(python-mecab-ko and its dictionary)") from e
        tagger = mecab.MeCab()
        return lambda word: tuple(sorted({m.span.start for m in tagger.parse(word)} - {0}))
    if name == "kiwi":
        try:
            from kiwipiepy import Kiwi
        except ImportError as e:
            raise KoreanError("--pretokenize kiwi needs Kiwi: pip install 'bertkit[korean]' (kiwipiepy)") from e
        kiwi = Kiwi()
        return lambda word: tuple(sorted({t.start for t in kiwi.tokenize(word)} - {0}))
    raise KoreanError(f"--pretokenize {name!r}: choose one of {', '.join(PRETOKENIZERS)}")


def morphemes(word: str, cuts) -> list[str]:
    bounds = [0, *[c for c in cuts if 0 < c < len(word)], len(word)]
    return [word[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def training_words(sentence: str, normalizer, pre_tokenizer, name: str) -> str:
    """The sentence as the vocabulary trainer should see it: BERT-normalised words, Korean ones cut into morphemes
    (pieces after the first spelled "##piece"), joined by spaces (the trainer then splits on whitespace only)."""
    cut = analyser(name)
    words = [w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(sentence))]
    out = []
    for word in words:
        if HANGUL.search(word):
            first, *rest = morphemes(word, cut(word))
            out.append(first)
            out.extend("##" + m for m in rest)
        else:
            out.append(word)
    return " ".join(out)


def crossing_share(tokenizer, sentences: list[str], name: str) -> dict:
    """Of the WordPiece pieces of Korean words, the share that straddle a morpheme boundary (analyser `name`)."""
    cut = analyser(name)
    pieces = crossing = 0
    for sentence, enc in zip(sentences, tokenizer.encode_batch(sentences, add_special_tokens=False)):
        words = {}
        for (start, end), word_id in zip(enc.offsets, enc.word_ids):
            words.setdefault(word_id, []).append((start, end))
        for spans in words.values():
            w0 = spans[0][0]
            word = sentence[w0:spans[-1][1]]
            if not HANGUL.search(word):
                continue
            boundaries = {w0 + c for c in cut(word)}
            for start, end in spans:
                pieces += 1
                crossing += any(start < b < end for b in boundaries)
    return {"korean_pieces": pieces, "crossing_pieces": crossing,
            "crossing_share": crossing / pieces if pieces else 0.0}
