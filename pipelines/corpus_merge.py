"""prepare-corpus's merge (step 3 of the stage, in the main process): the parts in input order, less the rows the
dedup tasks recorded, each document to train or holdout by a hash of its text, cut into shards of --shard-size.
Every decision depends only on the ordered document stream, never on timing, worker count or engine."""
import contextlib
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bertkit.fileio import checksum_file, make_folder
from bertkit.formats import (
    CORPUS_SCHEMA,
    REMOVED_SCHEMA,
    CorpusColumns as C,
    ShardEntry,
    corpus_file_name,
    corpus_schema,
)


def is_holdout(doc_id: str, fraction: float) -> bool:
    """The id is a hash of the text, so this split is stable across runs, input orders and worker counts."""
    return int(doc_id[8:16], 16) < fraction * (1 << 32)


class ShardWriter:
    """Cuts one split's ordered document stream into shards of about shard_size text bytes, each streamed to a temp
    file in the work folder batch by batch and renamed into place when full: memory is one batch, whatever the
    shard size or the split's share of the corpus (a buffered shard grew with the holdout split up to shard_size)."""

    def __init__(self, out: Path, split: str, shard_size: int, work: Path, schema: pa.Schema = CORPUS_SCHEMA,
                 on_shard=None):
        self.out, self.split, self.shard_size, self.work, self.schema = out, split, shard_size, work, schema
        self.on_shard = on_shard   # told of each shard in place (the unfinished manifest lists it)
        self.file = self.writer = None
        self.buffered, self.entries = 0, []
        self.rows = self.sentences = self.text_bytes = 0
        self.shard_rows = 0

    def add(self, table: pa.Table):
        with self._named():
            nbytes = table.column("nbytes").to_numpy()
            while len(table):
                cum = np.cumsum(nbytes)
                cut = int(np.searchsorted(cum, self.shard_size - self.buffered))  # first row reaching the size
                if cut >= len(table):
                    self._write(table)
                    self.buffered += int(cum[-1])
                    return
                self._write(table.slice(0, cut + 1))
                self.flush()
                table, nbytes = table.slice(cut + 1), nbytes[cut + 1:]

    @contextlib.contextmanager
    def _named(self):
        """Arrow's write errors carry the errno (a full disk: ENOSPC) but no file: the shard being written is named."""
        try:
            yield
        except OSError as e:
            if e.filename or e.errno is None:
                raise
            raise OSError(e.errno, e.strerror or str(e), str(self._temp())) from e

    def _temp(self) -> Path:
        return self.work / f"{Path(corpus_file_name(self.split, len(self.entries))).name}.tmp"

    def _write(self, table: pa.Table):
        if self.writer is None:
            self.file = pa.OSFile(str(self._temp()), "wb")
            self.writer = pa.ipc.new_file(self.file, self.schema)
        self.shard_rows += len(table)
        self.sentences += int(pc.sum(pc.list_value_length(table.column(C.SENTENCES))).as_py() or 0)
        self.text_bytes += int(pc.sum(table.column("nbytes")).as_py() or 0)
        self.writer.write_table(table.select(self.schema.names).cast(self.schema))

    def flush(self):
        self.buffered = 0
        if self.writer is None:
            return
        self.writer.close()
        self.file.close()
        name, tmp = corpus_file_name(self.split, len(self.entries)), self._temp()
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        make_folder((self.out / name).parent)   # removed/: never a link to elsewhere
        os.replace(tmp, self.out / name)
        self.entries.append(ShardEntry(name, self.split, self.shard_rows, (self.out / name).stat().st_size,
                                       checksum_file(self.out / name)))
        if self.on_shard is not None:
            self.on_shard(self.entries[-1])
        self.rows += self.shard_rows
        self.file = self.writer = None
        self.shard_rows = 0

    def close(self):
        with self._named():
            self.flush()


class Merger:
    """Splits the ordered stream of parts into the train and holdout shard writers, skipping the rows that the dedup
    tasks found to repeat an earlier document. Memory: one batch, and the duplicate lists memory-mapped (only the
    slice of the current batch is read); the shards being filled are on disk."""

    def __init__(self, out: Path, holdout: float, shard_size: int, duplicates: list[Path], work: Path,
                 cluster_sizes: Path | None = None, drop_sentences: Path | None = None,
                 contaminated: Path | None = None, languages: bool = False, near: Path | None = None,
                 keep_removed: bool = False, signals: bool = False, on_shard=None):
        self.holdout_fraction = holdout
        self.duplicates = [np.load(p, mmap_mode="r") for p in duplicates]  # sorted row positions, one per partition
        # --near-dedup: (position, size) of each cluster's kept document, sorted; the column's other rows hold 1
        self.heads = np.load(cluster_sizes, mmap_mode="r") if cluster_sizes else None
        # --decontaminate sentences: sorted (position, sentence) rows; the sentences go, a document left empty too
        self.drops = np.load(drop_sentences, mmap_mode="r") if drop_sentences else np.zeros((0, 2), np.int64)
        self.emptied = self.dropped_bytes = 0
        # --decontaminate documents: sorted positions that go (counted apart from the duplicates)
        self.contaminated = np.load(contaminated, mmap_mode="r") if contaminated else np.zeros(0, np.int64)
        self.contaminated_rows = 0
        # --near-dedup's removed positions, apart from the exact duplicates only to say the reason with --keep-removed
        self.near = np.load(near, mmap_mode="r") if near else np.zeros(0, np.int64)
        self.removed = ShardWriter(out, "removed", shard_size, work, REMOVED_SCHEMA, on_shard) if keep_removed else None
        self.position = 0  # rows of the parts merged so far
        schema = corpus_schema(cluster_sizes is not None, languages, signals)
        self.train = ShardWriter(out, "train", shard_size, work, schema, on_shard)
        self.holdout = ShardWriter(out, "holdout", shard_size, work, schema, on_shard)

    def _skipped(self, rows: int) -> np.ndarray:
        lo, hi = self.position, self.position + rows
        skip = np.zeros(rows, dtype=bool)
        for d in self.duplicates:
            skip[self._within(d, lo, rows)] = True
        self.position = hi
        return skip

    def add_part(self, part: Path):
        with pa.memory_map(str(part), "r") as source:
            for batch in pa.ipc.open_stream(source):
                keep, held = [], []
                start = self.position
                skip = self._skipped(batch.num_rows)
                exact = skip.copy()
                skip[self._within(self.near, start, batch.num_rows)] = True
                near = skip.copy()
                gone = self._within(self.contaminated, start, batch.num_rows)
                self.contaminated_rows += int((~skip[gone]).sum())
                skip[gone] = True
                for i, doc_id in enumerate(batch.column(C.ID).to_pylist()):
                    if skip[i]:
                        continue  # exact duplicate of an earlier document
                    (held if is_holdout(doc_id, self.holdout_fraction) else keep).append(i)
                table = pa.Table.from_batches([batch])
                if self.removed is not None and skip.any():
                    reasons = np.where(exact, "duplicate", np.where(near, "near_duplicate", "contaminated"))
                    self.keep_removed(table.take(np.flatnonzero(skip)), reasons[skip])
                if len(self.drops):
                    whole = table
                    table, emptied = self._drop_sentences(table, start, set(keep) | set(held))
                    if self.removed is not None and emptied:
                        self.keep_removed(whole.take(sorted(emptied)), ["contaminated"] * len(emptied))
                    keep, held = [i for i in keep if i not in emptied], [i for i in held if i not in emptied]
                if self.heads is not None:
                    table = table.append_column(C.CLUSTER_SIZE, pa.array(self._sizes(start, batch.num_rows)))
                if keep:
                    self.train.add(table.take(keep))
                if held:
                    self.holdout.add(table.take(held))

    def _sizes(self, start: int, rows: int) -> np.ndarray:
        """The cluster sizes of rows start.. (a removed row's is never written)."""
        sizes = np.ones(rows, np.int32)
        lo, hi = np.searchsorted(self.heads[:, 0], [start, start + rows])
        sizes[np.asarray(self.heads[lo:hi, 0]) - start] = self.heads[lo:hi, 1]
        return sizes

    @staticmethod
    def _within(positions: np.ndarray, start: int, rows: int) -> np.ndarray:
        lo, hi = np.searchsorted(positions, start), np.searchsorted(positions, start + rows)
        return np.asarray(positions[lo:hi]) - start

    def keep_removed(self, table: pa.Table, reasons) -> None:
        """Documents taken out, with why, to the removed/ shards (--keep-removed)."""
        self.removed.add(table.append_column(C.REASON, pa.array([str(r) for r in reasons], pa.string())))

    def add_removed_part(self, part: Path) -> None:
        """A part of the documents an input file's own steps took out (process_file), in input order."""
        with pa.memory_map(str(part), "r") as source:
            for batch in pa.ipc.open_stream(source):
                self.removed.add(pa.Table.from_batches([batch]))

    def _drop_sentences(self, table: pa.Table, start: int, kept: set) -> tuple[pa.Table, set]:
        """The batch with the listed sentences of its kept rows removed (their byte counts with them); the rows
        left with none. On the Arrow buffers: no Python string a sentence."""
        positions = np.asarray(self.drops[:, 0])
        lo, hi = np.searchsorted(positions, start), np.searchsorted(positions, start + len(table))
        if lo == hi:
            return table, set()
        drops = np.asarray(self.drops[lo:hi])
        column = table.column(C.SENTENCES).combine_chunks()
        flat, offsets = column.flatten(), column.offsets.to_numpy().astype(np.int64)
        offsets, rows, k = offsets - offsets[0], drops[:, 0] - start, drops[:, 1]
        mine = np.isin(rows, np.fromiter(kept, np.int64, len(kept))) & (k < np.diff(offsets)[rows])
        gone = np.unique(offsets[rows[mine]] + k[mine])   # the sentences' places in the flat column
        owner = np.searchsorted(offsets, gone, side="right") - 1
        sizes = pc.binary_length(flat.take(pa.array(gone))).to_numpy().astype(np.int64) + 4
        removed = np.bincount(owner, weights=sizes, minlength=len(table)).astype(np.int64)
        left = np.diff(offsets) - np.bincount(owner, minlength=len(table))
        keep = np.ones(len(flat), bool)
        keep[gone] = False
        sentences = pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(left)], pa.int32()), flat.filter(keep),
                                             type=table.schema.field(C.SENTENCES).type)
        emptied = set(np.flatnonzero((left == 0) & (removed > 0)).tolist())
        self.dropped_bytes += int(removed.sum())
        self.emptied += len(emptied)
        nbytes = table.column("nbytes").to_numpy() - removed
        table = table.set_column(table.schema.get_field_index(C.SENTENCES), C.SENTENCES, sentences)
        return table.set_column(table.schema.get_field_index("nbytes"), "nbytes", pa.array(nbytes, pa.int64())), emptied

    def close(self) -> list[ShardEntry]:
        self.train.close()
        self.holdout.close()
        if self.removed is not None:
            self.removed.close()
        return self.train.entries + self.holdout.entries + (self.removed.entries if self.removed is not None else [])
