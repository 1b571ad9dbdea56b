"""pretrain --ema: the moving average against one computed here from the weights after every step; kept exactly
across a stop and a resume; written by `export --ema` as a model transformers loads; refused where it cannot be."""
import json
import signal

import pytest
import torch
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.pretrain import ConfigError
from bertkit.pretrain.checkpoints import model_to_export
from tests.helpers import tiny_run

SETTINGS = dict(ema=0.8, max_steps=5, save_every=2, schedule="wsd", decay=0.0, warmup=0, lr=1e-3)


def test_the_moving_average_is_the_weights_averaged_step_by_step_and_resumes_exactly(tmp_path, clean_dist_env,
                                                                                      monkeypatch):
    from bertkit.pretrain import train as loop

    real_step, reference = loop.train_step, {}

    def averaged(run, stop_at=None):
        weights = {k: v.detach().float().clone() for k, v in run.model.state_dict().items()
                   if v.is_floating_point()}
        average = reference.setdefault(run.cfg.out, weights if run.step == 0 else None)   # it starts at the weights
        if stop_at is not None and run.step == stop_at:
            run.stop.signal = signal.SIGTERM
        result = real_step(run)
        if average is not None:
            for k, v in run.model.state_dict().items():
                if k in average:
                    average[k] = 0.8 * average[k] + 0.2 * v.detach().float()
        return result

    monkeypatch.setattr(loop, "train_step", averaged)
    _, whole = tiny_run(tmp_path, "whole", **SETTINGS)
    model, _, tag = model_to_export(whole, None, None, None, ema=True)
    assert tag == "global_step5"
    state = model.state_dict()
    expected = reference[str(whole)]
    assert expected and all(torch.allclose(state[k], v, atol=1e-6) for k, v in expected.items() if k in state)
    plain, _, _ = model_to_export(whole, None, None, None)
    assert not all(torch.equal(plain.state_dict()[k], state[k]) for k in expected if k in state)

    monkeypatch.setattr(loop, "train_step", lambda run: averaged(run, stop_at=2))
    _, halves = tiny_run(tmp_path, "halves", **SETTINGS)   # stops and saves at step 3
    monkeypatch.setattr(loop, "train_step", real_step)
    tiny_run(tmp_path, "halves", resume=True, **SETTINGS)
    resumed, _, _ = model_to_export(halves, None, None, None, ema=True)
    assert all(torch.equal(resumed.state_dict()[k], v) for k, v in state.items())

    r = CliRunner().invoke(main, ["export", str(whole), "--out", str(tmp_path / "ema"), "--ema"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "ema" / "manifest.json").read_text())["ema"] is True
    from transformers import AutoModelForPreTraining

    loaded = AutoModelForPreTraining.from_pretrained(tmp_path / "ema")
    word = [v for k, v in loaded.state_dict().items() if k.endswith("word_embeddings.weight")][0]
    ours = state[[k for k in state if k.endswith("word_embeddings.weight")][0]]
    assert torch.allclose(word, ours[:len(word)], atol=1e-6)   # the padding rows trimmed
    r = CliRunner().invoke(main, ["export", str(whole), "--out", str(tmp_path / "ema")])   # another kind of weights
    assert r.exit_code != 0 and "moving average" in r.output


def test_ema_is_refused_where_it_cannot_be(tmp_path, clean_dist_env):
    _, run = tiny_run(tmp_path, "plain")
    with pytest.raises(ConfigError, match="keeps no moving average"):
        model_to_export(run, None, None, None, ema=True)
    with pytest.raises(ConfigError, match="ZeRO stage 3"):
        tiny_run(tmp_path, "z3", ema=0.99, zero_stage=3)
    with pytest.raises(ConfigError, match="--ema 1.0"):
        tiny_run(tmp_path, "one", ema=1.0)


def test_a_rollback_takes_the_moving_average_back_to_its_checkpoint(tmp_path, clean_dist_env, monkeypatch):
    """A non-finite loss at step 6, rolled back to step 4's checkpoint: step 5's update (a step that stood) leaves
    the average with it, which is again exactly the one step 4's ema.pt holds."""
    from bertkit.pretrain import divergence, train as loop
    from bertkit.pretrain.ema import read_ema

    real_roll_back, seen = loop.roll_back, []

    def watched(run, problem):
        saved = read_ema(run.last_ckpt)
        moved = any(not torch.equal(v, saved[k]) for k, v in run.ema.state_dict().items())
        real_roll_back(run, problem)
        seen.append((moved, all(torch.equal(v, saved[k]) for k, v in run.ema.state_dict().items())))

    monkeypatch.setattr(loop, "roll_back", watched)
    monkeypatch.setattr(divergence, "_FAULTS_DONE", set())
    monkeypatch.setenv("BERTKIT_FAULT_STEPS", "6:nan")
    tiny_run(tmp_path, "rolled", ema=0.5, max_steps=8, save_every=4, on_nonfinite="rollback")
    assert seen == [(True, True)]
