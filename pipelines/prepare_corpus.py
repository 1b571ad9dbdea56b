"""prepare-corpus: raw text files -> cleaned, sentence-split, deduplicated documents in Arrow shards.

How it runs (and why it is byte-identical for any --workers or --engine and resumable after a kill):
  1. Each input file is one task (pipelines/engine.py runs them: in this process, a local pool, or on a Ray
     cluster). A task streams its file (bounded memory), cleans and splits its documents and writes them to
     OUT/.work/part-NNNNN.arrow, then OUT/.work/part-NNNNN.json with the file's counts. Both are written
     atomically; the .json marks the part done, so a restarted run redoes only unfinished files.
  2. Duplicates are found by P partition tasks: task p reads the id column of every part in input order, keeps the
     ids with id % P == p, and records the rows that repeat an earlier id (first occurrence wins) in
     OUT/.work/dedup-PPPPP-ppppp.npy. Duplicates share their id, hence their partition, so P never changes which
     rows are dropped; no process holds more than 1/P of the ids.
  3. The main process merges the parts strictly in input order: skips the recorded duplicates, sends each document
     to train or holdout by a hash of its text, and cuts shards of --shard-size. Every decision depends only on the
     ordered document stream, never on timing, worker count or engine. After a kill the merge is simply redone from
     the parts (it is cheap next to segmentation); shard files are deterministic, so rewriting them changes nothing.
  4. manifest.json is written with "complete": true, then OUT/.work is removed.
"""
import hashlib
import io
import math
import os
import re
import shutil
import socket
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bertkit import __version__
from bertkit.fileio import (
    atomic_write_arrow,
    atomic_write_bytes,
    atomic_write_json,
    checksum_file,
    disk_errors,
    folder_lock,
    read_json_or_none,
)
from bertkit.formats import (
    CORPUS_SCHEMA,
    MANIFEST,
    CorpusColumns as C,
    CorpusError,
    CorpusManifest,
    ShardEntry,
    corpus_file_name,
    corpus_shards,
    read_corpus_manifest,
    write_manifest,
)
from bertkit.pipelines import corpus_readers as readers
from bertkit.pipelines.engine import Engine, check_available, check_engine, check_shared_path
from bertkit.pipelines.sentences import check_splitter, clean_text, detect_language, split_sentences

PART_SCHEMA = CORPUS_SCHEMA.append(pa.field("nbytes", pa.int64(), nullable=False))  # text bytes, for shard cuts
PART_BATCH_ROWS = 1000
SHARD_NAME = re.compile(r"^(shard|holdout)-\d{5}\.arrow$")
DEDUP_ROWS_PER_PARTITION = 4_000_000   # ~100 MB of ids, positions and sort space per dedup task


@dataclass
class CorpusConfig:
    format: str = "auto"           # auto | wikiextractor | lines | paragraphs | jsonl | parquet | arrow
    text_field: str = "text"       # JSON Lines field / Parquet or Arrow column holding the text
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

    def output_options(self) -> dict:
        """The options that change the output; a resumed run must use the same ones."""
        skip = {"workers", "engine", "ray_address", "dedup_partitions", "overwrite", "strict", "progress"}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}


def parse_size(text) -> int:
    """'64MB', '512KiB', '1G', '100000' -> bytes (decimal and binary units both mean powers of 1024 here)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*", str(text).lower())
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 64MB, 512KB, 1GB)")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


# ------------------------------------------------------------------------------------------ one document

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


def build_sentences(raw: readers.RawDoc, config: CorpusConfig, removed: dict) -> list[str]:
    lines = [clean_text(line) for line in raw.lines]
    lines = [line for line in lines if line]
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
    language = config.language if config.language != "auto" else detect_language(" ".join(lines[:3]))
    if raw.kind == "join":
        return split_sentences(" ".join(lines), language, config.splitter)
    return [s for line in lines for s in split_sentences(line, language, config.splitter)]


def document_id(sentences: list[str]) -> str:
    return hashlib.sha1("\n".join(sentences).encode("utf-8")).hexdigest()[:16]


def is_holdout(doc_id: str, fraction: float) -> bool:
    """The id is a hash of the text, so this split is stable across runs, input orders and worker counts."""
    return int(doc_id[8:16], 16) < fraction * (1 << 32)


# ------------------------------------------------------------------------------------------ one input file (worker)

_progress_queue = None


def _init_worker(queue):
    global _progress_queue
    _progress_queue = queue
    try:  # Linux: die with the main process, so a killed run leaves no worker behind to race the resumed one
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _PartWriter:
    """Streams one file's documents to an Arrow IPC stream file; renamed into place only when complete."""

    def __init__(self, path: Path):
        # a per-process temp name: two processes on the same part (a straggler of a killed run, a Ray retry on
        # another node) never mix bytes
        self.path = path
        self.tmp = path.with_name(f"{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
        self.sink = pa.OSFile(str(self.tmp), "wb")
        self.writer = pa.ipc.new_stream(self.sink, PART_SCHEMA)
        self.rows = {name: [] for name in PART_SCHEMA.names}

    def add(self, doc_id, source, title, sentences, nbytes):
        for name, value in zip(PART_SCHEMA.names, (doc_id, source, title, sentences, nbytes)):
            self.rows[name].append(value)
        if len(self.rows[C.ID]) >= PART_BATCH_ROWS:
            self.flush()

    def flush(self):
        if self.rows[C.ID]:
            arrays = [pa.array(self.rows[f.name], type=f.type) for f in PART_SCHEMA]  # (pa.record_batch(dict)
            self.writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=PART_SCHEMA))  # imports pandas)
            self.rows = {name: [] for name in PART_SCHEMA.names}

    def close(self):
        self.flush()
        self.writer.close()
        self.sink.close()
        os.replace(self.tmp, self.path)


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
             "replaced_bytes": 0, "dropped": {}, "removed_lines": {}, "error": None}
    writer = _PartWriter(part)
    reported = [0, 0, time.monotonic()]  # bytes, docs, time of the last progress report

    def report(position: int, final: bool = False):
        now = time.monotonic()
        if final or now - reported[2] > 0.2:
            delta = (position - reported[0], stats["documents"] - reported[1])
            reported[:] = [position, stats["documents"], now]
            if _progress_queue is not None:
                _progress_queue.put(delta)
            elif _local_progress is not None:
                _local_progress(*delta)

    def drop(reason):
        stats["dropped"][reason] = stats["dropped"].get(reason, 0) + 1

    raw_file, decode = None, readers.LineDecoder(problems)
    try:
        stats["fingerprint"] = file_fingerprint(path)
        compression = readers.compression_of(path)
        head = readers.sniff(path, compression)
        fmt = readers.detect_format(path, compression, head) if config.format == "auto" else config.format
        stats["format"], stats["compression"] = fmt, compression
        if fmt in ("parquet", "arrow"):
            docs = readers.read_table(path, fmt, compression, problems, config.text_field)
        else:
            readers.check_text(head, path.name)
            stream, raw_file = readers.open_binary(path, compression)
            lines = readers.text_lines(stream, problems, decode)
            if fmt == "wikiextractor":
                docs = readers.read_wikiextractor(lines, problems, decode)
            elif fmt == "jsonl":
                docs = readers.read_jsonl(lines, problems, decode, config.text_field)
            else:
                docs = readers.read_blocks(lines, "lines" if fmt == "lines" else "join", problems, decode)
        for raw in docs:
            stats["documents_read"] += 1
            sentences = build_sentences(raw, config, stats["removed_lines"])
            chars = sum(len(s) for s in sentences)
            if not sentences:
                drop("empty")
            elif chars < config.min_chars:
                drop("too_short")
            elif len(sentences) < config.min_sentences:
                drop("too_few_sentences")
            else:
                title = clean_text(raw.title) if raw.title else None
                nbytes = sum(len(s.encode("utf-8")) for s in sentences) + 4 * len(sentences)
                writer.add(document_id(sentences), source, title or None, sentences, nbytes)
                stats["documents"] += 1
                stats["sentences"] += len(sentences)
            if raw_file is not None and stats["documents_read"] % 64 == 0:
                report(raw_file.tell())
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
    writer.close()
    for kind, n in problems.counts.items():
        if kind in ("bad_json", "missing_field", "outside_doc"):
            stats["dropped"][kind] = stats["dropped"].get(kind, 0) + n
    stats["problems"] = problems.counts
    stats["messages"] = problems.messages
    report(stats["fingerprint"]["bytes"], final=True)
    atomic_write_json(part.with_suffix(".json"), stats)
    return stats


_local_progress = None  # in-process (workers=1) progress callback


# ------------------------------------------------------------------------------------------ duplicates (P tasks)

_HEX = np.full(256, 255, dtype=np.uint8)
_HEX[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)


def id_keys(ids: pa.Array) -> np.ndarray:
    """Document ids -> their value as uint64 (int(id, 16), the key duplicates are found by); vectorised for the
    16-hex-digit ids that process_file writes."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if len(ids) and pa.types.is_string(ids.type) and ids.null_count == 0:
        offsets = np.frombuffer(ids.buffers()[1], np.int32)[ids.offset: ids.offset + len(ids) + 1]
        if np.all(np.diff(offsets) == 16):
            nibbles = _HEX[np.frombuffer(ids.buffers()[2], np.uint8)[offsets[0]: offsets[-1]].reshape(-1, 16)]
            if not (nibbles == 255).any():
                keys = np.zeros(len(ids), dtype=np.uint64)
                for j in range(16):
                    keys = (keys << np.uint64(4)) | nibbles[:, j]
                return keys
    return np.array([int(x, 16) for x in ids.to_pylist()], dtype=np.uint64)


def dedup_file(work: Path, partition: int, partitions: int) -> Path:
    return work / f"dedup-{partitions:05d}-{partition:05d}.npy"


def find_duplicates(parts: list[str], partition: int, partitions: int, out: str) -> dict:
    """Task: the positions (row numbers in the concatenation of the parts, in input order) of the documents whose
    id is in this partition (id % partitions == partition) and already occurred earlier: exactly the rows the
    one-set rule "skip an id seen before" drops, since equal ids fall in the same partition. Written atomically as
    a sorted int64 .npy, then a .json record (its presence marks the partition done)."""
    keys, positions, start = [], [], 0
    for part in parts:
        with pa.memory_map(part, "r") as source:  # only the id column's pages are touched
            for batch in pa.ipc.open_stream(source):
                k = id_keys(batch.column(C.ID))
                mine = np.flatnonzero(k % np.uint64(partitions) == partition)
                keys.append(k[mine])
                positions.append(mine.astype(np.int64) + start)
                start += batch.num_rows
    keys = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
    positions = np.concatenate(positions) if positions else np.zeros(0, np.int64)
    order = np.argsort(keys, kind="stable")  # stable: among equal ids, input order, so the first one is kept
    ordered = keys[order]
    repeat = np.zeros(len(keys), dtype=bool)
    repeat[1:] = ordered[1:] == ordered[:-1]
    duplicates = np.sort(positions[order][repeat])
    buffer = io.BytesIO()
    np.save(buffer, duplicates)
    out = Path(out)
    atomic_write_bytes(out, buffer.getvalue())
    record = {"partition": partition, "partitions": partitions, "rows": start, "duplicates": len(duplicates)}
    atomic_write_json(out.with_suffix(".json"), record)
    return record


def _run_dedup(engine: Engine, parts: list[Path], total_rows: int, partitions: int, work: Path) -> list[Path]:
    """The P dedup tasks (a finished one, from a killed run, is reused); returns their .npy files."""
    files = [dedup_file(work, p, partitions) for p in range(partitions)]
    todo = []
    for p, path in enumerate(files):
        record = read_json_or_none(path.with_suffix(".json"))
        if not (record and path.is_file() and record.get("rows") == total_rows):
            todo.append(p)
    for _ in engine.map(find_duplicates, [([str(x) for x in parts], p, partitions, str(files[p])) for p in todo]):
        pass
    return files


# ------------------------------------------------------------------------------------------ merge (main process)

class ShardWriter:
    """Cuts one split's ordered document stream into shards of about shard_size text bytes."""

    def __init__(self, out: Path, split: str, shard_size: int):
        self.out, self.split, self.shard_size = out, split, shard_size
        self.tables, self.buffered, self.entries = [], 0, []
        self.rows = self.sentences = self.text_bytes = 0

    def add(self, table: pa.Table):
        nbytes = table.column("nbytes").to_numpy()
        while len(table):
            cum = np.cumsum(nbytes)
            cut = int(np.searchsorted(cum, self.shard_size - self.buffered))  # first row reaching the size
            if cut >= len(table):
                self.tables.append(table)
                self.buffered += int(cum[-1])
                return
            self.tables.append(table.slice(0, cut + 1))
            self.flush()
            table, nbytes = table.slice(cut + 1), nbytes[cut + 1:]

    def flush(self):
        table = pa.concat_tables(self.tables).combine_chunks()
        self.tables, self.buffered = [], 0
        if not len(table):
            return
        self.rows += len(table)
        self.sentences += int(pc.sum(pc.list_value_length(table.column(C.SENTENCES))).as_py())
        self.text_bytes += int(pc.sum(table.column("nbytes")).as_py())
        table = table.drop_columns(["nbytes"]).cast(CORPUS_SCHEMA)
        name = corpus_file_name(self.split, len(self.entries))
        atomic_write_arrow(self.out / name, table)
        self.entries.append(ShardEntry(name, self.split, len(table), (self.out / name).stat().st_size,
                                       checksum_file(self.out / name)))

    def close(self):
        if self.tables:
            self.flush()


class Merger:
    """Splits the ordered stream of parts into the train and holdout shard writers, skipping the rows that the dedup
    tasks found to repeat an earlier document. Memory: one batch, one shard being filled, and the duplicate lists
    memory-mapped (only the slice of the current batch is read)."""

    def __init__(self, out: Path, config: CorpusConfig, duplicates: list[Path]):
        self.config = config
        self.duplicates = [np.load(p, mmap_mode="r") for p in duplicates]  # sorted row positions, one per partition
        self.position = 0  # rows of the parts merged so far
        self.train = ShardWriter(out, "train", config.shard_size)
        self.holdout = ShardWriter(out, "holdout", config.shard_size)

    def _skipped(self, rows: int) -> np.ndarray:
        lo, hi = self.position, self.position + rows
        skip = np.zeros(rows, dtype=bool)
        for d in self.duplicates:
            skip[np.asarray(d[np.searchsorted(d, lo): np.searchsorted(d, hi)]) - lo] = True
        self.position = hi
        return skip

    def add_part(self, part: Path):
        with pa.memory_map(str(part), "r") as source:
            for batch in pa.ipc.open_stream(source):
                keep, held = [], []
                skip = self._skipped(batch.num_rows)
                for i, doc_id in enumerate(batch.column(C.ID).to_pylist()):
                    if skip[i]:
                        continue  # exact duplicate of an earlier document
                    (held if is_holdout(doc_id, self.config.holdout) else keep).append(i)
                table = pa.Table.from_batches([batch])
                if keep:
                    self.train.add(table.take(keep))
                if held:
                    self.holdout.add(table.take(held))

    def close(self) -> list[ShardEntry]:
        self.train.close()
        self.holdout.close()
        return self.train.entries + self.holdout.entries


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
    from bertkit.progress import tqdm

    started = time.time()
    skipped = []
    files, input_problems = readers.expand_inputs(inputs, exclude=out, skipped=skipped)
    for message in input_problems:
        _say(f"warning: {message}")
    for path in skipped:
        _say(f"skipped {path}: a documentation file, not corpus text (give it by name to read it)")
    if not files:
        raise CorpusError("no input files to read: " + "; ".join(input_problems or ["no INPUT given"]))

    # what the output depends on: options and the input files (path, size, mtime); workers are not part of it
    fingerprint = {"options": config.output_options(),
                   "inputs": [[f.source, str(f.path.resolve()), *file_fingerprint(f.path).values()] for f in files]}
    work = out / ".work"
    manifest_path = out / MANIFEST
    previous = read_json_or_none(manifest_path)  # another stage's folder never gets here (folder_lock refuses it)
    if previous and previous.get("stage") == "prepare-corpus" and previous.get("fingerprint") == fingerprint \
            and previous.get("complete") and not config.overwrite:
        shutil.rmtree(work, ignore_errors=True)
        for split in ("train", "holdout"):
            corpus_shards(out, split)  # a damaged shard says so (sizes and rows), and that --overwrite rebuilds it
        _say(f"{out}: already complete with these inputs and options; nothing to do (--overwrite to redo)")
        return read_corpus_manifest(out)
    state = read_json_or_none(work / "state.json")
    if not config.overwrite:
        for what, found in (("an unfinished run", state), ("a finished run", previous)):
            if found and found.get("fingerprint") != fingerprint:
                raise CorpusError(f"{out}: holds {what} with other inputs or options. Use another --out, "
                                  f"or --overwrite to replace it")
        if previous is None and out.is_dir() and any(SHARD_NAME.match(p.name) for p in out.iterdir()):
            raise CorpusError(f"{out}: holds shard files but no manifest.json. Use another --out, or --overwrite")
    if config.overwrite:
        shutil.rmtree(work, ignore_errors=True)
        for p in out.glob("*.arrow") if out.is_dir() else []:
            if SHARD_NAME.match(p.name):
                p.unlink()
        manifest_path.unlink(missing_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    atomic_write_json(work / "state.json", {"fingerprint": fingerprint})
    atomic_write_json(manifest_path, {"stage": "prepare-corpus", "complete": False, "shards": [],
                                      "fingerprint": fingerprint, "bertkit_version": __version__})

    parts = [work / f"part-{i:05d}.arrow" for i in range(len(files))]
    done = {}
    for i, f in enumerate(files):
        meta = read_json_or_none(parts[i].with_suffix(".json"))
        if meta and parts[i].is_file() and meta.get("fingerprint") == file_fingerprint(f.path):
            done[i] = meta
    todo = [i for i in range(len(files)) if i not in done]
    if done:
        _say(f"resuming: {len(done)} of {len(files)} input files already processed")

    args = lambda i: (i, str(files[i].path), files[i].source, asdict(config), str(parts[i]))  # noqa: E731
    # fork where there is one (Linux): workers start in milliseconds and a caller's script needs no
    # `if __name__ == "__main__"` guard. The pool starts (in engine.map) before the progress bar's thread exists.
    import multiprocessing

    context = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    local_pool = config.engine == "local" and config.workers > 1 and len(todo) > 1
    queue = multiprocessing.get_context(context).Queue() if local_pool else None  # workers' progress
    counters = {"docs": 0}
    bar = None

    def advance(nbytes, ndocs):
        counters["docs"] += ndocs
        bar.update(nbytes)
        elapsed = max(bar.format_dict["elapsed"], 1e-9)
        bar.set_postfix_str(f"{counters['docs']:,} docs, {counters['docs'] / elapsed:,.0f} docs/s", refresh=False)

    # a Ray task reports when it finishes (the local ones report as they read, through the queue or in-process)
    finished = (lambda i, stats: advance(stats["fingerprint"]["bytes"], stats["documents"])) \
        if config.engine == "ray" else None
    results = {}
    global _local_progress
    try:
        with Engine(config.engine, config.workers, config.ray_address) as engine:
            stream = engine.map(process_file, [args(i) for i in todo], on_done=finished,
                                on_wait=lambda: _drain(queue, advance), context=context,
                                initializer=_init_worker if local_pool else None, initargs=(queue,))
            total_bytes = sum(f.path.stat().st_size for f in files)
            bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc="prepare-corpus",
                       disable=not config.progress, file=sys.stderr, dynamic_ncols=True)
            bar.update(sum(done[i]["fingerprint"]["bytes"] for i in done))
            counters["docs"] += sum(done[i]["documents"] for i in done)
            _local_progress = advance if config.engine == "local" and not local_pool else None
            for i in range(len(files)):
                stats = done[i] if i in done else next(stream)
                results[i] = stats
                for message in stats.get("messages", []):
                    _say(f"warning: {message}")
                if stats["error"]:
                    _say(f"error: {stats['error']}")
            _drain(queue, advance)
            total_rows = sum(results[i]["documents"] for i in range(len(files)))
            partitions = config.dedup_partitions or max(1, math.ceil(total_rows / DEDUP_ROWS_PER_PARTITION))
            bar.set_postfix_str(f"{counters['docs']:,} docs; finding duplicates ({partitions} task(s))")
            duplicates = _run_dedup(engine, parts, total_rows, partitions, work)
        bar.set_postfix_str(f"{counters['docs']:,} docs; merging")
        merger = Merger(out, config, duplicates)
        for part in parts:
            merger.add_part(part)
        entries = merger.close()
    finally:
        _local_progress = None
        if bar is not None:
            bar.close()

    manifest = _manifest(files, results, merger, entries, config, fingerprint, input_problems, skipped,
                         started)
    written = manifest.totals["documents"]
    if written == 0:  # nothing of value to resume: leave no unfinished run behind to block a corrected retry
        shutil.rmtree(work, ignore_errors=True)
        manifest_path.unlink(missing_ok=True)
        reasons = ", ".join(f"{k}: {v}" for k, v in manifest.dropped.items() if v) or "none"
        errors = "; ".join(manifest.errors[:5])
        raise CorpusError(f"no documents were kept (dropped by reason: {reasons}). "
                          f"{'Errors: ' + errors if errors else 'Check --format, --text-field, --min-chars.'}")
    for p in out.glob("*.arrow"):  # shards of an earlier, longer attempt with the same options cannot exist,
        if SHARD_NAME.match(p.name) and p.name not in {e.file for e in entries}:  # but be safe
            p.unlink()
    write_manifest(out, manifest)
    shutil.rmtree(work, ignore_errors=True)
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


def _drain(queue, advance):
    if queue is None:
        return
    while True:
        try:
            advance(*queue.get_nowait())
        except Exception:  # queue.Empty
            return


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
        schema={f.name: str(f.type) for f in CORPUS_SCHEMA},
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
    lines = [f"prepare-corpus: {t['documents']:,} documents ({t['train_documents']:,} train, "
             f"{t['holdout_documents']:,} holdout), {t['sentences']:,} sentences in {len(m.shards)} shard(s) "
             f"-> {out}",
             f"  read {t['input_files']} file(s), {t['input_bytes'] / 1e6:,.1f} MB, {t['documents_read']:,} documents "
             f"in {m.elapsed_seconds:.1f} s; dropped: {drops}"]
    if t["replaced_bytes"]:
        lines.append(f"  {t['replaced_bytes']:,} undecodable byte(s) replaced by U+FFFD")
    if m.errors:
        lines.append(f"  {len(m.errors)} input problem(s): see manifest.json \"errors\"")
    return "\n".join(lines)
