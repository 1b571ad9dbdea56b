"""A vocabulary's alphabet without the trainer: the characters of the normalised words and the `##` forms of those
that occur after the first place in a word, exactly as tokenizers' WordPiece trainer finds them (its pass with no
merges), several times faster.

The trainer normalises and splits every word of the text. Here the text is first cut at plain spaces (a space is
a word boundary before and after BERT's normalisation, and nothing in the normaliser reaches across one), each
distinct piece is normalised once, and numpy finds, over the normalised pieces' code points, which characters
follow another word character. Whether a character is a space, a word of its own (punctuation) or part of a word is
asked of the pre-tokenizer itself, once per character, so its rules are never written twice.
"""
import functools
import unicodedata

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bertkit.tokenization import CONTINUATION

UNKNOWN, SPACE, ALONE, WORD = 0, 1, 2, 3
SLICE_BYTES = 64 << 20   # text normalised per step: its distinct pieces bound the memory


@functools.cache
def _composition_seconds() -> np.ndarray:
    """Characters that NFC can join to the character before them: the second of any two-character canonical
    decomposition, and the Hangul vowel and final jamo (whose joining is algorithmic)."""
    seconds = np.zeros(0x110000, dtype=bool)
    for point in range(0x110000):
        parts = unicodedata.decomposition(chr(point)).split()
        if len(parts) == 2 and not parts[0].startswith("<"):
            seconds[int(parts[1], 16)] = True
    seconds[0x1161:0x1176] = seconds[0x11A8:0x11C3] = True
    return seconds


class Alphabet:
    """Characters seen, and those seen after another character of the same word, over any number of texts."""

    def __init__(self, normalizer, pre_tokenizer):
        self.normalizer, self.pre_tokenizer = normalizer, pre_tokenizer
        self.kind = np.full(0x110000, UNKNOWN, dtype=np.uint8)
        self.seen = np.zeros(0x110000, dtype=bool)
        self.continued = np.zeros(0x110000, dtype=bool)
        self.unchanged = np.full(0x110000, UNKNOWN, dtype=np.uint8)   # 1 yes, 2 no (`_unchanged`)

    def add(self, sentences: pa.Array) -> None:
        """Sentences (an Arrow string array) of any size, a slice at a time."""
        sizes = pc.binary_length(sentences).to_numpy(zero_copy_only=False)
        start, cumulative = 0, np.cumsum(sizes)
        while start < len(sentences):
            end = max(start + 1, int(np.searchsorted(cumulative, (cumulative[start - 1] if start else 0) +
                                                     SLICE_BYTES, side="right")))
            self._add_slice(sentences.slice(start, end - start))
            start = end

    def _add_slice(self, sentences: pa.Array) -> None:
        pieces = pc.unique(pc.list_flatten(pc.split_pattern(sentences, " ")))
        points = self._normalised(pieces)
        self.seen[points] = True
        for point in np.flatnonzero(self.seen & (self.kind == UNKNOWN)):
            self.kind[point] = self._kind(chr(point))
        in_word = self.kind[points] == WORD
        self.continued[points[1:][in_word[1:] & in_word[:-1]]] = True

    def _normalised(self, pieces: pa.Array) -> np.ndarray:
        """The pieces' code points after normalisation, a separator between two. A piece of characters the
        normaliser leaves as they are, whatever their neighbours (`_unchanged`), is not normalised: most of them."""
        names = pieces.to_pylist()
        raw = np.frombuffer("\n".join(names).encode("utf-32-le"), dtype=np.uint32)
        for point in np.flatnonzero(np.bincount(raw, minlength=0x110000).astype(bool) & (self.unchanged == UNKNOWN)):
            self.unchanged[point] = 1 if self._unchanged(chr(point)) else 2
        separator = np.zeros(len(raw), dtype=bool)
        separator[np.cumsum(pc.utf8_length(pieces).to_numpy(zero_copy_only=False) + 1)[:-1] - 1] = True
        owner = np.cumsum(separator) - separator                   # a separator belongs to the piece before it
        changed = np.zeros(len(names), dtype=bool)
        changed[owner[(self.unchanged[raw] != 1) & ~separator]] = True
        text = self.normalizer.normalize_str("\n".join(n for n, c in zip(names, changed) if c))  # "\n": a space
        return np.concatenate([raw[~changed[owner]], np.array([10], dtype=np.uint32),
                               np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)])

    def _unchanged(self, char: str) -> bool:
        """Whether the normaliser leaves `char` as it is beside any other such character: it does alone, and its
        canonical decomposition starts with a character of no combining class that combines with nothing before it
        (so NFD's reordering and NFC's composition stop at it). Unassigned in Python's Unicode tables: no."""
        first = unicodedata.normalize("NFD", char)[0]
        return (unicodedata.category(char) != "Cn" and unicodedata.combining(first) == 0 and
                not _composition_seconds()[ord(first)] and
                self.normalizer.normalize_str(char) == char)

    def _kind(self, char: str) -> int:
        words = [w for w, _ in self.pre_tokenizer.pre_tokenize_str(f"a{char}a")]
        return SPACE if words == ["a", "a"] else ALONE if words == ["a", char, "a"] else WORD

    def tokens(self) -> set[str]:
        """The alphabet and its `##` forms, as the trainer's pass without merges gives them (special tokens aside)."""
        chars = {chr(p) for p in np.flatnonzero(self.seen & (self.kind >= ALONE))}
        return chars | {CONTINUATION + chr(p) for p in np.flatnonzero(self.continued)}
