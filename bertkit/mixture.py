"""Several instance folders trained on as one, in set proportions (`pretrain --mixture A=0.7,B=0.3`, or sizes raised
to `--mixture-temperature`, as multilingual encoders sample their languages).

A mixture is a dataset of L slots (L: the sources' rows together), `slots[s]` of them source s's, apportioned to the
weights by largest remainder: the sampler (bertkit.data.EpochBatches) permutes the slots each epoch as it permutes any
dataset's rows, so every epoch holds each source in its proportion exactly, a resume finds its place as before, and
any prefix of an epoch holds it up to a random sample's spread. Slot j of source s in epoch e is the source's draw
e * slots[s] + j: its rows in an order of their own, a new permutation for every pass over them, so an up-weighted
source repeats (a new order each pass) and a down-weighted one shows other rows every epoch. Dynamic masking is the
source's own, seeded by its pass."""
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def weights_for(sizes: list[int], weights: list[float | None], temperature: float | None) -> np.ndarray:
    """The sources' sampling probabilities: the weights given, normalised; else the sizes raised to the temperature
    (1: in proportion to size; 0: uniform)."""
    if all(w is not None for w in weights):
        given = np.array(weights, dtype=np.float64)
    else:
        given = np.asarray(sizes, dtype=np.float64) ** (1.0 if temperature is None else temperature)
    return given / given.sum()


def capped(probabilities: np.ndarray, sizes: list[int], rows: int, max_epochs: float) -> np.ndarray:
    """The probabilities with no source drawn more than max_epochs times over its rows in a run of `rows` draws: a
    source above it is held at the cap, the others share the rest in their proportions (again, until none is over;
    Olmo's and mmBERT's cap on repeating a small source). ValueError when even every source at its cap cannot fill
    the run."""
    p, sizes = np.asarray(probabilities, dtype=np.float64), np.asarray(sizes, dtype=np.float64)
    limit = max_epochs * sizes / rows
    if limit.sum() < 1:
        raise ValueError(f"--mixture-max-epochs {max_epochs:g}: the run draws {rows:,} rows, more than {max_epochs:g} "
                         f"passes over the folders' {int(sizes.sum()):,}; raise it, or train fewer steps")
    held = np.zeros(len(p), bool)
    while (over := ~held & (p > limit + 1e-12)).any():
        held |= over
        free = ~held
        p = np.where(held, limit, p)
        p[free] = p[free] / p[free].sum() * (1 - p[held].sum()) if free.any() else p[free]
    return p / p.sum()


def apportion(probabilities: np.ndarray, total: int) -> np.ndarray:
    """Integer shares of `total` in the probabilities' proportions, summing to it (largest remainder; ties to the
    earlier source)."""
    exact = probabilities * total
    shares = np.floor(exact).astype(np.int64)
    extra = np.argsort(-(exact - shares), kind="stable")[: total - int(shares.sum())]
    shares[extra] += 1
    return shares


@dataclass
class Source:
    folder: str
    weight: float | None   # None: from --mixture-temperature


def parse_mixture(spec: tuple | list) -> list[Source]:
    """"DIR=WEIGHT" or "DIR" items (weights for all of them or for none)."""
    sources = []
    for item in spec:
        folder, _, weight = str(item).rpartition("=") if "=" in str(item) else (str(item), "", "")
        try:
            value = float(weight) if weight else None
        except ValueError:
            raise ValueError(f"--mixture {item}: the weight {weight!r} is not a number (DIR=WEIGHT, e.g. ko=0.7)") \
                from None
        if value is not None and not value > 0:
            raise ValueError(f"--mixture {item}: a weight must be above 0")
        sources.append(Source(folder, value))
    if len(sources) < 2:
        raise ValueError("--mixture names at least two instance folders (DIR=WEIGHT,DIR=WEIGHT)")
    if len({s.weight is None for s in sources}) > 1:
        raise ValueError("--mixture: give a weight to every folder or to none (then --mixture-temperature sets them)")
    if len({Path(s.folder).resolve() for s in sources}) < len(sources):
        raise ValueError("--mixture names one folder twice; give it once, with its whole weight")
    return sources


class Mixture:
    """The training rows of several InstanceDatasets (one split each) in proportions: `mixture[(epoch, slot)]`."""

    def __init__(self, datasets: list, probabilities: np.ndarray, seed: int, capped_for_rows: int | None = None):
        self.datasets, self.seed = datasets, int(seed)
        self.capped_for_rows = capped_for_rows   # --mixture-max-epochs' run length: a resumed run keeps these shares
        self.sizes = np.array([len(d) for d in datasets], dtype=np.int64)
        if not self.sizes.all():
            empty = datasets[int(np.flatnonzero(self.sizes == 0)[0])].dir
            raise ValueError(f"--mixture: {empty} has no training instances")
        self.probabilities = np.asarray(probabilities, dtype=np.float64)
        self.slots = apportion(self.probabilities, int(self.sizes.sum()))
        self.starts = np.r_[0, np.cumsum(self.slots)]
        self._orders = {}   # source -> (pass, its permutation): one pass kept per source
        first = datasets[0]
        self.dir, self.manifest, self.dynamic = first.dir, first.manifest, first.dynamic

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def sep_id(self):
        return self.datasets[0].sep_id

    @property
    def mask_id(self):
        return self.datasets[0].mask_id

    def rows_of(self, epoch: int, slots) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source, its pass, its row) of each slot of the epoch."""
        slots = np.asarray(slots, dtype=np.int64)
        source = np.searchsorted(self.starts, slots, side="right") - 1
        passes, k = np.divmod(epoch * self.slots[source] + slots - self.starts[source], self.sizes[source])
        row = np.empty(len(slots), dtype=np.int64)
        group = source * (int(passes.max(initial=0)) + 1) + passes
        for g in np.unique(group).tolist():   # a few (source, pass) groups an epoch
            mine = group == g
            row[mine] = self._order(int(source[mine][0]), int(passes[mine][0]))[k[mine]]
        return source, passes, row

    def _order(self, source: int, passes: int) -> np.ndarray:
        kept = self._orders.get(source)
        if kept is None or kept[0] != passes:
            kept = (passes, np.random.default_rng([self.seed, 7919, source, passes]).permutation(self.sizes[source]))
            self._orders[source] = kept
        return kept[1]

    def __getitem__(self, key):
        return self.rows([key])[0]

    def rows(self, keys) -> list[dict]:
        """The rows of (epoch, slot[, rate]) keys (a scheduled masking rate passes through to the source), a micro
        batch's sources and rows found together: a row at a time, finding them cost three times the reading."""
        keys, found = [tuple(k) for k in keys], {}
        for epoch in sorted({int(k[0]) for k in keys}):
            mine = [i for i, k in enumerate(keys) if int(k[0]) == epoch]
            slots = [int(keys[i][1]) for i in mine]
            for slot in (s for s in slots if not 0 <= s < len(self)):
                raise IndexError(f"slot {slot} out of range ({len(self)} in the mixture)")
            for i, source, passes, row in zip(mine, *(x.tolist() for x in self.rows_of(epoch, slots))):
                found[i] = self.datasets[source][(passes, row, *keys[i][2:])]
        return [found[i] for i in range(len(keys))]

    def realised(self, sampler, micro_batches: int) -> dict:
        """Rows and tokens of each source in the first `micro_batches` micro batches every rank drew from `sampler`
        (bertkit.data.EpochBatches over this mixture)."""
        from bertkit.data import drawn_rows

        counts, tokens = np.zeros(len(self.datasets), np.int64), np.zeros(len(self.datasets), np.int64)
        lengths = [d.lengths() for d in self.datasets]
        for epoch, slots in drawn_rows(sampler, micro_batches):
            source, _, row = self.rows_of(epoch, slots)
            counts += np.bincount(source, minlength=len(counts))
            for s in range(len(counts)):
                tokens[s] += int(lengths[s][row[source == s]].sum())
        return {"rows": counts.tolist(), "tokens": tokens.tolist()}


class Joined:
    """Several held-out splits read as one (`joined[(epoch, index)]`), their rows taken in turn (the first of each,
    the second of each, ...), so the first batches an evaluation reads hold every folder alike."""

    def __init__(self, datasets: list):
        self.datasets, self.dir = datasets, datasets[0].dir
        sizes = [len(d) for d in datasets]
        turns = [(r, s) for s, n in enumerate(sizes) for r in range(n)]
        turns.sort()   # by row, then by source: in turn
        self.source = np.array([s for _, s in turns], dtype=np.int64)
        self.row = np.array([r for r, _ in turns], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.row)

    @property
    def mask_id(self):
        return self.datasets[0].mask_id

    def __getitem__(self, key):
        epoch, index = key
        return self.datasets[int(self.source[index])][(epoch, int(self.row[index]))]


def read_manifests(sources: list[Source]) -> list:
    """The sources' manifests, which must agree on the vocabulary, the sequence length and the objective (one model
    reads them all)."""
    from bertkit.formats import read_instances_manifest

    manifests = [read_instances_manifest(s.folder) for s in sources]

    def identity(m):
        return {"vocabulary": (m.vocab_size, m.files.get("vocab.txt", {}).get("checksum")),
                "max_seq_length": m.max_seq_length, "objective": m.objective}

    first = identity(manifests[0])
    for source, manifest in zip(sources[1:], manifests[1:]):
        for what, value in identity(manifest).items():
            if value != first[what]:
                raise ValueError(f"--mixture: {source.folder} has another {what} than {sources[0].folder} ({value} "
                                 f"against {first[what]}); make every folder's instances with one tokenizer, "
                                 "--max-seq-length and --objective")
    return manifests


def open_mixture(sources: list[Source], temperature: float | None, seed: int,
                 cap: tuple[float, int] | None = None) -> tuple[Mixture, Joined]:
    """(the training mixture, the held-out splits joined) of the sources' folders; cap: (max epochs a source, the
    rows the run draws)."""
    from bertkit.data import InstanceDataset

    manifests = read_manifests(sources)
    train = [InstanceDataset(s.folder, "train", seed, m) for s, m in zip(sources, manifests)]
    probabilities = weights_for([len(d) for d in train], [s.weight for s in sources], temperature)
    if cap is not None:
        probabilities = capped(probabilities, [len(d) for d in train], cap[1], cap[0])
    return Mixture(train, probabilities, seed, cap[1] if cap else None), \
        Joined([InstanceDataset(s.folder, "holdout", seed, m) for s, m in zip(sources, manifests)])
