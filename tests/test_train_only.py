"""--train-only: a head (or the word embeddings) learns while the rest stays frozen, as a released model without an
MLM head needs before its decay (issue 83's vocabulary-extension study: the random head's first gradients reached
the encoder); a plan's next phase then trains everything with a new optimizer state."""
import json

import pytest
import torch

from bertkit.pretrain import ConfigError, PretrainConfig, load_run_state_dict, pretrain
from bertkit.pretrain.plan import run_plan
from bertkit.testing import make_instances_dir
from tests.helpers import TINY


def start(root, model):
    inst = make_instances_dir(root / "inst", n=48, holdout=8, max_len=32, seed=0)
    args = dict(instances=str(inst), micro_batch=8, optimizer="adamw", lr=1e-3, num_workers=0, eval_every=0,
                save_every=3, log_every=1, progress=False, report_to="none", objective="mlm")
    if model == "bert":
        (root / "model.json").write_text(json.dumps(TINY))
        model = str(root / "model.json")
    pretrain(PretrainConfig(out=str(root / "first"), model=model, max_steps=1, **args))
    return args


def moved(before: dict, after: dict) -> set:
    return {k for k in after if not torch.equal(before[k].float(), after[k].float())}


@pytest.mark.parametrize("model,words", [("bert", "bert.embeddings.word_embeddings.weight"),
                                         ("modernbert-tiny", "model.embeddings.tok_embeddings.weight")])
def test_only_the_parts_named_move(tmp_path, clean_dist_env, model, words):
    args = start(tmp_path, model)
    before, _, _ = load_run_state_dict(tmp_path / "first")
    for parts in (("head",), ("head", "embeddings")):
        out = tmp_path / "-".join(parts)
        pretrain(PretrainConfig(out=str(out), init_from=str(tmp_path / "first"), max_steps=3, train_only=parts, **args))
        changed = moved(before, load_run_state_dict(out)[0])
        encoder = {k for k in before if k.startswith("bert." if model == "bert" else "model.")}
        assert changed and changed - encoder == changed - {words}   # nothing else of the encoder
        assert (words in changed) == ("embeddings" in parts)
        assert changed - {words}, "the head trained"
        assert json.loads((out / "config.json").read_text())["pretrain"]["train_only"] == list(parts)
    with pytest.raises(ConfigError, match="train_only"):   # a resume keeps what trains (the optimizer holds it)
        pretrain(PretrainConfig(out=str(tmp_path / "head"), max_steps=4, resume=True, train_only=("embeddings",),
                                **args))
    with pytest.raises(ConfigError, match="choose head, embeddings"):
        PretrainConfig(out=str(tmp_path / "x"), train_only=("encoder",), **args).check()


def test_a_plan_trains_the_head_then_everything_with_a_new_optimizer_state(tmp_path, clean_dist_env):
    start(tmp_path, "bert")
    (tmp_path / "plan.toml").write_text(f"""
micro_batch = 8
optimizer = "adamw"
num_workers = 0
eval_every = 0
report_to = "none"
objective = "mlm"
init_from = "{tmp_path / 'first'}"
instances = "{tmp_path / 'inst'}"

[[phase]]
name = "head"
train_only = ["head"]
max_steps = 2

[[phase]]
name = "all"
max_steps = 2
""")
    run_plan(tmp_path / "plan.toml", tmp_path / "run", progress=False)
    first, _, _ = load_run_state_dict(tmp_path / "first")
    head, _, _ = load_run_state_dict(tmp_path / "run" / "01-head")
    final, _, _ = load_run_state_dict(tmp_path / "run" / "02-all")
    assert not any(k.startswith("bert.") for k in moved(first, head))
    assert any(k.startswith("bert.layers.") for k in moved(head, final))   # the encoder trains again
    config = json.loads((tmp_path / "run" / "02-all" / "config.json").read_text())["pretrain"]
    assert config["init_optimizer"] is False and config["train_only"] == []
    from bertkit.report import report

    page = report(tmp_path / "run").read_text()   # the phase table says what each phase trained
    assert "<td>&quot;head&quot;</td>" in page and "<td>&quot;all&quot;</td>" in page


def test_a_plan_may_name_the_parts_as_on_the_command_line(tmp_path):
    from bertkit.pretrain.plan import phase_config

    inst = make_instances_dir(tmp_path / "inst", n=16, holdout=2, max_len=32)
    for given in ("head, embeddings", ["head", "embeddings"]):
        cfg = phase_config({"instances": str(inst)}, {"name": "a", "train_only": given}, 0, tmp_path, None, False)
        assert cfg.train_only == ("head", "embeddings")
    mixed = phase_config({}, {"name": "b", "mixture": f"{inst}=0.7, {inst}=0.3"}, 0, tmp_path, None, False)
    assert mixed.mixture == (f"{inst}=0.7", f"{inst}=0.3")   # a mixture too
