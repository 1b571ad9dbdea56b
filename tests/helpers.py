"""What several test files share: small folders in the on-disk formats (bertkit.formats) and a tiny model shape."""
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from bertkit.fileio import atomic_write_arrow, checksum_file
from bertkit.formats import (
    CorpusManifest,
    ShardEntry,
    corpus_file_name,
    corpus_schema,
    write_manifest,
)
from bertkit.testing import (  # noqa: F401  shared with the benchmarks, re-exported for the tests
    DIST_VARS,
    N_WORDS,
    SPECIALS,
    TINY,
    env_without_dist,
    free_port,
    launch,
    make_instances_dir,
    toy_rows,
    toy_vocab,
)

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def layout(docs):
    """Documents as lists of segment lengths -> (tokens = 0..N-1, seg_start, doc_seg): a token's id is its index."""
    lens = [n for d in docs for n in d]
    seg_start = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    doc_seg = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    return np.arange(seg_start[-1]), seg_start, doc_seg


def doc_of(token, seg_start, doc_seg):
    seg = np.searchsorted(seg_start, token, side="right") - 1
    return int(np.searchsorted(doc_seg, seg, side="right") - 1)


def write_corpus(folder: Path, shards, holdout=(), cluster_sizes=None):
    """A prepare-corpus folder: shards (and holdout) are lists of shards, a shard a list of documents, a document
    a list of sentences; cluster_sizes (one list per shard, train then holdout) adds --near-dedup's column."""
    folder.mkdir(parents=True, exist_ok=True)
    entries, sizes = [], iter(cluster_sizes or ())
    for split, groups in (("train", shards), ("holdout", holdout)):
        for i, docs in enumerate(groups):
            name = corpus_file_name(split, i)
            columns = {"id": [hashlib.sha1(repr(d).encode()).hexdigest()[:16] for d in docs],
                       "source": ["test.txt"] * len(docs), "title": [None] * len(docs),
                       "sentences": [list(d) for d in docs]}
            if cluster_sizes is not None:
                columns["cluster_size"] = next(sizes)
            table = pa.table(columns, schema=corpus_schema(cluster_size=cluster_sizes is not None))
            atomic_write_arrow(folder / name, table)
            entries.append(ShardEntry(name, split, len(docs), (folder / name).stat().st_size,
                                      checksum_file(folder / name)))
    write_manifest(folder, CorpusManifest(stage="prepare-corpus", complete=True, shards=entries))
    return folder


def tiny_pretraining_inputs(root: Path, n: int) -> Path:
    """root/inst (n training rows, 16 held out, 32 tokens) and root/model.json (TINY): what a pretraining test runs
    on (`model=str(inst.parent / "model.json")`); returns the instances folder."""
    inst = root / "inst"
    make_instances_dir(inst, n=n, holdout=16, max_len=32)
    (root / "model.json").write_text(json.dumps(TINY))
    return inst


# ---------------------------------------------------------------- the DeepSpeed launcher on CPU ranks

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

    from bertkit.models import save_pretrained
    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)]
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    return save_pretrained(BertForPreTraining(BertConfig.preset("tiny", vocab_size=len(vocab))), root / name,
                           tokenizer_dir=root)
