"""prepare-corpus: raw text files -> cleaned, sentence-split, deduplicated documents in Arrow shards.

How it runs (and why it is byte-identical for any --workers or --engine and resumable after a kill):
  1. Each input file is one task (pipelines/engine.py runs them: in this process, a local pool, or on a Ray
     cluster). A task streams its file (bounded memory), cleans and splits its documents and writes them to
     OUT/.work/part-NNNNN.arrow, then OUT/.work/part-NNNNN.json with the file's counts. Both are written
     atomically; the .json marks the part done, so a restarted run redoes only unfinished files.
  2. Duplicates are found by P partition tasks (pipelines/dedup.py), recorded in OUT/.work/dedup-PPPPP-ppppp.npy.
  3. The main process merges the parts strictly in input order (pipelines/corpus_merge.py): skips the recorded
     duplicates, sends each document to train or holdout by a hash of its text, cuts shards of --shard-size. After
     a kill the merge is simply redone from the parts (it is cheap next to segmentation); shard files are
     deterministic, so rewriting them changes nothing.
  4. manifest.json is written with "complete": true, then OUT/.work is removed.
A document's cleaning and sentences are pipelines/sentences.py's; the input formats, pipelines/corpus_readers.py's.
"""
import math
import os
import re
import socket
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import pyarrow as pa

from bertkit import __version__
from bertkit.fileio import (
    FolderNotOwnedError,
    atomic_write_json,
    disk_errors,
    file_matches,
    folder_lock,
    read_json_or_none,
)
from bertkit.formats import (
    CORPUS_SCHEMA,
    MANIFEST,
    REMOVED_SCHEMA,
    CorpusColumns as C,
    CorpusError,
    CorpusManifest,
    ShardEntry,
    corpus_schema,
    corpus_shards,
    read_corpus_manifest,
    write_manifest,
)
from bertkit.pipelines import corpus_readers as readers, language, pii, quality
from bertkit.pipelines.corpus_merge import Merger
from bertkit.pipelines.decontaminate import EvaluationFileError, load_evaluation, run_decontamination
from bertkit.pipelines.dedup import ROWS_PER_PARTITION, run_dedup
from bertkit.pipelines.engine import Engine, check_available, check_engine, check_shared_path
from bertkit.pipelines.kept_words import run_both
from bertkit.pipelines.near_dedup import run_near_dedup
from bertkit.pipelines.sentences import build_sentences, check_splitter, clean_text, cleaned_lines, document_id

# the shards' columns, the language identified (--languages), the signals judged by (--filters) and the text's bytes
# (for shard cuts)
PART_SCHEMA = CORPUS_SCHEMA.append(pa.field(C.LANGUAGE, pa.string(), nullable=True)).append(
    pa.field(C.SIGNALS, pa.list_(pa.float64()), nullable=True)).append(pa.field("nbytes", pa.int64(), nullable=False))
# --keep-removed: what an input file's own steps took out, and why
REMOVED_PART_SCHEMA = REMOVED_SCHEMA.append(pa.field("nbytes", pa.int64(), nullable=False))
PART_BATCH_ROWS = 1000
SHARD_NAME = re.compile(r"^(shard|holdout)-\d{5}\.arrow$")
LISTED_SHARD = re.compile(r"(?:shard|holdout)-\d{5}\.arrow|removed/removed-\d{5}\.arrow")   # a manifest's names


@dataclass
class CorpusConfig:
    format: str = "auto"           # auto | wikiextractor | lines | paragraphs | jsonl | parquet | arrow
    text_field: str = "text"       # JSON Lines field / Parquet or Arrow column holding the text
    split: str = "train"           # a 🤗 DatasetDict saved with save_to_disk: the split read
    language: str = "auto"         # sentencex language code, or auto (per document: Hangul -> ko, kana -> ja, else en)
    splitter: str = "sentencex"    # sentencex | kss | kiwi (the last two for Korean documents; pipelines/sentences.py)
    min_chars: int = 50            # drop documents with fewer characters (sentences joined)
    min_sentences: int = 1         # drop documents with fewer sentences
    holdout: float = 0.01          # fraction of documents in the held-out split, chosen by a hash of the text
    shard_size: int = 64 << 20     # bytes of text per shard (approximate; a shard ends after the row crossing it)
    workers: int = 1               # processes (--engine local); the output does not depend on it
    engine: str = "local"          # local | ray: where the tasks run; the output does not depend on it
    ray_address: str | None = None  # --engine ray: head node host:port; None: a reachable cluster, else a local one
    dedup_partitions: int | None = None  # dedup tasks; None: one per 4 M documents. Never changes the output
    near_dedup: bool = False       # also remove near-duplicates (MinHash-LSH, pipelines/near_dedup.py)
    near_dedup_threshold: float = 0.8   # Jaccard of word 5-gram sets at which two documents are one
    near_dedup_bands: str | None = None  # "BxR" (e.g. datatrove's 14x8); None: chosen for the threshold
    pii: str = "keep"              # keep | redact | drop: personal data (pipelines/pii.py)
    keep_removed: bool = False     # the documents taken out, with why, in OUT/removed/ (never read by a stage)
    filters: str = "none"          # none | gopher | fineweb | fineweb2 | a rules file (pipelines/quality.py)
    languages: list = field(default_factory=list)   # keep only these (ISO 639-1: ko, en); [] keeps all, unjudged
    language_score: float = 0.5    # the identifier's least probability for a document kept (pipelines/language.py)
    decontaminate: tuple = ()      # evaluation files whose 13-grams are kept out (pipelines/decontaminate.py)
    decontaminate_mode: str = "sentences"   # sentences | documents: what goes where one is found
    decontaminate_max_docs: int = 10        # an n-gram in more documents than this is a common phrase, kept
    overwrite: bool = False        # replace an existing output (or unfinished run) made with other options
    strict: bool = False           # fail (after writing the output) if any input had a problem
    progress: bool = True          # tqdm bar on stderr

    def __post_init__(self):
        if self.format not in readers.FORMATS:
            raise ValueError(f"format must be one of {', '.join(readers.FORMATS)}, not {self.format!r}")
        if not 0.0 <= self.holdout < 1.0:
            raise ValueError(f"holdout must be in [0, 1), not {self.holdout}")
        if self.shard_size < 1024 or self.shard_size > (1 << 30):
            raise ValueError(f"shard_size must be between 1 KB and 1 GB, not {self.shard_size}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, not {self.workers}")
        check_engine(self.engine)
        check_splitter(self.splitter)
        if self.dedup_partitions is not None and self.dedup_partitions < 1:
            raise ValueError(f"dedup_partitions must be >= 1, not {self.dedup_partitions}")
        if self.min_chars < 0 or self.min_sentences < 0:
            raise ValueError("min_chars and min_sentences must be >= 0")
        self.decontaminate = [str(p) for p in self.decontaminate]   # as JSON gives it back: a resume compares
        if isinstance(self.languages, str):   # the flag's "ko,en"
            self.languages = self.languages.split(",")
        self.languages = [str(x).strip() for x in self.languages if str(x).strip()]
        if not 0.0 <= self.language_score <= 1.0:
            raise ValueError(f"language_score must be in [0, 1], not {self.language_score}")
        if self.decontaminate_mode not in ("sentences", "documents"):
            raise ValueError(f"decontaminate_mode must be sentences or documents, not {self.decontaminate_mode!r}")
        if self.filters != "none":
            quality.load_rules(self.filters)   # a preset, or a rules file that reads: said before anything runs
        if self.pii not in pii.MODES:
            raise ValueError(f"pii must be one of {', '.join(pii.MODES)}, not {self.pii!r}")
        if not 0.0 < self.near_dedup_threshold <= 1.0:
            raise ValueError(f"near_dedup_threshold must be in (0, 1], not {self.near_dedup_threshold}")
        self.near_dedup_settings()   # a bad --near-dedup-bands is said before anything runs

    def near_dedup_settings(self):
        from bertkit.pipelines.near_dedup import NearDedupSettings

        if self.near_dedup_bands is None:
            return NearDedupSettings.for_threshold(self.near_dedup_threshold)
        m = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", str(self.near_dedup_bands))
        if not m or int(m[1]) < 1 or int(m[2]) < 1 or int(m[1]) * int(m[2]) > 1024:
            raise ValueError(f"near_dedup_bands must be BANDSxROWS with at most 1,024 hashes (e.g. 14x8), not "
                             f"{self.near_dedup_bands!r}")
        bands, rows = int(m[1]), int(m[2])
        return NearDedupSettings(self.near_dedup_threshold, 5, bands * rows, bands, rows)

    def output_options(self) -> dict:
        """The options that change the output; a resumed run must use the same ones."""
        skip = {"workers", "engine", "ray_address", "dedup_partitions", "overwrite", "strict", "progress"}
        # the quality steps only when on: a corpus made before they existed keeps its fingerprint (and is "already
        # complete" to the same command)
        if not self.near_dedup:
            skip |= {"near_dedup", "near_dedup_threshold", "near_dedup_bands"}
        if self.pii == "keep":
            skip.add("pii")
        if self.filters == "none":
            skip.add("filters")
        if not self.languages:
            skip |= {"languages", "language_score"}
        if not self.keep_removed:
            skip.add("keep_removed")
        if self.split == "train":
            skip.add("split")
        if not self.decontaminate:
            skip |= {"decontaminate", "decontaminate_mode", "decontaminate_max_docs"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}


def parse_size(text) -> int:
    """'64MB', '512KiB', '1G', '100000' -> bytes (decimal and binary units both mean powers of 1024 here)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*", str(text).lower())
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 64MB, 512KB, 1GB)")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


# ------------------------------------------------------------------------------------------ one input file (worker)

_report = None  # where a task reports (bytes read, documents kept): a pool worker's queue, or the bar in-process


def _init_worker(queue):
    global _report
    _report = queue.put
    try:  # Linux: die with the main process, so a killed run leaves no worker behind to race the resumed one
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _PartWriter:
    """Streams one file's documents to an Arrow IPC stream file; renamed into place only when complete."""

    def __init__(self, path: Path, schema: pa.Schema = PART_SCHEMA):
        # a per-process temp name: two processes on the same part (a straggler of a killed run, a Ray retry on
        # another node) never mix bytes
        self.path, self.schema = path, schema
        self.tmp = path.with_name(f"{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
        self.sink = pa.OSFile(str(self.tmp), "wb")
        self.writer = pa.ipc.new_stream(self.sink, schema)
        self.rows = {name: [] for name in schema.names}

    def add(self, *values):
        """One document: the schema's columns' values, in order."""
        for name, value in zip(self.schema.names, values):
            self.rows[name].append(value)
        if len(self.rows[C.ID]) >= PART_BATCH_ROWS:
            self.flush()

    def flush(self):
        if self.rows[C.ID]:
            arrays = [pa.array(self.rows[f.name], type=f.type) for f in self.schema]  # (pa.record_batch(dict)
            self.writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self.schema))  # imports pandas)
            self.rows = {name: [] for name in self.schema.names}

    def close(self):
        self.flush()
        self.writer.close()
        self.sink.close()
        os.replace(self.tmp, self.path)


def removed_part(part: Path) -> Path:
    return part.with_name(part.stem + ".removed.arrow")


def file_fingerprint(path: Path) -> dict:
    st = path.stat()
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def process_file(index: int, path: str, source: str, options: dict, part: str) -> dict:
    """Worker task: one input file -> part file + counts. Never raises for bad input: the error goes in the counts."""
    config = CorpusConfig(**options)
    path, part = Path(path), Path(part)
    problems = readers.Problems(source)
    stats = {"index": index, "source": source, "path": str(path), "format": None, "compression": None,
             "fingerprint": {"bytes": 0, "mtime_ns": 0}, "documents_read": 0, "documents": 0, "sentences": 0,
             "replaced_bytes": 0, "dropped": {}, "removed_lines": {}, "pii": {}, "languages": {}, "error": None}
    writer = _PartWriter(part)
    removed = _PartWriter(removed_part(part), REMOVED_PART_SCHEMA) if config.keep_removed else None
    reported = [0, 0, time.monotonic()]  # bytes, docs, time of the last progress report

    def report(position: int, final: bool = False):
        now = time.monotonic()
        if final or now - reported[2] > 0.2:
            delta = (position - reported[0], stats["documents"] - reported[1])
            reported[:] = [position, stats["documents"], now]
            if _report is not None:
                _report(delta)

    raw_file, decode = None, readers.LineDecoder(problems)
    try:
        stats["fingerprint"] = file_fingerprint(path)
        docs, raw_file = _documents(path, config, stats, problems, decode)

        def keep_or_drop(batch):
            lines = [cleaned_lines(raw) for raw in batch]
            signals = _signals_of(batch, lines, config)   # (before build_sentences: it may take a line out)
            sentences = [build_sentences(raw, config.language, config.splitter, stats["removed_lines"], cleaned)
                         for raw, cleaned in zip(batch, lines)]
            worth = pii.worth_a_look(sentences) if config.pii != "keep" else [None] * len(batch)
            for raw, kept, found, look in zip(batch, sentences, signals, worth):
                _keep_or_drop(raw, kept, config, stats, writer, source, removed, found, look)
            stats["documents_read"] += len(batch)
            if raw_file is not None:
                report(raw_file.tell())

        _in_batches(docs, keep_or_drop)
    except readers.InputError as e:
        stats["error"] = f"{source}: {e}"
    except FileNotFoundError:
        stats["error"] = f"{source}: disappeared while the run was going ({path})"
    except PermissionError as e:
        stats["error"] = f"{source}: cannot be read ({e.strerror}); fix its permissions"
    except readers.STREAM_ERRORS as e:  # truncated or corrupt compressed stream, I/O error mid-file
        line = f" at line {decode.line}" if stats["format"] not in ("parquet", "arrow") else ""
        stats["error"] = (f"{source}: reading stopped{line}: {e}. Kept the {stats['documents']} complete "
                          f"document(s) before it; the file looks truncated or corrupt")
    except Exception as e:  # a bug must not cost the other files' output; it is reported as this file's error
        stats["error"] = f"{source}: internal error {type(e).__name__}: {e} (please report it)"
    finally:
        stats["replaced_bytes"] = decode.replaced
        if raw_file is not None:
            raw_file.close()
    _close_part(stats, problems, writer, removed)
    report(stats["fingerprint"]["bytes"], final=True)
    atomic_write_json(part.with_suffix(".json"), stats)
    return stats


def _close_part(stats: dict, problems, writer: "_PartWriter", removed: "_PartWriter | None") -> None:
    """The part (and its removed documents) closed, the file's reading problems counted as drops."""
    writer.close()
    if removed is not None:
        removed.close()
    for kind, n in problems.counts.items():
        if kind in ("bad_json", "missing_field", "outside_doc", "bad_row"):
            stats["dropped"][kind] = stats["dropped"].get(kind, 0) + n
    stats["problems"] = problems.counts
    stats["messages"] = problems.messages


def _documents(path: Path, config: CorpusConfig, stats: dict, problems, decode) -> tuple:
    """(the file's RawDocs as they are read, the open raw file or None): its format detected or given."""
    compression = readers.compression_of(path)
    head = readers.sniff(path, compression)
    fmt = readers.detect_format(path, compression, head) if config.format == "auto" else config.format
    stats["format"], stats["compression"] = fmt, compression
    if fmt in ("parquet", "arrow"):
        return readers.read_table(path, fmt, compression, problems, config.text_field), None
    readers.check_text(head, path.name)
    stream, raw_file = readers.open_binary(path, compression)
    lines = readers.text_lines(stream, problems, decode)
    if fmt == "wikiextractor":
        return readers.read_wikiextractor(lines, problems, decode), raw_file
    if fmt == "jsonl":
        return readers.read_jsonl(lines, problems, decode, config.text_field), raw_file
    if fmt in ("csv", "tsv"):
        return readers.read_delimited(lines, problems, decode, config.text_field, "," if fmt == "csv" else "\t"), \
            raw_file
    return readers.read_blocks(lines, "lines" if fmt == "lines" else "join", problems, decode), raw_file


def _in_batches(docs, handle, size: int = 128) -> None:
    """handle(batch) for every `size` documents read (the quality signals are found a batch at a time); the
    documents read before a reading error are handled too, as one at a time would have kept them."""
    pending = []
    try:
        for raw in docs:
            pending.append(raw)
            if len(pending) == size:
                batch, pending = pending, []
                handle(batch)
    finally:
        if pending:
            handle(pending)


def _signals_of(batch: list, lines: list, config: CorpusConfig) -> list:
    """Each document's quality signals under --filters: brought by a corpus given as input, else found from its
    cleaned lines (all of the batch's at once); None without --filters."""
    if config.filters == "none":
        return [None] * len(batch)
    todo = [i for i, raw in enumerate(batch) if raw.signals is None]
    found = quality.batch_signals([lines[i] for i in todo])
    signals = [raw.signals for raw in batch]
    for i, one in zip(todo, found):
        signals[i] = one
    return signals


def _keep_or_drop(raw, sentences: list[str], config: CorpusConfig, stats: dict, writer: "_PartWriter", source: str,
                  removed: "_PartWriter | None", found_signals: dict | None, worth: set[int] | None) -> None:
    """A document (its sentences given, and the ones worth a look for personal data) to the part, or its reason for
    being dropped counted (and with --keep-removed the document kept apart, with its reason)."""
    sentences, found_language, signals, reason = _cleaned(sentences, found_signals, config, stats, worth)
    if reason is None:
        reason = "empty" if not sentences else "too_short" if sum(len(x) for x in sentences) < config.min_chars \
            else "too_few_sentences" if len(sentences) < config.min_sentences else None
    title = clean_text(raw.title) if raw.title else None
    nbytes = sum(len(x.encode("utf-8")) for x in sentences) + 4 * len(sentences)
    if reason:
        stats["dropped"][reason] = stats["dropped"].get(reason, 0) + 1
        if removed is not None and sentences:
            removed.add(document_id(sentences), source, title or None, sentences, reason, signals, nbytes)
        return
    writer.add(document_id(sentences), source, title or None, sentences, found_language, signals, nbytes)
    stats["documents"] += 1
    stats["sentences"] += len(sentences)


def _cleaned(sentences: list, found: dict | None, config: CorpusConfig, stats: dict, worth: set[int] | None) -> tuple:
    """(sentences, language identified, signals as stored, reason to drop or None) after --languages, --filters
    (by the document's signals, `found`) and --pii, each counted; a document dropped for its personal data keeps
    them redacted, even in removed/."""
    found_language = signals = None
    if config.languages and sentences:
        found_language, score = language.identify(" ".join(sentences))
        stats["languages"][found_language] = stats["languages"].get(found_language, 0) + 1
        if found_language not in config.languages or score < config.language_score:
            return sentences, found_language, None, "language"
    if config.filters != "none" and sentences:
        signals = quality.pack(found)
        rule = quality.failed_rule(found, quality.load_rules(config.filters))
        if rule:
            return sentences, found_language, signals, f"quality_{rule}"
    if config.pii != "keep" and sentences:
        redacted, hits = pii.redact(sentences, worth)
        for kind, n in hits.items():
            stats["pii"][kind] = stats["pii"].get(kind, 0) + n
        if hits and (config.pii == "drop" or sum(hits.values()) > pii.MANY):
            return redacted, found_language, signals, "pii" if config.pii == "drop" else "pii_many"
        sentences = redacted
    return sentences, found_language, signals, None


# ------------------------------------------------------------------------------------------ the stage

def _say(message: str):
    from bertkit.progress import tqdm

    tqdm.write(message, file=sys.stderr)


def prepare_corpus(inputs, out, config: CorpusConfig | None = None) -> CorpusManifest:
    """Run the stage; returns the manifest. Raises CorpusError when the run as a whole fails, FolderLockedError when
    another process writes `out`, DiskError when the disk fails (the same command then resumes)."""
    config = config or CorpusConfig()
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    for path in inputs:
        check_shared_path(path, "input")
    check_shared_path(out, "--out")
    check_available(config.engine)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CorpusError(f"{out}: exists and is not a folder; --out must be a folder")
    with folder_lock(out, "prepare-corpus", _say), \
            disk_errors(out, "free space (or fix the disk), then run the same command again to resume"):
        return _prepare_corpus(inputs, out, config)


def _prepare_corpus(inputs, out: Path, config: CorpusConfig) -> CorpusManifest:
    started = time.time()
    files, input_problems, skipped = find_inputs(inputs, out, config.split)
    try:   # read before OUT is touched: a bad evaluation file is said at once
        evaluation = load_evaluation([Path(p) for p in config.decontaminate]) if config.decontaminate else None
    except EvaluationFileError as e:
        raise CorpusError(str(e)) from None
    # what the output depends on: options and the input files (path, size, mtime); workers are not part of it
    fingerprint = {"options": config.output_options(),
                   "inputs": [[f.source, str(f.path.resolve()), *file_fingerprint(f.path).values()] for f in files]}
    if config.filters not in ("none", *quality.PRESETS):   # a rules file changed is another output
        fingerprint["rules"] = [str(Path(config.filters).resolve()), *file_fingerprint(Path(config.filters)).values()]
    if config.decontaminate:   # an evaluation file changed is another output
        fingerprint["evaluation"] = [[str(Path(p).resolve()), *file_fingerprint(Path(p)).values()]
                                     for p in config.decontaminate]
    if not start_or_resume(out, config, fingerprint):
        _say(f"{out}: already complete with these inputs and options; nothing to do (--overwrite to redo)")
        return read_corpus_manifest(out)
    work = out / ".work"
    parts = [work / f"part-{i:05d}.arrow" for i in range(len(files))]
    results, duplicates, near, clean = process_files(files, parts, config, work, evaluation)
    whole = clean is not None and config.decontaminate_mode == "documents"
    merger = Merger(out, config.holdout, config.shard_size, duplicates, work, near=near[0] if near else None,
                    cluster_sizes=near[1] if near else None,
                    drop_sentences=clean[0] if clean and not whole else None, contaminated=clean[0] if whole else None,
                    languages=bool(config.languages), keep_removed=config.keep_removed,
                    signals=config.filters != "none", on_shard=unfinished_manifest(out, fingerprint))
    for part in parts:
        merger.add_part(part)
    if config.keep_removed:   # the merge's removals first, then each file's own, in input order
        for part in parts:
            if removed_part(part).is_file():
                merger.add_removed_part(removed_part(part))
    entries = merger.close()
    manifest = _manifest(files, results, merger, entries, config, fingerprint, input_problems, skipped, started)
    _account_for_steps(manifest, merger, config, duplicates, near, clean, results)
    return finish(out, manifest, entries, config)


def _account_for_steps(manifest: CorpusManifest, merger: Merger, config: CorpusConfig, duplicates: list, near,
                       clean, results: dict) -> None:
    """The merge's removals split by reason (exact and near duplicates, contamination) and each step's totals."""
    gone = manifest.dropped["duplicate"]   # every document the merge left out, by reason below
    contaminated = merger.contaminated_rows + merger.emptied
    exact = sum(int(np.load(p, mmap_mode="r").shape[0]) for p in duplicates) if near else gone - contaminated
    manifest.dropped["duplicate"] = exact
    if near:
        manifest.dropped["near_duplicate"] = gone - contaminated - exact
        settings = config.near_dedup_settings()
        manifest.totals["near_dedup"] = {"threshold": settings.threshold, "ngram": settings.ngram,
                                         "bands": settings.bands, "rows": settings.rows, **near[2]}
    if config.filters != "none":   # what the signals column holds, in order (a corpus given again as INPUT reads it)
        manifest.totals["signal_names"] = list(quality.SIGNAL_NAMES)
    if config.languages:
        manifest.totals["languages_identified"] = dict(sorted(_summed(results, "languages").items()))
    if clean:
        manifest.dropped["contaminated"] = contaminated
        manifest.totals["decontamination"] = {"mode": config.decontaminate_mode,
                                              "max_docs": config.decontaminate_max_docs,
                                              "sentence_bytes_removed": merger.dropped_bytes, **clean[1]}


def _summed(results: dict, key: str) -> dict:
    total = {}
    for s in results.values():
        for k, v in s.get(key, {}).items():
            total[k] = total.get(k, 0) + v
    return total


def find_inputs(inputs, out: Path, split: str = "train") -> tuple:
    """(input files, problems with the inputs given, documentation and dataset metadata files passed over), each
    said as found."""
    skipped = []
    files, input_problems = readers.expand_inputs(inputs, exclude=out, skipped=skipped, split=split)
    for message in input_problems:
        _say(f"warning: {message}")
    for path in skipped:
        what = "a 🤗 dataset's metadata" if path.name in ("state.json", "dataset_info.json", "dataset_dict.json") \
            else "a documentation file"
        _say(f"skipped {path}: {what}, not corpus text (give it by name to read it)")
    if not files:
        raise CorpusError("no input files to read: " + "; ".join(input_problems or ["no INPUT given"]))
    return files, input_problems, skipped


def start_or_resume(out: Path, config: CorpusConfig, fingerprint: dict) -> bool:
    """The resume decision. False: OUT is already complete with these inputs and options (its shards checked).
    True: the run goes on, resuming an unfinished run of the same fingerprint (its finished parts are kept), or
    from scratch (--overwrite clears OUT's own files first); another run's folder is refused."""
    work, manifest_path = out / ".work", out / MANIFEST
    if (work.exists() or work.is_symlink()) and not _is_our_work(work) and not _empty_folder(work):
        raise FolderNotOwnedError(f"{work}: holds files prepare-corpus did not write, where it keeps an unfinished "
                                  "run's parts; move them away, or give another --out")
    previous = read_json_or_none(manifest_path)  # another stage's folder never gets here (folder_lock refuses it)
    if previous and previous.get("stage") == "prepare-corpus" and previous.get("fingerprint") == fingerprint \
            and previous.get("complete") and not config.overwrite:
        remove_work(work)
        for split in ("train", "holdout"):
            corpus_shards(out, split)  # a damaged shard says so (sizes and rows), and that --overwrite rebuilds it
        return False
    if config.overwrite:
        remove_work(work)
        _remove_listed(out, previous)
        manifest_path.unlink(missing_ok=True)
    else:
        unfinished = read_json_or_none(work / "state.json")
        for what, found in (("an unfinished run", unfinished), ("a finished run", previous)):
            if found and found.get("fingerprint") != fingerprint:
                raise CorpusError(f"{out}: holds {what} with other inputs or options. Use another --out, "
                                  f"or --overwrite to replace it")
        if previous is None and out.is_dir() and any(SHARD_NAME.match(p.name) for p in out.iterdir()):
            raise CorpusError(f"{out}: holds shard files but no manifest.json. Use another --out, or --overwrite")
    work.mkdir(parents=True, exist_ok=True)
    atomic_write_json(work / "state.json", {"fingerprint": fingerprint})
    write_unfinished(out, fingerprint, [])
    return True


def write_unfinished(out: Path, fingerprint: dict, shards: list[dict]) -> None:
    """OUT's manifest while the run goes on: not complete, the shards already in place listed."""
    atomic_write_json(out / MANIFEST, {"stage": "prepare-corpus", "complete": False, "shards": shards,
                                       "fingerprint": fingerprint, "bertkit_version": __version__})


def unfinished_manifest(out: Path, fingerprint: dict):
    """on_shard for the merge: each shard put in place is listed at once in the still unfinished manifest, so an
    --overwrite after a kill mid-merge removes it (only listed files are ever removed)."""
    written = []

    def listed(entry: ShardEntry) -> None:
        written.append(asdict(entry))
        write_unfinished(out, fingerprint, written)
    return listed


def _remove_listed(out: Path, previous: dict | None) -> None:
    """An earlier run's shards (train, holdout, and --keep-removed's removed/): only those its manifest lists, each
    still the file it recorded (size and checksum: a user's file of that name, or one changed since, stays; the new
    run's shards replace theirs by name); removed/ too if that empties it."""
    shards = previous.get("shards") if isinstance(previous, dict) else None
    for shard in shards or []:
        name = str(shard.get("file", "")) if isinstance(shard, dict) else ""
        path = out / name
        if LISTED_SHARD.fullmatch(name) and path.is_file() and not path.is_symlink() and \
                not path.parent.is_symlink() and path.stat().st_size == shard.get("bytes") and \
                isinstance(shard.get("checksum"), str) and file_matches(path, shard["checksum"]):
            path.unlink()
    if _empty_folder(out / "removed"):
        (out / "removed").rmdir()


def _is_our_work(work: Path) -> bool:
    """OUT/.work as start_or_resume makes it: a real folder whose state.json (written first) holds a fingerprint."""
    if work.is_symlink() or not work.is_dir():
        return False
    state = read_json_or_none(work / "state.json")
    return isinstance(state, dict) and "fingerprint" in state


def _empty_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and not any(path.iterdir())


# every name prepare-corpus writes in OUT/.work: its state, per-file parts, dedup partitions, temporary files
WORK_FILE = re.compile(r"state\.json|part-\d{5}\.(arrow|json|removed\.arrow)|dedup-\d{5}-\d{5}\.(npy|json)|.+\.tmp")
# and in OUT/.work/near-dedup/ (pipelines/near_dedup.py)
WORK_FOLDERS = {   # and in its subfolders (pipelines/near_dedup.py, pipelines/decontaminate.py)
    "near-dedup": re.compile(r"(signatures-\d{5}|pairs-band\d{3}|checked-\d{12}|candidates|removed|cluster_sizes)"
                             r"\.(npy|json)|.+\.tmp"),
    "decontaminate": re.compile(r"(matches-\d{5}\.(npy|json)|evaluation\.npz|removed\.npy)|.+\.tmp")}


def remove_work(work: Path) -> None:
    """The files prepare-corpus wrote in OUT/.work (when the folder is ours: a user's of that name stays), its
    state.json last, then the folder if that left it empty: a file of anyone else's there is kept."""
    if _is_our_work(work):
        for name, pattern in WORK_FOLDERS.items():
            sub = work / name
            if sub.is_dir() and not sub.is_symlink():
                for p in sub.iterdir():
                    if p.is_file() and not p.is_symlink() and pattern.fullmatch(p.name):
                        p.unlink(missing_ok=True)
                if _empty_folder(sub):
                    sub.rmdir()
        names = sorted(p.name for p in work.iterdir() if p.is_file() and not p.is_symlink()
                       and WORK_FILE.fullmatch(p.name))
        for name in sorted(names, key=lambda n: n == "state.json"):   # the mark goes last
            (work / name).unlink(missing_ok=True)
    if _empty_folder(work):
        work.rmdir()


class Progress:
    """The stage's bar on stderr: bytes read and documents kept. Tasks report (bytes, documents) through `_report`:
    a local pool's workers into a queue drained here, one process straight in, Ray tasks as each one finishes."""

    def __init__(self, total_bytes: int, enabled: bool, queue=None):
        from bertkit.progress import tqdm

        self.queue, self.docs = queue, 0
        self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc="prepare-corpus",
                        plain=not enabled, file=sys.stderr, dynamic_ncols=True)

    def advance(self, nbytes: int, ndocs: int) -> None:
        self.docs += ndocs
        self.bar.update(nbytes)
        elapsed = max(self.bar.format_dict["elapsed"], 1e-9)
        self.bar.set_postfix_str(f"{self.docs:,} docs, {self.docs / elapsed:,.0f} docs/s", refresh=False)

    def drain(self) -> None:
        while self.queue is not None:
            try:
                self.advance(*self.queue.get_nowait())
            except Exception:  # queue.Empty
                return

    def now(self, what: str) -> None:
        self.bar.set_postfix_str(f"{self.docs:,} docs; {what}")


def process_files(files: list, parts: list[Path], config: CorpusConfig, work: Path,
                  evaluation=None) -> tuple[dict, list[Path], tuple]:
    """Step 1 and 2: every input file not already done becomes its part, then the dedup tasks run (and with
    --near-dedup the near-duplicate tasks). Returns ({file index: its counts}, the dedup tasks' files, and
    (removed positions, cluster sizes, counts) or None)."""
    global _report
    done = {}
    for i, f in enumerate(files):
        meta = read_json_or_none(parts[i].with_suffix(".json"))
        if meta and parts[i].is_file() and meta.get("fingerprint") == file_fingerprint(f.path):
            done[i] = meta
    todo = [i for i in range(len(files)) if i not in done]
    if done:
        _say(f"resuming: {len(done)} of {len(files)} input files already processed")
    args = [(i, str(files[i].path), files[i].source, asdict(config), str(parts[i])) for i in todo]
    # fork where there is one (Linux): workers start in milliseconds and a caller's script needs no
    # `if __name__ == "__main__"` guard. The pool starts (in engine.map) before the progress bar's thread exists.
    import multiprocessing

    context = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    local_pool = config.engine == "local" and config.workers > 1 and len(todo) > 1
    queue = multiprocessing.get_context(context).Queue() if local_pool else None
    progress, results = None, {}
    try:
        with Engine(config.engine, config.workers, config.ray_address) as engine:
            # a Ray task reports when it finishes (the local ones report as they read)
            stream = engine.map(process_file, args, context=context, on_wait=lambda: progress.drain(),
                                on_done=(lambda i, s: progress.advance(s["fingerprint"]["bytes"], s["documents"]))
                                if config.engine == "ray" else None,
                                initializer=_init_worker if local_pool else None, initargs=(queue,))
            progress = Progress(sum(f.path.stat().st_size for f in files), config.progress, queue)
            progress.advance(sum(d["fingerprint"]["bytes"] for d in done.values()),
                             sum(d["documents"] for d in done.values()))
            _report = (lambda delta: progress.advance(*delta)) if config.engine == "local" and not local_pool else None
            for i in range(len(files)):
                results[i] = done[i] if i in done else next(stream)
                for message in results[i].get("messages", []):
                    _say(f"warning: {message}")
                if results[i]["error"]:
                    _say(f"error: {results[i]['error']}")
            progress.drain()
            total_rows = sum(r["documents"] for r in results.values())
            partitions = config.dedup_partitions or max(1, math.ceil(total_rows / ROWS_PER_PARTITION))
            progress.now(f"finding duplicates ({partitions} task(s))")
            duplicates = run_dedup(engine, parts, total_rows, partitions, work)
            near, clean = _near_and_clean(engine, parts, total_rows, config, evaluation, work, progress)
        progress.now("merging")
    finally:
        _report = None
        if progress is not None:
            progress.bar.close()
    return results, duplicates, near, clean


def _near_and_clean(engine: Engine, parts: list[Path], total_rows: int, config: CorpusConfig, evaluation, work: Path,
                    progress: "Progress") -> tuple:
    """--near-dedup's and --decontaminate's steps over the parts: (what each removes, or None where off)."""
    near = clean = None
    if config.near_dedup and evaluation is not None:   # their words found once (pipelines/kept_words.py)
        progress.now("near-duplicate signatures and evaluation n-grams")
        run_both(engine, parts, config.near_dedup_settings(), evaluation, work)
    if config.near_dedup:
        near = run_near_dedup(engine, parts, total_rows, config.near_dedup_settings(), work, progress.now)
    if evaluation is not None:
        progress.now(f"decontaminating against {len(config.decontaminate)} evaluation file(s)")
        clean = run_decontamination(engine, parts, evaluation, config.decontaminate_mode,
                                    config.decontaminate_max_docs, work)
    return near, clean


def finish(out: Path, manifest: CorpusManifest, entries: list, config: CorpusConfig) -> CorpusManifest:
    """manifest.json written last (complete), the work folder removed, the summary said; no document kept, or an
    input problem under --strict, is an error."""
    manifest_path, work = out / MANIFEST, out / ".work"
    written = manifest.totals["documents"]
    if written == 0:  # nothing of value to resume: leave no unfinished run behind to block a corrected retry
        remove_work(work)
        manifest_path.unlink(missing_ok=True)
        reasons = ", ".join(f"{k}: {v}" for k, v in manifest.dropped.items() if v) or "none"
        errors = "; ".join(manifest.errors[:5])
        raise CorpusError(f"no documents were kept (dropped by reason: {reasons}). "
                          f"{'Errors: ' + errors if errors else 'Check --format, --text-field, --min-chars.'}")
    write_manifest(out, manifest)
    remove_work(work)
    _say(_summary(manifest, out))
    if config.holdout > 0 and manifest.totals["holdout_documents"] == 0:
        _say(f"warning: the holdout split is empty ({written} documents x --holdout {config.holdout} < 1)")
    # --strict fails on any input problem: a file that could not be read, and any line or row skipped or repaired
    # in one that could (bad JSON, a missing field, undecodable bytes)
    line_problems = sum(n for i in manifest.inputs for n in (i["problems"] or {}).values())
    if config.strict and (manifest.errors or line_problems):
        raise CorpusError(f"{len(manifest.errors)} unreadable input(s) and {line_problems} problem line(s) or "
                          f"row(s), with --strict: see the messages above (the output in {out} is complete "
                          "otherwise)")
    return manifest


def _manifest(files, results, merger, entries, config, fingerprint, input_problems, skipped,
              started) -> CorpusManifest:
    dropped, removed, inputs = {}, {}, []
    errors = list(input_problems)
    for i in range(len(files)):
        s = results[i]
        for k, v in s["dropped"].items():
            dropped[k] = dropped.get(k, 0) + v
        for k, v in s["removed_lines"].items():
            removed[k] = removed.get(k, 0) + v
        if s["error"]:
            errors.append(s["error"])
        inputs.append({"path": s["path"], "source": s["source"], "bytes": s["fingerprint"]["bytes"],
                       "format": s["format"], "compression": s["compression"],
                       "documents_read": s["documents_read"], "documents": s["documents"],
                       "replaced_bytes": s["replaced_bytes"], "problems": s["problems"], "error": s["error"],
                       "messages": s["messages"]})
    written = merger.train.rows + merger.holdout.rows
    dropped["duplicate"] = sum(s["documents"] for s in results.values()) - written
    return CorpusManifest(
        stage="prepare-corpus",
        complete=True,
        bertkit_version=__version__,
        schema={f.name: str(f.type) for f in corpus_schema(config.near_dedup, bool(config.languages),
                                                           config.filters != "none")},
        options=config.output_options(),
        inputs=inputs,
        totals={
            "input_files": len(files), "input_bytes": sum(s["fingerprint"]["bytes"] for s in results.values()),
            "documents_read": sum(s["documents_read"] for s in results.values()),
            "documents": written, "train_documents": merger.train.rows, "holdout_documents": merger.holdout.rows,
            "sentences": merger.train.sentences + merger.holdout.sentences,
            "text_bytes": merger.train.text_bytes + merger.holdout.text_bytes,
            "replaced_bytes": sum(s["replaced_bytes"] for s in results.values()),
            "files_with_errors": sum(1 for s in results.values() if s["error"]),
            **({"pii_found": dict(sorted(_summed(results, "pii").items()))} if config.pii != "keep" else {}),
        },
        dropped=dict(sorted(dropped.items())),
        removed_lines=dict(sorted(removed.items())),
        errors=errors,
        skipped_files=[str(p) for p in skipped],  # documentation files a folder walk passed over
        shards=entries,
        elapsed_seconds=round(time.time() - started, 2),
        fingerprint=fingerprint,
    )


def _summary(m: CorpusManifest, out: Path) -> str:
    t = m.totals
    drops = ", ".join(f"{k} {v:,}" for k, v in m.dropped.items() if v) or "none"
    shards = sum(s.split != "removed" for s in m.shards)
    lines = [f"prepare-corpus: {t['documents']:,} documents ({t['train_documents']:,} train, "
             f"{t['holdout_documents']:,} holdout), {t['sentences']:,} sentences in {shards} shard(s) "
             f"-> {out}",
             f"  read {t['input_files']} file(s), {t['input_bytes'] / 1e6:,.1f} MB, {t['documents_read']:,} documents "
             f"in {m.elapsed_seconds:.1f} s; dropped: {drops}"]
    if t["replaced_bytes"]:
        lines.append(f"  {t['replaced_bytes']:,} undecodable byte(s) replaced by U+FFFD")
    if m.errors:
        lines.append(f"  {len(m.errors)} input problem(s): see manifest.json \"errors\"")
    return "\n".join(lines)
