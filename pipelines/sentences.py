"""Text cleaning and sentence segmentation for prepare-corpus.

Cleaning: Unicode NFC (never NFD: NFD splits Hangul syllables into conjoining jamo), control characters removed,
whitespace collapsed. Segmentation: sentencex (Wikimedia's rule-based splitter, ~250 languages). We measured it
against blingfire on the en and ko Wikipedia samples (benchmarks/sentence_splitters.py, pipelines/README.md): it
is 3-5x faster and blingfire misses most Korean boundaries before digits and Latin words.
"""
import re
import unicodedata

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


def split_sentences(text: str, language: str) -> list[str]:
    """Sentences of one cleaned paragraph, each stripped; empty pieces dropped."""
    return [s for s in (piece.strip() for piece in segment(language, text)) if s]
