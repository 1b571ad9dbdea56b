"""A resume says what it changes (issue 36, part 3): a setting the command does not give is the run's own; one it
gives that can be applied (a lower --lr after a spike, more --max-steps) takes effect at the resumed step and is
logged and recorded with that step; one that cannot (another model, batch, seed or instances) is refused naming both
values; --max-steps at or below the run's step says so."""
import json
import shutil

import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.pretrain import ConfigError, PretrainConfig, pretrain
from tests.helpers import make_instances_dir, tiny_run


@pytest.fixture(scope="module")
def run4(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("resume"), n=96, max_steps=4, lr=1e-3, warmup=0)


def config(inst, out, **kw):
    args = dict(instances=str(inst), out=str(out), model=str(inst.parent / "model.json"), max_steps=8, micro_batch=8,
                optimizer="adamw", lr=1e-3, warmup=0, num_workers=0, eval_every=0, save_every=2, log_every=1,
                progress=False, report_to="none")
    return PretrainConfig(**{**args, **kw})


def records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def copy(run, tmp_path):
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


def test_a_resume_with_nothing_but_out_continues_the_run_as_it_was(run4, tmp_path):
    """From the CLI, every flag not given is the run's own: its instances, tiny model, batch, rate and steps."""
    _, run = run4
    mine = copy(run, tmp_path)
    r = CliRunner().invoke(main, ["pretrain", "--out", str(mine), "--resume", "--max-steps", "6", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "--resume at step 4 changes max_steps 4 -> 6 (from step 5 on)" in r.output
    config = json.loads((mine / "config.json").read_text())
    before = json.loads((run / "config.json").read_text())
    assert config["pretrain"]["model"] == before["pretrain"]["model"] and config["model"] == before["model"]
    assert config["resolved"] == before["resolved"] and config["init_from"] == before["init_from"]
    assert config["changes"] == [{"step": 4, "setting": "max_steps", "before": 4, "after": 6}]


def test_a_lower_lr_is_applied_from_the_resumed_step_and_recorded(run4, tmp_path, clean_dist_env, capfd):
    inst, run = run4
    mine2 = copy(run, tmp_path)
    pretrain(config(inst, mine2, lr=2e-4, resume=True))
    assert "--resume at step 4 changes lr 0.001 -> 0.0002; max_steps 4 -> 8 (from step 5 on)" in capfd.readouterr().err
    rows = records(mine2)
    assert {"step": 4, "resume_changes": {"lr": [1e-3, 2e-4], "max_steps": [4, 8]}} in rows
    lrs = {r["step"]: r["lr"] for r in rows if "lr" in r}
    # linear decay to 0 over 8 steps, no warmup: the lr of step s (logged after its update) is peak x (8 - s) / 8
    assert lrs[5] == pytest.approx(2e-4 * 3 / 8) and lrs[8] == pytest.approx(0.0)
    assert lrs[4] == pytest.approx(1e-3 * 0 / 4)  # the first launch decayed to 0 over its own 4 steps
    changes = json.loads((mine2 / "config.json").read_text())["changes"]
    assert {"step": 4, "setting": "lr", "before": 1e-3, "after": 2e-4} in changes
    assert json.loads((mine2 / "config.json").read_text())["resolved"]["lr"] == 2e-4


@pytest.mark.parametrize("change,says", [
    (dict(micro_batch=4), "micro_batch 8 -> 4"),
    (dict(seed=7), "seed 42 -> 7"),
    (dict(model="tiny"), "model "),
    (dict(optimizer="lamb"), "optimizer adamw -> lamb"),
])
def test_a_change_that_cannot_apply_is_refused_naming_both_values(run4, tmp_path, clean_dist_env, change, says):
    inst, run = run4
    mine = copy(run, tmp_path)
    with pytest.raises(ConfigError, match="--resume: .*" + says.replace("(", r"\(")):
        pretrain(config(inst, mine, resume=True, **change))
    assert records(mine) == records(run)  # nothing written


def test_other_instances_are_refused(run4, tmp_path, clean_dist_env):
    inst, run = run4
    other = make_instances_dir(tmp_path / "other", n=96, holdout=8, max_len=32, seed=5)
    mine = copy(run, tmp_path)
    model = str(inst.parent / "model.json")
    with pytest.raises(ConfigError, match=r"--resume: the instances .* -> .*other"):
        pretrain(config(other, mine, resume=True, model=model))
    longer = make_instances_dir(tmp_path / "longer", n=96, holdout=8, max_len=48)
    with pytest.raises(ConfigError, match=r"the instances' max_seq_length 32 -> 48"):
        pretrain(config(longer, mine, resume=True, model=model))


def test_max_steps_at_or_below_the_runs_step_says_so(run4, tmp_path, clean_dist_env):
    inst, run = run4
    mine = copy(run, tmp_path)
    with pytest.raises(ConfigError, match=r"--max-steps 3: the run is already at step 4; give more steps to "
                                          r"train on, or export it as it is \(bertkit export"):
        pretrain(config(inst, mine, resume=True, max_steps=3))
