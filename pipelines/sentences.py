"""Text cleaning and sentence segmentation for prepare-corpus.

Cleaning: Unicode NFC (never NFD: NFD splits Hangul syllables into conjoining jamo), control characters removed,
whitespace collapsed. Segmentation: sentencex (Wikimedia's rule-based splitter, ~250 languages). We measured it
against blingfire on the en and ko Wikipedia samples (benchmarks/gates/sentence_splitters.py, pipelines/README.md): it
is 3-5x faster and blingfire misses most Korean boundaries before digits and Latin words.

Korean documents may instead go to a Korean splitter (--splitter kss|kiwi): on a hand-annotated Korean gold set
(benchmarks/gates/korean_splitters.py) kss with MeCab makes 3x fewer boundary errors than sentencex (F1 0.960 vs 0.878)
but is ~800x slower, so sentencex stays the default.
"""
import functools
import hashlib
import re
import unicodedata
import warnings

from sentencex import segment

# C0/C1 controls become spaces (a form feed between words must not glue them); invisible format characters that
# only break tokens (BOM, soft hyphen, zero-width space) are deleted. ZWJ/ZWNJ stay: some scripts need them.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_INVISIBLE = re.compile(r"[\ufeff\u00ad\u200b\u2060\ufffe]")
_HANGUL = re.compile(r"[\uac00-\ud7a3\u1100-\u11ff\u3130-\u318f]")
_KANA = re.compile(r"[\u3040-\u30ff]")


def clean_text(text: str) -> str:
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    text = _CONTROL.sub(" ", text)
    text = _INVISIBLE.sub("", text)
    return " ".join(text.split())


def detect_language(text: str) -> str:
    """--language auto: a cheap script check of the document's start (Hangul -> ko, kana -> ja, else en)."""
    head = text[:2000]
    if _HANGUL.search(head):
        return "ko"
    if _KANA.search(head):
        return "ja"
    return "en"


SPLITTERS = ("sentencex", "kss", "kiwi")   # kss and kiwi: for Korean documents only
_INSTALL = {"kss": "pip install 'bertkit[korean]' (kss and python-mecab-ko)",
            "kiwi": "pip install 'bertkit[korean]' (kiwipiepy)"}


def check_splitter(splitter: str) -> None:
    """Fail before a stage writes anything when --splitter is unknown or its package is missing."""
    if splitter not in SPLITTERS:
        raise ValueError(f"splitter must be one of {', '.join(SPLITTERS)}, not {splitter!r}")
    if splitter != "sentencex":
        korean_splitter(splitter)


@functools.cache
def korean_splitter(splitter: str):
    """text -> sentences, loaded once per process (kss takes seconds to import, Kiwi to load its model)."""
    try:
        if splitter == "kss":
            with warnings.catch_warnings():   # kss imports bs4, which warns about an optional package
                warnings.simplefilter("ignore")
                import kss
            return lambda text: kss.split_sentences(text, backend="mecab")
        from kiwipiepy import Kiwi
        kiwi = Kiwi()
        return lambda text: [s.text for s in kiwi.split_into_sents(text)]
    except ImportError as e:
        raise ValueError(f"--splitter {splitter} needs a package that is not installed ({e}): "
                         f"{_INSTALL[splitter]}") from None


def split_sentences(text: str, language: str, splitter: str = "sentencex") -> list[str]:
    """Sentences of one cleaned paragraph, each stripped; empty pieces dropped. A Korean splitter is used for
    Korean text only: every other language still goes to sentencex."""
    if splitter != "sentencex" and language == "ko":
        pieces = korean_splitter(splitter)(text)
    else:
        pieces = segment(language, text)
    return [s for s in (piece.strip() for piece in pieces) if s]


# ---------------------------------------------------------------- a raw document's sentences (prepare-corpus)

# WikiExtractor leftovers: unexpanded templates ('}}{{', '|{{#if:'), table rows ('!colspan=..', '|-'), HTML
# attributes ('class="wikitable"', 'title="ctx_ver=..'), lone tags ('</dl>'). Whole lines of it are dropped;
# inline tags such as '<br>' or '<poem>' are deleted and their text kept.
_MARKUP = re.compile(r'^([|{}]|#(if|ifeq|switch|invoke|expr|tag)\b|</?[a-zA-Z][^>]*>$|[a-z-]+=")'
                     r'|\{\{|\}\}|\w="[^"]*"\s*/?>?$')


def _looks_like_markup(line: str) -> bool:
    # the substring tests skip the regex for ~all prose lines (it is a third of the run time otherwise)
    return ("{" in line or "}" in line or '="' in line or line[0] in "|#<") and bool(_MARKUP.search(line))


_INLINE_TAG = re.compile(r"</?(br|poem|onlyinclude|includeonly|noinclude|span|div|center|small|big|sup|sub|"
                         r"blockquote|dl|dd|dt|ul|ol|li|p|nowiki|gallery|font|abbr|s|u|tt)\b[^<>]*/?>", re.I)
_KO_SENTENCE_END = ("다.", "요.", "까.")


def _is_heading(line: str) -> bool:
    """WikiExtractor section titles stand alone, end with '.', and are short ('History.', '생애.')."""
    return (line.endswith(".") and len(line) <= 80 and len(line.split()) <= 8
            and not re.search(r"[.!?]", line[:-1]) and not line.endswith(_KO_SENTENCE_END))


def cleaned_lines(raw) -> list[str]:
    return [line for line in map(clean_text, raw.lines) if line]


def build_sentences(raw, language: str, splitter: str, removed: dict, lines: list[str] | None = None) -> list[str]:
    """A raw document (corpus_readers.RawDoc) as cleaned sentences; WikiExtractor leftovers, repeated titles and
    empty sections removed and counted in `removed`. language "auto": detected per document. lines: its
    cleaned_lines, when found already."""
    lines = cleaned_lines(raw) if lines is None else lines
    if raw.kind == "wiki":
        if lines and raw.title is not None and lines[0] == clean_text(raw.title):
            lines.pop(0)
            removed["repeated_title"] = removed.get("repeated_title", 0) + 1
        text = []
        for line in lines:
            if _looks_like_markup(line):
                removed["markup"] = removed.get("markup", 0) + 1
            elif "<" not in line:
                text.append(line)
            elif line := " ".join(_INLINE_TAG.sub(" ", line).split()):
                text.append(line)
        # a section title followed by another title or the end of the document is an empty section
        lines = []
        for i, line in enumerate(text):
            if _is_heading(line) and (i + 1 == len(text) or _is_heading(text[i + 1])):
                removed["empty_section"] = removed.get("empty_section", 0) + 1
            else:
                lines.append(line)
    if raw.kind == "lines":
        return lines
    if not lines:
        return []
    language = language if language != "auto" else detect_language(" ".join(lines[:3]))
    if raw.kind == "join":
        return split_sentences(" ".join(lines), language, splitter)
    return [s for line in lines for s in split_sentences(line, language, splitter)]


def document_id(sentences: list[str]) -> str:
    """A document's id: a hash of its sentences (the key duplicates are found by, and the holdout split's)."""
    return hashlib.sha1("\n".join(sentences).encode("utf-8")).hexdigest()[:16]
