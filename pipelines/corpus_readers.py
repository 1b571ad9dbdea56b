"""Finding, opening and parsing prepare-corpus inputs: every supported format yields RawDoc records.

Readers never raise on bad *content*: they record a problem (file, line, what to do) and go on, so one bad
line or file never costs the rest. They raise InputError only when the file as a whole cannot be read.
"""
import bz2
import codecs
import errno
import glob
import gzip
import io
import json
import lzma
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import zstandard

from bertkit.fileio import not_utf8_message

FORMATS = ("auto", "wikiextractor", "lines", "paragraphs", "jsonl", "csv", "tsv", "parquet", "arrow")
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")
MAGIC = {b"\x1f\x8b": "gz", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zst"}
MAX_MESSAGES_PER_KIND = 5  # per file: the first few in full, the rest only counted
MAX_LINE_BYTES = 64 << 20  # longer lines (a file with no line breaks...) are read in pieces
MAX_DOC_CHARS = 4 << 20    # a "document" this long (a file without blank lines...) is cut, so memory stays bounded


class InputError(Exception):
    """The file as a whole cannot be read (missing, binary, wrong format, truncated...)."""


@dataclass
class InputFile:
    path: Path          # where to read it
    source: str         # what the corpus records: relative to the parent of the input root it was found under


@dataclass
class RawDoc:
    title: str | None
    lines: list[str]    # raw (uncleaned) text lines
    line: int           # 1-based line (or row) where the document starts, for messages
    kind: str = "split"  # how lines become sentences: "wiki" or "split" each line; "join" then split; keep "lines"
    signals: dict | None = None   # a bertkit corpus given as INPUT: the quality signals it was judged by


class Problems:
    """Per-file problem log: counted by kind, the first few of each kind kept as messages."""

    def __init__(self, source: str):
        self.source = source
        self.counts: dict[str, int] = {}
        self.messages: list[str] = []

    def add(self, kind: str, message: str, line: int | None = None):
        n = self.counts.get(kind, 0) + 1
        self.counts[kind] = n
        where = f"{self.source}:{line}" if line else self.source
        if n <= MAX_MESSAGES_PER_KIND:
            self.messages.append(f"{where}: {message}")
        elif n == MAX_MESSAGES_PER_KIND + 1:
            self.messages.append(f"{self.source}: further '{kind}' problems are only counted")


# ---------------------------------------------------------------------------------------------------- discovery

def expand_inputs(inputs, exclude: Path | None = None, skipped: list[Path] | None = None, split: str = "train"
                  ) -> tuple[list[InputFile], list[str]]:
    """INPUT arguments -> files in a stable order (argument order; sorted walk inside folders and globs).

    Returns (files, problems): a missing path, an empty folder or a glob matching nothing is a problem message,
    not an exception, so the other inputs still run. Documentation files a folder walk passes over are appended
    to `skipped`.
    """
    files, problems, seen = [], [], set()
    exclude = exclude.resolve() if exclude else None

    def add(path: Path, source: str):
        key, problem = _candidate(path, exclude, seen)
        if problem:
            problems.append(problem)
        elif key is not None:
            seen.add(key)
            files.append(InputFile(path, source))

    for arg in inputs:
        arg = str(arg)
        path = Path(arg)
        if path.is_dir():
            try:
                found = _walk(path, skipped, split)
            except InputError as e:
                problems.append(str(e))
                continue
            if not found:
                problems.append(f"{arg}: folder holds no (non-hidden, non-documentation) files")
            for f in found:
                add(f, (Path(path.resolve().name) / f.relative_to(path)).as_posix())
        elif path.is_file() or (path.exists() and not path.is_dir()):
            add(path, path.name)
        elif glob.has_magic(arg):
            matches = sorted(glob.glob(arg, recursive=True))
            if not matches:
                problems.append(f"{arg}: pattern matches no file")
            # sources are named relative to the parent of the pattern's fixed leading folder: 'dumps/*/x.jsonl'
            # gives 'dumps/a/x.jsonl', so equal file names in different folders stay distinct
            fixed = Path(*_fixed_prefix(path.parts))
            for m in matches:
                m = Path(m)
                for f in (_walk(m, skipped, split) if m.is_dir() else [m]):
                    add(f, (Path(fixed.resolve().name) / f.relative_to(fixed)).as_posix())
        else:
            problems.append(f"{arg}: no such file or folder")
    return files, problems


def _candidate(path: Path, exclude: Path | None, seen: set) -> tuple[Path | None, str | None]:
    """(the resolved path of an input file to read, or None; what is wrong with it, or None): a name Arrow cannot
    hold, a link loop or a link to nothing, a FIFO or device, a second mention. Inside `exclude`: (None, None)."""
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:  # undecodable bytes (os.walk keeps them as surrogates): Arrow cannot hold it
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        return None, f"{shown}: the file name is not UTF-8, so it cannot be recorded; rename it. Skipped"
    try:
        key = path.resolve(strict=True)
    except (RuntimeError, OSError) as e:  # a symlink loop (RuntimeError before Python 3.13), a dangling link
        why = "a symbolic link loop" if isinstance(e, RuntimeError) or e.errno == errno.ELOOP else \
            "a link to nothing" if isinstance(e, FileNotFoundError) else e.strerror
        return None, f"{path}: cannot be read ({why}); skipped"
    if exclude and (key == exclude or exclude in key.parents):
        return None, None
    if not stat.S_ISREG(key.stat().st_mode):  # opening a FIFO would wait for a writer for ever
        return None, f"{path}: not a regular file (a FIFO, socket or device); skipped"
    if key in seen:
        return None, f"{path}: given more than once; read once"
    return key, None


def _fixed_prefix(parts) -> list[str]:
    """The folders of a glob pattern before its first wildcard ('.' if it starts with one)."""
    fixed = []
    for part in parts[:-1]:
        if glob.has_magic(part):
            break
        fixed.append(part)
    return fixed or ["."]


# files that sit beside data rather than being data (a dataset's README.md, SOURCE.md, LICENSE...): a folder walk
# skips them, naming each in the log and the manifest; a file given by name or glob is always read
DOC_STEMS = {"readme", "source", "sources", "license", "licence", "copying", "notice", "authors", "changelog",
             "citation", "checksums", "sha256sums", "md5sums", "manifest"}
DOC_SUFFIXES = {"", ".md", ".rst", ".txt", ".json", ".cff", ".html"}


def is_documentation(path: Path) -> bool:
    return path.stem.lower() in DOC_STEMS and path.suffix.lower() in DOC_SUFFIXES


def saved_dataset(folder: Path, split: str = "train") -> tuple[list[Path], list[Path]] | None:
    """(the Arrow files, the metadata files) of a 🤗 datasets `save_to_disk` folder, a DatasetDict's by its `split`;
    None when the folder is not one. Its JSON files describe the data: read as text they were documents of junk."""
    if (folder / "dataset_dict.json").is_file():
        try:
            splits = json.loads((folder / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
        except (ValueError, KeyError, TypeError):
            raise InputError(f"{folder / 'dataset_dict.json'}: not a 🤗 datasets DatasetDict's file") from None
        if split not in splits:
            raise InputError(f"{folder}: a 🤗 DatasetDict without the split {split!r} (its splits: "
                             f"{', '.join(map(str, splits))}); choose one with --split")
        found = saved_dataset(folder / split, split)
        return (found[0], [folder / "dataset_dict.json", *found[1]]) if found else None
    state, info = folder / "state.json", folder / "dataset_info.json"
    if not (state.is_file() and info.is_file()):
        return None
    try:
        names = [d["filename"] for d in json.loads(state.read_text(encoding="utf-8"))["_data_files"]]
    except (ValueError, KeyError, TypeError):
        return None
    if any(Path(n).is_absolute() or ".." in Path(n).parts for n in names):
        raise InputError(f"{state}: lists a data file outside its folder")
    return [folder / n for n in names], [state, info]


def hub_dataset_files(name: str, config: str | None = None, split: str = "train") -> list[Path]:
    """The Arrow files 🤗 datasets keeps in its cache for a dataset (a Hub name, or a dataset folder of data files),
    made by `load_dataset` if they are not there yet (from the cache alone with HF_DATASETS_OFFLINE=1): read in
    place, memory-mapped, like any Arrow input, so the run resumes and fingerprints as with files given."""
    try:
        import datasets
    except ImportError:
        raise InputError("--hf-dataset needs 🤗 datasets: pip install 'bertkit[hf]'") from None
    try:
        found = datasets.load_dataset(name, config, split=split)
    except Exception as e:   # the library says what is missing: the split, the config, the network, the cache
        raise InputError(f"--hf-dataset {name}{f' --hf-config {config}' if config else ''} --split {split}: "
                         f"{type(e).__name__}: {e}") from None
    files = [Path(f["filename"]) for f in found.cache_files]
    if not files:
        raise InputError(f"--hf-dataset {name}: 🤗 datasets holds it in memory, with no cache file to read; save it "
                         "with save_to_disk and give that folder as INPUT")
    return files


def corpus_folder(folder: Path) -> tuple[list[Path], list[Path]] | None:
    """(the shards, the manifest) of a bertkit corpus (a prepare-corpus output) given as INPUT: its documents as
    they were kept, and with --keep-removed those --filters took out, are judged again by other rules (the stored
    signals: no raw text read, no sentence split); None when the folder is not one."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("stage") != "prepare-corpus" or not manifest.get("complete"):
        return None
    names = [s.get("file") for s in manifest.get("shards", []) if isinstance(s, dict)]
    if any(not isinstance(n, str) or Path(n).is_absolute() or ".." in Path(n).parts for n in names):
        raise InputError(f"{folder / 'manifest.json'}: lists a shard outside its folder")
    return [folder / n for n in names], [folder / "manifest.json"]


def _walk(root: Path, skipped: list[Path] | None = None, split: str = "train") -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        dataset = saved_dataset(Path(dirpath), split) or corpus_folder(Path(dirpath))
        if dataset is not None:   # its Arrow files only, in its order; its metadata passed over, said
            out += dataset[0]
            if skipped is not None:
                skipped += dataset[1]
            dirnames[:] = []
            continue
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            if is_documentation(Path(name)):
                if skipped is not None:
                    skipped.append(Path(dirpath) / name)
                continue
            out.append(Path(dirpath) / name)
    return sorted(out, key=lambda p: p.relative_to(root).parts)


# ---------------------------------------------------------------------------------------------------- opening

class _ZstdReader(io.RawIOBase):
    """Streaming zstd (multi-frame) that raises EOFError on a truncated stream; zstandard's own reader is silent."""

    def __init__(self, raw):
        self._raw, self._buf, self._pos = raw, b"", 0
        self._dobj = zstandard.ZstdDecompressor().decompressobj()
        self._in_frame = False

    def readable(self):
        return True

    def readinto(self, b):
        while self._pos == len(self._buf):
            chunk = self._raw.read(1 << 16)
            if not chunk:
                if self._in_frame:
                    raise EOFError("zstd stream ended before the end of its frame (truncated file)")
                return 0
            out = []
            while chunk:  # one read may hold the end of a frame and the start of the next
                self._in_frame = True
                out.append(self._dobj.decompress(chunk))
                chunk = b""
                if self._dobj.eof:
                    self._in_frame = False
                    chunk = self._dobj.unused_data
                    self._dobj = zstandard.ZstdDecompressor().decompressobj()
            self._buf, self._pos = b"".join(out), 0
        n = min(len(b), len(self._buf) - self._pos)
        b[:n] = self._buf[self._pos:self._pos + n]
        self._pos += n
        return n


def compression_of(path: Path) -> str | None:
    with open(path, "rb") as f:
        head = f.read(6)
    for magic, name in MAGIC.items():
        if head.startswith(magic):
            return name
    return None


def open_binary(path: Path, compression: str | None):
    """(decompressed binary stream, raw file) – the raw file's tell() is the progress in input bytes."""
    raw = open(path, "rb")
    if compression == "gz":
        stream = gzip.GzipFile(fileobj=raw)
    elif compression == "bz2":
        stream = bz2.BZ2File(raw)
    elif compression == "xz":
        stream = lzma.LZMAFile(raw)
    elif compression == "zst":
        stream = io.BufferedReader(_ZstdReader(raw), 1 << 16)
    else:
        stream = raw
    return stream, raw


# what a truncated or corrupt stream raises (gzip/bz2: EOFError or OSError; xz: LZMAError; zstd: ZstdError)
STREAM_ERRORS = (EOFError, OSError, lzma.LZMAError, zstandard.ZstdError)


def sniff(path: Path, compression: str | None, head_bytes: int = 1 << 15) -> bytes:
    """The first bytes after decompression; a stream that breaks early is reported later, where it breaks."""
    stream, raw = open_binary(path, compression)
    head = b""
    try:
        while len(head) < head_bytes and (chunk := stream.read(4096)):
            head += chunk
    except STREAM_ERRORS as e:
        if not head:
            raise InputError(f"cannot decompress ({compression}): {e}. The file is corrupt or truncated; "
                             f"re-download or re-compress it")
    finally:
        stream.close()
        raw.close()
    return head


def detect_format(path: Path, compression: str | None, head: bytes) -> str:
    name = path.name.lower()
    for suffix in COMPRESSED_SUFFIXES:
        name = name.removesuffix(suffix)
    if head.startswith(b"PAR1") or name.endswith(".parquet"):
        return "parquet"
    if head.startswith((b"ARROW1", b"\xff\xff\xff\xff")) or name.endswith((".arrow", ".feather", ".ipc")):
        return "arrow"
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if name.endswith((".csv", ".tsv")):
        return name[-3:]
    first = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:64]
    if first.startswith(b"[") and name.endswith(".json"):
        raise InputError("is a JSON array; prepare-corpus reads JSON Lines (one object per line). "
                         "Convert it: jq -c '.[]' FILE.json > FILE.jsonl")
    if first.startswith(b"<doc"):
        return "wikiextractor"
    if first.startswith(b"{"):
        return "jsonl"
    return "paragraphs"


def check_text(head: bytes, name: str = "FILE"):
    """Refuse binary files early; a few undecodable bytes are fine (replaced and counted later)."""
    if not head:
        return
    if b"\x00" in head:
        hint = " (UTF-16 text? convert it: iconv -f UTF-16 -t UTF-8)" if head[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise InputError(f"looks binary (NUL bytes), not UTF-8 text{hint}; skipped. Pass only text, JSON Lines, "
                         f"Parquet or Arrow files")
    _, bad = decode_counting(head)
    if bad > len(head) // 10 + 3:  # +3: the sniffed head may end inside a multi-byte character
        raise InputError(f"{not_utf8_message(head, name)}; skipped")


# ---------------------------------------------------------------------------------------------------- decoding

_replaced = [0]  # bytes replaced by the last bertkit-replace decode


def _replace_and_count(err):
    _replaced[0] += err.end - err.start
    return "\ufffd", err.end


codecs.register_error("bertkit-replace", _replace_and_count)


def decode_counting(data: bytes) -> tuple[str, int]:
    """UTF-8 decode with bad bytes replaced by U+FFFD; returns (text, number of bytes replaced)."""
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        _replaced[0] = 0
        text = data.decode("utf-8", "bertkit-replace")
        return text, _replaced[0]


class LineDecoder:
    """Decodes lines, counting replaced bytes and tracking the current line number for messages."""

    def __init__(self, problems: Problems):
        self.problems = problems
        self.replaced = 0
        self.line = 0

    def __call__(self, data: bytes) -> str:
        text, n = decode_counting(data)
        if n:
            self.replaced += n
            self.problems.add("undecodable", f"{n} undecodable byte(s) replaced by U+FFFD", self.line)
        return text


def text_lines(stream, problems: Problems, decode: LineDecoder):
    """Decoded lines (without line end) of a binary stream, tracking the line number in decode.line.

    A line longer than MAX_LINE_BYTES (a file with no line breaks at all...) comes in pieces cut at a character
    boundary, so memory stays bounded whatever the input.
    """
    carry, continued = b"", False
    while True:
        data = carry + stream.readline(MAX_LINE_BYTES)
        carry = b""
        if not data:
            return
        first_piece = not continued
        if first_piece:
            decode.line += 1
        continued = not data.endswith(b"\n") and len(data) >= MAX_LINE_BYTES
        if continued:
            cut = len(data)
            while cut > len(data) - 4 and data[cut - 1] & 0xC0 == 0x80:  # back off over continuation bytes
                cut -= 1
            if data[cut - 1] >= 0xC0:  # ... and the lead byte of the cut character
                cut -= 1
            data, carry = data[:cut], data[cut:]
            if first_piece:
                problems.add("long_line", f"line longer than {MAX_LINE_BYTES:,} bytes: read in pieces", decode.line)
        if decode.line == 1 and data.startswith(b"\xef\xbb\xbf"):
            data = data[3:]
        yield decode(data).rstrip("\r\n")


# ---------------------------------------------------------------------------------------------------- formats

_DOC_OPEN = re.compile(r"^<doc(\s[^>]*)?>\s*$")
_ATTR = re.compile(r'(\w+)="([^"]*)"')


def read_wikiextractor(lines, problems: Problems, decode: LineDecoder):
    """<doc id=.. url=.. title=..> ... </doc> blocks; text outside blocks and broken blocks are reported."""
    doc, title, start, chars = None, None, 0, 0
    for text in lines:
        n = decode.line
        if text.startswith("<doc"):
            m = _DOC_OPEN.match(text.strip())
            if doc is not None:
                problems.add("malformed_doc", f"<doc> opened at line {start} has no </doc> before the next <doc>; "
                                              f"kept its text as one document", start)
                yield RawDoc(title, doc, start, "wiki")
            attrs = dict(_ATTR.findall(m.group(1) or "")) if m else {}
            if not m or "title" not in attrs:
                problems.add("malformed_doc", f"<doc> line without a title=\"...\" attribute: {text[:80]!r}", n)
            doc, title, start, chars = [], attrs.get("title"), n, 0
        elif text.strip() == "</doc>":
            if doc is None:
                problems.add("malformed_doc", "</doc> without an opening <doc ...>; ignored", n)
            else:
                yield RawDoc(title, doc, start, "wiki")
            doc = None
        elif doc is not None:
            doc.append(text)
            chars += len(text)
            if chars > MAX_DOC_CHARS:
                problems.add("long_document", f"<doc> opened at line {start} runs past {MAX_DOC_CHARS:,} "
                                              f"characters: cut into pieces (a missing </doc>?)", start)
                yield RawDoc(title, doc, start, "wiki")
                doc, chars = [], 0
        elif text.strip():
            problems.add("outside_doc", "text outside any <doc>...</doc> block; dropped", n)
    if doc is not None:
        problems.add("malformed_doc", f"<doc> opened at line {start} is not closed at the end of the file; "
                                      f"kept its text as one document", start)
        yield RawDoc(title, doc, start, "wiki")


def read_blocks(lines, kind: str, problems: Problems, decode: LineDecoder):
    """Blank-line separated documents (BERT's 'lines' layout, or paragraphs to split)."""
    doc, start, chars = [], 0, 0
    for text in lines:
        if text.strip():
            if not doc:
                start, chars = decode.line, 0
            doc.append(text)
            chars += len(text)
            if chars > MAX_DOC_CHARS:
                problems.add("long_document", f"no blank line for {len(doc):,} lines ({chars:,} characters): "
                                              f"cut into a document here; are documents separated by blank lines?",
                             start)
                yield RawDoc(None, doc, start, kind)
                doc = []
        elif doc:
            yield RawDoc(None, doc, start, kind)
            doc = []
    if doc:
        yield RawDoc(None, doc, start, kind)


def read_jsonl(lines, problems: Problems, decode: LineDecoder, text_field: str):
    for text in lines:
        n = decode.line
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            problems.add("bad_json", f"not valid JSON ({e.msg} at column {e.colno}); line skipped", n)
            continue
        if not isinstance(obj, dict):
            problems.add("bad_json", f"expected a JSON object per line, got {type(obj).__name__}; line skipped", n)
            continue
        value = obj.get(text_field)
        if not isinstance(value, str):
            what = "has no" if text_field not in obj else f"has a non-string ({type(value).__name__})"
            keys = ", ".join(list(obj)[:8])
            problems.add("missing_field", f"{what} {text_field!r} field (keys: {keys}); line skipped. "
                                          f"Choose the field with --text-field", n)
            continue
        title = obj.get("title")
        yield RawDoc(title if isinstance(title, str) else None, value.split("\n"), n, "split")


def read_delimited(lines, problems: Problems, decode: LineDecoder, text_field: str, delimiter: str):
    """CSV (RFC 4180: quoted fields may hold commas, quotes and line breaks) or TSV, its first row naming the
    columns: each row's `text_field` column is a document (a `title` column, if any, its title); a row with another
    number of fields than the header is counted and skipped."""
    import csv

    rows = csv.reader((line + "\n" for line in lines), delimiter=delimiter)
    try:
        header = next(rows)
    except StopIteration:
        return
    except csv.Error as e:
        raise InputError(f"is not {'CSV' if delimiter == ',' else 'TSV'} ({e})") from None
    if text_field not in header:
        raise InputError(f"has no {text_field!r} column (its header: {', '.join(header[:8])}); choose the column "
                         "with --text-field")
    text, title = header.index(text_field), header.index("title") if "title" in header else None
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except csv.Error as e:
            problems.add("bad_row", f"not a row of this file's layout ({e}); skipped", decode.line)
            continue
        if len(row) != len(header):
            if any(field.strip() for field in row):
                problems.add("bad_row", f"{len(row)} fields, the header has {len(header)}; row skipped", decode.line)
            continue
        yield RawDoc(row[title] if title is not None else None, row[text].split("\n"), decode.line, "split")


def _signal_names(shard: Path) -> list[str]:
    """The signals' order, from the manifest of the corpus the shard is in (its folder, or its removed/'s parent)."""
    for folder in (shard.parent, shard.parent.parent):
        try:
            names = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["totals"]["signal_names"]
            return [str(n) for n in names]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return []


def _corpus_rows(batches, schema, names: list[str]):
    """A bertkit corpus shard's documents: their sentences kept as they are (kind "lines"), with their stored
    signals; of a removed/ shard only those --filters took out (the other removals would be made again)."""
    from bertkit.pipelines.quality import unpack

    row = 0
    for batch in batches:
        def column(name):
            return batch.column(name).to_pylist() if name in schema.names else [None] * batch.num_rows

        for title, sentences, signals, reason in zip(*map(column, ("title", "sentences", "signals", "reason"))):
            row += 1
            if reason is not None and not reason.startswith("quality_"):
                continue
            yield RawDoc(title, sentences, row, "lines",
                         unpack(signals, names) if signals and len(signals) == len(names) else None)


def read_table(path: Path, fmt: str, compression: str | None, problems: Problems, text_field: str):
    """Parquet or Arrow (IPC file or stream) with a text column, read batch by batch."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if compression:  # columnar files need random access: decompress to memory (they are rarely compressed whole)
        stream, raw = open_binary(path, compression)
        with stream, raw:
            source = pa.BufferReader(stream.read())
    else:
        source = pa.memory_map(str(path), "r")
    try:
        if fmt == "parquet":
            pf = pq.ParquetFile(source)
            schema, batches = pf.schema_arrow, None
        else:
            try:
                reader = pa.ipc.open_file(source)
                schema = reader.schema
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            except pa.ArrowInvalid:
                source.seek(0)
                reader = pa.ipc.open_stream(source)
                schema, batches = reader.schema, iter(reader)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"cannot be read as {fmt}: {e}. Is the file complete and really {fmt}?")
    if text_field not in schema.names and "sentences" in schema.names and "id" in schema.names:
        yield from _corpus_rows(batches if batches is not None else pf.iter_batches(batch_size=1024), schema,
                                _signal_names(path))
        return
    if text_field not in schema.names:
        raise InputError(f"has no column {text_field!r} (columns: {', '.join(schema.names)}). "
                         f"Choose the text column with --text-field")
    columns = [text_field] + (["title"] if "title" in schema.names and text_field != "title" else [])
    if batches is None:
        batches = pf.iter_batches(batch_size=1024, columns=columns)
    row = 0
    try:
        for batch in batches:
            texts = batch.column(text_field).to_pylist()
            titles = batch.column("title").to_pylist() if "title" in columns else [None] * len(texts)
            for text, title in zip(texts, titles):
                row += 1
                if not isinstance(text, str):
                    problems.add("missing_field", f"row {row}: {text_field!r} is null or not a string; skipped")
                    continue
                yield RawDoc(title if isinstance(title, str) else None, text.split("\n"), row, "split")
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"stopped after row {row}: {e}. The file looks truncated or corrupt")
