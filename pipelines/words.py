"""The words prepare-corpus's cleaning steps count in (near-duplicate shingles, quality signals, evaluation n-grams):
what words() finds, as a reader sees them (lower case, every digit 0, split on anything not a letter or digit, so a
Korean word is an eojeol), found on a whole batch of documents' code points in numpy: no Python call per word."""
import functools
import re
import unicodedata
from dataclasses import dataclass

import numpy as np

VERSION = 3   # of the hashes: a killed run's task files from another version are made again
WORD, LETTER, SPACE, HANGUL = 1, 2, 4, 8   # a character's classes, as bits
_NOT_WORD = re.compile(r"[\W_]+")
_DIGIT = re.compile(r"\d")
_P = 1_000_003
SPAN = 1 << 20   # characters weighed by one table of powers (8 MB with its inverses)
MASK32 = np.uint64(0xFFFFFFFF)


def lower(character: str) -> str:
    """A character in lower case, one for one (str.lower's first character: "İ" -> "i", a final "Σ" -> "σ"), so
    that a table of code points can do it."""
    return character.lower()[:1] or character


def words(text: str) -> list[str]:
    """The words, as the numpy functions below find them on code points (the reference of the tests)."""
    text = _DIGIT.sub("0", "".join(map(lower, unicodedata.normalize("NFC", text))))
    return _NOT_WORD.sub(" ", text).split()


def _marks(pattern: str, characters: str) -> np.ndarray:
    """Which characters the regex matches, one regex pass (str.isalnum, isdecimal and isspace are re's \\w, \\d
    and \\s)."""
    marked = re.sub(pattern, "\x01", characters)
    return np.frombuffer(re.sub("[^\x01]", "\x00", marked).encode("latin-1"), np.uint8).astype(bool)


@functools.cache
def _classes() -> np.ndarray:
    """Every code point's classes: WORD (str.isalnum: the regex \\w less "_"), LETTER (a word character but a
    decimal digit: [^\\W\\d_]), SPACE (str.isspace: what str.split splits on), HANGUL (a syllable). Planes 4-16
    hold none."""
    characters = "\x00\x00" + "".join(map(chr, range(2, 0x40000)))   # U+0001, the mark, has no class either
    table = np.zeros(0x110000, np.uint8)
    table[:0x40000] = (WORD * _marks(r"[^\W_]", characters) + LETTER * _marks(r"[^\W\d_]", characters)
                       + SPACE * _marks(r"\s", characters))
    table[0xAC00:0xD7A4] |= HANGUL
    return table


@functools.cache
def _codes() -> np.ndarray:
    """Every code point's value inside a word hash: 0 outside words, else its lower case's code point + 1 (a digit:
    "0"'s). One lookup a character does the lower-casing, the digits and the word test of hash_words."""
    classes = _classes()
    table = np.zeros(0x110000, np.uint32)
    word = np.flatnonzero(classes & WORD)
    lowered = np.array([ord(lower(chr(c))) for c in word.tolist()], np.uint32)
    table[word] = np.where(classes[word] & LETTER, lowered + 1, 0x31)
    return table


@functools.cache
def _powers(span: int) -> tuple[np.ndarray, np.ndarray]:
    """P**i and P**-i mod 2**32 for i < span (P odd: it has an inverse)."""
    return tuple(np.cumprod(np.r_[np.uint32(1), np.full(span - 1, p, np.uint32)], dtype=np.uint32)
                 for p in (_P, pow(_P, -1, 2 ** 32)))


def _spans(begins: np.ndarray, n: int) -> np.ndarray:
    """Where the spans of at most SPAN characters start, each cut where a word begins (only a word longer than SPAN,
    no reader's word, is cut), so that the table of powers stays SPAN long whatever the batch."""
    starts = [0]
    while starts[-1] + SPAN < n:
        limit = starts[-1] + SPAN
        last = begins[max(int(np.searchsorted(begins, limit, side="right")) - 1, 0)]
        starts.append(int(last) if last > starts[-1] else limit)
    return np.array(starts, np.int64)


def hash_words(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(one 32-bit hash per word, as uint64: sum of (lower-cased code point + 1) * P**k over its characters k, digits
    as "0", mod 2**32; the place where each word begins; where it ends), for code points. One prefix sum over the
    batch's characters, each weighed by P to the power of its place in its span; a word's share of the sum divided
    by P to its first place's: no Python call and no loop per word."""
    values = _codes()[points]
    inside = np.zeros(len(points) + 2, bool)   # a word's characters, between two outside
    np.not_equal(values, 0, out=inside[1:-1])
    changes = np.flatnonzero(inside[1:] != inside[:-1])   # a word's first place, then the place after its last
    begins, ends = changes[0::2], changes[1::2]
    if len(begins) == 0:
        return np.zeros(0, np.uint64), begins, ends
    power, inverse = _powers(SPAN)
    starts = _spans(begins, len(points))
    bounds = np.r_[starts, len(points)]
    weights = power[:len(points)] if len(starts) == 1 else \
        np.concatenate([power[:hi - lo] for lo, hi in zip(bounds[:-1], bounds[1:])])
    with np.errstate(over="ignore"):   # all mod 2**32
        prefix = np.zeros(len(points) + 1, np.uint32)
        np.cumsum(values * weights, dtype=np.uint32, out=prefix[1:])
        place = begins if len(starts) == 1 else begins - starts[np.searchsorted(starts, begins, side="right") - 1]
        return ((prefix[ends] - prefix[begins]) * inverse[place]).astype(np.uint64), begins, ends


@dataclass
class WordBatch:
    points: np.ndarray    # the texts' code points (uint32), each text followed by "\n"
    starts: np.ndarray    # each text's first place, then the end
    hashes: np.ndarray    # each word's hash
    begins: np.ndarray    # each word's first place
    ends: np.ndarray      # the place after each word's last
    text: np.ndarray      # each word's text (index in the batch)

    @functools.cached_property
    def classes(self) -> np.ndarray:
        """Each code point's classes (the quality signals read them; the hashes do not)."""
        return _classes()[self.points]


def batch_words(texts: list[str]) -> WordBatch:
    """The words of every text at once (a separator between texts: no word crosses one)."""
    starts = np.r_[0, np.cumsum([len(t) + 1 for t in texts], dtype=np.int64)]
    points = np.frombuffer(("\n".join(texts) + "\n").encode("utf-32-le"), np.uint32) if texts else \
        np.zeros(0, np.uint32)
    hashes, begins, ends = hash_words(points)
    per_text = np.diff(np.searchsorted(begins, starts))   # (the texts' starts sought among the words: fewer)
    return WordBatch(points, starts, hashes, begins, ends, np.repeat(np.arange(len(texts)), per_text))


def word_hashes(text: str) -> np.ndarray:
    return batch_words([text]).hashes


def ngrams32(hashed: np.ndarray, n: int) -> np.ndarray:
    """The polynomial over each run of n consecutive word hashes, mod 2**32 (MinHash's shingles)."""
    acc = np.zeros(max(len(hashed) - n + 1, 0), dtype=np.uint64)
    for k in range(n if len(acc) else 0):
        acc = (acc * np.uint64(1_000_003) + hashed[k: len(hashed) - n + 1 + k]) & MASK32
    return acc


def ngrams64(hashed: np.ndarray, n: int) -> np.ndarray:
    """A 64-bit polynomial over each run of n word hashes (wrapping): few chance matches over billions of n-grams."""
    count = max(len(hashed) - n + 1, 0)
    acc = np.zeros(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n if count else 0):
            acc = acc * np.uint64(0x100000001B3) + (hashed[k: len(hashed) - n + 1 + k] & MASK32)
    return acc


def longer(grams: np.ndarray, hashed: np.ndarray, at: np.ndarray, n: int) -> np.ndarray:
    """ngrams64's n-grams at places `at`, from the (n-1)-grams there: one step of the polynomial (for callers that
    follow only some places)."""
    with np.errstate(over="ignore"):
        return grams * np.uint64(0x100000001B3) + (hashed[at + n - 1] & MASK32)
