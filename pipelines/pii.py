"""prepare-corpus --pii: personal data found by pattern in each document's sentences, then redacted (replaced by a
placeholder), or the document dropped. Kinds: e-mail addresses, IPv4 addresses, phone numbers (Korean mobile and
landline numbers, +82 and other international numbers), Korean resident registration numbers (a real birth date and
sex digit) and card numbers (13-19 digits passing the Luhn check). Dates, ISBNs, prices and version numbers are not
personal data: the patterns and their guards are written against them (tests/test_pii.py counts false redactions),
and against what Korean Wikipedia holds that looks like them (enzyme numbers, decimals, archive timestamps, network
ranges, part numbers; docs/studies/2026-12-02-near-duplicates.md).

A document with more than MANY hits is dropped whatever the mode (dolma's rule: such a page is a directory or a
leak, not prose)."""
import functools
import re

import numpy as np

from bertkit.pipelines.words import LETTER, WORD, _classes

MODES = ("keep", "redact", "drop")
MANY = 5
PLACEHOLDER = {"email": "[EMAIL]", "rrn": "[RRN]", "card": "[CARD]", "phone": "[PHONE]", "ip": "[IP]"}

_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9][\w.+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,24}(?![\w@])")
# a number ends where no digit follows, nor a separator and a digit (a sentence's full stop may follow)
_RRN = re.compile(r"(?<![\d-])(\d{2})(0[1-9]|1[0-2])(0[1-9]|[12]\d|3[01])\s?-?\s?([1-8])\d{6}(?!\d|-\d)")
# not after a decimal point or a path's slash (6.241509074460763, web.archive.org/web/20171223160453/...)
_CARD = re.compile(r"(?<![\d.,/-])\d(?:[ -]?\d){12,18}(?!\d|[ -]\d|/)")
_PHONE = re.compile(
    r"(?<![\d+])(?<!\d[.-])(?:"
    r"\+82[ -]?\(?0?\)?(?:1[016789]|2|[3-6][1-5]|70)[ .-]?\d{3,4}[ .-]?\d{4}"      # +82 10 1234 5678, +82-2-...
    r"|\(?0(?:1[016789]|2|[3-6][1-5]|70)\)?[ .-]?\d{3,4}[ .-]\d{4}"                 # 010-1234-5678, 02-123-4567
    r"|01[016789]\d{7,8}"                                                           # 01012345678
    r"|\+(?:[13-79]\d{0,2})[ -]?\(?\d{1,4}\)?[ -]?\d{3,4}[ -]?\d{3,4}"              # +1 555 123 4567, +44 20 ...
    r")(?!\d|[.-]\d|[A-Za-z])")   # a letter right after: a part number (KONAMI 051649 2212P003)
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IP = re.compile(rf"(?<![\w.])(?:{_OCTET}\.){{3}}{_OCTET}(?!\w|\.\d)")
_VERSION_BEFORE = re.compile(r"(?:\bv|\bver\.?|version|버전[은는이:]?|release|릴리스|/|\bEC(?: number)?)\s*$", re.I)
_VERSION_AFTER = re.compile(r"^\s*(?:버전|version|release|릴리스|판)", re.I)
_ISBN_BEFORE = re.compile(r"ISBN(?:-1[03])?:?\s*$", re.I)


def luhn(digits: str) -> bool:
    total = 0
    for i, d in enumerate(reversed(digits)):
        n = int(d) * (2 if i % 2 else 1)
        total += n - 9 if n > 9 else n
    return total % 10 == 0


def _rrn(m: re.Match, text: str) -> bool:
    """A birth date that exists (29 February only in leap years, for the century the sex digit gives)."""
    year, month, day, sex = int(m[1]), int(m[2]), int(m[3]), int(m[4])
    century = {1: 1900, 2: 1900, 5: 1900, 6: 1900, 3: 2000, 4: 2000, 7: 2000, 8: 2000}[sex]
    days = [31, 29 if (century + year) % 4 == 0 and ((century + year) % 100 or (century + year) % 400 == 0) else 28,
            31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1]
    return day <= days


def _card(m: re.Match, text: str) -> bool:
    digits = re.sub(r"\D", "", m[0])
    return 13 <= len(digits) <= 19 and luhn(digits) and not _ISBN_BEFORE.search(text[max(0, m.start() - 12):m.start()])


def _ip(m: re.Match, text: str) -> bool:
    """Not a version (v1.5.0.4, Apache/1.3.3.7, 1.5.0.4 버전), an enzyme (EC 2.7.1.1), numbers of one digit each
    (4.4.4.4: a tiling, a citation), or a network's own address or broadcast (10.0.0.0, x.x.x.255): none of these
    names a machine someone uses."""
    octets = [int(x) for x in m[0].split(".")]
    return not (_VERSION_BEFORE.search(text[max(0, m.start() - 12):m.start()]) or
                _VERSION_AFTER.search(text[m.end():m.end() + 10]) or max(octets) < 10 or octets[3] in (0, 255))


# what find() needs to find anything (a sentence without it is not looked at): seven digits close together (phones,
# resident registration and card numbers), a digit, a dot, one to three digits, a dot and a digit (IPs), an @
# (e-mails); as a regex (the tests' reference) and in numpy over a whole batch's code points (places_worth_a_look)
_SEVEN_DIGITS, _DOTTED = re.compile(r"\d(?:[ ().+-]{0,2}+\d){6}"), re.compile(r"\d\.\d{1,3}+\.\d")
_QUICK = re.compile(rf"[\d@](?:(?<=@)|(?<=\d)(?:{_DOTTED.pattern[2:]}|{_SEVEN_DIGITS.pattern[2:]}))")
_SEPARATOR = np.zeros(128, bool)
_SEPARATOR[[ord(c) for c in " ().+-"]] = True
KINDS = (("email", _EMAIL, None), ("rrn", _RRN, _rrn), ("card", _CARD, _card), ("phone", _PHONE, None),
         ("ip", _IP, _ip))


def find(text: str) -> list[tuple[int, int, str]]:
    """(start, end, kind) of every personal datum in text, left to right, none overlapping (the kinds in KINDS'
    order claim their spans first)."""
    worth = {"email": "@" in text, "ip": _DOTTED.search(text) is not None}
    worth["rrn"] = worth["card"] = worth["phone"] = _SEVEN_DIGITS.search(text) is not None
    spans = []
    for kind, pattern, check in KINDS:
        if not worth[kind]:
            continue
        for m in pattern.finditer(text):
            if (check is None or check(m, text)) and all(m.end() <= s or m.start() >= e for s, e, _ in spans):
                spans.append((m.start(), m.end(), kind))
    return sorted(spans)


@functools.cache
def _decimal() -> np.ndarray:
    """Which code points below U+20000 re's \\d matches (none above): words' table of classes, a word character
    that is not a letter."""
    return (_classes()[:0x20000] & (WORD | LETTER)) == WORD


def _digits(points: np.ndarray) -> np.ndarray:
    """Where the decimal digits are: ASCII ones by arithmetic, the rest (none below U+0660, none a Hangul syllable)
    looked up among the few other characters."""
    found = np.flatnonzero((points - np.uint32(48)) < 10)
    other = np.flatnonzero((points >= 0x660) & ((points - np.uint32(0xAC00)) >= 11172))
    more = other[_decimal().take(points[other], mode="clip")]
    return np.sort(np.concatenate([found, more])) if len(more) else found


def places_worth_a_look(points: np.ndarray) -> np.ndarray:
    """Every place where _QUICK matches, for code points ending in a newline: an @; a digit followed by six more,
    each after at most two separators; a digit followed by a dot, a run of one to three digits, a dot and a digit."""
    digits, end = _digits(points), len(points) - 1
    found = [np.flatnonzero(points == 64)]
    if len(digits) >= 2:
        gap = np.diff(digits) - 1
        one, two = (_SEPARATOR.take(points[np.minimum(digits[:-1] + k, end)], mode="clip") for k in (1, 2))
        near = (gap == 0) | ((gap <= 2) & one & ((gap == 1) | two))   # the next digit after 0-2 separators
        if len(near) >= 6:
            linked = np.r_[0, np.cumsum(near)]
            found.append(digits[:len(near) - 5][linked[6:] - linked[:-6] == 6])
        run = np.flatnonzero(np.r_[True, gap > 0])   # each run of digits: its first digit's index
        first, last = digits[run], digits[np.r_[run[1:] - 1, len(digits) - 1]] + 1
        digit = np.zeros(len(points) + 2, bool)
        digit[digits] = True
        short = np.flatnonzero((last - first <= 3) & (first >= 2))
        first, last = first[short], last[short]
        dotted = (points[first - 1] == 46) & digit[first - 2] & (points[np.minimum(last, end)] == 46) & digit[last + 1]
        found.append(first[dotted] - 2)
    return np.concatenate(found)


def worth_a_look(documents: list[list[str]]) -> list[set[int]]:
    """For each document (its sentences), the sentences where find() could find anything: one numpy pass over the
    batch (no quick test crosses the newline between two sentences)."""
    sentences = [s for d in documents for s in d]
    points = np.frombuffer(("\n".join(sentences) + "\n").encode("utf-32-le"), np.uint32)
    places = places_worth_a_look(points)
    out = [set() for _ in documents]
    if len(places):
        starts = np.cumsum(np.fromiter(map(len, sentences), np.int64, len(sentences)) + 1)
        sentence = np.searchsorted(starts, places, side="right")
        first = np.cumsum([0] + [len(d) for d in documents])
        document = np.searchsorted(first, sentence, side="right") - 1
        for d, i in zip(document.tolist(), (sentence - first[document]).tolist()):
            out[d].add(i)
    return out


def redact(sentences: list[str], worth: set[int] | None = None) -> tuple[list[str], dict]:
    """The sentences with each personal datum replaced by its placeholder, and the hits counted by kind; `worth`:
    worth_a_look's for them, when found already."""
    counts, out = {}, list(sentences)
    for i in sorted(worth_a_look([sentences])[0] if worth is None else worth):
        sentence = sentences[i]
        for start, end, kind in reversed(find(sentence)):
            sentence = sentence[:start] + PLACEHOLDER[kind] + sentence[end:]
            counts[kind] = counts.get(kind, 0) + 1
        out[i] = sentence
    return out, counts
