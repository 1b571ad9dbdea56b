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


def atomic_write_bytes(path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_json(path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n").encode("utf-8"))


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
