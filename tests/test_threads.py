"""bertkit chooses its threads (issue 40): the cores it may use, less what other processes keep busy, divided among
the run's processes; --threads or OMP_NUM_THREADS win; the choice is said and recorded."""
import json

import pytest
import torch

import bertkit.threads as threads


@pytest.fixture(autouse=True)
def keep_torch_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("busy,processes,expected", [(0.0, 1, 4), (0.9, 1, 3), (1.4, 1, 3), (1.6, 1, 2),
                                                     (0.0, 2, 2), (3.0, 2, 1), (8.0, 1, 1)])
def test_auto_takes_the_free_cores_shared_among_the_processes(monkeypatch, busy, processes, expected):
    monkeypatch.setattr(threads, "busy_cores", lambda seconds=0.25: busy)
    monkeypatch.setenv("LOCAL_SIZE", str(processes))
    choice = threads.choose_threads()
    assert (choice.threads, choice.source) == (expected, "auto") and torch.get_num_threads() == expected
    assert f"threads: {expected} (4 core(s), {busy:.1f} kept busy by other processes" in choice.describe()


def test_flag_and_environment_win(monkeypatch):
    monkeypatch.setattr(threads, "busy_cores", lambda seconds=0.25: pytest.fail("not measured when given"))
    assert threads.choose_threads(3).threads == 3 and torch.get_num_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    choice = threads.choose_threads()
    assert (choice.threads, choice.source) == (1, "OMP_NUM_THREADS") and torch.get_num_threads() == 1
    assert threads.choose_threads(2).source == "--threads"


def test_busy_cores_sees_a_busy_neighbour():
    """A real measurement: a process spinning on one core shows as (about) one busy core."""
    import subprocess
    import sys
    import time

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert threads.busy_cores(0.5) > 0.6
    finally:
        spin.kill()


def test_pretrain_says_and_records_its_choice(tmp_path, capfd):
    from tests.helpers import tiny_run

    _, run = tiny_run(tmp_path, threads=1)
    assert "threads: 1 (from --threads)" in capfd.readouterr().err
    assert json.loads((run / "config.json").read_text())["threads"]["threads"] == 1
