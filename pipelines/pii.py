"""prepare-corpus --pii: personal data found by pattern in each document's sentences, then redacted (replaced by a
placeholder), or the document dropped. Kinds: e-mail addresses, IPv4 addresses, phone numbers (Korean mobile and
landline numbers, +82 and other international numbers), Korean resident registration numbers (a real birth date and
sex digit) and card numbers (13-19 digits passing the Luhn check). Dates, ISBNs, prices and version numbers are not
personal data: the patterns and their guards are written against them (tests/test_pii.py counts false redactions),
and against what Korean Wikipedia holds that looks like them (enzyme numbers, decimals, archive timestamps, network
ranges, part numbers; docs/studies/2026-12-02-near-duplicates.md).

A document with more than MANY hits is dropped whatever the mode (dolma's rule: such a page is a directory or a
leak, not prose)."""
import bisect
import itertools
import re

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


# quick tests that most sentences (a year, a count) fail: seven digits close together (phones, resident registration
# and card numbers), digits between dots (IPs), an @ (e-mails). What follows a first digit is written once: possessive
# runs (giving a separator or digit back could not make a match)
_SEVEN_DIGITS_AFTER, _DOTTED_AFTER = r"(?:[ ().+-]{0,2}+\d){6}", r"\.\d{1,3}+\.\d"
_SEVEN_DIGITS = re.compile(rf"\d{_SEVEN_DIGITS_AFTER}")
_DOTTED = re.compile(rf"\d{_DOTTED_AFTER}")
# the three in one scan of a document: a character class first, so that re jumps between digits and @s
_QUICK = re.compile(rf"[\d@](?:(?<=@)|(?<=\d)(?:{_DOTTED_AFTER}|{_SEVEN_DIGITS_AFTER}))")
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


def _worth_a_look(sentences: list[str]) -> set[int]:
    """The sentences where find() could find anything: one scan of the document for the quick tests (none of them
    crosses the newline between two sentences)."""
    text = "\n".join(sentences)
    places = [m.start() for m in _QUICK.finditer(text)]
    if not places:
        return set()
    ends = list(itertools.accumulate(len(x) + 1 for x in sentences))
    return {bisect.bisect_right(ends, place) for place in places}


def redact(sentences: list[str]) -> tuple[list[str], dict]:
    """The sentences with each personal datum replaced by its placeholder, and the hits counted by kind."""
    counts, out = {}, list(sentences)
    for i in sorted(_worth_a_look(sentences)):
        sentence = sentences[i]
        for start, end, kind in reversed(find(sentence)):
            sentence = sentence[:start] + PLACEHOLDER[kind] + sentence[end:]
            counts[kind] = counts.get(kind, 0) + 1
        out[i] = sentence
    return out, counts
