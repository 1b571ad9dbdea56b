"""What a sentence encoder trains on: (anchor, positive[, hard negative]) rows from a CSV / TSV / JSON-lines file with
named columns, from an NLI file (KoSimCSE's and SimCSE's supervised recipe: a premise, its entailment the positive,
its contradiction the hard negative), or sentences of a bertkit corpus folder for unsupervised SimCSE (each sentence
its own positive)."""
import json
from pathlib import Path

from bertkit.errors import DataError
from bertkit.finetune.classify import jsonl_objects, read_utf8, table_rows


def read_pairs(path, anchor: str = "anchor", positive: str = "positive", negative: str | None = None) -> list:
    """[(anchor, positive[, negative]), ...] from .csv (RFC 4180 quoting), .tsv (tab-separated, no quoting),
    .jsonl or a 🤗 dataset (bertkit.hf_rows), whose header (or keys, or columns) names the columns; an empty text or a
    missing column names the file and line."""
    from bertkit.hf_rows import dataset_records, is_dataset

    names = [anchor, positive] + ([negative] if negative else [])
    if is_dataset(path):
        records = dataset_records(path)
    else:
        path = Path(path)
        fmt = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}.get(path.suffix.lower(), "tsv")
        text = read_utf8(path)
        records = jsonl_objects(path, text, "an object of named texts") if fmt == "jsonl" else \
            _table_records(path, text, fmt)
    rows = []
    for line, record in records:
        missing = [n for n in names if n not in record]
        if missing:
            raise DataError(f"{path}:{line}: no column {missing[0]!r}; this row has {sorted(record)}. Name the "
                            "columns with --anchor/--positive/--negative")
        wrong = next((n for n in names if not isinstance(record[n], str)), None)
        if wrong is not None:
            raise DataError(f"{path}:{line}: {wrong!r} is {json.dumps(record[wrong])[:40]}, not a text; each text is a "
                            "JSON string")
        row = tuple(record[n] for n in names)
        if not all(t.strip() for t in row):
            raise DataError(f"{path}:{line}: an empty text in {names}; fix or remove this row")
        rows.append(row)
    if len(rows) < 2:
        raise DataError(f"{path}: {len(rows)} row(s); in-batch negatives need at least 2 pairs")
    return rows


def _table_records(path: Path, text: str, fmt: str):
    table = table_rows(text, fmt, path)
    if not table:
        raise DataError(f"{path}: the file is empty")
    header = table[0]
    for i, row in enumerate(table[1:], 2):
        if len(row) > len(header):   # a text holding a tab (.tsv) or an unquoted comma (.csv): never cut silently
            raise DataError(f"{path}:{i}: {len(row)} fields, the header has {len(header)}; a .tsv has no quoting, so "
                            "a text may not hold a tab (a .csv quotes a text with commas: \"a, b\"). Use .csv with "
                            "quotes or .jsonl for such texts")
        if any(field.strip() for field in row):
            yield i, dict(zip(header, row))


NLI_SETS = {"klue-nli": "klue/klue-nli-v1.1/klue-nli-v1.1_train.json"}   # by name, under --data-dir


def nli_triplets(path) -> list[tuple[str, str, str]]:
    """(premise, an entailed hypothesis, a contradicting one) for each premise of an NLI file that has both: KLUE-NLI
    .json, or KorNLI / MultiNLI-style .tsv (sentence1, sentence2, gold_label); each premise once, its first of each."""
    from bertkit.finetune.korean import read_examples

    by_premise: dict[str, dict] = {}
    for e in read_examples(path):
        by_premise.setdefault(e.text_a, {}).setdefault(e.label, e.text_b)
    rows = [(p, h["entailment"], h["contradiction"]) for p, h in by_premise.items()
            if "entailment" in h and "contradiction" in h]
    if len(rows) < 2:
        raise DataError(f"{path}: {len(rows)} premise(s) with both an entailment and a contradiction; an NLI file's "
                        "labels are entailment, neutral and contradiction")
    return rows


def _bottom_k(items, limit: int, seed: int, text=lambda item: item) -> list:
    """Up to `limit` items of distinct text(item), those whose text's seeded hash is smallest (a bottom-k sample:
    uniform, fixed by `seed`, `limit` items kept however many stream past), in hash order."""
    import hashlib
    import heapq

    key, kept, seen = seed.to_bytes(8, "little", signed=True), [], set()   # kept: a max-heap of (-hash, item)
    for item in items:
        h = int.from_bytes(hashlib.blake2b(text(item).encode(), key=key, digest_size=8).digest(), "little")
        if h in seen or (len(kept) == limit and h >= -kept[0][0]):
            continue
        seen.add(h)
        if len(kept) == limit:
            seen.discard(-heapq.heappushpop(kept, (-h, item))[0])
        else:
            heapq.heappush(kept, (-h, item))
    return [item for _, item in sorted(kept, key=lambda kept_item: kept_item[0], reverse=True)]


def _documents(corpus_dir):
    """Each document of a bertkit corpus folder's train split, as its list of sentences (one shard in memory)."""
    from bertkit.fileio import read_arrow
    from bertkit.formats import CorpusColumns, corpus_shards

    for shard in corpus_shards(corpus_dir):
        yield from read_arrow(shard).column(CorpusColumns.SENTENCES).to_pylist()


def corpus_sentences(corpus_dir, limit: int, seed: int, min_chars: int = 10) -> list:
    """Up to `limit` distinct sentences (at least `min_chars` long) from a bertkit corpus folder's train split, a
    seeded uniform sample, as SimCSE's (sentence, sentence) pairs."""
    kept = _bottom_k((s for doc in _documents(corpus_dir) for s in doc if len(s.strip()) >= min_chars), limit, seed)
    if len(kept) < 2:
        raise DataError(f"{corpus_dir}: {len(kept)} sentence(s) of {min_chars}+ characters; SimCSE needs more")
    return [(sentence, sentence) for sentence in kept]


def corpus_passages(corpus_dir, limit: int, seed: int, sentences: int = 6, keep_query: float = 0.1,
                    min_chars: int = 10) -> list:
    """The Inverse Cloze Task (Lee et al. 2019), retrieval's pairs from text alone: each document cut into passages
    of `sentences` consecutive sentences (the last may be shorter; at least 2), a seeded sample of `limit` of them,
    and for each (one of its sentences, the passage without it; with it for a `keep_query` share, so that the
    model also learns word overlap)."""
    import random

    def passages():
        for doc in _documents(corpus_dir):
            doc = [s.strip() for s in doc if len(s.strip()) >= min_chars]
            for i in range(0, len(doc), sentences):
                if len(doc[i:i + sentences]) >= 2:
                    yield tuple(doc[i:i + sentences])

    rows = []
    for parts in _bottom_k(passages(), limit, seed, text="\x1f".join):
        rng = random.Random(f"{seed}:" + "\x1f".join(parts))   # each passage's own draw, whatever else is sampled
        q = rng.randrange(len(parts))
        rest = parts if rng.random() < keep_query else parts[:q] + parts[q + 1:]
        rows.append((parts[q], " ".join(rest)))
    if len(rows) < 2:
        raise DataError(f"{corpus_dir}: {len(rows)} passage(s) of 2+ sentences; the Inverse Cloze Task needs more")
    return rows
