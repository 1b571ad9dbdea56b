"""pretrain --time-budget (the schedule follows the clock; the run stops, saves and records its schedule when the
time is spent; --resume counts the time already used) and --schedule-from (a recorded schedule replayed step for
step). One process, no launcher."""
import json
import math

import pytest
from click.testing import CliRunner

from bertkit.cli import main as cli
from bertkit.pretrain import PretrainConfig, pretrain
from bertkit.pretrain.budget import lr_at, parse_duration
from tests.helpers import TINY, make_instances_dir
from tests.test_pretrain_dist import metrics

pytestmark = pytest.mark.usefixtures("clean_dist_env", "one_thread")


@pytest.fixture
def one_thread():
    """Steps of a tiny model on two threads crawl when another process holds the cores; the checks count steps."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def inst(tmp_path_factory):
    root = tmp_path_factory.mktemp("budget")
    (root / "model.json").write_text(json.dumps(TINY))
    return make_instances_dir(root / "inst", n=256, holdout=16, max_len=32), root / "model.json"


def cfg(inst, out, **kw):
    instances, model = inst
    return PretrainConfig(**{**dict(instances=str(instances), out=str(out), model=str(model), micro_batch=8,
                                    optimizer="adamw", lr=3e-3, warmup=0.2, log_every=1, save_every=10 ** 6,
                                    eval_every=0, num_workers=0, progress=False, report_to="none"), **kw})


def test_durations():
    assert parse_duration("2h") == 7200 and parse_duration("30m") == 1800 and parse_duration("1h30m") == 5400
    assert parse_duration("90s") == 90 and parse_duration("1.5h") == 5400
    for bad in ("", "2", "2 hours", "0m", "-1h", "h"):
        with pytest.raises(ValueError, match="duration|longer than 0"):
            parse_duration(bad)
    # the schedule's shape: warmup to the peak at the warmup fraction, linear decay to 0 at the end
    assert lr_at(0.05, 0.1, "linear") == pytest.approx(0.5) and lr_at(0.1, 0.1, "linear") == 1.0
    assert lr_at(0.55, 0.1, "linear") == pytest.approx(0.5) and lr_at(1.0, 0.1, "linear") == 0.0
    assert lr_at(0.55, 0.1, "poly") == pytest.approx(math.sqrt(0.5))


def test_a_budgeted_run_stops_saves_records_and_replays_exactly(inst, tmp_path):
    run = tmp_path / "timed"
    result = pretrain(cfg(inst, run, time_budget=3.0))
    steps = result["step"]
    schedule = json.loads((run / "schedule.json").read_text())
    assert steps >= 5 and schedule["steps"] == steps and len(schedule["fraction"]) == steps
    assert schedule["time_used_s"] >= 3.0 and (run / "checkpoints" / "latest").read_text() == f"global_step{steps}"
    fractions = schedule["fraction"]
    assert fractions == sorted(fractions) and fractions[-1] < 1.0 <= schedule["time_used_s"] / 3.0 + 1e-9
    logged = metrics(run)
    lrs = [logged[s]["lr"] for s in range(1, steps + 1)]
    peak = max(lrs)
    assert peak == pytest.approx(3e-3, rel=0.2) and lrs[-1] < 0.25 * peak  # warmed up, then decayed with the clock
    assert all(logged[s]["elapsed_s"] <= logged[s + 1]["elapsed_s"] for s in range(1, steps))

    # --schedule-from: the same steps, the same rates, the same losses, on whatever clock
    replay = tmp_path / "replay"
    assert pretrain(cfg(inst, replay, schedule_from=str(run)))["step"] == steps
    again = metrics(replay)
    for s in range(1, steps + 1):  # (the rate logged at a step is the next step's: the last one was never used)
        assert again[s]["loss"] == pytest.approx(logged[s]["loss"], rel=1e-6)
        assert s == steps or again[s]["lr"] == logged[s]["lr"]
    with pytest.raises(Exception, match="recorded only"):
        pretrain(cfg(inst, tmp_path / "too-long", schedule_from=str(run), max_steps=steps + 1))


def test_resume_counts_the_time_already_used(inst, tmp_path):
    run = tmp_path / "resumed"
    pretrain(cfg(inst, run, time_budget=3.0, max_steps=6))  # stopped by --max-steps, budget left
    first = json.loads((run / "schedule.json").read_text())
    assert first["steps"] == 6 and 0 < first["time_used_s"] < 3.0
    result = pretrain(cfg(inst, run, time_budget=3.0, max_steps=10 ** 6, resume=True))  # the cap lifted: the clock
    second = json.loads((run / "schedule.json").read_text())
    assert second["steps"] == result["step"] > 6 and second["fraction"][:6] == first["fraction"]
    assert second["fraction"][7] >= (first["time_used_s"] - 0.001) / 3.0  # step 8 (the first rate set after the resume)
    # came from the clock going on from the time used, not from 0
    # a resume with another budget would change the schedule: refused
    with pytest.raises(Exception, match="time_budget 3.0 -> 5.0"):
        pretrain(cfg(inst, run, time_budget=5.0, resume=True))


def test_a_resumed_run_s_clock_goes_on_from_its_checkpoint(inst, tmp_path):
    """Without a budget too: the log's elapsed_s (what quality-against-minutes curves read) continues across a
    resume rather than starting again from 0."""
    run = tmp_path / "steps"
    pretrain(cfg(inst, run, max_steps=6))
    marker = json.loads((run / "checkpoints" / "global_step6" / "checkpoint.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    at_six = [r["elapsed_s"] for r in rows if r.get("step") == 6 and "loss" in r][-1]
    assert marker["elapsed_s"] == pytest.approx(at_six, abs=1e-3) and at_six > 0
    pretrain(cfg(inst, run, max_steps=8, resume=True))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    after = [r["elapsed_s"] for r in rows if r.get("step") == 7 and "loss" in r]
    assert after and after[-1] > at_six


def test_flags(inst, tmp_path):
    instances, model = inst
    base = ["pretrain", "--instances", str(instances), "--model", str(model), "--out", str(tmp_path / "r")]
    for flags, message in ((["--time-budget", "0m"], "longer than 0"), (["--time-budget", "soon"], "not a duration"),
                           (["--max-steps", "0"], "--max-steps")):
        r = CliRunner().invoke(cli, base + flags)
        assert r.exit_code == 2 and message in r.output, r.output


def test_a_budget_shorter_than_eval_every_still_evaluates_on_the_clock(inst, tmp_path):
    """Issue 40: --eval-every counts steps, which a short budget never reaches; the clock adds an evaluation every
    tenth of the budget and one at the end."""
    run = tmp_path / "clock"
    pretrain(cfg(inst, run, time_budget=3.0, eval_every=10 ** 6, eval_batches=1))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval_loss" in r]
    last_step = max(r["step"] for r in records)
    assert len(evals) >= 2 and evals[-1]["step"] == last_step
    assert len(evals) <= 11  # a tenth of the budget apart, plus the end
