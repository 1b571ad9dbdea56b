"""The words prepare-corpus's cleaning steps count in (near-duplicate shingles, quality signals, evaluation n-grams):
what words() finds, as a reader sees them (lower case, every digit 0, split on anything not a letter or digit, so a
Korean word is an eojeol), found on a whole batch of documents' code points in numpy: no Python call per word."""
import functools
import re
import unicodedata
from dataclasses import dataclass

import numpy as np

VERSION = 2   # of the hashes: a killed run's task files from another version are made again
WORD, LETTER, SPACE, HANGUL = 1, 2, 4, 8   # a character's classes, as bits
_NOT_WORD = re.compile(r"[\W_]+")
_DIGIT = re.compile(r"\d")
_POWERS32 = (np.cumprod(np.full(64, 1_000_003, dtype=np.uint64)) // np.uint64(1_000_003)).astype(np.uint32)
MASK32 = np.uint64(0xFFFFFFFF)


def words(text: str) -> list[str]:
    """The words, as the numpy functions below find them on code points."""
    text = _DIGIT.sub("0", unicodedata.normalize("NFC", text).lower())
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


def hash_words(points: np.ndarray, classes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(one 32-bit hash per word, as uint64: a polynomial over its code points, the first 64 counting, digits as 0;
    the place where each word begins), for code points and their classes."""
    word = (classes & WORD).astype(bool)
    begins = np.flatnonzero(word & np.r_[True, ~word[:-1]]) if len(points) else np.zeros(0, np.int64)
    if len(begins) == 0:
        return np.zeros(0, np.uint64), begins
    inside = points[word]
    digit = (classes[word] & LETTER) == 0   # a word character but no letter: a decimal digit
    first = np.cumsum(word, dtype=np.int32)[begins] - 1   # each word's first character among the word characters
    place = np.arange(len(inside), dtype=np.int32) - np.repeat(first, np.diff(np.r_[first, len(inside)]))
    with np.errstate(over="ignore"):   # all mod 2**32
        values = (np.where(digit, np.uint32(0x30), inside) + np.uint32(1)) * _POWERS32[np.minimum(place, 63)]
        return np.add.reduceat(values, first, dtype=np.uint32).astype(np.uint64), begins


@dataclass
class WordBatch:
    points: np.ndarray    # the texts' lower-cased code points (uint32), each text followed by "\n"
    classes: np.ndarray   # each code point's classes
    starts: np.ndarray    # each text's first place, then the end
    hashes: np.ndarray    # each word's hash
    begins: np.ndarray    # each word's first place
    text: np.ndarray      # each word's text (index in the batch)


def batch_words(texts: list[str]) -> WordBatch:
    """The words of every text at once (a separator between texts: no word crosses one)."""
    lowered = [t.lower() for t in texts]
    starts = np.r_[0, np.cumsum([len(t) + 1 for t in lowered], dtype=np.int64)]
    points = np.frombuffer(("\n".join(lowered) + "\n").encode("utf-32-le"), np.uint32) if texts else \
        np.zeros(0, np.uint32)
    classes = _classes()[points]
    hashes, begins = hash_words(points, classes)
    return WordBatch(points, classes, starts, hashes, begins, np.searchsorted(starts, begins, side="right") - 1)


def word_hashes(text: str) -> np.ndarray:
    return batch_words([text]).hashes


def ngrams32(hashed: np.ndarray, n: int) -> np.ndarray:
    """The polynomial over each run of n consecutive word hashes, mod 2**32 (MinHash's shingles)."""
    acc = np.zeros(max(len(hashed) - n + 1, 0), dtype=np.uint64)
    for k in range(n if len(acc) else 0):
        acc = (acc * np.uint64(1_000_003) + hashed[k: len(hashed) - n + 1 + k]) & MASK32
    return acc


def ngrams64(hashed: np.ndarray, n: int, shorter: np.ndarray | None = None) -> np.ndarray:
    """A 64-bit polynomial over each run of n word hashes (wrapping): few chance matches over billions of n-grams.
    Given the (n-1)-grams as `shorter`, one step from them."""
    count = max(len(hashed) - n + 1, 0)
    if count == 0:
        return np.zeros(0, np.uint64)
    with np.errstate(over="ignore"):
        if shorter is not None:
            return shorter[:count] * np.uint64(0x100000001B3) + (hashed[n - 1:] & MASK32)
        acc = np.zeros(count, dtype=np.uint64)
        for k in range(n):
            acc = acc * np.uint64(0x100000001B3) + (hashed[k: len(hashed) - n + 1 + k] & MASK32)
    return acc
