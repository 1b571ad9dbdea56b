"""prepare-corpus --near-dedup: MinHash-LSH over word n-grams, every candidate pair checked by its true Jaccard,
clusters joined, one document kept per cluster (the first in input order) with the cluster's size.

Steps, each a set of deterministic tasks writing their own files (so workers, engine and a killed run's resume
never change a byte): one signature task per part (each document's band hashes), one bucket task per band
(documents sharing a band hash become candidate pairs, each with the bucket's first), one check task per slice of
the pairs (the pair's true Jaccard over its shingles, recomputed from the text), then the components in the main
process (scipy's connected components: 4 bytes a document and 16 a checked pair)."""
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from bertkit.fileio import atomic_write_json, atomic_write_npy, make_folder
from bertkit.formats import CorpusColumns as C
from bertkit.pipelines.engine import Engine, finished
from bertkit.pipelines.words import MASK32, VERSION, batch_words, ngrams32

PAIRS_PER_TASK = 200_000    # checks per task: a few seconds to a minute each
CHUNK = 8192                # shingles hashed at once (112 x 8192 x 4 bytes: fastest of 2k-16k, measured)
HASHES = 2                  # of the hash functions: a killed run's signatures made with others are made again


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


def batch_shingles(texts: list[str], ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """Every text's distinct shingles, the 32-bit hashes of its word n-grams (a text of fewer words: itself whole, as
    one), as (text, hash) pairs sorted by text then hash."""
    found = batch_words(texts)
    return word_shingles(found.hashes, found.text, len(texts), ngram)


def word_shingles(hashed: np.ndarray, text: np.ndarray, texts: int, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """batch_shingles of texts given by their words' hashes and each word's text (in order)."""
    counts = np.bincount(text, minlength=texts)
    first_word = np.r_[0, np.cumsum(counts)[:-1]]
    grams = ngrams32(hashed, ngram)
    inside = np.flatnonzero(text[: len(grams)] == text[ngram - 1:])
    owners, values = [text[inside]], [grams[inside]]
    for short in range(1, ngram):
        fewer = np.flatnonzero(counts == short)
        owners.append(fewer)
        values.append(ngrams32(hashed, short)[first_word[fewer]] if len(fewer) else np.zeros(0, np.uint64))
    keys = np.sort((np.concatenate(owners).astype(np.uint64) << np.uint64(32)) | np.concatenate(values))
    keys = keys[np.r_[True, keys[1:] != keys[:-1]]] if len(keys) else keys   # (np.unique: slower)
    return (keys >> np.uint64(32)).astype(np.int64), keys & MASK32


def shingles(text: str, ngram: int) -> np.ndarray:
    return batch_shingles([text], ngram)[1].astype(np.uint32)


def hash_functions(settings: NearDedupSettings) -> tuple[np.ndarray, np.ndarray]:
    """(a x + b) mod 2**32 with odd a: a permutation of the 32-bit shingle hashes (themselves word polynomials) per
    hash function, in 32-bit arithmetic that numpy runs on vector registers (64-bit multiplies it cannot)."""
    rng = np.random.default_rng(settings.seed)
    a = rng.integers(0, 2 ** 31, settings.num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    return a, rng.integers(0, 2 ** 32, settings.num_perm, dtype=np.uint32)


def _bands(signatures: np.ndarray, settings: NearDedupSettings) -> np.ndarray:
    """(documents, num_perm) signatures -> (documents, bands): each band's values hashed to one uint64 (wrapping:
    a collision only adds a candidate to check)."""
    rows = signatures[:, : settings.bands * settings.rows].reshape(len(signatures), settings.bands, settings.rows)
    out = np.zeros((len(signatures), settings.bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(settings.rows):
            out = (out ^ rows[:, :, k]) * np.uint64(0x9E3779B97F4A7C15)
    return out


def _permuted(x: np.ndarray, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """(a x + b) mod 2**32 for every hash function (rows) and shingle x (columns), in place in out: rows of
    shingles are long runs for numpy's loops, and no temporaries (both twice as fast)."""
    np.multiply(a[:, None], x[None, :], out=out)
    return np.add(out, b[:, None], out=out)


def _minhash(x: np.ndarray, a: np.ndarray, b: np.ndarray, buffer: np.ndarray | None = None) -> np.ndarray:
    buffer = np.empty((len(a), CHUNK), np.uint32) if buffer is None else buffer
    signature = np.full(len(a), 2 ** 32, dtype=np.uint64)   # no shingle: above every hash
    for start in range(0, len(x), buffer.shape[1]):   # bounded temporary memory for long documents
        chunk = x[start:start + buffer.shape[1]].astype(np.uint32)
        signature = np.minimum(signature, _permuted(chunk, a, b, buffer[:, :len(chunk)]).min(1))
    return signature


def band_hashes(shingle_set: np.ndarray, a: np.ndarray, b: np.ndarray, settings: NearDedupSettings) -> np.ndarray:
    """One document's MinHash signature cut into bands, each band hashed (batch_band_hashes gives the same)."""
    return _bands(_minhash(shingle_set, a, b)[None, :], settings)[0]


def batch_band_hashes(texts: list[str], a: np.ndarray, b: np.ndarray, settings: NearDedupSettings) -> np.ndarray:
    """band_hashes(shingles(text)) of every text at once: one numpy pass over the batch's words and shingles."""
    found = batch_words(texts)
    return word_band_hashes(found.hashes, found.text, len(texts), a, b, settings)


def word_band_hashes(hashed: np.ndarray, text: np.ndarray, texts: int, a: np.ndarray, b: np.ndarray,
                     settings: NearDedupSettings) -> np.ndarray:
    """batch_band_hashes of texts given by their words' hashes and each word's text."""
    owner, x = word_shingles(hashed, text, texts, settings.ngram)
    signatures = np.full((texts, settings.num_perm), 2 ** 32, dtype=np.uint64)
    first = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]]) if len(owner) else np.zeros(0, np.int64)
    docs = owner[first]
    bounds, buffer, x = np.r_[first, len(x)], np.empty((len(a), CHUNK), np.uint32), x.astype(np.uint32)
    i = 0
    while i < len(docs):   # groups of whole documents, up to CHUNK shingles each (in the cache)
        j = min(max(i + 1, int(np.searchsorted(bounds, bounds[i] + CHUNK, side="right")) - 1), len(docs))
        lo, hi = bounds[i], bounds[j]
        if hi - lo > CHUNK:   # one long document, in pieces
            signatures[docs[i]] = _minhash(x[lo:hi], a, b, buffer)
        else:
            values = _permuted(x[lo:hi], a, b, buffer[:, :hi - lo])
            signatures[docs[i:j]] = np.minimum.reduceat(values, bounds[i:j] - lo, axis=1).T
        i = j
    return _bands(signatures, settings)


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
    return write_signatures(out, hashes, s)


def write_signatures(out: str, hashes: list[np.ndarray], s: NearDedupSettings) -> dict:
    table = np.concatenate(hashes) if hashes else np.zeros((0, s.bands), np.uint64)
    atomic_write_npy(Path(out), table)
    record = {"rows": len(table), "settings": asdict(s), "words": VERSION, "hashes": HASHES}
    atomic_write_json(Path(out).with_suffix(".json"), record)
    return record


def signature_files(work: Path, parts: int) -> list[Path]:
    return [work / "near-dedup" / f"signatures-{i:05d}.npy" for i in range(parts)]


def signatures_done(out: Path, settings: NearDedupSettings) -> bool:
    return finished(out, settings=asdict(settings), words=VERSION, hashes=HASHES)


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
    atomic_write_npy(Path(out), pairs)
    record = {"band": band, "pairs": len(pairs)}
    atomic_write_json(Path(out).with_suffix(".json"), record)
    return record


class PartTexts:
    """Documents by position (their row in the parts in input order), read from the memory-mapped parts. Each call
    maps the parts it needs and lets them go: a task's memory does not grow with the corpus as it reads."""

    def __init__(self, parts: list[str], rows: list[int]):
        self.parts, self.starts = parts, np.cumsum([0] + list(rows))   # rows: each part's, as its signatures hold

    def texts(self, positions: np.ndarray) -> list[str]:
        """The documents at these sorted positions, each as one text."""
        part_of = np.searchsorted(self.starts, positions, side="right") - 1
        found = []
        for part in np.unique(part_of).tolist():
            wanted, start = positions[part_of == part] - self.starts[part], 0
            with pa.memory_map(self.parts[part], "r") as source:
                for batch in pa.ipc.open_stream(source):   # each batch's rows taken from it: nothing else copied
                    mine = wanted[(wanted >= start) & (wanted < start + batch.num_rows)] - start
                    if len(mine):
                        found += [_text(x) for x in batch.column(C.SENTENCES).take(mine).to_pylist()]
                    start += batch.num_rows
        return found


def check_task(parts: list[str], rows: list[int], pairs_file: str, lo: int, hi: int, settings: dict,
               out: str) -> dict:
    """Task: pairs lo..hi of the candidate list, kept when their shingle sets' Jaccard reaches the threshold."""
    s = NearDedupSettings(**settings)
    pairs = np.asarray(np.load(pairs_file, mmap_mode="r")[lo:hi])
    texts = PartTexts(parts, rows)
    keep = np.zeros(len(pairs), bool)
    for start in range(0, len(pairs), 1024):   # a batch of pairs: their documents' shingles found at once
        chunk = pairs[start:start + 1024]
        positions = np.unique(chunk)
        owner, x = batch_shingles(texts.texts(positions), s.ngram)
        keep[start:start + len(chunk)] = pair_jaccard(owner, x, np.searchsorted(positions, chunk),
                                                      len(positions)) >= s.threshold
    atomic_write_npy(Path(out), pairs[keep] if len(pairs) else np.zeros((0, 2), np.int64))
    record = {"lo": lo, "hi": hi, "kept": int(keep.sum())}
    atomic_write_json(Path(out).with_suffix(".json"), record)
    return record


def pair_jaccard(owner: np.ndarray, x: np.ndarray, pairs: np.ndarray, texts: int) -> np.ndarray:
    """Each pair's Jaccard, the pair naming two texts of batch_shingles's (owner, x): the shingles of both sides
    keyed by the pair and sorted, a key found twice is in both sets. 0 for two empty sets (texts without a word are
    not duplicates of each other: two equal ones are the exact dedup's)."""
    bounds = np.searchsorted(owner, np.arange(texts + 1))
    size = np.diff(bounds)
    keys = []
    for side in (0, 1):
        lengths = size[pairs[:, side]]
        place = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths - bounds[pairs[:, side]], lengths)
        keys.append((np.repeat(np.arange(len(pairs)), lengths).astype(np.uint64) << np.uint64(32)) | x[place])
    ordered = np.sort(np.concatenate(keys))
    both = ordered[1:][ordered[1:] == ordered[:-1]] >> np.uint64(32)
    common = np.bincount(both.astype(np.int64), minlength=len(pairs))
    union = size[pairs[:, 0]] + size[pairs[:, 1]] - common
    return np.where(union > 0, common / np.maximum(union, 1), 0.0)


def run_near_dedup(engine: Engine, parts: list[Path], total_rows: int, settings: NearDedupSettings, work: Path,
                   say=None) -> tuple[Path, Path, dict]:
    """The three task steps (finished tasks of a killed run reused), then the clusters. Returns (the removed
    positions, sorted int64 .npy; (position, size) of each cluster's kept document, an (n, 2) int64 .npy; counts)."""
    say = say or (lambda message: None)
    folder = make_folder(work / "near-dedup")
    options = asdict(settings)
    signatures = signature_files(work, len(parts))
    todo = [(str(p), options, str(out)) for p, out in zip(parts, signatures) if not signatures_done(out, settings)]
    say(f"near-duplicates: signatures of {total_rows:,} documents ({settings.bands} bands x {settings.rows} rows)")
    list(engine.map(signature_task, todo))
    buckets = [folder / f"pairs-band{b:03d}.npy" for b in range(settings.bands)]
    list(engine.map(bucket_task, [([str(p) for p in signatures], b, str(out)) for b, out in enumerate(buckets)
                                  if not finished(out, band=b)]))
    candidates = np.unique(np.concatenate([np.load(p) for p in buckets] + [np.zeros((0, 2), np.int64)]), axis=0)
    atomic_write_npy(folder / "candidates.npy", candidates)
    slices = [(lo, min(lo + PAIRS_PER_TASK, len(candidates))) for lo in range(0, len(candidates), PAIRS_PER_TASK)]
    checked = [folder / f"checked-{lo:012d}.npy" for lo, _ in slices]
    say(f"near-duplicates: checking {len(candidates):,} candidate pairs' Jaccard")
    rows = [int(json.loads(p.with_suffix(".json").read_text())["rows"]) for p in signatures]   # counted once
    list(engine.map(check_task, [([str(p) for p in parts], rows, str(folder / "candidates.npy"), lo, hi, options,
                                  str(out)) for (lo, hi), out in zip(slices, checked)
                                 if not finished(out, lo=lo, hi=hi)]))
    edges = np.concatenate([np.load(p) for p in checked] + [np.zeros((0, 2), np.int64)])
    removed, heads, counts = clusters(edges, total_rows)
    counts.update(candidate_pairs=len(candidates), checked_pairs=len(edges))
    atomic_write_npy(folder / "removed.npy", removed)
    atomic_write_npy(folder / "cluster_sizes.npy", heads)
    return folder / "removed.npy", folder / "cluster_sizes.npy", counts


def clusters(edges: np.ndarray, total_rows: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """Connected components of the checked pairs: each kept at its first position (the earliest in input order,
    the exact dedup's rule too), the others removed; (removed positions, (position, size) of each cluster's kept
    document: every other position's size is 1, counts). Memory: the positions the pairs name, not the corpus."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    nodes = np.unique(edges)   # sorted positions
    pairs = np.searchsorted(nodes, edges)
    graph = coo_matrix((np.ones(len(pairs), np.int8), (pairs[:, 0], pairs[:, 1])), shape=(len(nodes), len(nodes)))
    _, labels = connected_components(graph, directed=False)
    _, first, size = np.unique(labels, return_index=True, return_counts=True)   # first: each cluster's earliest
    kept = first[labels] == np.arange(len(nodes))
    big = kept & (size[labels] > 1)
    heads = np.stack([nodes[big], size[labels[big]]], axis=1).astype(np.int64).reshape(-1, 2)
    removed = nodes[~kept].astype(np.int64)
    return removed, heads, {"clusters": len(heads), "removed": len(removed),
                            "largest_cluster": int(size.max()) if len(size) else int(total_rows > 0)}
