"""Divergence: a non-finite loss (injected through the test-only BERTKIT_FAULT_STEPS hook) or a loss spike either
stops the run with what to do, or rolls back to the last good checkpoint, skips the data that led there and goes on,
logging what it did; the skip is remembered by checkpoints, so a later --resume keeps the same data order."""
import json
import math

import pytest

from bertkit.pretrain import PretrainConfig, TrainingError, pretrain
from tests.helpers import finish, launch, tiny_pretraining_inputs


@pytest.fixture(scope="module")
def instances(tmp_path_factory):
    return tiny_pretraining_inputs(tmp_path_factory.mktemp("div"), n=256)


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_nonfinite_loss_rolls_back_on_two_ranks(instances, tmp_path):
    run = tmp_path / "run"
    args = ["--instances", instances, "--out", run, "--model", instances.parent / "model.json", "--max-steps", 10,
            "--micro-batch", 4, "--global-batch", 16, "--optimizer", "adamw", "--zero-stage", 2, "--lr", "1e-3",
            "--log-every", 1, "--save-every", 3, "--eval-every", 0, "--num-workers", 0, "--report-to", "none",
            "--on-nonfinite", "rollback"]
    out = finish(launch(args, BERTKIT_FAULT_STEPS="8:nan"))
    assert "loss is nan at step 8: rolled back to global_step6 and skipped 4 micro batch(es)" in out
    logged = records(run)
    [rollback] = [r for r in logged if "rollback_to" in r]
    assert rollback == {"step": 8, "rollback_to": 6, "rollback_reason": "loss is nan", "skipped_micro_batches": 4}
    steps = [r["step"] for r in logged if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 7, 8, 9, 10]  # step 7 again after the rollback, then on to the end
    assert all(math.isfinite(r["loss"]) for r in logged if "loss" in r)
    marker = json.loads((run / "checkpoints" / "global_step10" / "checkpoint.json").read_text())
    assert marker["skipped_micro_batches"] == 4 and marker["world_size"] == 2


def test_nonfinite_loss_stops_by_default_naming_the_fix(instances, tmp_path, clean_dist_env, monkeypatch):
    monkeypatch.setenv("BERTKIT_FAULT_STEPS", "3:nan")
    with pytest.raises(TrainingError, match=r"loss is nan at step 3; stopped without saving .*--on-nonfinite "
                                            r"rollback"):
        pretrain(PretrainConfig(instances=str(instances), out=str(tmp_path / "run"),
                                model=str(instances.parent / "model.json"), micro_batch=8, max_steps=6,
                                progress=False, num_workers=0, report_to="none", save_every=2))


def test_a_loss_spike_rolls_back_and_the_skip_survives_a_resume(instances, tmp_path, clean_dist_env, monkeypatch):
    """A 1000x loss at step 9 after 8 good steps: rolled back to step 8 with step 9's data skipped. Resuming a
    copy of the run from step 10 then sees exactly the data the uninterrupted rolled-back run saw."""
    import shutil

    from bertkit.pretrain import divergence

    monkeypatch.setattr(divergence, "_FAULTS_DONE", set())
    monkeypatch.setenv("BERTKIT_FAULT_STEPS", "9:1000")
    cfg = dict(instances=str(instances), model=str(instances.parent / "model.json"), micro_batch=8, max_steps=14,
               optimizer="adamw", lr=1e-3, log_every=1, save_every=2, keep_last=10, eval_every=0, progress=False,
               num_workers=0, report_to="none", on_spike="rollback", spike_factor=3.0, spike_window=5)
    run = tmp_path / "run"
    pretrain(PretrainConfig(out=str(run), **cfg))
    logged = records(run)
    [rollback] = [r for r in logged if "rollback_to" in r]
    assert rollback["step"] == 9 and rollback["rollback_to"] == 8 and rollback["skipped_micro_batches"] == 1
    assert rollback["rollback_reason"].startswith("loss spike: ") and "x the median" in rollback["rollback_reason"]
    losses = {r["step"]: r["loss"] for r in logged if "loss" in r}  # later lines win: the steps after the rollback

    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    for step in (12, 14):
        shutil.rmtree(copy / "checkpoints" / f"global_step{step}")
    (copy / "metrics.jsonl").write_text("")
    pretrain(PretrainConfig(out=str(copy), resume=True, **cfg))
    resumed = {r["step"]: r["loss"] for r in records(copy) if "loss" in r}
    assert resumed == pytest.approx({s: losses[s] for s in (11, 12, 13, 14)}, rel=1e-6)


def test_rollbacks_are_limited(instances, tmp_path, clean_dist_env, monkeypatch):
    from bertkit.pretrain import divergence

    monkeypatch.setattr(divergence, "_FAULTS_DONE", set())
    monkeypatch.setenv("BERTKIT_FAULT_STEPS", "3:nan,4:nan")
    with pytest.raises(TrainingError, match=r"loss is nan at step 4; cannot roll back \(1 rollbacks already\)"):
        pretrain(PretrainConfig(instances=str(instances), out=str(tmp_path / "run"),
                                model=str(instances.parent / "model.json"), micro_batch=8, max_steps=8,
                                progress=False, num_workers=0, report_to="none", save_every=2,
                                on_nonfinite="rollback", max_rollbacks=1))
