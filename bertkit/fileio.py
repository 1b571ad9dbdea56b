"""Atomic writes, checksums, folder locks and disk errors, shared by every stage: a reader never sees a half-written
file, a damaged one is named, two writers never share a folder, and no write goes through a link (every file is
written as a new file and renamed into place).

Checksums are xxHash's XXH3-128 ("xxh3_128:<hex>"): about 27 GB/s on one core here against 1.8 GB/s for sha256
(so verifying a checkpoint costs about what reading it does), and 128 bits make an accidental match between a
damaged and an intact file negligible. It detects damage, not tampering: a file's identity across stages (the
vocabulary's) stays sha256.
"""
import contextlib
import errno
import hashlib
import json
import math
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import xxhash

from bertkit.errors import DamagedFileError, regular_file

CHECKSUM = "xxh3_128"
DISK_ERRORS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is exceeded",
               errno.EIO: "an input/output error (a failing disk or network file system)",
               errno.EROFS: "the file system is read-only"}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


# ---------------------------------------------------------------- what a command wrote

class _Recording:
    """One output folder's recording: the files written under it (absolute paths), which existing files a writer may
    replace there (None: any), and what to do after each write (the record kept current, so a kill leaves it)."""

    def __init__(self, may_replace=None, after_write=None):
        self.names: set = set()
        self.may_replace, self.after_write = may_replace, after_write


_RECORDS: dict[str, _Recording] = {}   # an output folder (absolute) -> its recording


def record_writes(folder, may_replace=None, after_write=None) -> set:
    """From now on, every file a bertkit writer puts under `folder` is added to the set returned (absolute paths):
    the record of what a command wrote is the names it wrote, never a difference of the folder before and after
    (which would count a user's file saved there during a long run as bertkit's). may_replace(path) -> bool: whether
    an existing file there may be replaced (a user's file may not: FolderNotOwnedError names it); after_write(): run
    after each write of a visible file."""
    recording = _Recording(may_replace, after_write)
    _RECORDS[os.path.abspath(folder)] = recording
    return recording.names


def stop_recording(folder) -> None:
    _RECORDS.pop(os.path.abspath(folder), None)


def _recordings(path: str):
    return [(folder, r) for folder, r in list(_RECORDS.items()) if path.startswith(folder + os.sep)]


def check_replace(path, appending: bool = False) -> None:
    """Refuse a write below a linked folder inside a recording folder (OUT/best -> another model's folder), and the
    replacement of a file that the folder's command did not write (a user's summary.json where bertkit writes one):
    FolderNotOwnedError naming it, before anything is written. A link where the file goes is replaced (never
    followed); a file this command wrote, or one its record shows bertkit wrote, is replaced."""
    path = os.path.abspath(path)
    for folder, recording in _recordings(path):
        between = Path(os.path.relpath(path, folder)).parents[:-1]
        linked = next((Path(folder, p) for p in reversed(between) if Path(folder, p).is_symlink()), None)
        if linked is not None:   # a folder inside the output that is a link: the write would land elsewhere
            raise FolderNotOwnedError(f"{linked}: a link to {os.readlink(linked)}; bertkit writes only inside the "
                                      "folder it was given, never through a link in it. Remove the link (or give "
                                      "another output folder), then run the same command again")
    if appending or os.path.islink(path) or not os.path.lexists(path):   # an append destroys nothing
        return
    for folder, recording in _recordings(path):
        if os.path.relpath(path, folder).startswith(".bertkit"):   # the lock, the record, staging: bertkit's names
            continue
        if path not in recording.names and recording.may_replace and not recording.may_replace(path):
            raise FolderNotOwnedError(f"{path}: bertkit did not write this, and it would be replaced; move it away "
                                      "(or give another output folder), then run the same command again")


def note_written(path) -> None:
    """Tell the recorders that bertkit put `path` in place (every writer here calls it; code that writes through
    another library, TensorBoard's, calls it for the files that library wrote)."""
    path = os.path.abspath(path)
    for folder, recording in _recordings(path):
        recording.names.add(path)
        if recording.after_write and not os.path.relpath(path, folder).startswith("."):
            recording.after_write()


def _temp_beside(path: Path):
    check_replace(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, _FILE_MODE)  # mkstemp makes 0600 files; outputs should read like any other file
    return fd, Path(tmp)


def atomic_write_bytes(path, data: bytes, fsync: bool = True) -> None:
    """Write to a temp file beside `path`, then rename it into place. fsync=False for records whose loss in a
    crash only costs redoing work (the rename still means a reader sees all of the file or none of it)."""
    path = Path(path)
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        note_written(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_copy(src, dst, within=None) -> None:
    """Copy src into a new file beside dst, renamed into place: a link found at dst is replaced, never followed
    (a folder from someone else may hold one pointing anywhere), and src must be a regular file no link leads to
    (below `within`, the folder it comes from): a link to /proc/self/environ is refused, never copied."""
    regular_file(src, within)
    dst = Path(dst)
    fd, tmp = _temp_beside(dst)
    try:
        with os.fdopen(fd, "wb") as f, open(src, "rb") as source:
            shutil.copyfileobj(source, f)
        os.replace(tmp, dst)
        note_written(dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def make_folder(path) -> Path:
    """path as a real folder, made if missing; a link or a file there is refused, naming it: a write below a link
    would land outside the folder the user gave."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise FolderNotOwnedError(f"{path}: a link or a file where bertkit makes a folder of its own; move it away, "
                                  "then run the same command again")
    path.mkdir(parents=True, exist_ok=True)
    return path


def open_append(path):
    """A log file opened for appending, never through a link: one found there is replaced by a new file."""
    path = Path(path)
    check_replace(path, appending=not path.is_symlink())
    if path.is_symlink():
        print(f"note: {path} was a symbolic link; replaced by a new file (bertkit never writes through a link)",
              file=sys.stderr)
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, _FILE_MODE)
    note_written(path)
    return os.fdopen(fd, "a", encoding="utf-8")


def finite_json(obj):
    """obj with every NaN or infinity as None: JSON has neither (Python's NaN token is refused by strict readers,
    jq and JavaScript's JSON.parse among them), and null is what JSON.stringify writes for them."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def atomic_write_json(path, obj, fsync: bool = True) -> None:
    """`obj` as strict JSON: a NaN or infinity (a correlation of constant predictions, a diverged loss) is written as
    null, never as a token other readers reject."""
    data = json.dumps(finite_json(obj), indent=2, ensure_ascii=False, sort_keys=False, allow_nan=False) + "\n"
    atomic_write_bytes(path, data.encode("utf-8"), fsync)


def atomic_write_npy(path, array) -> None:
    """A numpy array as an .npy file, written as atomic_write_bytes writes (np.load reads it)."""
    import io

    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, array)
    atomic_write_bytes(path, buffer.getvalue())


def read_json_or_none(path):
    """The JSON in `path`, or None when it is missing or unreadable (a resume record lost in a crash)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def atomic_write_arrow(path, table) -> None:
    """Write a pyarrow Table as an Arrow IPC *file* (memory-mappable), atomically."""
    import pyarrow as pa

    path = Path(path)
    fd, tmp = _temp_beside(path)
    os.close(fd)
    try:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        note_written(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_arrow(path, memory_map: bool = True):
    """Read an Arrow IPC file written by atomic_write_arrow, memory-mapped by default. A file that is not a
    readable Arrow file raises DamagedFileError naming it (never pyarrow's own error)."""
    import pyarrow as pa

    try:
        source = pa.memory_map(str(path), "r") if memory_map else pa.OSFile(str(path), "rb")
        return pa.ipc.open_file(source).read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        if isinstance(e, OSError) and e.errno not in (None, errno.EIO):
            raise
        raise DamagedFileError(path, f"not a readable Arrow file ({str(e).splitlines()[0]})") from None


def sha256_file(path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def checksum_bytes(data: bytes) -> str:
    return f"{CHECKSUM}:{xxhash.xxh3_128(data).hexdigest()}"


def checksum_file(path, chunk: int = 8 << 20) -> str:
    """"xxh3_128:<hex>" of a file, streamed."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return f"{CHECKSUM}:{h.hexdigest()}"


def file_matches(path, checksum: str) -> bool:
    """Whether the file has this checksum ("xxh3_128:..." or, from older manifests, "sha256:...")."""
    algorithm, _, digest = checksum.partition(":")
    if algorithm == CHECKSUM:
        return checksum_file(path) == checksum
    if algorithm == "sha256":
        return sha256_file(path) == digest
    raise ValueError(f"unknown checksum algorithm {algorithm!r}")


def file_entry(path) -> dict:
    """{"bytes", "checksum"} of a file, as manifests record it."""
    path = Path(path)
    return {"bytes": path.stat().st_size, "checksum": checksum_file(path)}


def not_utf8_message(data: bytes, name) -> str:
    """What to say about bytes that are not UTF-8: which legacy encoding they read as, and the iconv command."""
    scripts = {"cp949": ((0xAC00, 0xD7A3),), "shift_jis": ((0x3040, 0x30FF), (0x4E00, 0x9FFF)),
               "gb18030": ((0x4E00, 0x9FFF),)}
    for codec, label in (("cp949", "CP949/EUC-KR (Korean Windows)"), ("shift_jis", "Shift-JIS (Japanese)"),
                         ("gb18030", "GB18030 (Chinese)")):
        text = data.decode(codec, "ignore")
        try:
            data.decode(codec)
        except UnicodeDecodeError as e:
            if e.start < len(data) - 4:  # a sniffed head may end inside a character
                continue
        wide = [c for c in text if ord(c) > 0x7F]
        native = sum(any(a <= ord(c) <= b for a, b in scripts[codec]) for c in wide)
        if not wide or native < 0.8 * len(wide):  # decodes, but not as that language's text: another encoding
            continue
        return (f"is {label} text, not UTF-8; convert it first: iconv -f {codec.upper()} -t UTF-8 {name} > "
                f"{Path(str(name)).stem}.utf8{Path(str(name)).suffix}")
    return ("is not UTF-8 (binary, or a legacy encoding?); convert it to UTF-8 first, e.g. "
            f"iconv -f CP949 -t UTF-8 {name} > {Path(str(name)).stem}.utf8{Path(str(name)).suffix}")


# ---------------------------------------------------------------- one writer per folder

LOCK_FILE = ".bertkit.lock"


class FolderError(Exception):
    """A folder could not be written: another writer holds it, or the disk failed. The message says what to do."""


class FolderLockedError(FolderError):
    pass


def _process_start(pid: int) -> str | None:
    """The kernel's start time of a process (Linux), to tell a live process from a later one that reused its id."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(holder: dict) -> bool:
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return True  # unreadable: assume it is alive rather than take over a live writer's folder
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    started = _process_start(pid)
    return started is None or holder.get("process_start") in (None, started)


class FolderNotOwnedError(FolderError):
    """A command was pointed at a folder that holds something else: another stage's output or the user's files."""


# the command that wrote a folder, from the files it writes (a manifest's stage, a run's config.json) or, for a run
# that was killed, its lock
OUTPUT_KINDS = {"prepare-corpus": "a corpus", "train-tokenizer": "a tokenizer", "make-instances": "an instances",
                "pretrain": "a pretraining run", "export": "an exported model", "finetune": "a fine-tuning",
                "finetune-korean": "a Korean evaluation", "finetune-embed": "a sentence-embedding training"}


# the work folders a killed stage leaves before its manifest exists
WORK_FOLDERS = {".work": "prepare-corpus", ".scans": "train-tokenizer", ".parts": "make-instances"}


def folder_kind(folder) -> str | None:
    """Which command's output `folder` is (a key of OUTPUT_KINDS); "" for a folder holding anything else; None when
    it does not exist or holds only hidden files (bertkit's lock, a scheduler's notes, .DS_Store)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    for name, key in (("manifest.json", "stage"), ("config.json", "stage"), (LOCK_FILE, "what")):
        d = read_json_or_none(folder / name) if (folder / name).is_file() else None
        if name == LOCK_FILE and isinstance(d, dict) and (d.get("host") != socket.gethostname() or _alive(d)):
            continue  # a live writer (or one on another host): folder_lock says who holds the folder
        if isinstance(d, dict) and d.get(key) in OUTPUT_KINDS:
            return d[key]
    for name, kind in WORK_FOLDERS.items():
        if (folder / name).is_dir():
            return kind
    if not any(not p.name.startswith(".") for p in folder.iterdir()):
        return None
    summary = read_json_or_none(folder / "metrics.json") if (folder / "metrics.json").is_file() else None
    if isinstance(summary, dict) and "task" in summary and "settings" in summary:
        return "finetune"
    return ""


def check_folder_owned(folder, what: str, overwrite: bool = False) -> None:
    """Refuse to write `what`'s output into a folder that holds anything but `what`'s own (new, empty, or the same
    command's output to resume or overwrite), naming what is there. Nothing is created. With `overwrite`, a folder
    of the user's own files is written into (bertkit.outputs then replaces only bertkit's files there)."""
    folder = Path(folder)
    if folder.is_symlink() and not folder.exists():
        raise FolderNotOwnedError(f"{folder}: a link to {os.readlink(folder)}, which does not exist; remove the "
                                  f"link or give {what} another folder")
    if folder.exists() and not folder.is_dir():
        raise FolderNotOwnedError(f"{folder}: exists and is not a folder; give {what} a new or empty folder")
    above = next((p for p in folder.absolute().parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise FolderNotOwnedError(f"{folder}: cannot be made, as {above} is a file, not a folder; give {what} "
                                  "another folder")
    kind = folder_kind(folder)
    if kind is None or kind == what or (kind == "" and overwrite):
        return
    if kind:
        there = f"{OUTPUT_KINDS[kind]} folder ({kind}'s output)"
    else:
        names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
        there = "files no bertkit command wrote there (" + ", ".join(names[:5]) + \
            (f" and {len(names) - 5} more" if len(names) > 5 else "") + ")"
    raise FolderNotOwnedError(f"{folder} holds {there}; {what} writes only into a new or empty folder or its own "
                              "output. Choose another folder")


@contextlib.contextmanager
def folder_lock(folder, what: str, say=None, overwrite: bool = False):
    """Hold FOLDER/.bertkit.lock (host, pid, what, since) while writing the folder. The folder must be new, empty or
    `what`'s own output (check_folder_owned). A second writer stops at once with FolderLockedError saying who
    holds it; a lock left by a dead process on this host is taken over (`say` is told). Liveness comes from the
    process table, never from clocks, so clock skew cannot expire a live lock. A folder made here and left empty by
    a failed command is removed again."""
    folder = Path(folder)
    check_folder_owned(folder, what, overwrite)
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FolderError(f"{folder}: cannot be made ({e.strerror}); give {what} another folder") from None
    try:
        with _locked(folder, what, say):
            yield
    except BaseException:
        if created and not any(p.name != LOCK_FILE for p in folder.iterdir()):
            shutil.rmtree(folder, ignore_errors=True)
        raise


@contextlib.contextmanager
def _locked(folder: Path, what: str, say):
    path = folder / LOCK_FILE
    me = {"host": socket.gethostname(), "pid": os.getpid(), "process_start": _process_start(os.getpid()),
          "what": what, "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(sys.argv)[:500]}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, _FILE_MODE)
        except FileExistsError:
            try:
                holder = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                holder = {}
            if holder.get("host") == me["host"] and not _alive(holder):
                stale = path.with_name(f"{LOCK_FILE}.stale.{os.getpid()}")
                try:
                    os.replace(path, stale)  # one taker wins the rename; the others find the new lock next round
                except FileNotFoundError:
                    continue
                stale.unlink(missing_ok=True)
                if say:
                    say(f"{folder}: took over the lock left by process {holder.get('pid')} on this host, which is "
                        f"gone ({holder.get('what')}, since {holder.get('since')})")
                continue
            where = "this host" if holder.get("host") == me["host"] else f"host {holder.get('host')}"
            raise FolderLockedError(
                f"{folder} is being written by process {holder.get('pid')} on {where} ({holder.get('what')}, since "
                f"{holder.get('since')}: {holder.get('command')}). Wait for it to finish, or use another output "
                f"folder; if that process is certainly gone, delete {path}") from None
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(me, f)
        break
    else:
        raise FolderLockedError(f"{folder}: could not take {path}; another writer keeps taking it")
    try:
        yield
    finally:
        try:
            if json.loads(path.read_text(encoding="utf-8")).get("pid") == me["pid"]:
                path.unlink()
        except (OSError, ValueError):
            pass


# ---------------------------------------------------------------- disk full, I/O errors

class DiskError(FolderError):
    """A stage could not write its folder (disk full, I/O error); nothing it wrote is marked complete."""

    def __init__(self, errno_: int, message: str):
        super().__init__(message)
        self.errno = errno_


@contextlib.contextmanager
def disk_errors(folder, retry: str):
    """Turn ENOSPC / EDQUOT / EIO / EROFS while writing `folder` into one DiskError with what to do. torch.save
    reports a failed write (a full disk included) as a RuntimeError without an errno: on a device that is (nearly)
    full it is taken for ENOSPC."""
    try:
        yield
    except OSError as e:
        if e.errno not in DISK_ERRORS:
            raise
        where = f" ({e.filename})" if e.filename else ""
        raise DiskError(e.errno, f"{folder}: {DISK_ERRORS[e.errno]} while writing{where}. Nothing unfinished was "
                                 f"marked complete: {retry}") from None
    except RuntimeError as e:
        torch_write = any(s in str(e) for s in ("unexpected pos", "file write failed", "PytorchStreamWriter"))
        if not torch_write or free_bytes(folder) > NEARLY_FULL:
            raise
        raise DiskError(errno.ENOSPC, f"{folder}: {DISK_ERRORS[errno.ENOSPC]} while writing (torch: "
                                      f"{str(e).splitlines()[0][:100]}). Nothing unfinished was marked complete: "
                                      f"{retry}") from None


NEARLY_FULL = 64 << 20


def free_bytes(folder) -> int:
    """Bytes free to this user on the device holding folder (or its nearest existing parent)."""
    path = Path(folder).absolute()
    while not path.exists():
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
