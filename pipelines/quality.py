"""prepare-corpus --filters: each document's quality signals, computed once from its lines and words, then rules
(a signal's minimum or maximum) from a named preset or a file. The signals and presets follow Gopher (Rae et al.
2021, table A1), FineWeb (Penedo et al. 2024) and FineWeb2's per-language thresholds (github.com/huggingface/fineweb-2,
configs/kor_Hang.yml for Korean); words here are what --near-dedup's words() finds (a Korean word is an eojeol, so
the Korean stop words are FineWeb2's particles and endings found at a word's end). The first rule a document fails
is its drop reason, counted in the manifest."""
import functools
import json
import re
from pathlib import Path

import numpy as np
import tomllib

from bertkit.pipelines.words import HANGUL, LETTER, SPACE, WordBatch, batch_words, longer

LOW48 = np.uint64(2 ** 48 - 1)   # an n-gram key's hash bits (its text in the top 16)
TERMINAL = tuple('.!?。！？…"\'”’)」』]')
# FineWeb2's Korean stop words (kor_Hang.yml) are morphemes; as eojeol endings, the particles and endings among them
KOREAN_ENDINGS = ("의", "다", "는", "에", "을", "은", "를", "에서", "가", "으로", "로", "고", "이", "한", "했")

GOPHER = {"words": (50, 100_000), "mean_word_length": (3, 10), "hash_ratio": (None, 0.1),
          "ellipsis_ratio": (None, 0.1), "bullet_lines": (None, 0.9), "ellipsis_lines": (None, 0.3),
          "alpha_words": (0.8, None), "stop_words": (2, None), "dup_line_frac": (None, 0.3),
          "dup_line_char_frac": (None, 0.2), "top_2gram": (None, 0.2), "top_3gram": (None, 0.18),
          "top_4gram": (None, 0.16), "dup_5gram": (None, 0.15), "dup_6gram": (None, 0.14), "dup_7gram": (None, 0.13),
          "dup_8gram": (None, 0.12), "dup_9gram": (None, 0.11), "dup_10gram": (None, 0.10)}
FINEWEB = {**GOPHER, "line_punct": (0.12, None), "short_lines": (None, 0.67), "char_dup": (None, 0.01),
           "new_line_ratio": (None, 0.3)}
FINEWEB2_KO = {**GOPHER, "mean_word_length": (1, 6), "alpha_words": (0.791, None), "dup_line_frac": (None, 0.374),
               "dup_line_char_frac": (None, None), "top_2gram": (None, 0.282), "top_3gram": (None, 0.228),
               "top_4gram": (None, 0.185), "dup_5gram": (None, 0.201), "dup_6gram": (None, 0.184),
               "dup_7gram": (None, 0.168), "dup_8gram": (None, 0.154), "dup_9gram": (None, 0.14),
               "dup_10gram": (None, 0.127), "line_punct": (0.062, None), "char_dup": (None, 0.1),
               "new_line_ratio": (None, 0.196)}
SIGNAL_NAMES = ["language", "words", "mean_word_length", "hash_ratio", "ellipsis_ratio", "alpha_words", "stop_words",
                "new_line_ratio", "bullet_lines", "ellipsis_lines", "dup_line_frac", "dup_line_char_frac", "char_dup",
                "line_punct", "short_lines", *(f"top_{n}gram" for n in (2, 3, 4)),
                *(f"dup_{n}gram" for n in range(5, 11))]
PRESETS = {"gopher": {"ko": GOPHER, "en": GOPHER}, "fineweb": {"ko": FINEWEB, "en": FINEWEB},
           "fineweb2": {"ko": FINEWEB2_KO, "en": {**FINEWEB, "char_dup": (None, 0.1)}}}


_ENGLISH_STOP = re.compile(r"\b(?:the|be|to|of|and|that|have|with)\b", re.I)
_KOREAN_STOP = re.compile(r"[\uac00-\ud7a3](?:" + "|".join(sorted(KOREAN_ENDINGS, key=len, reverse=True)) + r")(?!\w)")


def _stop_words(text: str, lang: str, enough: int = 10) -> int:
    """Stop words (Korean: words ending in one of the endings), counted up to `enough` (the rules ask for 2)."""
    count = 0
    for _ in (_KOREAN_STOP if lang == "ko" else _ENGLISH_STOP).finditer(text):
        count += 1
        if count == enough:
            break
    return count


def _line_signals(lines: list[str]) -> dict:
    count, chars = max(len(lines), 1), sum(map(len, lines)) or 1
    seen, duplicated, duplicated_chars, bullets, ellipses, punctuated = set(), 0, 0, 0, 0, 0
    for line in lines:
        if line in seen:
            duplicated, duplicated_chars = duplicated + 1, duplicated_chars + len(line)
        seen.add(line)
        end = line.rstrip()
        bullets += line.lstrip().startswith(("•", "-", "*", "·"))
        ellipses += end.endswith(("...", "…"))
        punctuated += end.endswith(TERMINAL)
    return {"bullet_lines": bullets / count, "ellipsis_lines": ellipses / count, "dup_line_frac": duplicated / count,
            "dup_line_char_frac": duplicated_chars / chars, "char_dup": duplicated_chars / chars,
            "line_punct": punctuated / count, "short_lines": sum(len(line) <= 30 for line in lines) / count}


def signals(lines: list[str]) -> dict:
    """Every signal of one document, given its non-empty lines."""
    return batch_signals([lines])[0]


def batch_signals(documents: list[list[str]]) -> list[dict]:
    """Every signal of each document (its non-empty lines; the text is the lines joined by newlines), the words,
    tokens and scripts of all of them found in one numpy pass."""
    if not documents:
        return []
    texts = ["\n".join(lines) for lines in documents]
    found = batch_words(texts)
    n = len(texts)
    counts = np.bincount(found.text, minlength=n)
    lengths = found.ends - found.begins
    chars = np.bincount(found.text, weights=lengths, minlength=n)
    repetition = _repetition(found, lengths, chars)
    alpha, tokens = _tokens_with_a_letter(found)
    hangul, latin = _scripts(found)
    out = []
    for d, (lines, text) in enumerate(zip(documents, texts)):
        words, lang = max(int(counts[d]), 1), "ko" if hangul[d] > latin[d] else "en"
        out.append({"language": lang, "words": int(counts[d]),
                    "mean_word_length": float(chars[d] / counts[d]) if counts[d] else 0.0,
                    "hash_ratio": text.count("#") / words,
                    "ellipsis_ratio": (text.count("...") + text.count("…")) / words,
                    "alpha_words": float(alpha[d] / max(tokens[d], 1)), "stop_words": _stop_words(text, lang),
                    "new_line_ratio": max(len(lines) - 1, 0) / words, **_line_signals(lines),
                    **{name: float(values[d]) for name, values in repetition.items()}})
    return out


def _tokens_with_a_letter(found: WordBatch) -> tuple[np.ndarray, np.ndarray]:
    """Per text: whitespace tokens holding a letter of any script (not: 2024, --, 3.5%), and all tokens. A token's
    stretch runs to the next one's start (only spaces between: a text ends in one, so none crosses a text)."""
    space = (found.classes & SPACE) != 0
    starting = np.empty(len(space), bool)   # not a space, after one (or first)
    starting[0] = not space[0]
    np.greater(space[:-1], space[1:], out=starting[1:])
    begins = np.flatnonzero(starting)
    if len(begins) == 0:
        return np.zeros(len(found.starts) - 1), np.zeros(len(found.starts) - 1, np.int64)
    holding = np.logical_or.reduceat((found.classes & LETTER) != 0, begins)
    first = np.searchsorted(begins, found.starts)   # each text's first token, then the end
    return np.diff(np.r_[0, np.cumsum(holding)][first]).astype(float), np.diff(first)


def _per_text(found: WordBatch, mask: np.ndarray) -> np.ndarray:
    """How many of each text's characters the mask holds (every text ends in "\n": none is empty)."""
    return np.add.reduceat(mask.view(np.uint8), found.starts[:-1], dtype=np.int64) if len(mask) else \
        np.zeros(len(found.starts) - 1, np.int64)


def _scripts(found: WordBatch) -> tuple[np.ndarray, np.ndarray]:
    """Per text: its Hangul syllables and its Latin letters."""
    hangul = (found.classes & HANGUL) != 0
    latin = (found.points < 128) & ((found.classes & LETTER) != 0)
    return _per_text(found, hangul), _per_text(found, latin)


def _repetition(found: WordBatch, lengths: np.ndarray, chars: np.ndarray) -> dict:
    """Gopher's repetition signals per text, over its words: the most frequent n-gram's share of the characters
    (n 2-4; of equally frequent ones, the first in the text, as datatrove's Counter finds it), and the share of
    characters inside n-grams seen before (n 5-10). An n-gram is keyed by its text (16 bits) and hash (48 bits).
    Only places that can hold a repeated n-gram are followed: a repeated n-gram's two (n-1)-grams repeat too, so
    each n keeps the places where the (n-1)-gram and the next place's repeat, and only those are hashed and sorted."""
    n_texts, n_words, hashed, text = len(found.starts) - 1, len(found.hashes), found.hashes, found.text
    out = {f"{'top' if n < 5 else 'dup'}_{n}gram": np.zeros(n_texts) for n in range(2, 11)}
    cumulative = np.r_[0, np.cumsum(lengths)]
    at = np.flatnonzero(text[:-1] == text[1:])   # places whose 2-gram lies inside one text
    grams = hashed[at]
    for n in range(2, 11):
        if n > 2:
            inside = at + n - 1 < n_words
            inside[inside] = text[at[inside]] == text[at[inside] + n - 1]
            at, grams = at[inside], grams[inside]
        if len(at) == 0:
            break
        grams = longer(grams, hashed, at, n)
        runs = _Runs((text[at].astype(np.uint64) << np.uint64(48)) | (grams & LOW48))
        if n < 5:
            _top(out[f"top_{n}gram"], runs, at, cumulative, n, chars)
        else:
            covered = np.zeros(len(lengths), bool)
            for k in range(n):
                covered[at[runs.later] + k] = True
            out[f"dup_{n}gram"] = np.bincount(text[covered], weights=lengths[covered], minlength=n_texts) / \
                np.maximum(chars, 1)
        at, grams = at[runs.again], grams[runs.again]
        repeats = np.zeros(n_words + 1, bool)
        repeats[at] = True
        follow = repeats[at + 1]   # the next place's n-gram repeats too: this one may grow into a repeated (n+1)-gram
        at, grams = at[follow], grams[follow]
    return out


class _Runs:
    """Equal keys as runs of one sort: which keys come again, and which come after an equal one (in key order's
    positions: the keys are in text order)."""

    def __init__(self, keys: np.ndarray):
        self.order = np.argsort(keys)
        ordered = keys[self.order]
        self.edges = _changes(ordered, end=True)
        self.length, self.value = np.diff(self.edges), ordered[self.edges[:-1]]
        self.first = np.minimum.reduceat(self.order, self.edges[:-1])   # each run's first position
        repeated = np.repeat(self.length > 1, self.length)
        self.again = np.zeros(len(keys), bool)
        self.again[self.order] = repeated
        self.later = self.order[repeated & (self.order != np.repeat(self.first, self.length))]


def _changes(values: np.ndarray, end: bool = False) -> np.ndarray:
    """Where each run of equal values begins (and the end, if asked): np.r_ costs more than the work here."""
    flags = np.empty(len(values) + end, bool)
    flags[0] = True
    np.not_equal(values[1:], values[:-1], out=flags[1:len(values)])
    if end:
        flags[-1] = True
    return np.flatnonzero(flags)


def _top(out: np.ndarray, runs: _Runs, at: np.ndarray, cumulative: np.ndarray, n: int, chars: np.ndarray) -> None:
    """The most frequent n-gram's characters x its count over the text's characters, for texts with a repeat (of
    equally frequent ones, the one first in the text)."""
    owner = (runs.value >> np.uint64(48)).astype(np.int64)   # each run's text, ascending
    group = _changes(owner, end=True)
    best = np.maximum.reduceat(runs.length, group[:-1])
    top = np.flatnonzero((runs.length == np.repeat(best, np.diff(group))) & (runs.length > 1))
    if len(top) == 0:
        return
    texts = owner[top]
    starts = _changes(texts)
    place = at[np.minimum.reduceat(runs.first[top], starts)]   # each text's first place of a most frequent n-gram
    texts = texts[starts]
    count = runs.length[top[starts]]
    out[texts] = (cumulative[place + n] - cumulative[place]) * count / chars[texts]


def pack(found: dict) -> list[float]:
    """The signals as a corpus stores them (a list of doubles, in SIGNAL_NAMES's order; the language as 1 for ko)."""
    return [(1.0 if found["language"] == "ko" else 0.0) if name == "language" else float(found[name])
            for name in SIGNAL_NAMES]


def unpack(values: list, names: list[str]) -> dict:
    found = dict(zip(names, values))
    found["language"] = "ko" if found.get("language") == 1.0 else "en"
    return found


@functools.cache
def load_rules(name: str) -> dict:
    """A preset's rules by language, or a user's TOML/JSON file: {signal: {min, max}} for every language, or
    {"ko": {...}, "en": {...}} (a language without a section keeps none). Unknown signals are refused."""
    if name in PRESETS:
        return PRESETS[name]
    path = Path(name)
    if not path.is_file():
        raise ValueError(f"--filters {name}: neither a preset ({', '.join(['none', *PRESETS])}) nor a rules file")
    data = tomllib.loads(path.read_text(encoding="utf-8")) if path.suffix == ".toml" else \
        json.loads(path.read_text(encoding="utf-8"))
    sections = data if set(data) <= {"ko", "en"} else {"ko": data, "en": data}
    known = set(FINEWEB)
    rules = {}
    for lang, section in sections.items():
        unknown = set(section) - known
        if unknown:
            raise ValueError(f"{path}: no signal {sorted(unknown)[0]!r}; the signals: {', '.join(sorted(known))}")
        for signal, bounds in section.items():
            if not isinstance(bounds, dict) or set(bounds) - {"min", "max"} or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) for v in bounds.values()):
                raise ValueError(f"{path}: {signal} = {bounds!r}; a rule is {{min = NUMBER, max = NUMBER}} (either or "
                                 "both)")
        rules[lang] = {k: (v.get("min"), v.get("max")) for k, v in section.items()}
    return rules


def failed_rule(found: dict, rules: dict) -> str | None:
    """The first rule (in the preset's order) the signals break, or None."""
    for signal, (low, high) in rules.get(found["language"], {}).items():
        value = found[signal]
        if (low is not None and value < low) or (high is not None and value > high):
            return signal
    return None
