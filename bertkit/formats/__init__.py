"""The on-disk contract between the stages: folder layouts, Arrow schemas, column names and manifests.

The stages write these (bertkit.pipelines, bertkit.pretrain) and the loaders read them through the readers here,
one per stage; README.md beside this file documents every folder for users. All data files are Arrow IPC *files*
(memory-mappable), written atomically; each folder's manifest.json is written last and is what marks it finished.
"""
import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path

import pyarrow as pa

from bertkit.errors import CorpusError, DamagedFileError, FormatError, InstancesError, RunError, regular_file  # noqa: F401

MANIFEST = "manifest.json"
# A tokenizer folder; make-instances, a pretraining run and an export carry copies of these files.
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
SPLITS = ("train", "holdout")
IGNORE_INDEX = -100   # label of a position that is not predicted, in every collated batch (torch's ignore_index)


def listed_file(folder, name, listed_in) -> Path:
    """folder/name for a file name read from a manifest, checkpoint.json or a weights index: a name that would
    leave the folder (absolute, `..`, empty) is refused naming the entry, as no bertkit folder lists one."""
    parts = Path(name).parts if isinstance(name, str) else ()
    if not parts or Path(name).is_absolute() or ".." in parts:
        raise FormatError(f"{listed_in}: lists the file {name!r}, which is not inside {folder}; a bertkit folder "
                          "only lists its own files, so this one may not come from bertkit")
    return Path(folder) / name


# ---------------------------------------------------------------- manifests: read and write

@dataclass
class ShardEntry:
    """One data file of a folder, in order."""
    file: str
    split: str          # "train" or "holdout"
    rows: int
    bytes: int
    checksum: str       # "xxh3_128:<hex>" (bertkit.fileio.checksum_file); older manifests: "sha256:<hex>"


def _shard(s: dict) -> ShardEntry:
    checksum = s["checksum"] if "checksum" in s else f"sha256:{s['sha256']}"
    return ShardEntry(s["file"], s["split"], s["rows"], s["bytes"], checksum)


def _from_dict(cls, data: dict, error: type, where: Path, fix: str):
    """cls(**data) with every field of cls present (extra keys from newer versions are ignored)."""
    names = [f.name for f in fields(cls)]
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    missing = [k for k in required if k not in data]
    if missing:
        raise error(f"{where}: lacks {', '.join(map(repr, missing))}; {fix}")
    values = {k: data[k] for k in names if k in data}
    if "shards" in values:
        values["shards"] = [_shard(s) for s in values["shards"]]
        for s in values["shards"]:
            listed_file(where.parent, s.file, where)
    for name in values.get("files") or {}:
        listed_file(where.parent, name, where)
    return cls(**values)


def _read_manifest(folder: Path, stage: str, error: type, fix: str) -> dict:
    """manifest.json of a finished `stage` output, as a dict; error (naming the folder and `fix`) otherwise."""
    path = folder / MANIFEST
    if not folder.is_dir():
        raise error(f"{folder}: no such folder. {fix}")
    if not path.is_file():
        raise error(f"{folder}: no {MANIFEST}, so not a finished {stage} output. {fix}")
    regular_file(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path}: not valid JSON ({e}). Re-run {stage} into a fresh folder.") from e
    if not isinstance(data, dict) or data.get("stage") != stage:
        found = data.get("stage") if isinstance(data, dict) else None
        raise error(f"{path}: stage is {found!r}, not {stage!r}; this folder is not a {stage} output.")
    if not data.get("complete", False):
        raise error(f"{folder}: {stage} did not finish; re-run the same command to resume it.")
    return data


def write_manifest(folder, manifest) -> None:
    """A manifest dataclass as folder/manifest.json, atomically (written last: it marks the folder finished)."""
    from bertkit.fileio import atomic_write_json

    atomic_write_json(Path(folder) / MANIFEST, asdict(manifest))


def _check_files(folder: Path, shards: list[ShardEntry], fix: str) -> None:
    """The cheap check made whenever a folder is opened: every listed file exists with its size and row count
    (Arrow metadata only). Checksums are `bertkit verify`'s job."""
    import pyarrow as pa

    for s in shards:
        path = folder / s.file
        if not path.is_file():
            raise DamagedFileError(path, f"listed in {folder / MANIFEST} but missing", fix)
        size = path.stat().st_size
        if size != s.bytes:
            raise DamagedFileError(path, f"{size:,} bytes, but {MANIFEST} says {s.bytes:,}: the file was cut short "
                                         "or replaced", fix)
        try:
            with pa.memory_map(str(path), "r") as source:
                reader = pa.ipc.open_file(source)
                rows = sum(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
        except (pa.ArrowInvalid, OSError) as e:
            raise DamagedFileError(path, f"not a readable Arrow file ({str(e).splitlines()[0]})", fix) from None
        if rows != s.rows:
            raise DamagedFileError(path, f"{rows:,} rows, but {MANIFEST} says {s.rows:,}", fix)


# ---------------------------------------------------------------- corpus folder (prepare-corpus)

class CorpusColumns:
    ID = "id"                 # sha1 of the cleaned sentences joined by "\n", 16 hex digits: stable document id
    SOURCE = "source"         # input file, relative to the input root it was found under
    TITLE = "title"           # WikiExtractor title (or a title field/column), else null
    SENTENCES = "sentences"   # cleaned, NFC-normalised sentences in document order
    CLUSTER_SIZE = "cluster_size"   # --near-dedup only: documents in this one's near-duplicate cluster (1: none)
    LANGUAGE = "language"     # --languages only: the language identified (ISO 639-1)
    REASON = "reason"         # removed/ only (--keep-removed): why the document was taken out (the manifest's names)
    SIGNALS = "signals"       # --filters only: the quality signals judged by, doubles in the order totals.signal_names


CORPUS_SCHEMA = pa.schema([
    pa.field(CorpusColumns.ID, pa.string(), nullable=False),
    pa.field(CorpusColumns.SOURCE, pa.string(), nullable=False),
    pa.field(CorpusColumns.TITLE, pa.string(), nullable=True),
    pa.field(CorpusColumns.SENTENCES, pa.list_(pa.string()), nullable=False),
])


REMOVED_SCHEMA = CORPUS_SCHEMA.append(pa.field(CorpusColumns.REASON, pa.string(), nullable=False)).append(
    pa.field(CorpusColumns.SIGNALS, pa.list_(pa.float64()), nullable=True))


def corpus_schema(cluster_size: bool = False, language: bool = False, signals: bool = False) -> pa.Schema:
    """The shards' schema: with --near-dedup the cluster size a later stage may upsample by (FineWeb2's
    rehydration), with --languages each document's language."""
    schema = CORPUS_SCHEMA
    if cluster_size:
        schema = schema.append(pa.field(CorpusColumns.CLUSTER_SIZE, pa.int32(), nullable=False))
    if language:
        schema = schema.append(pa.field(CorpusColumns.LANGUAGE, pa.string(), nullable=False))
    if signals:   # with them a corpus given again as INPUT is judged by other rules without its raw text
        schema = schema.append(pa.field(CorpusColumns.SIGNALS, pa.list_(pa.float64()), nullable=False))
    return schema


CORPUS_FIX = ("`bertkit verify {folder}` checks every file; the same prepare-corpus command with --overwrite rebuilds "
              "the folder from its inputs")


def corpus_file_name(split: str, index: int) -> str:
    if split == "removed":   # --keep-removed: what the steps took out, beside the corpus, never read by a stage
        return f"removed/removed-{index:05d}.arrow"
    return f"{'shard' if split == 'train' else 'holdout'}-{index:05d}.arrow"


@dataclass
class CorpusManifest:
    """Later stages need only `shards`; the rest reports how the corpus was made."""
    stage: str
    complete: bool
    bertkit_version: str = ""
    schema: dict = field(default_factory=dict)      # column -> Arrow type, as written
    options: dict = field(default_factory=dict)     # everything that shapes the output (CorpusConfig.output_options)
    inputs: list = field(default_factory=list)      # per input file: path, source, bytes, format, documents ...
    totals: dict = field(default_factory=dict)      # input_files, documents, train/holdout_documents, sentences ...
    dropped: dict = field(default_factory=dict)     # documents by reason
    removed_lines: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)
    skipped_files: list = field(default_factory=list)   # documentation files a folder walk passed over
    shards: list[ShardEntry] = field(default_factory=list)
    elapsed_seconds: float = 0.0
    fingerprint: dict = field(default_factory=dict)     # options + input paths, sizes, mtimes: same run or not


def read_corpus_manifest(corpus_dir) -> CorpusManifest:
    corpus_dir = Path(corpus_dir)
    fix = f"Run (or resume) `bertkit prepare-corpus INPUT --out {corpus_dir}`."
    data = _read_manifest(corpus_dir, "prepare-corpus", CorpusError, fix)
    return _from_dict(CorpusManifest, data, CorpusError, corpus_dir / MANIFEST,
                      "re-run prepare-corpus with this bertkit version.")


def corpus_shards(corpus_dir, split: str = "train") -> list[Path]:
    """Shard paths of one split, in order, checked to exist (the one way later stages find a corpus's text)."""
    corpus_dir = Path(corpus_dir)
    manifest = read_corpus_manifest(corpus_dir)
    shards = [s for s in manifest.shards if s.split == split]
    _check_files(corpus_dir, shards, CORPUS_FIX.format(folder=corpus_dir))
    return [corpus_dir / s.file for s in shards]


# ---------------------------------------------------------------- tokenizer folder (train-tokenizer)

@dataclass
class TokenizerManifest:
    stage: str
    complete: bool
    source: str                 # "trained" or "vocab_file"
    settings: dict              # every option that shapes the vocabulary (TokenizerConfig, resolved)
    corpus: dict | None         # path, manifest_sha256; None when adopted from a vocab_file without a corpus
    vocab_size: int
    alphabet_size: int
    vocab_sha256: str
    files: dict                 # file -> {"bytes", "checksum"} (older manifests: file -> sha256 hex)
    stats: dict | None          # held-out [UNK] rate and pieces per word
    warnings: list = field(default_factory=list)


def read_tokenizer_manifest(tokenizer_dir) -> TokenizerManifest:
    tokenizer_dir = Path(tokenizer_dir)
    data = _read_manifest(tokenizer_dir, "train-tokenizer", FormatError,
                          f"Run `bertkit train-tokenizer CORPUS --out {tokenizer_dir}`.")
    return _from_dict(TokenizerManifest, data, FormatError, tokenizer_dir / MANIFEST,
                      "re-run train-tokenizer with this bertkit version.")


# ---------------------------------------------------------------- instances folder (make-instances)

class InstanceColumns:
    INPUT_IDS = "input_ids"                  # [CLS] A [SEP] B [SEP], masked in static mode
    B_START = "b_start"                      # index of B's first token: token_type_ids = 1 from there on
    NSP_LABEL = "next_sentence_label"        # 0 = B follows A (IsNext), 1 = B is random (NotNext): HF's convention
    MASKED_POSITIONS = "masked_positions"    # static only: the selected positions, ascending
    MASKED_IDS = "masked_ids"                # static only: the original ids there (the MLM labels)


def id_type(vocab_size: int) -> pa.DataType:
    """Token ids are stored as uint16 when the vocabulary fits, else int32."""
    return pa.uint16() if vocab_size <= 65536 else pa.int32()


def instance_schema(vocab_size: int, masked: bool) -> pa.Schema:
    """instances-NNNNN.arrow / holdout-NNNNN.arrow: one unpadded row per instance."""
    ids = id_type(vocab_size)
    columns = [
        pa.field(InstanceColumns.INPUT_IDS, pa.list_(ids), nullable=False),
        pa.field(InstanceColumns.B_START, pa.uint16(), nullable=False),
        pa.field(InstanceColumns.NSP_LABEL, pa.int8(), nullable=False),
    ]
    if masked:
        columns += [
            pa.field(InstanceColumns.MASKED_POSITIONS, pa.list_(pa.uint16()), nullable=False),
            pa.field(InstanceColumns.MASKED_IDS, pa.list_(ids), nullable=False),
        ]
    return pa.schema(columns)


INSTANCES_FIX = ("`bertkit verify {folder}` checks every file; running the same make-instances command again "
                 "rewrites only the damaged files")


def instances_file_name(split: str, index: int) -> str:
    return f"{'instances' if split == 'train' else 'holdout'}-{index:05d}.arrow"


@dataclass(frozen=True)
class MaskingOptions:
    """How make-instances masks, as one object: its flags, InstancesConfig.masking, the manifest's "masking" and
    bertkit.masking.MaskingSpec all carry it, so a new masking option is a field here and a flag there."""
    masked_lm_prob: float = 0.15
    max_predictions: int | None = None      # None: 20 (BERT's) at 0.15, else max_seq_length x rate (for_length)
    whole_word_mask: bool = False
    mask_replace: tuple = (0.8, 0.1, 0.1)   # shares of chosen positions: [MASK], kept, random token
    # improvements over the reference, each restored by its switch
    random_from_whole_vocab: bool = False   # random replacements may draw [PAD], [CLS], [unused..] ...
    wwm_decide_per_piece: bool = False      # whole-word masking draws 80/10/10 per piece (google-research/bert#910)

    def __post_init__(self):
        object.__setattr__(self, "mask_replace", tuple(float(x) for x in self.mask_replace))  # JSON gives a list

    def for_length(self, max_seq_length: int | None) -> "MaskingOptions":
        """These options with max_predictions filled in for instances of this length."""
        if self.max_predictions is not None:
            return self
        if self.masked_lm_prob == 0.15:
            return replace(self, max_predictions=20)
        if max_seq_length is None:
            raise ValueError(f"max_predictions: give it for masked_lm_prob {self.masked_lm_prob} "
                             "(20 is BERT's at 0.15 only)")
        return replace(self, max_predictions=math.ceil(max_seq_length * self.masked_lm_prob))

    def problem(self) -> str | None:
        """What is wrong with these options, in the command's words; None when they are usable."""
        if not 0.0 < self.masked_lm_prob < 1.0:
            return f"--masked-lm-prob {self.masked_lm_prob}: must be between 0 and 1"
        if self.max_predictions is not None and self.max_predictions < 1:
            return f"--max-predictions {self.max_predictions}: must be at least 1"
        shares = self.mask_replace
        if len(shares) != 3 or min(shares) < 0 or abs(sum(shares) - 1) > 1e-9:
            return (f"--mask-replace {','.join(f'{x:g}' for x in shares)}: three shares ([MASK], kept, random) "
                    "that sum to 1, e.g. 0.8,0.1,0.1")
        return None

    @classmethod
    def gather(cls, flat: dict) -> dict:
        """A flat dict (command flags, an older manifest or resume record) with the masking options moved into
        one "masking" entry; other keys unchanged. Older manifests kept two of them under "reference_behaviour"."""
        out = dict(flat)
        reference = out.get("reference_behaviour")
        if isinstance(reference, dict):
            out["reference_behaviour"] = {k: v for k, v in reference.items() if k not in cls.field_names()}
            out.update({k: v for k, v in reference.items() if k in cls.field_names()})
        if "masking" not in out:
            out["masking"] = {k: out.pop(k) for k in cls.field_names() if k in out}
        return out

    @staticmethod
    def field_names() -> tuple[str, ...]:
        return tuple(f.name for f in fields(MaskingOptions))


@dataclass
class InstancesManifest:
    stage: str
    complete: bool
    mode: str                   # "static" (masked on disk) or "dynamic" (masked by the loader)
    vocab_size: int
    vocab_sha256: str | None
    max_seq_length: int
    masking: MaskingOptions     # how the loader masks dynamic instances as make-instances would (static: as it did)
    seed: int
    shards: list[ShardEntry]
    compat: str | None = None
    short_seq_prob: float | None = None
    dupe: int | None = None
    holdout_dupe: int | None = None
    same_doc_notnext: bool = False   # reference behaviour: a NotNext B may come from A's own document
    next_sentence_label: str = "0 = B follows A (IsNext), 1 = B is random (NotNext)"
    tokenizer: str | None = None
    corpus: str | None = None
    stats: dict = field(default_factory=dict)
    files: dict = field(default_factory=dict)   # the tokenizer files copied beside the shards: {"bytes", "checksum"}
    objective: str = "nsp"      # nsp | sop (next_sentence_label 1 = segments swapped) | none (one segment, MLM only)

    def shard_files(self, split: str) -> list[str]:
        return [s.file for s in self.shards if s.split == split]


def read_instances_manifest(instances_dir) -> InstancesManifest:
    """The manifest of a finished, non-empty instances folder; InstancesError saying what to run otherwise."""
    instances_dir = Path(instances_dir)
    fix = f"Run `bertkit make-instances CORPUS --tokenizer TOK --out {instances_dir}` first."
    if not instances_dir.is_dir():
        raise InstancesError(f"{instances_dir}: no such instances folder. {fix}")
    data = MaskingOptions.gather(_read_manifest(instances_dir, "make-instances", InstancesError, fix))
    reference = data.pop("reference_behaviour", None)     # older manifests: same_doc_notnext sat there
    if isinstance(reference, dict) and "same_doc_notnext" in reference:
        data.setdefault("same_doc_notnext", reference["same_doc_notnext"])
    m = _from_dict(InstancesManifest, data, InstancesError, instances_dir / MANIFEST,
                   "re-run make-instances with this bertkit version.")
    try:
        m.masking = MaskingOptions(**m.masking)
        problem = m.masking.problem()
    except (TypeError, ValueError) as e:
        problem = str(e)
    if problem:
        raise InstancesError(f"{instances_dir / MANIFEST}: its masking options are not usable ({problem}); "
                             "re-run make-instances with this bertkit version.")
    if m.mode not in ("static", "dynamic"):
        raise InstancesError(f"{instances_dir / MANIFEST}: mode is {m.mode!r}, expected 'static' or 'dynamic'.")
    _check_files(instances_dir, m.shards, INSTANCES_FIX.format(folder=instances_dir))
    if not any(s.split == "train" and s.rows > 0 for s in m.shards):
        raise InstancesError(f"{instances_dir}: no training instances (the corpus was empty or too short?). "
                             "Check the corpus, then re-run make-instances.")
    return m


# ---------------------------------------------------------------- pretraining run folder (pretrain)

RUN_CONFIG = "config.json"            # RunConfig below
DEEPSPEED_CONFIG = "deepspeed_config.json"
# the --deepspeed-config a run began with, as given: what a --resume reads (never the path the run recorded)
USER_DEEPSPEED_CONFIG = "deepspeed_user_config.json"
RUN_TOKENIZER = "tokenizer"           # copies of the instances' TOKENIZER_FILES
CHECKPOINTS = "checkpoints"           # global_stepN/ (+ .partial while written) and `latest`
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"


@dataclass
class RunConfig:
    """RUN/config.json: what a pretraining run was started with; --resume, --init-from and export read it."""
    stage: str
    pretrain: dict              # PretrainConfig as given
    resolved: dict              # DeepSpeedSettings: the values actually used
    model: dict                 # BertConfig
    init_from: str
    instances: str
    vocab_size: int
    vocab_sha256: str | None
    max_seq_length: int | None
    world_size: int
    deepspeed: dict             # the DeepSpeed config actually used
    kernels: str = ""           # the attention/LayerNorm backend that ran (triton, torch, reference)
    objective: str = "nsp"      # the instances' objective: nsp | sop | none (export writes no NSP head then)
    instances_id: str | None = None   # sha256 over the instances' shard checksums (bertkit.pretrain.resume)
    changes: list = field(default_factory=list)  # settings a --resume changed: {"step", "setting", "before", "after"}
    threads: dict | None = None       # rank 0's torch threads and why (bertkit.threads.ThreadChoice)

    @property
    def zero_stage(self) -> int:
        return int(self.deepspeed["zero_optimization"]["stage"])


def read_run_config(run_dir) -> RunConfig:
    run_dir = Path(run_dir)
    path = run_dir / RUN_CONFIG
    if not path.is_file():
        raise RunError(f"{run_dir}: no {RUN_CONFIG}, so not a bertkit pretrain run folder")
    regular_file(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"{path}: not valid JSON ({e}); the run folder is damaged") from e
    return _from_dict(RunConfig, data, RunError, path, "it was written by another bertkit version")


def write_run_config(run_dir, config: RunConfig) -> None:
    from bertkit.fileio import atomic_write_json

    atomic_write_json(Path(run_dir) / RUN_CONFIG, asdict(config))


# ---------------------------------------------------------------- checkpoints and exports

CHECKPOINT_MARKER = "checkpoint.json"   # inside checkpoints/global_stepN/, written last


@dataclass
class CheckpointMarker:
    """A checkpoint is complete only when this is written, after every rank's files: it lists them all (ZeRO's
    per-rank shards and RNG states included) with their sizes and checksums."""
    step: int
    world_size: int
    files: dict                 # path relative to the checkpoint folder -> {"bytes", "checksum"}
    skipped_micro_batches: int = 0   # data skipped by divergence rollbacks before this step (bertkit.pretrain)
    elapsed_s: float = 0.0           # the run's clock at this step, so a resumed run's log goes on from it


@dataclass
class ExportManifest:
    """manifest.json of a `bertkit export` folder (an HF model folder: transformers ignores this file)."""
    stage: str
    complete: bool
    run: str                    # the run folder's name (older exports: its full path)
    checkpoint: str
    files: dict                 # file -> {"bytes", "checksum"}
    random_seed: int | None = None   # `export --random-weights`: fresh weights at this seed, no checkpoint read
    run_id: str | None = None        # a digest of the run folder's full path (bertkit.pretrain.checkpoints)
    ema: bool = False                # `export --ema`: the checkpoint's moving average of the weights


def read_export_manifest(folder) -> ExportManifest:
    folder = Path(folder)
    data = _read_manifest(folder, "export", FormatError, f"Run `bertkit export RUN --out {folder}`.")
    return _from_dict(ExportManifest, data, FormatError, folder / MANIFEST, "re-run bertkit export.")


def folder_kind(folder) -> str | None:
    """Which stage wrote a folder: prepare-corpus, train-tokenizer, make-instances, export, pretrain, finetune."""
    import json

    folder = Path(folder)
    try:
        stage = json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("stage")
    except (OSError, ValueError, AttributeError):
        stage = None
    if stage:
        return stage
    if (folder / RUN_CONFIG).is_file() and (folder / CHECKPOINTS).is_dir():
        return "pretrain"
    if (folder / "metrics.json").is_file():
        return "finetune"
    return None
