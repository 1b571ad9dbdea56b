"""Pretraining data: an instances folder (make-instances) read memory-mapped, batched per rank, deterministically.

* `bertkit.formats.read_instances_manifest` checks the folder and tells what to run when it is missing, unfinished
  or empty; the columns and manifest fields read here are defined there.
* `InstanceDataset` reads rows straight out of the memory-mapped Arrow files (never loaded whole). Static folders
  carry their masking; dynamic ones are masked here with `bertkit.masking.mask_instance` and a generator seeded from
  (seed, epoch, index), so the masking of a row never depends on the worker, the rank or a resume.
* `EpochBatches` is the sampler: one permutation per epoch (seeded from (seed, epoch)), rank r takes every
  world_size-th row, cut into micro batches; a resume starts at micro batch k without reading the k before it.
* `collate` pads to the batch's longest row rounded up to a multiple of 8 (tensor-core friendly, few shapes);
  `collate_packed` lays the rows end to end instead (no padding at all) for the varlen attention kernel.
"""
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from bertkit.fileio import read_arrow
from bertkit.formats import (
    IGNORE_INDEX,
    InstanceColumns as C,
    InstancesError,
    InstancesManifest,
    read_instances_manifest,
)


class _ListColumn:
    """A list<int> Arrow column over several files as numpy views (values, offsets) into the memory map."""

    def __init__(self, chunks):
        self.values, self.offsets = [], []
        for chunk in chunks:
            offsets = chunk.offsets.to_numpy()
            self.offsets.append(offsets)
            self.values.append(chunk.values.to_numpy(zero_copy_only=True))

    def get(self, chunk: int, row: int) -> np.ndarray:
        o = self.offsets[chunk]
        return self.values[chunk][o[row]:o[row + 1]]


class InstanceDataset:
    """Rows of one split. `dataset[(epoch, index)]` -> dict of numpy arrays (epoch only matters when dynamic)."""

    def __init__(self, instances_dir, split: str = "train", seed: int = 0, manifest: InstancesManifest | None = None):
        self.dir = Path(instances_dir)
        self.manifest = manifest or read_instances_manifest(self.dir)
        self.split, self.seed = split, int(seed)
        self.dynamic = self.manifest.mode == "dynamic"
        files = [self.dir / name for name in self.manifest.shard_files(split)]
        tables = [read_arrow(p) for p in files]
        tables = [t for t in tables if t.num_rows]
        # one record batch per chunk: a row is found by (chunk, row in chunk)
        chunks = [b for t in tables for b in t.to_batches()]
        chunks = [b for b in chunks if b.num_rows]
        sizes = np.array([b.num_rows for b in chunks], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(sizes)])
        self.input_ids = _ListColumn([b.column(C.INPUT_IDS) for b in chunks])
        self.b_start = [b.column(C.B_START).to_numpy() for b in chunks]
        self.nsp = [b.column(C.NSP_LABEL).to_numpy() for b in chunks]
        if not self.dynamic:
            self.masked_positions = _ListColumn([b.column(C.MASKED_POSITIONS) for b in chunks])
            self.masked_ids = _ListColumn([b.column(C.MASKED_IDS) for b in chunks])
        self.spec, self._at_rate = None, {}
        if self.dynamic:
            from bertkit.masking import MaskingSpec
            from bertkit.tokenization import read_vocab

            vocab_file = self.dir / "vocab.txt"
            if not vocab_file.is_file():
                raise InstancesError(f"{vocab_file}: missing; dynamic masking needs the vocabulary. "
                                     "Re-run make-instances (it copies vocab.txt into the folder).")
            m = self.manifest
            try:
                vocab = read_vocab(vocab_file)
            except ValueError as e:  # TokenizerError: names the file and line
                raise InstancesError(f"{e}. Re-run make-instances to copy a good vocab.txt.") from None
            # masked as make-instances would have, its reference-behaviour switches included
            self.spec = MaskingSpec.from_vocab(vocab, m.masking)

    def masked_at(self, rate: float) -> "InstanceDataset":
        """This dynamic split masked at another rate (pretrain --masked-lm-prob): its masking otherwise as
        make-instances chose, with room for the predictions the rate makes at the instances' length."""
        import dataclasses
        import math

        if not self.dynamic:
            raise InstancesError(f"{self.dir}: static instances (masked on disk by make-instances) keep their rate; "
                                 "make them with --mode dynamic to mask at another rate as pretraining goes")
        options = self.spec.options
        room = max(options.max_predictions, math.ceil(self.manifest.max_seq_length * rate))
        self.spec = dataclasses.replace(self.spec, options=dataclasses.replace(options, masked_lm_prob=rate,
                                                                               max_predictions=room))
        self._at_rate = {}
        return self

    def _spec_at(self, rate: float):
        """The spec at another rate (a key's third element: a rate scheduled as training goes), its room for
        predictions the one masked_at made (for the schedule's highest rate)."""
        import dataclasses

        if rate not in self._at_rate:
            self._at_rate[rate] = dataclasses.replace(
                self.spec, options=dataclasses.replace(self.spec.options, masked_lm_prob=rate))
        return self._at_rate[rate]

    def lengths(self) -> np.ndarray:
        """Tokens of every row, in index order (from the Arrow offsets: nothing is read)."""
        return np.concatenate([np.diff(o) for o in self.input_ids.offsets]) if self.input_ids.offsets else \
            np.zeros(0, dtype=np.int64)

    @cached_property
    def sep_id(self) -> int | None:
        """The [SEP] id (it ends each document inside an MLM-only row), or None without a vocabulary."""
        from bertkit.tokenization import read_vocab

        vocab_file = self.dir / "vocab.txt"
        tokens = read_vocab(vocab_file) if vocab_file.is_file() else []
        return tokens.index("[SEP]") if "[SEP]" in tokens else None

    @cached_property  # read once: evaluate() asks at every --eval-every
    def mask_id(self) -> int | None:
        """The [MASK] id, from the vocabulary make-instances copied beside the shards (None without one)."""
        if self.spec is not None:
            return self.spec.mask_id
        vocab_file = self.dir / "vocab.txt"
        if not vocab_file.is_file():
            return None
        from bertkit.tokenization import read_vocab

        try:
            return read_vocab(vocab_file).index("[MASK]")
        except ValueError:
            return None

    def __len__(self) -> int:
        return int(self.starts[-1])

    def tokens(self, index: int) -> np.ndarray:
        """Row `index`'s token ids as made (unmasked for dynamic instances, masked on disk for static ones)."""
        return self.input_ids.get(*self._locate(index))

    def _locate(self, index: int):
        chunk = int(np.searchsorted(self.starts, index, side="right") - 1)
        return chunk, index - int(self.starts[chunk])

    def __getitem__(self, key):
        epoch, index, *rate = key   # (epoch, index), or with the rate this row is masked at (RateSchedule)
        if not 0 <= index < len(self):
            raise IndexError(f"instance {index} out of range ({len(self)} in {self.dir} {self.split})")
        chunk, row = self._locate(int(index))
        ids = self.input_ids.get(chunk, row).astype(np.int64)
        if self.dynamic:
            from bertkit.masking import mask_instance

            rng = np.random.default_rng([self.seed, int(epoch), int(index)])
            ids, positions, labels = mask_instance(ids, rng, self._spec_at(rate[0]) if rate else self.spec)
        else:
            positions = self.masked_positions.get(chunk, row).astype(np.int64)
            labels = self.masked_ids.get(chunk, row).astype(np.int64)
        token_type = np.zeros(len(ids), dtype=np.int64)
        token_type[int(self.b_start[chunk][row]):] = 1
        return {"input_ids": np.asarray(ids, dtype=np.int64), "token_type_ids": token_type,
                "mlm_positions": np.asarray(positions, dtype=np.int64), "mlm_labels": np.asarray(labels, np.int64),
                "next_sentence_label": int(self.nsp[chunk][row])}


def round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def collate(rows: list[dict], pad_multiple: int = 8, pad_id: int = 0) -> dict:
    """Right-pad to the batch's longest row rounded up to pad_multiple; MLM slots padded with label -100."""
    import torch

    seq = round_up(max(len(r["input_ids"]) for r in rows), pad_multiple)
    preds = round_up(max(1, max(len(r["mlm_positions"]) for r in rows)), pad_multiple)
    n = len(rows)
    input_ids = np.full((n, seq), pad_id, dtype=np.int64)
    token_type = np.zeros((n, seq), dtype=np.int64)
    attention = np.zeros((n, seq), dtype=np.int64)
    positions = np.zeros((n, preds), dtype=np.int64)
    labels = np.full((n, preds), IGNORE_INDEX, dtype=np.int64)
    for i, r in enumerate(rows):
        length, k = len(r["input_ids"]), len(r["mlm_positions"])
        input_ids[i, :length] = r["input_ids"]
        token_type[i, :length] = r["token_type_ids"]
        attention[i, :length] = 1
        positions[i, :k] = r["mlm_positions"]
        labels[i, :k] = r["mlm_labels"]
    nsp = np.array([r["next_sentence_label"] for r in rows], dtype=np.int64)
    return {k: torch.from_numpy(v) for k, v in (("input_ids", input_ids), ("token_type_ids", token_type),
                                                   ("attention_mask", attention), ("mlm_positions", positions),
                                                   ("mlm_labels", labels), ("next_sentence_label", nsp))}


def collate_packed(rows: list[dict], pad_multiple: int = 8, split_at: int | None = None) -> dict:
    """The rows end to end, unpadded: input_ids / token_type_ids / position_ids (T,), cu_seqlens (B+1,) int32,
    max_seqlen (the longest row rounded up to pad_multiple: a host-side bucket, so the GPU is never asked),
    mlm_positions / mlm_labels (P,) at flat token positions, next_sentence_label (B,). With split_at (the [SEP] id),
    doc_cu_seqlens also cuts each row after every [SEP] inside it: the documents an MLM-only row holds, which a
    model that reads it (ModernBERT) keeps from attending across each other."""
    import torch

    lengths = np.array([len(r["input_ids"]) for r in rows], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    batch = {
        "input_ids": np.concatenate([r["input_ids"] for r in rows]).astype(np.int64),
        "token_type_ids": np.concatenate([r["token_type_ids"] for r in rows]).astype(np.int64),
        "position_ids": np.concatenate([np.arange(n) for n in lengths]).astype(np.int64),
        "cu_seqlens": starts.astype(np.int32),
        "mlm_positions": np.concatenate([np.asarray(r["mlm_positions"], np.int64) + s
                                         for r, s in zip(rows, starts)]).astype(np.int64),
        "mlm_labels": np.concatenate([np.asarray(r["mlm_labels"], np.int64) for r in rows]).astype(np.int64),
        "next_sentence_label": np.array([r["next_sentence_label"] for r in rows], dtype=np.int64),
    }
    if split_at is not None:
        ids = batch["input_ids"]
        ends = np.flatnonzero(ids == split_at) + 1
        batch["doc_cu_seqlens"] = np.union1d(starts, ends).astype(np.int32)
    batch = {k: torch.from_numpy(v) for k, v in batch.items()}
    batch["max_seqlen"] = round_up(int(lengths.max()), pad_multiple)
    return batch


def to_device(batch: dict, device) -> dict:
    """Tensors to the device; plain values (a packed batch's max_seqlen) stay on the host."""
    return {k: v.to(device, non_blocking=True) if hasattr(v, "to") else v for k, v in batch.items()}


@dataclass
class EpochBatches:
    """Micro batches of one rank: [(epoch, index), ...] lists, from micro batch `start` of epoch `start_epoch` on.

    Every rank gets the same number of micro batches per epoch (the permutation's tail that does not fill a micro
    batch on every rank is dropped, a different tail each epoch), so ranks never wait on one another.
    """
    num_rows: int
    micro_batch: int
    seed: int
    rank: int = 0
    world_size: int = 1
    start_epoch: int = 0
    start: int = 0
    shuffle: bool = True

    @property
    def per_epoch(self) -> int:
        return self.num_rows // (self.world_size * self.micro_batch)

    def dealt(self, epoch: int) -> np.ndarray:
        """The rows every rank takes in the epoch, in the order dealt: the first k micro batches of every rank are
        its first k x micro_batch x world_size."""
        order = (np.random.default_rng([self.seed, epoch]).permutation(self.num_rows) if self.shuffle
                 else np.arange(self.num_rows))
        return order[: self.per_epoch * self.micro_batch * self.world_size]

    def first_rows(self, epoch: int, micro_batches: int) -> np.ndarray:
        """The rows of the epoch's first `micro_batches` micro batches of every rank."""
        return self.dealt(epoch)[:micro_batches * self.micro_batch * self.world_size]

    def epoch_indices(self, epoch: int) -> np.ndarray:
        mine = self.dealt(epoch)[self.rank::self.world_size]
        return mine.reshape(self.per_epoch, self.micro_batch)

    def __iter__(self):
        if self.per_epoch == 0:
            raise InstancesError(f"{self.num_rows} instances cannot fill one micro batch of {self.micro_batch} on "
                                 f"each of {self.world_size} rank(s); lower --micro-batch or make more instances.")
        yield from _epoch_after_epoch(self.epoch_indices, self.start_epoch, self.start)


def drawn_rows(sampler, micro_batches: int):
    """(epoch, its rows) of the first `micro_batches` micro batches of every rank of an EpochBatches or
    TokenBudgetBatches, one epoch in memory at a time."""
    per_epoch = max(sampler.per_epoch, 1)
    for epoch in range(-(-micro_batches // per_epoch)):
        yield epoch, sampler.first_rows(epoch, min(micro_batches - epoch * per_epoch, per_epoch))


def tokens_drawn(sampler, lengths: np.ndarray, micro_batches: int) -> int:
    """Tokens of the rows in the first `micro_batches` micro batches of every rank."""
    return sum(int(lengths[rows].sum()) for _, rows in drawn_rows(sampler, micro_batches))


def scheduled_rate(first: float, last: float, steps: int, step: int) -> float:
    """A rate linear from `first` at step 0 to `last` at step `steps` - 1 (to six places)."""
    return round(first + (last - first) * min(step, steps - 1) / max(steps - 1, 1), 6)


@dataclass
class RateSchedule:
    """A sampler's micro batches with each key's masking rate: linear from `first` at optimizer step 0 to `last` at
    the run's last step, micro batch k of the run (counted from `start`) in step `step_of(k)`, so a resumed run
    masks as one never stopped."""
    batches: object
    first: float
    last: float
    steps: int
    step_of: object = None   # micro batch -> its step; None: one micro batch a step
    start: int = 0

    def __iter__(self):
        for k, keys in enumerate(self.batches, start=self.start):
            rate = scheduled_rate(self.first, self.last, self.steps, self.step_of(k) if self.step_of else k)
            yield [(*key, rate) for key in keys]


def _epoch_after_epoch(batches_of, epoch: int, start: int):
    """[(epoch, row), ...] micro batches from batch `start` of `epoch` on, without end; batches_of(epoch) lists an
    epoch's batches (the same number every epoch, so a resume's (epoch, start) finds its place)."""
    while True:
        for rows in batches_of(epoch)[start:]:
            yield [(epoch, int(row)) for row in rows]
        epoch, start = epoch + 1, 0


def best_fit(lengths: np.ndarray, order: np.ndarray, budget: int) -> list[list[int]]:
    """Rows in `order` packed into bins of at most `budget` tokens, each row into the fullest open bin it fits
    (best fit; a new bin when none does). Deterministic: ties go to the earliest bin."""
    import bisect

    bins, room = [], []          # room: sorted (space left, bin index) of the bins the shortest row still fits
    shortest = int(lengths.min(initial=1))
    for row in order.tolist():
        n = int(lengths[row])
        k = bisect.bisect_left(room, (n, -1))
        if k == len(room):
            bins.append([row])
            left, b = budget - n, len(bins) - 1
        else:
            left, b = room.pop(k)
            bins[b].append(row)
            left -= n
        if left >= shortest:
            bisect.insort(room, (left, b))
    return bins


@dataclass
class TokenBudgetBatches:
    """Micro batches of one rank filled to a token budget by best fit (ModernBERT's fixed budget: a step's cost
    does not depend on how long the documents are): each epoch packs a fresh permutation, deals the bins to the
    ranks in turn and keeps the same number on every rank. That number is the fewest bins a perfect packing could
    need, so it is the same every epoch (the few extra bins best fit makes are dropped, other rows each epoch) and a
    resume finds its place as with EpochBatches."""
    lengths: np.ndarray
    budget: int
    seed: int
    rank: int = 0
    world_size: int = 1
    start_epoch: int = 0
    start: int = 0

    def __post_init__(self):
        self.lengths = np.asarray(self.lengths, dtype=np.int64)
        longest = int(self.lengths.max(initial=0))
        if longest > self.budget:
            raise InstancesError(f"--token-budget {self.budget}: an instance has {longest} tokens; give a budget of "
                                 "at least the instances' --max-seq-length")

    @property
    def per_epoch(self) -> int:
        return int(self.lengths.sum()) // (self.budget * self.world_size)

    def first_rows(self, epoch: int, micro_batches: int) -> np.ndarray:
        """The rows of the epoch's first `micro_batches` micro batches of every rank: the bins are dealt in turn, so
        they are the first micro batches x ranks bins."""
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.lengths))
        bins = best_fit(self.lengths, order, self.budget)[:micro_batches * self.world_size]
        return np.asarray([row for b in bins for row in b], dtype=np.int64)

    def epoch_bins(self, epoch: int) -> list[list[int]]:
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.lengths))
        return best_fit(self.lengths, order, self.budget)[self.rank::self.world_size][:self.per_epoch]

    def __iter__(self):
        if self.per_epoch == 0:
            raise InstancesError(f"{int(self.lengths.sum())} tokens of instances cannot fill one micro batch of "
                                 f"{self.budget} tokens on each of {self.world_size} rank(s); lower --token-budget")
        yield from _epoch_after_epoch(self.epoch_bins, self.start_epoch, self.start)


class _Rows:
    """Map-style view for torch's DataLoader: a sampler-produced list of keys -> one collated batch."""

    def __init__(self, dataset: InstanceDataset, pad_multiple: int, unpadded: bool = False,
                 split_at: int | None = None):
        self.dataset, self.pad_multiple, self.unpadded, self.split_at = dataset, pad_multiple, unpadded, split_at

    def __getitem__(self, keys):
        batched = getattr(self.dataset, "rows", None)   # a mixture finds a micro batch's rows together
        rows = batched(keys) if batched else [self.dataset[k] for k in keys]
        if self.unpadded:
            return collate_packed(rows, self.pad_multiple, self.split_at)
        return collate(rows, self.pad_multiple)


def _ignore_stop_signals(worker_id: int) -> None:
    # Ctrl-C / SIGTERM to the process group reach the workers too: leave them to the trainer, which saves a
    # checkpoint at the next step (it needs its workers until then). Workers still exit with their parent.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def batch_loader(dataset: InstanceDataset, batches, num_workers: int = 0, pad_multiple: int = 8,
                 unpadded: bool = False, split_at: int | None = None):
    """Iterate collated micro batches in `batches` order; workers prefetch, the order never changes.
    unpadded: packed batches (collate_packed, split_at: its document cuts) instead of padded ones."""
    import torch

    return torch.utils.data.DataLoader(_Rows(dataset, pad_multiple, unpadded, split_at), sampler=batches,
                                       batch_size=None,
                                       num_workers=num_workers, persistent_workers=False,
                                       prefetch_factor=4 if num_workers else None,
                                       worker_init_fn=_ignore_stop_signals if num_workers else None)


def close_loader(loader) -> None:
    """Stop a batch_loader iterator's worker processes now, whatever state the run is in. The workers ignore SIGTERM
    (see _ignore_stop_signals), so a loader that outlives its loop (held by an exception's traceback) would leave
    them to interpreter exit, which would wait on them forever."""
    shutdown = getattr(loader, "_shutdown_workers", None)  # only multi-process iterators have workers
    if shutdown is not None:
        shutdown()
