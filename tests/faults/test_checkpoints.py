"""Checkpoints known complete: a damaged or unfinished newest checkpoint is passed over (with the reason) by
--resume and export, the run goes on exactly from the newest good one, and pruning never deletes the only good one."""
import json

import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.fileio import DiskError
from bertkit.pretrain import PretrainConfig, pretrain
from bertkit.pretrain.checkpoints import find_checkpoint
from bertkit.safe_load import safe_load
from tests.helpers import tiny_pretraining_inputs


@pytest.fixture(scope="module")
def instances(tmp_path_factory):
    return tiny_pretraining_inputs(tmp_path_factory.mktemp("ckpt"), n=96)


def config(instances, out, **kw):
    args = dict(instances=str(instances), out=str(out), model=str(instances.parent / "model.json"), micro_batch=8,
                max_steps=6, save_every=2, keep_last=3, log_every=1, eval_every=0, progress=False, num_workers=0,
                optimizer="adamw", lr=1e-3, report_to="none")
    return PretrainConfig(**{**args, **kw})


def losses(run):
    by_step = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "loss" in r:
            by_step[r["step"]] = r["loss"]
    return by_step


def test_resume_and_export_skip_a_damaged_newest_checkpoint(instances, tmp_path, clean_dist_env, capfd):
    """The issue's second case: truncated files of the newest checkpoint; global_step4 beside it is intact."""
    run = tmp_path / "run"
    pretrain(config(instances, run))
    uninterrupted = losses(run)
    states = sorted((run / "checkpoints" / "global_step6").glob("*model_states.pt"))
    states[0].write_bytes(states[0].read_bytes()[:1000])
    capfd.readouterr()
    chosen = find_checkpoint(run)
    assert chosen.tag == "global_step4" and "global_step6: mp_rank_00_model_states.pt has 1,000 bytes" in \
        chosen.skipped[0]

    r = CliRunner().invoke(main, ["export", str(run), "--out", str(tmp_path / "export")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "export" / "config.json").read_text())["bertkit"]["checkpoint"] == "global_step4"
    assert "skipped checkpoint global_step6: mp_rank_00_model_states.pt has 1,000 bytes" in r.output

    # resuming redoes steps 5-6 from global_step4 and logs the uninterrupted run's losses again
    (run / "metrics.jsonl").write_text("")
    pretrain(config(instances, run, resume=True))
    assert "skipped checkpoint global_step6" in capfd.readouterr().err
    assert losses(run) == pytest.approx({s: uninterrupted[s] for s in (5, 6)}, rel=1e-6)
    verdict = CliRunner().invoke(main, ["verify", str(run)])
    assert verdict.exit_code == 0, verdict.output  # the damaged step 6 was rewritten by the resumed run


def test_a_checkpoint_killed_before_its_marker_is_not_used(instances, tmp_path, clean_dist_env):
    run = tmp_path / "run"
    pretrain(config(instances, run, max_steps=4))
    (run / "checkpoints" / "global_step4" / "checkpoint.json").unlink()  # as if killed before the marker
    chosen = find_checkpoint(run)
    assert chosen.tag == "global_step2" and "global_step4: no checkpoint.json" in chosen.skipped[0]
    v = CliRunner().invoke(main, ["verify", str(run)])
    assert v.exit_code == 0 and "global_step4: incomplete" in v.output


def test_a_failed_save_never_costs_the_only_good_checkpoint(instances, tmp_path, clean_dist_env, monkeypatch):
    """keep-last 1 and a disk that fails while step 4 is written: the run stops with a message naming the folder,
    step 2 stays the one good checkpoint, and --resume continues from it."""
    import bertkit.pretrain.checkpoints as ck

    run = tmp_path / "run"
    real = ck.file_entry
    calls = {"n": 0}

    def failing(path):
        if "global_step4" in str(path):
            calls["n"] += 1
            raise OSError(28, "No space left on device", str(path))
        return real(path)

    monkeypatch.setattr(ck, "file_entry", failing)
    with pytest.raises(DiskError, match=r"no space left on the device while writing .*global_step4.*resume"):
        pretrain(config(instances, run, keep_last=1))
    assert calls["n"] == 1
    assert sorted(p.name for p in (run / "checkpoints").glob("global_step*")) == ["global_step2"]  # no .partial
    assert find_checkpoint(run).tag == "global_step2"
    monkeypatch.setattr(ck, "file_entry", real)
    result = pretrain(config(instances, run, keep_last=1, resume=True))
    assert result["step"] == 6 and find_checkpoint(run).tag == "global_step6"
    assert sorted(p.name for p in (run / "checkpoints").glob("global_step*")) == ["global_step6"]


def test_explicit_damaged_checkpoint_is_refused_by_export(instances, tmp_path, clean_dist_env):
    run = tmp_path / "run"
    pretrain(config(instances, run, max_steps=4))
    rng = next((run / "checkpoints" / "global_step2").glob("rng_rank0.pt"))
    data = bytearray(rng.read_bytes())
    data[-1] ^= 1
    rng.write_bytes(bytes(data))
    r = CliRunner().invoke(main, ["export", str(run), "--out", str(tmp_path / "e"), "--checkpoint", "global_step2"])
    assert r.exit_code == 1 and "global_step2: damaged (rng_rank0.pt does not match its checksum)" in r.output
    assert safe_load(next((run / "checkpoints" / "global_step4").glob("rng_rank0.pt")))


def test_a_damaged_export_is_named_by_its_loaders_and_verify(instances, tmp_path, clean_dist_env):
    run, export = tmp_path / "run", tmp_path / "export"
    pretrain(config(instances, run, max_steps=2))
    assert CliRunner().invoke(main, ["export", str(run), "--out", str(export)]).exit_code == 0
    assert CliRunner().invoke(main, ["verify", str(export)]).exit_code == 0
    weights = export / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    v = CliRunner().invoke(main, ["verify", str(export)])
    assert v.exit_code == 1 and f"DAMAGED {weights}" in v.output
    r = CliRunner().invoke(main, ["fill-mask", "--model", str(export), "w1 [MASK] w2"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"{weights}: not a readable safetensors file" in r.output and "export it again" in r.output
