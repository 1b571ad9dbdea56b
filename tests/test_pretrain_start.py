"""The model a pretraining run starts from (bertkit/pretrain/start.py): each start that cannot work stops before
training with a message that names what does not fit and the fix, and an --init-from continues the source's
weights exactly."""
import json

import pytest
import torch

from bertkit.formats import read_instances_manifest
from bertkit.pretrain import ConfigError, PretrainConfig
from bertkit.pretrain.start import build_model
from tests.helpers import TINY, tiny_model_folder, tiny_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Instances (32 tokens, the toy vocabulary), a BERT run and an ELECTRA run on them (2 steps each)."""
    root = tmp_path_factory.mktemp("start")
    inst, bert_run = tiny_run(root, "bert")
    _, electra_run = tiny_run(root, "electra", objective="electra", generator_size=0.5)
    _, modern_run = tiny_run(root, "modernbert", objective="mlm", model="modernbert-tiny")
    return root, inst, bert_run, electra_run, modern_run


def start(inst, objective="nsp", **flags):
    cfg = PretrainConfig(instances=str(inst), out=str(inst.parent / "unused"), **flags)
    return build_model(cfg, read_instances_manifest(inst), None, objective)


def write_model(root, name, **changes):
    path = root / f"{name}.json"
    path.write_text(json.dumps({**TINY, **changes}))
    return str(path)


def test_a_bert_config_that_does_not_fit_the_instances_is_named(runs):
    root, inst, *_ = runs
    with pytest.raises(ConfigError, match=r"vocabulary has 999 tokens .* made with 133 .* use instances made with"):
        start(inst, model=write_model(root, "wide-vocab", vocab_size=999))
    with pytest.raises(ConfigError, match=r"has sequences of 32 tokens but the model has only 16 positions"):
        start(inst, model=write_model(root, "short", max_position_embeddings=16))


def test_modernbert_refuses_what_it_cannot_be(runs):
    root, inst, *_ = runs
    with pytest.raises(ConfigError, match=r"ModernBERT is MLM-only, but .* NSP instances: make them with"):
        start(inst, "nsp", model="modernbert-tiny")
    with pytest.raises(ConfigError, match=r"--norm post: ModernBERT is pre-LN by design; drop --norm"):
        start(inst, "none", model="modernbert-tiny", norm="post")
    # 96 / 2 = 48-wide heads: the Triton kernels turn RoPE in power-of-two halves; --kernels auto falls back
    odd = root / "odd-heads.json"
    odd.write_text(json.dumps({"family": "modernbert", "vocab_size": 133, "hidden_size": 96, "num_layers": 2,
                               "num_heads": 2, "intermediate_size": 64}))
    with pytest.raises(ConfigError, match=r"--kernels triton: .* heads are 48 wide: use --kernels auto or torch"):
        start(inst, "none", model=str(odd), kernels="triton")
    model, mb, _ = start(inst, "none", model=str(odd), kernels="auto")
    assert mb.head_dim == 48 and sum(p.numel() for p in model.parameters()) > 0


def test_init_from_continues_a_run_of_the_same_objective_only(runs):
    root, inst, bert_run, electra_run, _ = runs
    model, _, source = start(inst, "nsp", init_from=str(bert_run))
    assert "global_step2" in source
    from bertkit.pretrain import load_run_state_dict

    state, _, _ = load_run_state_dict(bert_run)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    with pytest.raises(ConfigError, match=r"an electra run cannot start this nsp run"):
        start(inst, "nsp", init_from=str(electra_run))
    with pytest.raises(ConfigError, match=r"an nsp run cannot start this electra run"):
        start(inst, "electra", init_from=str(bert_run))
    folder = tiny_model_folder(root)
    with pytest.raises(ConfigError, match=r"ELECTRA continues from its run folder \(the one with checkpoints/\)"):
        start(inst, "electra", init_from=str(folder))


def test_norm_cannot_change_the_weights_it_starts_from(runs):
    _, inst, bert_run, *_ = runs
    with pytest.raises(ConfigError, match=r"--norm pre: the weights this run starts from .* are post-LN; drop --norm"):
        start(inst, "nsp", init_from=str(bert_run), norm="pre")


@pytest.mark.parametrize("which", ["bert", "electra", "modernbert"])
def test_export_random_weights_is_where_the_run_began(runs, which):
    """`export --random-weights`: the run's architecture and tokenizer with the weights `pretrain` drew at its seed
    (the random start its pretraining is judged against), read by transformers; not a checkpoint's."""
    from click.testing import CliRunner
    from safetensors.torch import load_file

    from bertkit.cli import main
    from bertkit.formats import read_export_manifest
    from bertkit.pretrain.checkpoints import read_run_config

    root, inst, *by_kind = runs
    run = dict(zip(["bert", "electra", "modernbert"], by_kind))[which]
    recorded = read_run_config(run)
    out = root / f"random-{which}"
    caller_rng = torch.get_rng_state()
    r = CliRunner().invoke(main, ["export", str(run), "--out", str(out), "--random-weights"])
    assert r.exit_code == 0, r.output
    assert torch.equal(torch.get_rng_state(), caller_rng)  # drawn on a forked generator
    assert "random weights drawn at seed 42, the weights this run began from" in r.output
    torch.manual_seed(recorded.pretrain["seed"])  # as pretrain() does before building its model
    began, _, _ = start(inst, recorded.objective, model=recorded.pretrain["model"],
                        **({"generator_size": 0.5} if which == "electra" else {}))
    trained = root / f"trained-{which}"
    assert CliRunner().invoke(main, ["export", str(run), "--out", str(trained)]).exit_code == 0
    fresh, pretrained = load_file(out / "model.safetensors"), load_file(trained / "model.safetensors")
    assert fresh.keys() == pretrained.keys()
    assert any(not torch.equal(fresh[k], pretrained[k]) for k in fresh)
    from bertkit.models import save_pretrained
    save_pretrained(began, root / f"began-{which}", tokenizer_dir=inst)  # the step-0 model, written the same way
    for weights in ["model.safetensors"] + (["generator/model.safetensors"] if which == "electra" else []):
        expected, got = load_file(root / f"began-{which}" / weights), load_file(out / weights)
        assert expected.keys() == got.keys() and all(torch.equal(got[k], expected[k]) for k in got), weights
    assert read_export_manifest(out).random_seed == recorded.pretrain["seed"]
    assert (out / "vocab.txt").read_bytes() == (trained / "vocab.txt").read_bytes()

    if which == "bert":
        import transformers

        transformers.AutoModelForPreTraining.from_pretrained(out)
        # another seed draws other weights; a trained export in the folder is not replaced by a random one unasked
        other = CliRunner().invoke(main, ["export", str(run), "--out", str(root / "seed9"), "--random-weights",
                                          "--seed", "9"])
        assert "not the weights this run began from (random initialisation, seed 42)" in other.output
        assert other.exit_code == 0 and not torch.equal(load_file(root / "seed9" / "model.safetensors")[
            "bert.embeddings.word_embeddings.weight"], fresh["bert.embeddings.word_embeddings.weight"])
        over = CliRunner().invoke(main, ["export", str(run), "--out", str(trained), "--random-weights"])
        assert over.exit_code == 1 and "--overwrite" in over.output, over.output
        assert "kind trained weights (this command: random weights (seed 42))" in over.output
        lone = CliRunner().invoke(main, ["export", str(run), "--out", str(root / "x"), "--seed", "3"])
        assert lone.exit_code == 2 and "--seed goes with --random-weights" in lone.output
