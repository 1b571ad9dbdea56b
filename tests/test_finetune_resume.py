"""A killed fine-tuning continues from OUT/resume/ when the same command runs again, and ends exactly where an
uninterrupted one ends: every step's loss, every epoch's scores, the predictions. Another setting starts afresh
(saying so), and a state file from elsewhere is loaded as plain data or not at all."""
import json

import pytest
import torch

from bertkit.finetune.train import TrainConfig
from tests.helpers import tiny_model_folder

STEPS_PER_EPOCH = 5  # 40 rows, batch 8


@pytest.fixture
def task(tmp_path):
    """A tiny BERT (dropout 0.1, so the resumed run must draw dropout's masks where the first left off) and a
    40-row classification set."""
    tiny_model_folder(tmp_path, "model")
    rows = ["text\tlabel"] + [f"w{i} w{(i * 5) % 27} w{(i * 7) % 27}\t{i % 2}" for i in range(40)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    return tmp_path


def finetune(task, name: str, checkpoint_minutes: float = 0.0, lr: float = 1e-3) -> dict:
    from bertkit.finetune.classify import finetune_classify

    cfg = TrainConfig(out_dir=str(task / name), epochs=2, batch_size=8, learning_rate=lr, seed=3, save_model=False,
                      report_to="none", log_every=1, checkpoint_minutes=checkpoint_minutes)
    return finetune_classify(task / "model", task / "train.tsv", task / "train.tsv", cfg, text_a="text",
                             label="label", max_seq_length=16)


def step_losses(folder) -> dict:
    """{step: loss} from OUT/metrics.jsonl (a resumed run appends; later lines win)."""
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def killed_at(monkeypatch, step: int):
    """Kill the fine-tuning (KeyboardInterrupt) right after it saves its state at `step`."""
    from bertkit.finetune import train

    save = train.Checkpoints.save

    def save_then_die(self, *args):
        save(self, *args)
        if self.ft.step == step:
            raise KeyboardInterrupt

    monkeypatch.setattr(train.Checkpoints, "save", save_then_die)


@pytest.mark.parametrize("kill_step, minutes", [
    (3, 1e-9),                    # in the first epoch (1e-9 minutes: a state after every step)
    (STEPS_PER_EPOCH, 1e-9),      # after the first epoch's last step, before its evaluation
    (STEPS_PER_EPOCH, 1000.0),    # between the epochs (the only state a long interval leaves here)
    (STEPS_PER_EPOCH + 2, 1e-9),  # in the second epoch, its shuffle drawn after the first's
])
def test_a_killed_fine_tuning_continues_to_the_uninterrupted_result(task, monkeypatch, capsys, kill_step, minutes):
    whole = finetune(task, "whole")
    with monkeypatch.context() as m:
        killed_at(m, kill_step)
        with pytest.raises(KeyboardInterrupt):
            finetune(task, "killed", checkpoint_minutes=minutes)
    assert (task / "killed" / "resume" / "state.pt").is_file()
    capsys.readouterr()
    resumed = finetune(task, "killed", checkpoint_minutes=minutes)
    assert f"resuming the fine-tuning in {task / 'killed'} at step {kill_step} of {2 * STEPS_PER_EPOCH}" in \
        capsys.readouterr().out
    assert [(e["train_loss"], e["accuracy"]) for e in resumed["epochs"]] == \
        [(e["train_loss"], e["accuracy"]) for e in whole["epochs"]]
    assert step_losses(task / "killed") == step_losses(task / "whole")
    predictions = "dev_predictions.json"
    assert (task / "killed" / predictions).read_text() == (task / "whole" / predictions).read_text()
    assert not (task / "killed" / "resume").exists()  # removed once the fine-tuning ends


def test_another_setting_starts_afresh_and_says_why(task, monkeypatch, capsys):
    with monkeypatch.context() as m:
        killed_at(m, 3)
        with pytest.raises(KeyboardInterrupt):
            finetune(task, "run", checkpoint_minutes=1e-9)
    capsys.readouterr()
    other = finetune(task, "run", lr=5e-4)
    err = capsys.readouterr().out
    assert "an unfinished fine-tuning with another setting (learning_rate 0.001 (this command: 0.0005))" in err
    assert "starting afresh" in err and "resuming" not in err
    fresh = finetune(task, "fresh", lr=5e-4)
    assert [e["train_loss"] for e in other["epochs"]] == [e["train_loss"] for e in fresh["epochs"]]


def test_a_crafted_state_file_is_never_executed(task, monkeypatch):
    """OUT/resume/state.pt is read as plain data: one that would run code stops the command, naming the file."""
    from bertkit.safe_load import UnsafeCheckpointError

    marker = task / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    with monkeypatch.context() as m:
        killed_at(m, 3)
        with pytest.raises(KeyboardInterrupt):
            finetune(task, "run", checkpoint_minutes=1e-9)
    state = task / "run" / "resume" / "state.pt"
    torch.save({"step": 3, "x": Evil()}, state)
    with pytest.raises(UnsafeCheckpointError, match=f"{state}: holds objects a checkpoint never holds"):
        finetune(task, "run", checkpoint_minutes=1e-9)
    assert not marker.exists()


def test_the_cli_flag_sets_how_often_the_state_is_saved(task, monkeypatch):
    """`finetune classify --checkpoint-minutes`: a tiny interval leaves a state the same command continues from;
    0 leaves none, so the command run again starts afresh (and is not refused)."""
    from click.testing import CliRunner

    from bertkit.cli import main
    from bertkit.finetune import train

    class Killed(Exception):
        pass

    def command(name, minutes):
        return ["finetune", "classify", "--model", str(task / "model"), "--train-file", str(task / "train.tsv"),
                "--dev-file", str(task / "train.tsv"), "--text-a", "text", "--label", "label", "--out",
                str(task / name), "--epochs", "2", "--batch-size", "8", "--lr", "1e-3", "--seed", "3",
                "--max-seq-length", "16", "--no-save-model", "--report-to", "none", "--checkpoint-minutes", minutes]

    if_due = train.Checkpoints.if_due

    def die_at_step_3(self, *args):  # killed after step 3, whether or not the interval saved a state there
        if_due(self, *args)
        if self.ft.step == 3:
            raise Killed

    for name, minutes, saved in (("often", "1e-9", True), ("never", "0", False)):
        with monkeypatch.context() as m:
            m.setattr(train.Checkpoints, "if_due", die_at_step_3)
            assert isinstance(CliRunner().invoke(main, command(name, minutes)).exception, Killed)
        assert (task / name / "resume" / "state.pt").is_file() == saved, name
        again = CliRunner().invoke(main, command(name, minutes))
        assert again.exit_code == 0, again.output
        assert ("resuming the fine-tuning in" in again.output) == saved, again.output
