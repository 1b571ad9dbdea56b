"""prepare-corpus --near-dedup: MinHash-LSH over word n-grams, every candidate pair checked by its true Jaccard,
clusters joined, one document kept per cluster (the first in input order) with the cluster's size.

Steps, each a set of deterministic tasks writing their own files (so workers, engine and a killed run's resume
never change a byte): one signature task per part (each document's band hashes), one bucket task per band
(documents sharing a band hash become candidate pairs, each with the bucket's first), one check task per slice of
the pairs (the pair's true Jaccard over its shingles, recomputed from the text), then the components in the main
process (scipy's connected components: 4 bytes a document and 16 a checked pair)."""
import functools
import re
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from bertkit.fileio import atomic_write_bytes, atomic_write_json, make_folder, read_json_or_none
from bertkit.formats import CorpusColumns as C
from bertkit.pipelines.engine import Engine

PAIRS_PER_TASK = 200_000    # checks per task: a few seconds to a minute each
_NOT_WORD = re.compile(r"[\W_]+")
_DIGIT = re.compile(r"\d")


@dataclass(frozen=True)
class NearDedupSettings:
    threshold: float = 0.8   # documents whose shingle sets' Jaccard is at least this are one cluster
    ngram: int = 5           # words per shingle
    num_perm: int = 112      # MinHash values per document, cut into bands x rows
    bands: int = 18          # choose_bands(0.8)
    rows: int = 6
    seed: int = 1            # the hash functions: fixed, so signatures never change between runs

    @classmethod
    def for_threshold(cls, threshold: float, ngram: int = 5, num_perm: int = 112) -> "NearDedupSettings":
        bands, rows = choose_bands(threshold, num_perm)
        return cls(threshold, ngram, num_perm, bands, rows)


def candidate_probability(jaccard: float, bands: int, rows: int) -> float:
    """The chance two documents of this Jaccard share at least one band: 1 - (1 - J^r)^b."""
    return 1 - (1 - jaccard ** rows) ** bands


def choose_bands(threshold: float, num_perm: int = 112, recall: float = 0.995) -> tuple[int, int]:
    """bands x rows <= num_perm for a threshold: of those that make a pair at exactly the threshold a candidate with
    probability `recall` or more, the one with the fewest candidates below it (each costs a check, none is removed
    by mistake: every candidate's true Jaccard decides). At 0.8: 18 x 6 (0.9958 at 0.8; datatrove's 14 x 8: 0.92)."""
    def below(bands, rows, steps=200):
        return sum(candidate_probability((i + 0.5) / steps * threshold, bands, rows) for i in range(steps)) / steps

    shapes = [(num_perm // rows, rows) for rows in range(1, num_perm + 1)]
    sure = [s for s in shapes if candidate_probability(threshold, *s) >= recall]
    if not sure:
        return max(shapes, key=lambda s: candidate_probability(threshold, *s))
    return min(sure, key=lambda s: below(*s))


def words(text: str) -> list[str]:
    """The words shingles are made of, as a reader sees them (word_hashes finds the same split on bytes): lower
    case, every digit 0, punctuation and symbols as spaces, split on spaces (a Korean word is then an eojeol). So a
    reposted text with other punctuation, spacing, case or numbers is the same text."""
    text = _DIGIT.sub("0", unicodedata.normalize("NFC", text).lower())
    return _NOT_WORD.sub(" ", text).split()


_POWERS = np.cumprod(np.full(64, 1_000_003, dtype=np.uint64)) // np.uint64(1_000_003)   # 1, p, p^2 ... mod 2**64
_MASK32 = np.uint64(0xFFFFFFFF)
_POWERS32 = (_POWERS & _MASK32).astype(np.uint32)


_ASCII_SEPARATOR = np.ones(256, dtype=bool)    # ASCII bytes but a-z, 0-9 separate words; the others: _letters
_ASCII_SEPARATOR[list(b"abcdefghijklmnopqrstuvwxyz0123456789")] = False
_ASCII_SEPARATOR[128:] = False


@functools.cache
def _word_characters() -> np.ndarray:
    """For every code point, whether it is part of a word: what str.isalnum says (the regex \\w less "_")."""
    return np.array([chr(c).isalnum() for c in range(0x110000)], dtype=bool)


def _letters(raw: np.ndarray) -> np.ndarray:
    """Which bytes of UTF-8 text belong to words, decided per character as words() decides: ASCII by a table, the
    other characters decoded in numpy and looked up."""
    letter = ~_ASCII_SEPARATOR[raw]
    lead = np.flatnonzero(raw >= 0xC0)
    if len(lead) == 0:
        return letter
    padded = np.r_[raw, np.zeros(3, np.uint8)]
    b0, b1, b2, b3 = (padded[lead + k].astype(np.uint32) & m for k, m in enumerate((0xFF, 0x3F, 0x3F, 0x3F)))
    point = np.where(b0 < 0xE0, ((b0 & 0x1F) << 6) | b1, np.where(
        b0 < 0xF0, ((b0 & 0x0F) << 12) | (b1 << 6) | b2, ((b0 & 0x07) << 18) | (b1 << 12) | (b2 << 6) | b3))
    word = _word_characters()[np.minimum(point, 0x10FFFF)]
    size = np.where(b0 < 0xE0, 2, np.where(b0 < 0xF0, 3, 4))
    letter[np.repeat(lead, size) + (np.arange(size.sum()) - np.repeat(np.cumsum(size) - size, size))] = \
        np.repeat(word, size)
    return letter


def _words(raw: np.ndarray, letter: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(one 32-bit hash per word: a polynomial over its UTF-8 bytes, the first 64 counting, digits as 0; the byte
    where each word begins) for lowered UTF-8 bytes, in numpy: no Python call per word."""
    letter = _letters(raw) if letter is None else letter
    begins = np.flatnonzero(letter & np.r_[True, ~letter[:-1]]) if len(raw) else np.zeros(0, np.int64)
    if len(begins) == 0:
        return np.zeros(0, np.uint64), begins
    byte = raw[letter]
    first = np.cumsum(letter, dtype=np.int32)[begins] - 1   # each word's first byte among the letters
    place = np.arange(len(byte), dtype=np.int32) - np.repeat(first, np.diff(np.r_[first, len(byte)]))
    byte = np.where((byte >= 0x30) & (byte <= 0x39), 0x30, byte).astype(np.uint32)
    with np.errstate(over="ignore"):   # all mod 2**32 (the same numbers as mod 2**64 then cut: a ring's map)
        values = (byte + np.uint32(1)) * _POWERS32[np.minimum(place, 63)]
        return np.add.reduceat(values, first, dtype=np.uint32).astype(np.uint64), begins


def word_hashes(text: str) -> np.ndarray:
    return _words(np.frombuffer(text.lower().encode("utf-8"), np.uint8))[0]


def _ngrams(hashed: np.ndarray, n: int) -> np.ndarray:
    """The polynomial over each run of n consecutive word hashes, mod 2**32."""
    acc = np.zeros(len(hashed) - n + 1, dtype=np.uint64)
    for k in range(n):
        acc = (acc * np.uint64(1_000_003) + hashed[k: len(hashed) - n + 1 + k]) & _MASK32
    return acc


def ngrams64(hashed: np.ndarray, n: int) -> np.ndarray:
    """A 64-bit polynomial over each run of n word hashes (wrapping): few chance matches over billions of n-grams."""
    acc = np.zeros(max(len(hashed) - n + 1, 0), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            acc = acc * np.uint64(0x100000001B3) + (hashed[k: len(hashed) - n + 1 + k] & _MASK32)
    return acc


def shingles(text: str, ngram: int) -> np.ndarray:
    """The distinct 32-bit hashes of the text's word n-grams (the whole text as one when it has fewer words)."""
    hashed = word_hashes(text)
    if len(hashed) == 0:
        return hashed.astype(np.uint32)
    return np.unique(_ngrams(hashed, min(ngram, len(hashed))).astype(np.uint32))


def hash_functions(settings: NearDedupSettings) -> tuple[np.ndarray, np.ndarray]:
    """Multiply-shift hashes ((a x + b) mod 2**64) >> 32 with odd a: universal, and no modulo to compute."""
    rng = np.random.default_rng(settings.seed)
    a = rng.integers(0, 2 ** 63, settings.num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    return a, rng.integers(0, 2 ** 63, settings.num_perm, dtype=np.uint64)


def _bands(signatures: np.ndarray, settings: NearDedupSettings) -> np.ndarray:
    """(documents, num_perm) signatures -> (documents, bands): each band's values hashed to one uint64 (wrapping:
    a collision only adds a candidate to check)."""
    rows = signatures[:, : settings.bands * settings.rows].reshape(len(signatures), settings.bands, settings.rows)
    out = np.zeros((len(signatures), settings.bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(settings.rows):
            out = (out ^ rows[:, :, k]) * np.uint64(0x9E3779B97F4A7C15)
    return out


def _minhash(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    signature = np.full(len(a), 2 ** 32, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for start in range(0, len(x), 4096):   # bounded temporary memory for long documents
            chunk = x[start:start + 4096, None].astype(np.uint64)
            signature = np.minimum(signature, ((chunk * a[None, :] + b[None, :]) >> np.uint64(32)).min(0))
    return signature


def band_hashes(shingle_set: np.ndarray, a: np.ndarray, b: np.ndarray, settings: NearDedupSettings) -> np.ndarray:
    """One document's MinHash signature cut into bands, each band hashed (batch_band_hashes gives the same)."""
    return _bands(_minhash(shingle_set, a, b)[None, :], settings)[0]


def batch_band_hashes(texts: list[str], a: np.ndarray, b: np.ndarray, settings: NearDedupSettings) -> np.ndarray:
    """band_hashes(shingles(text)) of every text at once: one numpy pass over the batch's bytes, words and shingles
    (a Python call per document only where it has fewer words than a shingle, or a great many shingles)."""
    encoded = [t.lower().encode("utf-8") for t in texts]
    doc_start = np.r_[0, np.cumsum([len(e) + 1 for e in encoded])[:-1]]
    hashed, begins = _words(np.frombuffer(b"\n".join(encoded) + b"\n", np.uint8))
    doc = np.searchsorted(doc_start, begins, side="right") - 1
    n, signatures = settings.ngram, np.full((len(texts), settings.num_perm), 2 ** 32, dtype=np.uint64)
    whole = np.zeros(0, np.uint64)
    if len(hashed) >= n:
        acc = _ngrams(hashed, n)
        inside = doc[: len(acc)] == doc[n - 1:]
        whole, owner = acc[inside], doc[: len(acc)][inside]
    else:
        owner = np.zeros(0, np.int64)
    counts = np.bincount(doc, minlength=len(texts))
    for d in np.flatnonzero((counts > 0) & (counts < n)):   # fewer words than a shingle: the text is one
        signatures[d] = _minhash(shingles(texts[d], n), a, b)
    keys = np.sort((owner.astype(np.uint64) << np.uint64(32)) | whole)   # (np.unique hashes first: slower)
    keys = keys[np.r_[True, keys[1:] != keys[:-1]]] if len(keys) else keys
    owner, x = (keys >> np.uint64(32)).astype(np.int64), keys & _MASK32
    first = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]]) if len(owner) else np.zeros(0, np.int64)
    docs = owner[first]
    bounds = np.r_[first, len(x)]
    i = 0
    while i < len(docs):   # groups of whole documents, about 2k shingles each (in the cache)
        j = max(i + 1, int(np.searchsorted(bounds, bounds[i] + 2_048, side="right")) - 1)
        j = min(j, len(docs))
        lo, hi = bounds[i], bounds[j]
        if hi - lo > 65_536:   # one very long document: bounded memory
            signatures[docs[i]] = _minhash(x[lo:hi], a, b)
        else:
            with np.errstate(over="ignore"):
                values = (x[lo:hi, None] * a[None, :] + b[None, :]) >> np.uint64(32)
            signatures[docs[i:j]] = np.minimum.reduceat(values, bounds[i:j] - lo, axis=0)
        i = j
    return _bands(signatures, settings)


def jaccard(first: np.ndarray, second: np.ndarray) -> float:
    """Of two shingle sets; 0 for two empty ones (texts without a word are not duplicates of each other: two equal
    ones are the exact dedup's)."""
    if len(first) == 0 and len(second) == 0:
        return 0.0
    common = len(np.intersect1d(first, second, assume_unique=True))
    return common / (len(first) + len(second) - common)


def _text(sentences) -> str:
    return " ".join(sentences)


def _part_batches(part: str):
    with pa.memory_map(part, "r") as source:
        yield from pa.ipc.open_stream(source)


def signature_task(part: str, settings: dict, out: str) -> dict:
    """Task: every document of one part -> its band hashes, an (rows, bands) uint64 .npy, then a .json record."""
    s = NearDedupSettings(**settings)
    a, b = hash_functions(s)
    hashes = [batch_band_hashes([_text(x) for x in batch.column(C.SENTENCES).to_pylist()], a, b, s)
              for batch in _part_batches(part)]
    table = np.concatenate(hashes) if hashes else np.zeros((0, s.bands), np.uint64)
    _save(Path(out), table)
    record = {"rows": len(table), "settings": asdict(s)}
    atomic_write_json(Path(out).with_suffix(".json"), record)
    return record


def bucket_task(signatures: list[str], band: int, out: str) -> dict:
    """Task: the documents sharing this band's hash, each paired with the first of its bucket (input order), as a
    sorted (pairs, 2) int64 .npy of positions."""
    column = np.concatenate([np.load(p, mmap_mode="r")[:, band] for p in signatures]) if signatures else \
        np.zeros(0, np.uint64)
    order = np.argsort(column, kind="stable")   # equal hashes stay in input order: the bucket's first is earliest
    ordered = column[order]
    starts = np.ones(len(ordered), dtype=bool)
    starts[1:] = ordered[1:] != ordered[:-1]
    first = order[np.flatnonzero(starts)][np.cumsum(starts) - 1]
    pairs = np.stack([first, order], axis=1)[~starts].astype(np.int64)
    _save(Path(out), pairs)
    record = {"band": band, "pairs": len(pairs)}
    atomic_write_json(Path(out).with_suffix(".json"), record)
    return record


class PartTexts:
    """Documents by position (their row in the parts in input order), read from the memory-mapped parts."""

    def __init__(self, parts: list[str]):
        self.tables = []
        for part in parts:
            with pa.memory_map(part, "r") as source:
                self.tables.append(pa.ipc.open_stream(source).read_all())
        self.starts = np.cumsum([0] + [len(t) for t in self.tables])

    def sentences(self, position: int) -> list[str]:
        part = int(np.searchsorted(self.starts, position, side="right")) - 1
        return self.tables[part].column(C.SENTENCES)[int(position - self.starts[part])].as_py()


def check_task(parts: list[str], pairs_file: str, lo: int, hi: int, settings: dict, out: str) -> dict:
    """Task: pairs lo..hi of the candidate list, kept when their shingle sets' Jaccard reaches the threshold."""
    s = NearDedupSettings(**settings)
    pairs = np.load(pairs_file, mmap_mode="r")[lo:hi]
    texts, cache = PartTexts(parts), {}

    def shingle_set(position):
        if position not in cache:
            if len(cache) > 20_000:
                cache.clear()
            cache[position] = shingles(_text(texts.sentences(position)), s.ngram)
        return cache[position]

    keep = np.array([jaccard(shingle_set(int(i)), shingle_set(int(j))) >= s.threshold for i, j in pairs], dtype=bool)
    _save(Path(out), np.asarray(pairs)[keep] if len(pairs) else np.zeros((0, 2), np.int64))
    record = {"lo": lo, "hi": hi, "kept": int(keep.sum())}
    atomic_write_json(Path(out).with_suffix(".json"), record)
    return record


def _save(path: Path, array: np.ndarray) -> None:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array)
    atomic_write_bytes(path, buffer.getvalue())


def _done(path: Path, **expected) -> bool:
    record = read_json_or_none(path.with_suffix(".json"))
    return bool(record) and path.is_file() and all(record.get(k) == v for k, v in expected.items())


def run_near_dedup(engine: Engine, parts: list[Path], total_rows: int, settings: NearDedupSettings, work: Path,
                   say=None) -> tuple[Path, Path, dict]:
    """The three task steps (finished tasks of a killed run reused), then the clusters. Returns (the removed
    positions, sorted int64 .npy; every position's cluster size, int32 .npy, 0 where removed; counts)."""
    say = say or (lambda message: None)
    folder = make_folder(work / "near-dedup")
    options = asdict(settings)
    signatures = [folder / f"signatures-{i:05d}.npy" for i in range(len(parts))]
    todo = [(str(p), options, str(out)) for p, out in zip(parts, signatures) if not _done(out, settings=options)]
    say(f"near-duplicates: signatures of {total_rows:,} documents ({settings.bands} bands x {settings.rows} rows)")
    list(engine.map(signature_task, todo))
    buckets = [folder / f"pairs-band{b:03d}.npy" for b in range(settings.bands)]
    list(engine.map(bucket_task, [([str(p) for p in signatures], b, str(out)) for b, out in enumerate(buckets)
                                  if not _done(out, band=b)]))
    candidates = np.unique(np.concatenate([np.load(p) for p in buckets] + [np.zeros((0, 2), np.int64)]), axis=0)
    _save(folder / "candidates.npy", candidates)
    slices = [(lo, min(lo + PAIRS_PER_TASK, len(candidates))) for lo in range(0, len(candidates), PAIRS_PER_TASK)]
    checked = [folder / f"checked-{lo:012d}.npy" for lo, _ in slices]
    say(f"near-duplicates: checking {len(candidates):,} candidate pairs' Jaccard")
    list(engine.map(check_task, [([str(p) for p in parts], str(folder / "candidates.npy"), lo, hi, options, str(out))
                                 for (lo, hi), out in zip(slices, checked) if not _done(out, lo=lo, hi=hi)]))
    edges = np.concatenate([np.load(p) for p in checked] + [np.zeros((0, 2), np.int64)])
    removed, sizes, counts = clusters(edges, total_rows)
    counts.update(candidate_pairs=len(candidates), checked_pairs=len(edges))
    _save(folder / "removed.npy", removed)
    _save(folder / "cluster_sizes.npy", sizes)
    return folder / "removed.npy", folder / "cluster_sizes.npy", counts


def clusters(edges: np.ndarray, total_rows: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """Connected components of the checked pairs: each kept at its first position (the earliest in input order,
    the exact dedup's rule too), the others removed; (removed positions, sizes at kept positions, counts)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(len(edges), np.int8), (edges[:, 0], edges[:, 1])), shape=(total_rows, total_rows))
    _, labels = connected_components(graph, directed=False)
    first = np.full(labels.max() + 1 if total_rows else 0, total_rows, dtype=np.int64)
    np.minimum.at(first, labels, np.arange(total_rows))
    size = np.bincount(labels, minlength=len(first)).astype(np.int32)
    kept = first[labels] == np.arange(total_rows)
    sizes = np.where(kept, size[labels], 0).astype(np.int32)
    removed = np.flatnonzero(~kept).astype(np.int64)
    return removed, sizes, {"clusters": int((size > 1).sum()), "removed": len(removed),
                            "largest_cluster": int(size.max()) if len(size) else 0}
