"""prepare-corpus's exact-duplicate removal, in P partition tasks (step 2 of the stage): task p reads the id column of
every part in input order, keeps the ids with id % P == p, and records the rows that repeat an earlier id (first
occurrence wins). Duplicates share their id, hence their partition, so P never changes which rows are dropped; no
process holds more than 1/P of the ids."""
from pathlib import Path

import numpy as np
import pyarrow as pa

from bertkit.fileio import atomic_write_json, atomic_write_npy
from bertkit.formats import CorpusColumns as C
from bertkit.pipelines.engine import Engine, finished

ROWS_PER_PARTITION = 4_000_000   # ~100 MB of ids, positions and sort space per dedup task

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
    out = Path(out)
    atomic_write_npy(out, duplicates)
    record = {"partition": partition, "partitions": partitions, "rows": start, "duplicates": len(duplicates)}
    atomic_write_json(out.with_suffix(".json"), record)
    return record


def run_dedup(engine: Engine, parts: list[Path], total_rows: int, partitions: int, work: Path) -> list[Path]:
    """The P dedup tasks (a finished one, from a killed run, is reused); returns their .npy files."""
    files = [dedup_file(work, p, partitions) for p in range(partitions)]
    todo = [p for p, path in enumerate(files) if not finished(path, rows=total_rows)]
    for _ in engine.map(find_duplicates, [([str(x) for x in parts], p, partitions, str(files[p])) for p in todo]):
        pass
    return files
