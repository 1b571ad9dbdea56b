"""Atomic writes and checksums shared by every stage: a reader never sees a half-written file."""
import hashlib
import json
import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def _temp_beside(path: Path):
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
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_json(path, obj, fsync: bool = True) -> None:
    data = json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n"
    atomic_write_bytes(path, data.encode("utf-8"), fsync)


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
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_arrow(path, memory_map: bool = True):
    """Read an Arrow IPC file written by atomic_write_arrow, memory-mapped by default."""
    import pyarrow as pa

    source = pa.memory_map(str(path), "r") if memory_map else pa.OSFile(str(path), "rb")
    return pa.ipc.open_file(source).read_all()


def sha256_file(path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
