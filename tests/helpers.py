"""What several test files share: small folders in the on-disk formats (bertkit.formats) and a tiny model shape."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from bertkit.fileio import atomic_write_arrow, checksum_file, sha256_file
from bertkit.formats import (
    CORPUS_SCHEMA,
    CorpusManifest,
    InstancesManifest,
    MaskingOptions,
    ShardEntry,
    corpus_file_name,
    instance_schema,
    instances_file_name,
    write_manifest,
)
from bertkit.masking import MaskingSpec, mask_instance
from bertkit.testing import free_port

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT")

# a BERT small enough to pretrain for a few steps in a test (the vocabulary is toy_vocab's)
TINY = {"vocab_size": 133, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}


def layout(docs):
    """Documents as lists of segment lengths -> (tokens = 0..N-1, seg_start, doc_seg): a token's id is its index."""
    lens = [n for d in docs for n in d]
    seg_start = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    doc_seg = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    return np.arange(seg_start[-1]), seg_start, doc_seg


def doc_of(token, seg_start, doc_seg):
    seg = np.searchsorted(seg_start, token, side="right") - 1
    return int(np.searchsorted(doc_seg, seg, side="right") - 1)


def write_corpus(folder: Path, shards, holdout=()):
    """A prepare-corpus folder: shards (and holdout) are lists of shards, a shard a list of documents, a document
    a list of sentences."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for split, groups in (("train", shards), ("holdout", holdout)):
        for i, docs in enumerate(groups):
            name = corpus_file_name(split, i)
            table = pa.table({"id": [hashlib.sha1(repr(d).encode()).hexdigest()[:16] for d in docs],
                              "source": ["test.txt"] * len(docs), "title": [None] * len(docs),
                              "sentences": [list(d) for d in docs]}, schema=CORPUS_SCHEMA)
            atomic_write_arrow(folder / name, table)
            entries.append(ShardEntry(name, split, len(docs), (folder / name).stat().st_size,
                                      checksum_file(folder / name)))
    write_manifest(folder, CorpusManifest(stage="prepare-corpus", complete=True, shards=entries))
    return folder


SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
N_WORDS = 120


def toy_vocab() -> list[str]:
    return SPECIALS + [f"w{i}" for i in range(N_WORDS)] + [f"##s{i}" for i in range(8)]


def toy_rows(n: int, max_len: int, seed: int):
    """Rows a tiny model learns from in a few steps: Zipf-distributed words; B is Zipf too when IsNext,
    uniform when NotNext."""
    rng = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, N_WORDS + 1)
    zipf /= zipf.sum()
    rows = []
    for _ in range(n):
        total = int(rng.integers(12, max_len - 3 + 1))
        a_len = int(rng.integers(4, total - 3))
        not_next = int(rng.random() < 0.5)
        a = rng.choice(N_WORDS, size=a_len, p=zipf)
        b = rng.integers(0, N_WORDS, size=total - a_len) if not_next else rng.choice(N_WORDS, total - a_len, p=zipf)
        ids = [2] + [5 + int(t) for t in a] + [3] + [5 + int(t) for t in b] + [3]
        rows.append((np.array(ids, dtype=np.int64), a_len + 2, not_next))
    return rows


def make_instances_dir(path, n=256, holdout=32, max_len=64, mode="dynamic", seed=0, rows_per_shard=100,
                       max_predictions=10):
    """A small make-instances folder in the contract's format (formats.instance_schema + manifest.json)."""
    path.mkdir(parents=True, exist_ok=True)
    vocab = toy_vocab()
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    spec = MaskingSpec.from_vocab(vocab, MaskingOptions(max_predictions=max_predictions))
    schema = instance_schema(len(vocab), mode == "static")
    rng = np.random.default_rng(seed + 1)
    shards = []
    for split, rows in (("train", toy_rows(n, max_len, seed)), ("holdout", toy_rows(holdout, max_len, seed + 7))):
        for k, lo in enumerate(range(0, len(rows), rows_per_shard)):
            chunk = rows[lo:lo + rows_per_shard]
            cols = {"input_ids": [], "b_start": [], "next_sentence_label": []}
            if mode == "static":
                cols.update(masked_positions=[], masked_ids=[])
            for ids, b_start, nsp in chunk:
                if mode == "static":
                    ids, positions, labels = mask_instance(ids, rng, spec)
                    cols["masked_positions"].append(positions.tolist())
                    cols["masked_ids"].append(labels.tolist())
                cols["input_ids"].append(np.asarray(ids).tolist())
                cols["b_start"].append(b_start)
                cols["next_sentence_label"].append(nsp)
            name = instances_file_name(split, k)
            atomic_write_arrow(path / name, pa.table(cols, schema=schema))
            shards.append(ShardEntry(name, split, len(chunk), (path / name).stat().st_size, checksum_file(path / name)))
    write_manifest(path, InstancesManifest(
        stage="make-instances", complete=True, mode=mode, vocab_size=len(vocab),
        vocab_sha256=sha256_file(path / "vocab.txt"), max_seq_length=max_len,
        masking=MaskingOptions(max_predictions=max_predictions), seed=seed, shards=shards, tokenizer=str(path)))
    return path


def tiny_pretraining_inputs(root: Path, n: int) -> Path:
    """root/inst (n training rows, 16 held out, 32 tokens) and root/model.json (TINY): what a pretraining test runs
    on (`model=str(inst.parent / "model.json")`); returns the instances folder."""
    inst = root / "inst"
    make_instances_dir(inst, n=n, holdout=16, max_len=32)
    (root / "model.json").write_text(json.dumps(TINY))
    return inst


# ---------------------------------------------------------------- the DeepSpeed launcher on CPU ranks

def env_without_dist(**extra):
    """This process's environment without its process-group variables, one thread per rank."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PATH=f"{BIN}:{env.get('PATH', '')}", **extra)
    return env


def launch(args, ranks=2, **env):
    """`deepspeed --num_gpus RANKS cli.py pretrain ARGS` in its own process group (so a test can kill it all)."""
    cmd = [str(BIN / "deepspeed"), "--num_gpus", str(ranks), "--master_port", str(free_port()), "cli.py", "pretrain",
           *map(str, args)]
    return subprocess.Popen(cmd, cwd=REPO, env=env_without_dist(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(proc, timeout=180):
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def quick_finetune(model_dir: Path, out: Path, run: Path | None = None, overwrite: bool = False) -> dict:
    """One epoch of `finetune classify` from a model folder on 32 two-word rows made from its own vocabulary: does
    fine-tuning start from it? The rows go to out/train.tsv, the run to `run` (default out/run). Returns the
    summary."""
    from bertkit.finetune.classify import finetune_classify
    from bertkit.finetune.train import TrainConfig

    vocab = (Path(model_dir) / "vocab.txt").read_text().split()
    rows = ["text\tlabel"] + [f"{vocab[10 + i % 50]} {vocab[20 + (i * 7) % 50]}\t{i % 2}" for i in range(32)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.tsv").write_text("\n".join(rows) + "\n")
    return finetune_classify(model_dir, out / "train.tsv", out / "train.tsv",
                             TrainConfig(out_dir=str(run or out / "run"), epochs=1, batch_size=8, save_model=False,
                                         overwrite=overwrite),
                             text_a="text", label="label", max_seq_length=16)


def tiny_run(root: Path, out: str = "run", n: int = 64, **config) -> tuple[Path, Path]:
    """(instances, run folder): a TINY model pretrained for a few steps in this process (one ZeRO-2 AdamW
    checkpoint at step 2 unless `config` says otherwise), the process-group variables it sets kept out of the
    environment. For module fixtures of the fault tests."""
    from bertkit.pretrain import PretrainConfig, pretrain

    inst = root / "inst"
    if not inst.exists():
        make_instances_dir(inst, n=n, holdout=8, max_len=32)
        (root / "model.json").write_text(json.dumps(TINY))
    args = dict(instances=str(inst), out=str(root / out), model=str(root / "model.json"), max_steps=2, micro_batch=8,
                optimizer="adamw", num_workers=0, eval_every=0, save_every=2, log_every=1, progress=False,
                report_to="none")
    saved = dict(os.environ)
    try:
        pretrain(PretrainConfig(**{**args, **config}))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return inst, root / out


def tiny_run_exported(root: Path) -> Path:
    """tiny_run's run folder (returned), with its export beside it in root/model."""
    from bertkit.pretrain import export

    _, run_dir = tiny_run(root)
    export(run_dir, root / "model")
    return run_dir


def tiny_model_folder(root: Path, name: str = "tiny") -> Path:
    """A randomly initialised tiny BERT (seed 0) saved in HF format over a 32-token vocabulary (w0 .. w26)."""
    import torch

    from bertkit.config import BertConfig
    from bertkit.models import save_pretrained
    from bertkit.models.bert import BertForPreTraining

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)]
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    return save_pretrained(BertForPreTraining(BertConfig.preset("tiny", vocab_size=len(vocab))), root / name,
                           tokenizer_dir=root)
