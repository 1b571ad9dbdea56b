"""`bertkit make-instances`: MLM + NSP training instances from a prepare-corpus folder.

The rules are google-research/bert's create_pretraining_data.py (pipelines/README.md, make-instances, numbers them 1-6);
this module runs them per work unit (a run of documents of one shard), in parallel, numpy doing the per-token work:

  tokenize the unit once (WordEncoder: distinct words through the Rust tokenizer)  ->  for each dupe pass:
  pairs (Python loop over chunks: rules 1-3)  ->  shuffle  ->  truncate (rule 4, closed form)  ->
  assemble [CLS] A [SEP] B [SEP] (rule 5, index arithmetic)  ->  mask (rule 6, bertkit.masking.mask_batch)  ->
  one Arrow file per (unit, pass), written atomically.

Each (split, unit, pass) has its own generator seeded by (seed, split, unit, pass) and units depend only on the
corpus, so the output is the same bytes whatever --workers or --engine is (pipelines/engine.py runs the units here,
in a process pool or as Ray tasks), and a killed run resumes by redoing only the files that are missing. Memory is
one unit's tokens plus one pass of its instances, never corpus x dupe.
`--compat google` (pipelines/google_compat.py) instead replays the reference's random calls exactly.
"""
import sys
from array import array
from bisect import bisect_left
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from bertkit.fileio import (
    LOCK_FILE,
    atomic_copy,
    atomic_write_bytes,
    atomic_write_json,
    checksum_bytes,
    disk_errors,
    file_entry,
    file_matches,
    folder_lock,
    read_arrow,
    read_json_or_none,
)
from bertkit.formats import (
    TOKENIZER_FILES,
    CorpusColumns,
    InstancesError,
    InstancesManifest,
    MaskingOptions,
    ShardEntry,
    corpus_shards,
    instances_file_name,
    read_corpus_manifest,
    write_manifest,
)
from bertkit.masking import mask_batch
from bertkit.pipelines.engine import Engine, check_available, check_engine, check_shared_path
from bertkit.pipelines.google_compat import make_instances_google
from bertkit.pipelines.instance_io import (
    empty_stats,
    instances_table,
    load_stage_tokenizer,
    masking_spec,
    pass_stats,
    ragged_arange,
    single_threaded_tokenizers,
    tokenize_documents,
    word_encoder,
)
from bertkit.progress import tqdm
from bertkit.recipes import RECIPES

MAX_POSITIONS = 512          # BERT's position embeddings: the limit of NSP/SOP pairs
MAX_MLM_ONLY = 8192          # --objective none: ModernBERT's context (RoPE has no position table)
SPLIT_CODE = {"train": 0, "holdout": 1}


OBJECTIVES = ("nsp", "sop", "none")


@dataclass
class InstancesConfig:
    max_seq_length: int = 128
    masking: MaskingOptions = field(default_factory=MaskingOptions)   # max_predictions resolved for the length
    objective: str = "nsp"             # nsp (BERT) | sop (ALBERT: same-document segments, swapped order negative)
                                       # | none (RoBERTa FULL-SENTENCES: one segment across documents, MLM only)
    short_seq_prob: float = 0.1
    dupe: int | None = None            # passes over the corpus; None: 10 in static mode, 1 in dynamic mode
    seed: int = 12345
    mode: str = "static"               # "static": masked here; "dynamic": unmasked pairs, masked by the loader
    workers: int = 1                   # processes (--engine local); the output does not depend on it
    engine: str = "local"              # local | ray: where the work units run; the output does not depend on it
    ray_address: str | None = None     # --engine ray: head node host:port; None: a reachable cluster, else a local one
    compat: str | None = None          # "google": single process, the reference's exact random calls
    same_doc_notnext: bool = False          # NotNext B may come from A's own document (NVIDIA/DeepLearningExamples#421)
    holdout_dupe: int = 1                   # passes over the held-out split (an evaluation set needs one)
    unit_mb: float | None = None            # work unit: a run of one shard's documents with about this much text;
                                            # None: corpus text / 32, clamped to 1..16 MB (never depends on workers)
    rows_per_file: int = 250_000            # --compat google only: it writes one shuffled list, cut into files
    rehydrate: str | None = None            # repeat a training document by its near-duplicate cluster's size
                                            # ("fineweb2" or "N:W,...": rehydration below); never the holdout

    def __post_init__(self):
        if isinstance(self.masking, dict):   # from asdict (the workers' copy) or JSON
            self.masking = MaskingOptions(**self.masking)
        if self.compat == "google":         # the reference's behaviour in every respect
            self.masking = replace(self.masking, random_from_whole_vocab=True, wwm_decide_per_piece=True)
            self.same_doc_notnext = True
        if self.masking.problem() is None:  # a bad rate is reported by check(), in the command's words
            self.masking = self.masking.for_length(self.max_seq_length)

    @classmethod
    def from_flags(cls, flags: dict, given: set = frozenset()) -> "InstancesConfig":
        """The config of `bertkit make-instances`' flags (named as the fields are; the masking ones gathered into
        `masking`); a --recipe's settings fill the flags not in `given`."""
        flags = dict(flags)
        recipe = flags.pop("recipe", None)
        if recipe:
            if recipe not in RECIPES:
                raise InstancesError(f"--recipe {recipe!r}: choose one of {', '.join(RECIPES)}")
            flags.update({k: v for k, v in RECIPES[recipe]["make-instances"].items() if k not in given})
        flags = MaskingOptions.gather(flags)
        return cls(**{**flags, "masking": MaskingOptions(**flags["masking"])})

    @property
    def passes(self) -> int:
        return self.dupe if self.dupe is not None else (10 if self.mode == "static" else 1)

    def check(self) -> None:
        limit = MAX_MLM_ONLY if self.objective == "none" else MAX_POSITIONS
        if not 8 <= self.max_seq_length <= limit:
            longer = "" if self.objective == "none" else f"; up to {MAX_MLM_ONLY:,} with --objective none (MLM only)"
            raise InstancesError(f"--max-seq-length {self.max_seq_length}: must be between 8 and {limit} "
                                 f"(BERT has {MAX_POSITIONS} positions; [CLS] A [SEP] B [SEP] needs room for A and B"
                                 f"{longer})")
        if self.mode not in ("static", "dynamic"):
            raise InstancesError(f"--mode {self.mode!r}: use static or dynamic")
        if self.compat not in (None, "google"):
            raise InstancesError(f"--compat {self.compat!r}: the only compatibility mode is 'google'")
        if self.compat == "google" and self.mode != "static":
            raise InstancesError("--compat google writes masked instances as the reference does: use --mode static")
        if self.objective not in OBJECTIVES:
            raise InstancesError(f"--objective {self.objective!r}: choose nsp, sop or none")
        if self.compat == "google" and (self.objective != "nsp" or self.masking.mask_replace != (0.8, 0.1, 0.1)):
            raise InstancesError("--compat google replays BERT's recipe: --objective nsp and --mask-replace "
                                 "0.8,0.1,0.1")
        if self.masking.problem():
            raise InstancesError(self.masking.problem())
        if self.passes < 1 or self.holdout_dupe < 1:
            raise InstancesError(f"--dupe {self.passes}: must be at least 1")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise InstancesError(f"--short-seq-prob {self.short_seq_prob}: must be between 0 and 1")
        if self.workers < 1:
            raise InstancesError(f"--workers {self.workers}: must be at least 1")
        check_engine(self.engine, InstancesError)
        if self.rehydrate is not None:
            rehydration(self.rehydrate)   # a bad table stops here, in the flag's words
            if self.compat == "google":
                raise InstancesError("--compat google replays the reference, which has no --rehydrate")
        if self.compat == "google" and self.engine != "local":
            raise InstancesError("--compat google replays one random stream in one process, in memory: use "
                                 "--engine local")

    def identity(self) -> dict:
        """The options that decide the output bytes (not workers, not the engine): a resumed run must match them."""
        d = asdict(self)
        for run_only in ("workers", "engine", "ray_address"):
            d.pop(run_only)
        d["dupe"] = self.passes
        d["masking"]["mask_replace"] = list(self.masking.mask_replace)  # as JSON keeps it
        if self.rehydrate is None:
            d.pop("rehydrate")   # as folders made before the option recorded it
        return d


# FineWeb2's re-hydration (github.com/huggingface/fineweb-2, README): the document kept from a near-duplicate cluster
# of N appears as many times as the weight of the largest bound <= N; clusters of 1,000 or more are taken to be
# boilerplate and kept once. (bound, appearances), bounds rising from 1.
REHYDRATION = {"fineweb2": ((1, 1), (2, 2), (3, 3), (5, 5), (100, 8), (1000, 1))}


def rehydration(spec: str) -> tuple[tuple[int, int], ...]:
    """--rehydrate's table: a name in REHYDRATION or "N:W,N:W,..." (from cluster size N on, W appearances)."""
    if spec in REHYDRATION:
        return REHYDRATION[spec]
    try:
        table = tuple((int(n), int(w)) for n, w in (pair.split(":") for pair in spec.split(",")))
    except ValueError:
        table = ()
    bounds = [n for n, _ in table]
    if not table or bounds[0] != 1 or bounds != sorted(set(bounds)) or not all(1 <= w <= 100 for _, w in table):
        raise InstancesError(f"--rehydrate {spec!r}: give {' or '.join(REHYDRATION)}, or cluster-size bounds rising "
                             "from 1 with the appearances from each on (1 to 100), as 1:1,2:2,5:4,1000:1")
    return table


def appearances(cluster_sizes: np.ndarray, spec: str) -> np.ndarray:
    """How many times each document appears in the training passes, for its cluster's size."""
    bounds, weights = (np.array(column) for column in zip(*rehydration(spec)))
    return weights[np.searchsorted(bounds, np.maximum(cluster_sizes, 1), side="right") - 1]


# ---------------------------------------------------------------------------------------------------------------
# Rules 1-3: segment pairs of one pass over one shard's documents


def build_pairs(seg_start: np.ndarray, doc_seg: np.ndarray, rng: np.random.Generator, config: InstancesConfig,
                block: int = 4096):
    """Token ranges of A and B for every instance of one pass, in document order.

    Returns int64 arrays a_lo, a_hi, b_lo, b_hi (ranges into the unit's token array) and bool not_next, plus the
    number of chunks skipped (a one-token chunk in a one-document pool: nothing to pair it with).
    Uniform draws come from a block refilled before it can run out (a chunk uses at most 14), so the Python loop
    only indexes a list; every integer is floor(u * n).
    """
    max_num = config.max_seq_length - 3
    n_docs = len(doc_seg) - 1
    starts, dseg = seg_start.tolist(), doc_seg.tolist()
    single_doc = n_docs == 1 and not config.same_doc_notnext
    reference_tries = config.same_doc_notnext
    out = {k: array("q") for k in ("a_lo", "a_hi", "b_lo", "b_hi", "not_next")}
    a_lo_, a_hi_, b_lo_, b_hi_, nn_ = (out[k].append for k in ("a_lo", "a_hi", "b_lo", "b_hi", "not_next"))
    skipped = 0
    u, k = rng.random(block).tolist(), 0
    for d in range(n_docs):
        if k > block - 16:
            u, k = rng.random(block).tolist(), 0
        target = max_num                                   # rule 1
        if u[k] < config.short_seq_prob:
            target = 2 + int(u[k + 1] * (max_num - 1))
        k += 2
        s_end = dseg[d + 1]
        chunk = dseg[d]
        while chunk < s_end:
            # rule 2: the chunk's last segment i is the first where it reaches the target, or the document's last
            i = bisect_left(starts, starts[chunk] + target, chunk + 1, s_end) - 1
            if k > block - 16:
                u, k = rng.random(block).tolist(), 0
            n_chunk = i - chunk + 1
            a_end = chunk + (1 if n_chunk == 1 else 1 + int(u[k] * (n_chunk - 1)))
            a_lo, a_hi = starts[chunk], starts[a_end]
            next_chunk = i + 1
            if config.objective == "sop":                # ALBERT: A and B from one chunk, swapped for the negative
                pair = _pair_in_chunk(starts, i, n_chunk, a_lo, a_hi, u, k, swap=u[k + 2] < 0.5)
            elif single_doc:                             # nothing to draw a random B from: B is A's continuation
                pair = _pair_in_chunk(starts, i, n_chunk, a_lo, a_hi, u, k, swap=False)
            elif n_chunk == 1 or u[k + 1] < 0.5:       # rule 3: NotNext
                pair = (a_lo, a_hi, *_random_b(starts, dseg, d, n_docs, target - (a_hi - a_lo), u, k,
                                               reference_tries), 1)
                next_chunk = a_end                     # the chunk's segments after A start the next chunk
            else:                                      # IsNext: B is the rest of the chunk
                pair = (a_lo, a_hi, a_hi, starts[i + 1], 0)
            if pair is None:
                skipped += 1
            else:
                a_lo_(pair[0]), a_hi_(pair[1]), b_lo_(pair[2]), b_hi_(pair[3]), nn_(pair[4])
            k += 13
            chunk = next_chunk
    arrays = {k: np.frombuffer(v, dtype=np.int64) if len(v) else np.zeros(0, np.int64) for k, v in out.items()}
    arrays["not_next"] = arrays["not_next"].astype(bool)
    return arrays, skipped


def _pair_in_chunk(starts, i, n_chunk, a_lo, a_hi, u, k, swap: bool):
    """A and B both from one chunk (SOP, or a pool of one document): the chunk's first segments and the rest, or a
    lone segment cut inside; swapped (label 1) for SOP's negative. None for a one-token chunk."""
    if n_chunk > 1:
        lo, mid, hi = a_lo, a_hi, starts[i + 1]
    elif a_hi - a_lo >= 2:
        lo, mid, hi = a_lo, a_lo + 1 + int(u[k + 1] * (a_hi - a_lo - 1)), a_hi
    else:
        return None
    return (mid, hi, lo, mid, 1) if swap else (lo, mid, mid, hi, 0)


def _random_b(starts, dseg, d, n_docs, b_target, u, k, reference_tries) -> tuple[int, int]:
    """NotNext's B: segments from a random point of another document, up to b_target tokens. The reference makes
    10 tries to avoid document d; otherwise uniform over the other documents."""
    if reference_tries:
        for t in range(10):
            r = int(u[k + 2 + t] * n_docs)
            if r != d:
                break
    else:
        r = int(u[k + 2] * (n_docs - 1))
        r += r >= d
    r0, r1 = dseg[r], dseg[r + 1]
    rs = r0 + int(u[k + 12] * (r1 - r0))
    return starts[rs], starts[bisect_left(starts, starts[rs] + b_target, rs + 1, r1)]


# ---------------------------------------------------------------------------------------------------------------
# Rules 4-5: truncation and assembly, vectorised


def full_sentences(tokens: np.ndarray, seg_start: np.ndarray, doc_seg: np.ndarray, rng: np.random.Generator,
                   max_seq_length: int, cls_id: int, sep_id: int, dtype):
    """--objective none (RoBERTa's FULL-SENTENCES): the pass's documents in a random order, their segments laid end
    to end into rows of at most max_seq_length tokens, [CLS] first, [SEP] last and between documents; a segment
    longer than a row is cut. Returns (flat ids, row offsets); every row is one segment (b_start = its length)."""
    budget = max_seq_length - 2
    starts = seg_start.tolist()
    rows, row, used = [], [], 0
    for d in rng.permutation(len(doc_seg) - 1).tolist():
        for s in range(int(doc_seg[d]), int(doc_seg[d + 1])):
            lo, hi = starts[s], min(starts[s + 1], starts[s] + budget)
            if used + hi - lo > budget and row:
                rows.append(row)
                row, used = [], 0
            row.append((lo, hi))
            used += hi - lo
        if row and used < budget:
            row.append(None)  # a [SEP] between documents
            used += 1
    if row:
        rows.append(row)
    pieces, lengths = [], []
    for row in rows:
        if row[-1] is None:
            row = row[:-1]  # the row's own closing [SEP] ends it
        parts = [np.array([cls_id], dtype)]
        parts += [np.array([sep_id], dtype) if r is None else tokens[r[0]:r[1]] for r in row]
        parts.append(np.array([sep_id], dtype))
        pieces.append(np.concatenate(parts))
        lengths.append(len(pieces[-1]))
    ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype)
    return ids, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def shuffle_rows(ids: np.ndarray, offsets: np.ndarray, rng: np.random.Generator):
    """The rows of a flat (ids, offsets) batch in a random order."""
    lengths = np.diff(offsets)
    order = rng.permutation(len(lengths))
    new_lengths = lengths[order]
    new_offsets = np.concatenate([[0], np.cumsum(new_lengths)]).astype(np.int64)
    return ids[ragged_arange(offsets[:-1][order], new_lengths)], new_offsets


def truncation_amounts(len_a: np.ndarray, len_b: np.ndarray, max_num: int):
    """How many tokens rule 4 removes from A and from B.

    The loop "trim the longer side, B on a tie" first cuts the longer side down to the shorter, then alternates
    starting with B; so with excess e and difference d: e <= d -> the longer loses e; else it loses d and the
    remaining r = e - d split as B ceil(r/2), A floor(r/2).
    """
    excess = np.maximum(0, len_a + len_b - max_num)
    d = np.abs(len_a - len_b)
    r = np.maximum(0, excess - d)
    a_longer = len_a > len_b
    cut_longer = np.minimum(excess, d)
    trim_a = np.where(a_longer, cut_longer, 0) + r // 2
    trim_b = np.where(a_longer, 0, cut_longer) + (r + 1) // 2
    return trim_a, trim_b


def assemble(tokens: np.ndarray, pairs: dict, rng: np.random.Generator, max_seq_length: int, cls_id: int,
             sep_id: int, dtype):
    """Rules 4 and 5 for all pairs: returns (flat ids, row offsets, b_start)."""
    a_lo, a_hi, b_lo, b_hi = pairs["a_lo"], pairs["a_hi"], pairs["b_lo"], pairs["b_hi"]
    trim_a, trim_b = truncation_amounts(a_hi - a_lo, b_hi - b_lo, max_seq_length - 3)
    front_a, front_b = rng.binomial(trim_a, 0.5), rng.binomial(trim_b, 0.5)   # each trim: first or last, p = 0.5
    a_lo, a_hi = a_lo + front_a, a_hi - (trim_a - front_a)
    b_lo, b_hi = b_lo + front_b, b_hi - (trim_b - front_b)
    len_a, len_b = a_hi - a_lo, b_hi - b_lo
    lengths = len_a + len_b + 3
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = np.empty(int(offsets[-1]), dtype=dtype)
    row0 = offsets[:-1]
    ids[row0] = cls_id
    ids[row0 + 1 + len_a] = sep_id
    ids[offsets[1:] - 1] = sep_id
    ids[ragged_arange(row0 + 1, len_a)] = tokens[ragged_arange(a_lo, len_a)]
    ids[ragged_arange(row0 + 2 + len_a, len_b)] = tokens[ragged_arange(b_lo, len_b)]
    return ids, offsets, len_a + 2


# ---------------------------------------------------------------------------------------------------------------
# One shard: tokenize once, then every pass; stats per written file


def arrow_file_bytes(table: pa.Table) -> bytes:
    """The Arrow IPC file of a table, in memory (hashed and written without reading it back)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def file_name(split: str, unit_index: int, pass_index: int, n_units: int) -> str:
    # pass-major numbering: reading files in order sees every document once before seeing it again
    return instances_file_name(split, pass_index * n_units + unit_index)


def plan_units(shards: list[Path], unit_bytes: int) -> list[tuple[int, int, int]]:
    """(shard index, first row, end row) of each work unit: consecutive documents of one shard, cut once a unit
    holds unit_bytes of text. The NotNext document of an instance comes from its unit."""
    units = []
    for k, path in enumerate(shards):
        sentences = read_arrow(path).column(CorpusColumns.SENTENCES).combine_chunks()
        offsets = sentences.offsets.to_numpy().astype(np.int64)
        text_bytes = np.concatenate([[0], np.cumsum(pa.compute.binary_length(sentences.flatten()).to_numpy(
            zero_copy_only=False).astype(np.int64))])
        row_end_bytes = text_bytes[offsets[1:] - offsets[0]]          # text before each row's end
        lo, n_rows = 0, len(offsets) - 1
        while lo < n_rows:
            start = text_bytes[offsets[lo] - offsets[0]]
            hi = int(np.searchsorted(row_end_bytes, start + unit_bytes, side="left")) + 1
            hi = min(n_rows, max(lo + 1, hi))
            units.append((k, lo, hi))
            lo = hi
    return units


def corpus_text_bytes(shards: list[Path]) -> int:
    return sum(int(pa.compute.sum(pa.compute.binary_length(
        read_arrow(p).column(CorpusColumns.SENTENCES).combine_chunks().flatten())).as_py() or 0) for p in shards)


def process_unit(task: dict) -> list[dict]:
    """Worker: every missing or damaged pass file of one work unit. Returns [{file, split, rows, bytes, checksum,
    stats}]."""
    config = InstancesConfig(**task["config"])
    out_dir, parts = Path(task["out"]), Path(task["out"]) / ".parts"
    passes = config.passes if task["split"] == "train" else config.holdout_dupe
    names = [file_name(task["split"], task["unit_index"], p, task["n_units"]) for p in range(passes)]
    done = finished_passes(names, out_dir)
    if len(done) == len(names):
        return [done[n] for n in names]

    _, vocab = load_stage_tokenizer(task["tokenizer"])
    spec = masking_spec(vocab, config.masking)
    table = read_arrow(task["path"]).slice(task["row_lo"], task["row_hi"] - task["row_lo"])
    if config.rehydrate and task["split"] == "train":   # each copy its own document: its own pairs and masks
        repeat = appearances(table.column(CorpusColumns.CLUSTER_SIZE).to_numpy(), config.rehydrate)
        table = table.take(np.repeat(np.arange(table.num_rows), repeat))
    dtype = np.uint16 if len(vocab) <= 65536 else np.int32  # ids are 0..len(vocab)-1 (checked where it is read)
    tokens, seg_start, doc_seg = tokenize_documents(word_encoder(task["tokenizer"]),
                                                    table.column(CorpusColumns.SENTENCES))
    tokens = tokens.astype(dtype)
    del table
    results = []
    for p, name in enumerate(names):
        if name in done:
            results.append(done[name])
            continue
        rng = np.random.default_rng([config.seed, SPLIT_CODE[task["split"]], task["unit_index"], p])
        tbl, stats = one_pass(tokens, seg_start, doc_seg, rng, config, spec, len(vocab), dtype)
        data = arrow_file_bytes(tbl)
        atomic_write_bytes(out_dir / name, data)           # fsynced before it gets its name
        entry = {"file": name, "split": task["split"], "rows": tbl.num_rows, "bytes": len(data),
                 "checksum": checksum_bytes(data), "pass": p, "stats": stats}
        # a resume record, written last: its presence marks the file finished. Not fsynced: the file it describes
        # was, and a record lost in a crash only means the file is made again.
        atomic_write_json(parts / f"{name}.json", entry, fsync=False)
        results.append(entry)
    return results


def finished_passes(names: list[str], out_dir: Path) -> dict:
    """The pass files already made: a readable record, and the file with its size and checksum (else redone)."""
    done = {}
    for n in names:
        entry = read_json_or_none(out_dir / ".parts" / f"{n}.json")
        path = out_dir / n
        if entry and "checksum" in entry and path.is_file() and entry["bytes"] == path.stat().st_size \
                and file_matches(path, entry["checksum"]):
            done[n] = entry
    return done


def one_pass(tokens, seg_start, doc_seg, rng, config: InstancesConfig, spec, vocab_size: int, dtype):
    """(table, stats) of one pass over a unit's documents: full sentences (MLM only) or A/B pairs, shuffled,
    masked here when static."""
    if config.objective == "none":
        ids, offsets = full_sentences(tokens, seg_start, doc_seg, rng, config.max_seq_length, spec.cls_id,
                                      spec.sep_id, dtype)
        ids, offsets = shuffle_rows(ids, offsets, rng)
        b_start, skipped = np.diff(offsets), 0                # no B segment
        pairs = {"not_next": np.zeros(len(b_start), bool)}
        special = (ids == spec.cls_id) | (ids == spec.sep_id)
        specials = np.add.reduceat(special, offsets[:-1]) if len(b_start) else np.zeros(0, np.int64)
    else:
        if len(doc_seg) > 1:
            pairs, skipped = build_pairs(seg_start, doc_seg, rng, config)
        else:
            pairs, skipped = {k: np.zeros(0, np.int64) for k in ("a_lo", "a_hi", "b_lo", "b_hi")}, 0
            pairs["not_next"] = np.zeros(0, bool)
        order = rng.permutation(len(pairs["a_lo"]))          # the file's rows come shuffled
        pairs = {k: v[order] for k, v in pairs.items()}
        ids, offsets, b_start = assemble(tokens, pairs, rng, config.max_seq_length, spec.cls_id, spec.sep_id, dtype)
        specials = 3
    if config.mode == "static":
        masked, pos, labels, pred_off, kinds = mask_batch(ids, offsets, rng, spec)
        row_of = np.repeat(np.arange(len(offsets) - 1), np.diff(pred_off))
        tbl = instances_table(masked, offsets, b_start, pairs["not_next"], vocab_size,
                              (pos - offsets[:-1][row_of], labels, pred_off))
        stats = pass_stats(offsets, b_start, pairs["not_next"], config.max_seq_length, spec, kinds, skipped,
                           specials)
    else:
        tbl = instances_table(ids, offsets, b_start, pairs["not_next"], vocab_size)
        stats = pass_stats(offsets, b_start, pairs["not_next"], config.max_seq_length, skipped=skipped,
                           specials=specials)
    stats["documents"], stats["segments"] = len(doc_seg) - 1, len(seg_start) - 1
    return tbl, stats


# ---------------------------------------------------------------------------------------------------------------
# The stage


def check_tokenizer(tokenizer_dir) -> tuple[list[str], str]:
    from bertkit.tokenization import SPECIAL_TOKENS, TokenizerError, check_ids_fit, vocab_sha256

    try:
        tok, vocab = load_stage_tokenizer(tokenizer_dir)
        check_ids_fit(tok, len(vocab), tokenizer_dir, "its vocab.txt", "tokens",
                      "train the tokenizer again (`bertkit train-tokenizer`) so that both files are written together")
    except TokenizerError as e:
        raise InstancesError(str(e)) from None
    missing = [t for t in SPECIAL_TOKENS if t not in set(vocab)]
    if missing:
        raise InstancesError(f"{tokenizer_dir}: the vocabulary lacks {missing}; make-instances needs all of "
                             f"{SPECIAL_TOKENS}. Train one with `bertkit train-tokenizer`.")
    return vocab, vocab_sha256(tokenizer_dir)


def copy_tokenizer_files(tokenizer_dir, out: Path, vocab: list[str]) -> None:
    """The tokenizer files travel with the instances (formats.TOKENIZER_FILES): vocab.txt and tokenizer.json
    written from the loaded tokenizer, the HF files copied when the source has them."""
    from bertkit.tokenization import load_tokenizer, vocab_text

    src = Path(tokenizer_dir)
    atomic_write_bytes(out / "vocab.txt", vocab_text(vocab))
    atomic_write_bytes(out / "tokenizer.json", load_tokenizer(src).to_str(pretty=True).encode("utf-8"))
    for name in TOKENIZER_FILES:
        if name in ("vocab.txt", "tokenizer.json"):
            continue
        if src.is_dir() and (src / name).is_file():
            atomic_copy(src / name, out / name)


def summarize(entries: list[dict], config: InstancesConfig) -> dict:
    """Manifest statistics, summed over files."""
    total = empty_stats(config.max_seq_length)
    per_pass, by_split = {}, {}
    for e in entries:
        st = e["stats"]
        if e["split"] == "train":
            by_pass = st.get("instances_by_pass") or {e["pass"]: st["instances"]}
            for p, n_p in (enumerate(by_pass) if isinstance(by_pass, list) else by_pass.items()):
                per_pass[p] = per_pass.get(p, 0) + n_p
            for k, v in st.items():
                if k == "length_counts":
                    total[k] = [a + b for a, b in zip(total[k], v)]
                elif k in total:
                    total[k] += v
        by_split[e["split"]] = by_split.get(e["split"], 0) + st["instances"]
    n, sel, cand = total["instances"], total["selected"], total["candidates"]
    bin_w = max(1, config.max_seq_length // 16)
    counts = total.pop("length_counts")
    out = {
        "instances": by_split,
        "instances_per_pass": [per_pass[p] for p in sorted(per_pass)],
        "train_counts": total,   # sums over the train split's files
        "not_next_share": total["not_next"] / n if n else 0.0,
        "mean_length": total["tokens"] / n if n else 0.0,
        "length_histogram": {"bin_width": bin_w, "counts": [sum(counts[i:i + bin_w])
                                                             for i in range(0, len(counts), bin_w)]},
    }
    if config.mode == "static":
        out.update(selected_fraction=sel / cand if cand else 0.0,
                   expected_selected_fraction=total["expected_selected"] / cand if cand else 0.0,
                   mask_share=total["mask"] / sel if sel else 0.0,
                   random_share=total["random"] / sel if sel else 0.0,
                   kept_share=total["kept"] / sel if sel else 0.0)
    return out


def _flat(settings: dict) -> dict:
    return {**{k: v for k, v in settings.items() if k != "masking"}, **settings.get("masking", {})}


def _corpus_identity(manifest) -> list:
    return [[s.file, s.split, s.checksum, s.rows] for s in manifest.shards]


def make_instances(corpus_dir, tokenizer_dir, out, config: InstancesConfig | None = None,
                   progress: bool = True) -> InstancesManifest:
    """Write the instances of a prepare-corpus folder into `out`; returns the manifest. Resumes a killed run, and
    rewrites only damaged files when run again on a finished folder."""
    config = config or InstancesConfig()
    config.check()
    for path, what in ((corpus_dir, "corpus"), (tokenizer_dir, "--tokenizer"), (out, "--out")):
        check_shared_path(path, what)
    check_available(config.engine)
    corpus_dir, out = Path(corpus_dir), Path(out)
    checked = check_tokenizer(tokenizer_dir)  # a tokenizer that does not fit stops before anything is written
    with folder_lock(out, "make-instances", tqdm.write), \
            disk_errors(out, "free space (or fix the disk), then run the same command again to resume"):
        return _make_instances(corpus_dir, tokenizer_dir, out, config, progress, checked)


def _make_instances(corpus_dir: Path, tokenizer_dir, out: Path, config: InstancesConfig,
                    progress: bool, checked: tuple) -> InstancesManifest:
    corpus_manifest = read_corpus_manifest(corpus_dir)
    train, holdout = corpus_shards(corpus_dir, "train"), corpus_shards(corpus_dir, "holdout")
    if not train:
        raise InstancesError(f"{corpus_dir}: the corpus has no training shard; run prepare-corpus on some text")
    vocab, vocab_sha = checked
    rehydrated = rehydrated_counts(corpus_dir, train, config.rehydrate) if config.rehydrate else None

    identity = {"config": config.identity(), "vocab_sha256": vocab_sha,
                "corpus": _corpus_identity(corpus_manifest)}
    run_file = out / ".parts" / "run.json"
    if run_file.is_file():
        previous = read_json_or_none(run_file) or {"config": {}, "vocab_sha256": None}
        previous["config"] = MaskingOptions.gather(previous["config"])   # older records kept the options flat
        if previous != identity:
            before, now = _flat(previous["config"]), _flat(identity["config"])
            changed = sorted(k for k in now.keys() | before.keys() if before.get(k) != now.get(k))
            what = ", ".join(changed) or ("the tokenizer" if previous["vocab_sha256"] != vocab_sha else "the corpus")
            raise InstancesError(f"{out}: holds instances made with different settings ({what}); "
                                 f"use a new --out folder or delete {out}")
    elif out.exists() and any(p.name != LOCK_FILE for p in out.iterdir()):
        raise InstancesError(f"{out}: exists and is not a make-instances output; choose an empty or new --out folder")
    atomic_write_json(run_file, identity)
    for stale in list(out.glob(".*.tmp")) + list((out / ".parts").glob(".*.tmp")):
        stale.unlink()   # half-written files of a killed run (atomic writes never expose them)

    if config.compat == "google":
        entries = make_instances_google(train, holdout, tokenizer_dir, out, config, progress)
    else:
        entries = _run_units(train, holdout, tokenizer_dir, out, config, progress)

    stats = summarize(entries, config)
    if rehydrated:
        stats["rehydrated"] = rehydrated
    if config.objective == "nsp" and stats["not_next_share"] > 0.6:
        tqdm.write(f"warning: {stats['not_next_share']:.0%} of the pairs are NotNext (about 50 % expected): "
                   f"--max-seq-length {config.max_seq_length} leaves {config.max_seq_length - 3} tokens for two "
                   "segments, too few for most pairs of this corpus's sentences: a longer --max-seq-length (BERT "
                   "uses 128, then 512) keeps next-sentence prediction meaningful, or --objective none trains MLM "
                   "alone", file=sys.stderr)
    if stats["instances"].get("train", 0) == 0:
        raise InstancesError(f"{corpus_dir}: no instance could be made: the corpus has no non-empty document "
                             f"(every sentence tokenized to nothing)")
    copy_tokenizer_files(tokenizer_dir, out, vocab)
    settings = {**config.identity(), "masking": config.masking}   # what decided the bytes
    manifest = InstancesManifest(
        stage="make-instances", complete=True, vocab_size=len(vocab), vocab_sha256=vocab_sha,
        **{f.name: settings[f.name] for f in fields(InstancesManifest) if f.name in settings},
        next_sentence_label={"nsp": "0 = B follows A (IsNext), 1 = B is random (NotNext)",
                             "sop": "0 = A then B as in the document, 1 = the two swapped",
                             "none": "unused (0): one segment per instance"}[config.objective],
        tokenizer=str(Path(tokenizer_dir).resolve()), corpus=str(corpus_dir.resolve()),
        shards=[ShardEntry(*(e[k] for k in ("file", "split", "rows", "bytes", "checksum"))) for e in entries],
        files={name: file_entry(out / name) for name in TOKENIZER_FILES if (out / name).is_file()},
        stats=stats)
    write_manifest(out, manifest)
    return manifest


def rehydrated_counts(corpus_dir: Path, train: list[Path], spec: str) -> dict:
    """{documents, appearances}: the training documents and how many times they appear in each pass with
    --rehydrate; stops, saying what to do, on a corpus without the near-duplicate cluster sizes."""
    repeats = []
    for path in train:
        table = read_arrow(path)
        if CorpusColumns.CLUSTER_SIZE not in table.column_names:
            raise InstancesError(f"{corpus_dir}: --rehydrate repeats documents by the {CorpusColumns.CLUSTER_SIZE} "
                                 "column prepare-corpus --near-dedup writes, which this corpus has not: run "
                                 "prepare-corpus --near-dedup, or leave out --rehydrate")
        repeats.append(appearances(table.column(CorpusColumns.CLUSTER_SIZE).to_numpy(), spec))
    repeats = np.concatenate(repeats)
    return {"weights": [list(pair) for pair in rehydration(spec)], "documents": len(repeats),
            "appearances": int(repeats.sum())}


def _run_units(train, holdout, tokenizer_dir, out: Path, config: InstancesConfig, progress: bool) -> list[dict]:
    if config.unit_mb is not None:
        unit_bytes = int(config.unit_mb * (1 << 20))
    else:
        unit_bytes = int(min(16 << 20, max(1 << 20, corpus_text_bytes(train) // 32)))
    tasks = []
    for split, paths in (("train", train), ("holdout", holdout)):
        units = plan_units(paths, unit_bytes)
        tasks += [{"split": split, "unit_index": u, "n_units": len(units), "path": str(paths[k]), "row_lo": lo,
                   "row_hi": hi, "out": str(out), "tokenizer": str(tokenizer_dir), "config": asdict(config)}
                  for u, (k, lo, hi) in enumerate(units)]
    bar = tqdm(total=len(tasks), desc="make-instances", unit="unit", plain=not progress)
    # one worker = one core: tokenizers' thread pool off here and in the workers (spawned: they inherit the
    # environment, and no fork of a parent whose tokenizers/arrow thread pools are already running); Ray tasks
    # set it themselves
    with single_threaded_tokenizers(), Engine(config.engine, config.workers, config.ray_address) as engine:
        results = list(engine.map(process_unit, [(t,) for t in tasks], on_done=lambda i, r: bar.update(1),
                                  context="spawn"))
    bar.close()
    entries = [e for r in results for e in r]
    order = {"train": 0, "holdout": 1}
    return sorted(entries, key=lambda e: (order[e["split"]], e["file"]))
