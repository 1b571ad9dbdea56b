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

from bertkit.pipelines.near_dedup import _letters, _words, ngrams64

TERMINAL = tuple('.!?。！？…"\'”’)」』]')
# FineWeb2's Korean stop words (kor_Hang.yml) are morphemes; as eojeol endings, the particles and endings among them
KOREAN_ENDINGS = ("의", "다", "는", "에", "을", "은", "를", "에서", "가", "으로", "로", "고", "이", "한", "했")
_HANGUL = re.compile(r"[\uac00-\ud7a3]")
_LATIN = re.compile(r"[A-Za-z]")

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


_LETTER = re.compile(r"[^\W\d_]")   # a letter of any script
_ENGLISH_STOP = re.compile(r"\b(?:the|be|to|of|and|that|have|with)\b", re.I)
_KOREAN_STOP = re.compile(r"[\uac00-\ud7a3](?:" + "|".join(sorted(KOREAN_ENDINGS, key=len, reverse=True)) + r")(?!\w)")


def language(text: str) -> str:
    """ko when Hangul letters outnumber Latin ones in the first 4,000 characters (the presets' two sets of
    thresholds), else en."""
    head = text[:4000]
    return "ko" if len(_HANGUL.findall(head)) > len(_LATIN.findall(head)) else "en"


def _tokens_with_a_letter(tokens: list[str]) -> int:
    """Whitespace tokens holding a letter of any script (not: 2024, --, 3.5%)."""
    return sum(1 for t in tokens if t.isalpha() or _LETTER.search(t) is not None)


def _stop_words(text: str, lang: str, enough: int = 10) -> int:
    """Stop words (Korean: words ending in one of the endings), counted up to `enough` (the rules ask for 2)."""
    count = 0
    for _ in (_KOREAN_STOP if lang == "ko" else _ENGLISH_STOP).finditer(text):
        count += 1
        if count == enough:
            break
    return count


def _grams(hashed: np.ndarray, lengths: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each n-gram's hash and its characters."""
    chars = np.r_[0, np.cumsum(lengths)]
    return ngrams64(hashed, n), chars[n:] - chars[:-n]


def _top_and_duplicated(hashed: np.ndarray, lengths: np.ndarray, total: int) -> dict:
    """Gopher's repetition signals over the word hashes: the most frequent n-gram's share of the characters (n 2-4),
    and the share of characters inside n-grams seen before (n 5-10), both over the words' characters. A text with
    no repeated 5-gram has no repeated longer one: most prose stops there."""
    out = {f"{'top' if n < 5 else 'dup'}_{n}gram": 0.0 for n in range(2, 11)}
    for n in range(2, 11):
        if len(hashed) < n or total == 0:
            break
        grams, chars = _grams(hashed, lengths, n)
        ordered = np.sort(grams)
        repeated = ordered[1:] == ordered[:-1]
        if not repeated.any():
            if n >= 5:
                break
            continue
        if n < 5:   # the most frequent n-gram: the longest run of equal hashes
            edges = np.flatnonzero(np.r_[True, ~repeated, True])
            run = int(np.diff(edges).argmax())
            count, value = int(edges[run + 1] - edges[run]), ordered[edges[run]]
            out[f"top_{n}gram"] = float(chars[np.flatnonzero(grams == value)[0]] * count) / total
            continue
        order = np.argsort(grams, kind="stable")   # the words of every later occurrence, each word once
        later = order[np.r_[False, grams[order][1:] == grams[order][:-1]]]
        covered = np.zeros(len(hashed), bool)
        for k in range(n):
            covered[later + k] = True
        out[f"dup_{n}gram"] = float(lengths[covered].sum()) / total
    return out


def _line_signals(lines: list[str]) -> dict:
    count = max(len(lines), 1)
    seen, duplicated, duplicated_chars = set(), 0, 0
    for line in lines:
        if line in seen:
            duplicated, duplicated_chars = duplicated + 1, duplicated_chars + len(line)
        seen.add(line)
    chars = sum(len(line) for line in lines) or 1
    return {"bullet_lines": sum(line.lstrip().startswith(("•", "-", "*", "·")) for line in lines) / count,
            "ellipsis_lines": sum(line.rstrip().endswith(("...", "…")) for line in lines) / count,
            "dup_line_frac": duplicated / count, "dup_line_char_frac": duplicated_chars / chars,
            "char_dup": duplicated_chars / chars,
            "line_punct": sum(line.rstrip().endswith(TERMINAL) for line in lines) / count,
            "short_lines": sum(len(line) <= 30 for line in lines) / count}


def signals(lines: list[str], text: str) -> dict:
    """Every signal of one document: lines are its non-empty lines, text the document as one string."""
    raw = np.frombuffer(text.lower().encode("utf-8"), np.uint8)
    hashed, lengths = _word_hashes_and_lengths(raw)
    n, tokens, lang = max(len(hashed), 1), text.split(), language(text)
    return {"language": lang, "words": len(hashed), "mean_word_length": float(lengths.mean()) if len(hashed) else 0.0,
            "hash_ratio": text.count("#") / n, "ellipsis_ratio": (text.count("...") + text.count("…")) / n,
            "alpha_words": _tokens_with_a_letter(tokens) / max(len(tokens), 1),
            "stop_words": _stop_words(text, lang), "new_line_ratio": max(len(lines) - 1, 0) / n,
            **_line_signals(lines), **_top_and_duplicated(hashed, lengths, int(lengths.sum()))}


def _word_hashes_and_lengths(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each word's hash (near_dedup's words) and its length in characters (its bytes that begin a character)."""
    letter = _letters(raw)
    hashed, begins = _words(raw, letter)
    if not len(hashed):
        return hashed, np.zeros(0, np.int64)
    starts_char = (letter & ((raw & 0xC0) != 0x80)).astype(np.int64)
    runs = np.cumsum(starts_char)
    ends = np.r_[begins[1:], len(raw)] - 1
    # characters from each word's first byte to the last letter byte before the next word
    last = np.searchsorted(np.flatnonzero(letter), ends, side="right") - 1
    last_letter = np.flatnonzero(letter)[last]
    return hashed, runs[last_letter] - runs[begins] + starts_char[begins]


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
