"""A family is one module: tests/toy_family.py registers a toy encoder (no edit in bertkit/), and it goes through
pretrain (DeepSpeed, one rank), export, load and a fine-tune as BERT and ModernBERT do."""
import importlib
import json

import pytest
import torch

from tests.helpers import tiny_run, toy_vocab


@pytest.fixture(scope="module")
def toy_family():
    """The toy family, registered by importing its module, and unregistered after this file's tests."""
    from bertkit.models import FAMILIES, register

    module = importlib.import_module("tests.toy_family")
    register(module.TOY)  # (again, if an earlier test file's teardown removed it)
    yield module
    FAMILIES.pop("toy")


@pytest.fixture(scope="module")
def toy_run(toy_family, tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    inst, run = tiny_run(root, "toy", model="toy-tiny", objective="mlm", max_steps=4, save_every=4)
    return root, inst, run


def test_a_registered_family_pretrains_exports_and_loads(toy_family, toy_run):
    from bertkit.models import family_of, load_pretrained
    from bertkit.pretrain import export, load_run_state_dict

    root, inst, run = toy_run
    recorded = json.loads((run / "config.json").read_text())
    assert recorded["model"]["family"] == "toy" and recorded["objective"] == "none"
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line and '"step"' in line]
    assert len(losses) == 4 and all(x == x for x in losses)  # four finite training steps were logged
    state, _, tag = load_run_state_dict(run)
    assert tag == "global_step4"

    out = export(run, root / "model")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "bertkit-toy" and config["classifier_pooling"] == "mean"  # MLM-only: the mean
    model = load_pretrained(out)
    assert isinstance(model, toy_family.ToyForMaskedLM) and family_of(model) is toy_family.TOY
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())  # the checkpoint's own weights
    # the loaded model predicts: [MASK] at position 2 of a row of the toy vocabulary
    ids = torch.tensor([[2, 10, 4, 11, 3]])
    out_logits = model(ids, mlm_positions=torch.tensor([[2]])).mlm_logits
    assert out_logits.shape == (1, 1, len(toy_vocab()))


def test_a_registered_family_is_refused_what_it_cannot_be(toy_run):
    from bertkit.formats import read_instances_manifest
    from bertkit.pretrain import ConfigError, PretrainConfig
    from bertkit.pretrain.start import build_model

    root, inst, run = toy_run
    cfg = PretrainConfig(instances=str(inst), out=str(root / "unused"), model="toy-tiny")
    with pytest.raises(ConfigError, match=r"Toy is MLM-only, but .* NSP instances"):
        build_model(cfg, read_instances_manifest(inst), None, "nsp")
    with pytest.raises(ConfigError, match=r"--norm post: the toy is pre-LN; drop --norm"):
        build_model(PretrainConfig(instances=str(inst), out=str(root / "unused"), model="toy-tiny", norm="post"),
                    read_instances_manifest(inst), None, "none")
    with pytest.raises(ConfigError, match=r"--model tiny is a BERT, but --init-from .* holds a Toy"):
        build_model(PretrainConfig(instances=str(inst), out=str(root / "unused"), model="tiny", init_from=str(run)),
                    read_instances_manifest(inst), None, "none")


def test_a_registered_family_fine_tunes(toy_family, toy_run, tmp_path):
    from bertkit.finetune.classify import finetune_classify
    from bertkit.finetune.train import TrainConfig
    from bertkit.models import load_pretrained
    from bertkit.pretrain import export

    root, _, run = toy_run
    model_dir = export(run, tmp_path / "model")
    # the label is whether w1 is in the sentence: learnable in a few epochs
    rows = ["text\tlabel"] + [f"w{i % 9 + 2} {'w1' if i % 2 else 'w0'} w{i % 5 + 3}\t{i % 2}" for i in range(48)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    cfg = TrainConfig(out_dir=str(tmp_path / "ft"), epochs=6, batch_size=8, learning_rate=3e-3, seed=0)
    summary = finetune_classify(model_dir, tmp_path / "train.tsv", tmp_path / "train.tsv", cfg, text_a="text",
                                label="label", max_seq_length=16)
    assert summary["epochs"][-1]["accuracy"] > 0.9, summary["epochs"]
    best = load_pretrained(tmp_path / "ft" / "best")
    assert isinstance(best, toy_family.ToyForSequenceClassification) and best.num_labels == 2
