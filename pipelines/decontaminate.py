"""prepare-corpus --decontaminate FILE...: evaluation text kept out of pretraining. Every text of each evaluation
file as published (SQuAD/KorQuAD and KLUE JSON, JSON lines: every string value; TSV/CSV and plain text: every field
of every line) becomes its word 13-grams (a text of 8-12 words: itself whole, as GPT-3 did for short examples);
words as --near-dedup finds them. A corpus document sharing one of them loses the sentences that hold it
(--decontaminate-mode sentences) or goes whole (documents). An n-gram found in more than --decontaminate-max-docs
documents is a common phrase, not a leak, and is ignored (GPT-3's and NeMo Curator's rule).

Tasks: one per part (the matches of its documents: position, sentence, n-gram), then the main process counts each
n-gram's documents and writes what goes."""
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from bertkit.fileio import atomic_write_bytes, atomic_write_json, atomic_write_npy, make_folder, read_json_or_none
from bertkit.formats import CorpusColumns as C
from bertkit.pipelines.engine import Engine, finished
from bertkit.pipelines.words import VERSION, WordBatch, batch_words, longer, ngrams64

NGRAM = 13
SHORTEST = 8          # words: a shorter text is too common to mean a leak
MODES = ("sentences", "documents")
LOW24 = np.uint64(0xFFFFFF)


@dataclass(frozen=True)
class EvalNgrams:
    hashes: np.ndarray    # sorted unique uint64 n-gram hashes
    sets: np.ndarray      # for each hash, the index of the first evaluation file that holds it
    lengths: tuple        # the n-gram lengths present (13, and the short texts' own lengths)
    names: tuple          # evaluation files' names, by index
    prefixes: np.ndarray  # sorted unique hashes of the n-grams' first SHORTEST words (a corpus place's first test)


def text_ngrams(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n-gram hashes, each one's length in words, the hash of each one's first SHORTEST words) of every text: its
    13-grams, or the whole text of 8-12 words, or none (a text of fewer words)."""
    found = batch_words(texts)
    text, counts = found.text, np.bincount(found.text, minlength=len(texts))
    first_word = np.r_[0, np.cumsum(counts)[:-1]]
    prefix = ngrams64(found.hashes, SHORTEST)
    grams = ngrams64(found.hashes, NGRAM)
    inside = np.flatnonzero(text[: len(grams)] == text[NGRAM - 1:])
    hashes, lengths, prefixes = [grams[inside]], [np.full(len(inside), NGRAM)], [prefix[inside]]
    for n in range(SHORTEST, NGRAM):
        short = first_word[counts == n]
        hashes.append(ngrams64(found.hashes, n)[short])
        lengths.append(np.full(len(short), n))
        prefixes.append(prefix[short])
    return np.concatenate(hashes), np.concatenate(lengths), np.concatenate(prefixes)


class EvaluationFileError(ValueError):
    """An evaluation file that cannot be read: names it, the line, and what to do."""


def evaluation_texts(path: Path) -> list[str]:
    """Every text of an evaluation file as published: JSON (one document, or JSON lines) by its string values at any
    depth; anything else by the fields of its lines (tab-, then comma-separated when the name says .csv)."""
    try:
        raw = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise EvaluationFileError(f"{path}: not UTF-8 text (byte {e.start}); --decontaminate reads evaluation files "
                                  "as published, in UTF-8 (iconv converts a legacy one)") from None
    except OSError as e:
        raise EvaluationFileError(f"{path}: cannot be read ({e.strerror})") from None
    values = []

    def walk(node):
        if isinstance(node, str):
            values.append(node)
        elif isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    if path.suffix.lower() in (".json", ".jsonl"):
        try:
            walk(json.loads(raw))
        except json.JSONDecodeError:
            for n, line in enumerate(raw.split("\n"), 1):
                try:
                    walk(json.loads(line) if line.strip() else None)
                except json.JSONDecodeError as e:
                    raise EvaluationFileError(f"{path}:{n}: neither one JSON document nor JSON lines ({e.msg}); give "
                                              "the evaluation file as published") from None
        return values
    separator = "," if path.suffix.lower() == ".csv" else "\t"
    return [field for line in raw.split("\n") for field in line.split(separator)]


def load_evaluation(paths: list[Path]) -> EvalNgrams:
    hashes, sets, lengths, prefixes = [np.zeros(0, np.uint64)], [np.zeros(0, np.int32)], set(), [np.zeros(0, np.uint64)]
    for index, path in enumerate(paths):
        found, n, prefix = text_ngrams(evaluation_texts(path))
        hashes.append(found)
        sets.append(np.full(len(found), index, np.int32))
        lengths.update(int(x) for x in np.unique(n))
        prefixes.append(prefix)
    allh, alls = np.concatenate(hashes), np.concatenate(sets)
    order = np.lexsort((alls, allh))
    allh, alls = allh[order], alls[order]
    first = np.r_[True, allh[1:] != allh[:-1]] if len(allh) else np.zeros(0, bool)
    return EvalNgrams(allh[first], alls[first], tuple(sorted(lengths)), tuple(p.name for p in paths),
                      np.unique(np.concatenate(prefixes)))


def save_evaluation(ev: EvalNgrams, path: Path) -> None:
    import io

    buffer = io.BytesIO()
    np.savez(buffer, hashes=ev.hashes, sets=ev.sets, lengths=np.array(ev.lengths, np.int64), prefixes=ev.prefixes)
    atomic_write_bytes(path, buffer.getvalue())


def match_task(part: str, evaluation: str, out: str) -> dict:
    """Task: every evaluation n-gram found in this part's documents, as (row, first sentence, last sentence, n-gram
    index) int64 rows, rows counted within the part."""
    found, row0 = [], 0
    ngrams = EvalLookup(evaluation)
    with pa.memory_map(part, "r") as source:
        for batch in pa.ipc.open_stream(source):
            docs = batch.column(C.SENTENCES).to_pylist()
            if len(ngrams.hashes):
                found.append(word_matches(batch_words([s for d in docs for s in d]), docs, ngrams, row0))
            row0 += len(docs)
    return write_matches(out, found, row0)


def write_matches(out: str, found: list[np.ndarray], rows: int) -> dict:
    matches = np.concatenate(found) if found else np.zeros((0, 4), np.int64)
    atomic_write_npy(Path(out), matches)
    record = {"rows": rows, "matches": len(matches), "words": VERSION}
    atomic_write_json(Path(out).with_suffix(".json"), record)
    return record


class EvalLookup:
    """A saved evaluation's n-grams as a task looks them up: sorted hashes, sorted prefixes (each n-gram's first
    SHORTEST words), and a first test on 24 bits of each prefix (most corpus places stop there)."""

    def __init__(self, evaluation: str):
        saved = np.load(evaluation)
        self.hashes, self.lengths = saved["hashes"], [int(n) for n in saved["lengths"]]
        self.prefixes = saved["prefixes"]
        self.present = np.zeros(1 << 24, dtype=bool)
        self.present[(self.prefixes & LOW24).astype(np.int64)] = True


def _among(values: np.ndarray, sorted_values: np.ndarray) -> np.ndarray:
    place = np.minimum(np.searchsorted(sorted_values, values), len(sorted_values) - 1)
    return sorted_values[place] == values


def word_matches(found: WordBatch, docs: list[list[str]], ngrams: EvalLookup, row0: int) -> np.ndarray:
    """The matches of a batch of documents whose sentences' words are found (one text a sentence). Every place's
    first SHORTEST words are looked up once; only the places that begin an evaluation n-gram are followed to the
    longer lengths (words.longer: each n-gram one step from its (n-1)-gram)."""
    hashed, sentence = found.hashes, found.text                              # each word's sentence (in the batch)
    owner = np.repeat(np.arange(len(docs)), [len(d) for d in docs])          # each sentence's document
    first_sentence = np.r_[0, np.cumsum([len(d) for d in docs])[:-1]]
    doc = owner[sentence] if len(sentence) else sentence
    grams = ngrams64(hashed, SHORTEST) if len(ngrams.hashes) else np.zeros(0, np.uint64)
    at = np.flatnonzero(ngrams.present[(grams & LOW24).view(np.int64)])
    at = at[_among(grams[at], ngrams.prefixes)]
    grams, out = grams[at], []
    for n in range(SHORTEST, max(ngrams.lengths, default=0) + 1):
        if n > SHORTEST:
            more = at + n - 1 < len(hashed)
            at, grams = at[more], grams[more]
            grams = longer(grams, hashed, at, n)
        if n not in ngrams.lengths or not len(at):
            continue
        place = np.minimum(np.searchsorted(ngrams.hashes, grams), len(ngrams.hashes) - 1)
        equal = (ngrams.hashes[place] == grams) & (doc[at] == doc[at + n - 1])   # inside one document
        hit, d = at[equal], doc[at[equal]]
        out.append(np.stack([d + row0, sentence[hit] - first_sentence[d], sentence[hit + n - 1] - first_sentence[d],
                             place[equal]], axis=1))
    return np.concatenate(out) if out else np.zeros((0, 4), np.int64)


def match_files(work: Path, parts: int) -> list[Path]:
    return [work / "decontaminate" / f"matches-{i:05d}.npy" for i in range(parts)]


def matches_done(out: Path) -> bool:
    return finished(out, words=VERSION)


def run_decontamination(engine: Engine, parts: list[Path], ev: EvalNgrams, mode: str, max_docs: int,
                        work: Path) -> tuple[Path, dict]:
    """The match tasks (finished ones reused), then what goes: a sorted int64 .npy of positions (documents) or an
    (n, 2) one of (position, sentence) (sentences); and per evaluation file the documents and sentences matched."""
    folder = make_folder(work / "decontaminate")
    save_evaluation(ev, folder / "evaluation.npz")
    outs = match_files(work, len(parts))
    todo = [(str(p), str(folder / "evaluation.npz"), str(o)) for p, o in zip(parts, outs) if not matches_done(o)]
    list(engine.map(match_task, todo))
    starts = np.cumsum([0] + [read_json_or_none(o.with_suffix(".json"))["rows"] for o in outs])
    matches = np.concatenate([np.load(o) + np.array([s, 0, 0, 0]) for o, s in zip(outs, starts)]
                             + [np.zeros((0, 4), np.int64)])
    pairs = np.unique(matches[:, [3, 0]], axis=0)                           # (n-gram, document) once each
    documents_per_ngram = np.bincount(pairs[:, 0], minlength=len(ev.hashes))
    kept = matches[documents_per_ngram[matches[:, 3]] <= max_docs]
    report = {name: {"documents": 0, "sentences": 0} for name in ev.names}
    sentences = _spanned(kept)
    for index, name in enumerate(ev.names):
        mine = kept[ev.sets[kept[:, 3]] == index]
        report[name]["documents"] = len(np.unique(mine[:, 0]))
        report[name]["sentences"] = len(_spanned(mine))
    removed = np.unique(kept[:, 0]) if mode == "documents" else sentences
    atomic_write_npy(folder / "removed.npy", removed.astype(np.int64))
    return folder / "removed.npy", {"files": report, "evaluation_ngrams": len(ev.hashes),
                                    "ngrams_too_common": int((documents_per_ngram > max_docs).sum())}


def _spanned(matches: np.ndarray) -> np.ndarray:
    """(position, sentence) of every sentence the matches span (a 13-gram spans at most 13), each once."""
    width = matches[:, 2] - matches[:, 1]
    pieces = [np.stack([matches[width >= k, 0], matches[width >= k, 1] + k], axis=1)
              for k in range(int(width.max()) + 1 if len(width) else 0)]
    return np.unique(np.concatenate(pieces + [np.zeros((0, 2), np.int64)]), axis=0)
