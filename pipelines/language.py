"""prepare-corpus --languages: each document's language, identified offline by py3langid (langid.py's naive Bayes
model over byte n-grams, 97 languages, shipped inside its 4.6 MB wheel: nothing is downloaded at run time), on the
document's first SAMPLE characters. The probability is the model's, normalised over its languages."""
import functools

SAMPLE = 2000   # characters: enough for a confident guess, and the cost stays per document, not per byte


@functools.cache
def identifier():
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier
    except ImportError:
        raise ImportError("--languages needs py3langid: pip install py3langid (bertkit's own install has it)") from None
    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def identify(text: str) -> tuple[str, float]:
    """(ISO 639-1 code, probability) of the text's language."""
    found, probability = identifier().classify(text[:SAMPLE])
    return found, float(probability)
