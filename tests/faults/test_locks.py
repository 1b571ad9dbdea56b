"""One writer per folder: a second writer stops at once saying who holds the folder; a lock left by a dead process on
this host is taken over with a message; one from another host is never taken; clocks play no part."""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.fileio import LOCK_FILE, FolderLockedError, folder_lock
from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus

REPO = Path(__file__).resolve().parents[2]


def raw_text(folder: Path, files: int = 6) -> Path:
    for i in range(files):
        paragraphs = [" ".join(f"word{(i * 31 + j * 7 + k) % 97}" for k in range(40)) + "." for j in range(30)]
        (folder / "in").mkdir(parents=True, exist_ok=True)
        (folder / "in" / f"f{i}.txt").write_text("\n\n".join(paragraphs) + "\n")
    return folder / "in"


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def write_lock(folder: Path, **holder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_FILE).write_text(json.dumps({"host": socket.gethostname(), "what": "prepare-corpus",
                                                "since": "2026-01-01 00:00:00 UTC", "command": "bertkit ...",
                                                **holder}))


def test_a_second_prepare_corpus_into_the_same_folder_stops_at_once(tmp_path):
    """The issue's third case: the same job submitted twice. The second stops with who holds the folder; the
    first finishes intact."""
    inputs, out = raw_text(tmp_path), tmp_path / "out"
    script = (f"import sys, time; sys.path.insert(0, {str(REPO)!r}); import bertkit.pipelines.prepare_corpus as pc\n"
              "real = pc.process_file\n"
              "def slow(*a):\n    s = real(*a); time.sleep(0.5); return s\n"
              "pc.process_file = slow\n"
              f"pc.prepare_corpus([{str(inputs)!r}], {str(out)!r}, pc.CorpusConfig(progress=False, min_chars=10, "
              "workers=1))\n")
    first = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.time() + 60
    while not (out / LOCK_FILE).exists() and time.time() < deadline:
        time.sleep(0.02)
    t = time.time()
    r = CliRunner().invoke(main, ["prepare-corpus", str(inputs), "--out", str(out), "--min-chars", "10",
                                  "--no-progress", "-j", "1"])
    assert time.time() - t < 5  # at once, not after the first finishes
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"{out} is being written by process {first.pid} on this host (prepare-corpus, since" in r.output
    assert first.wait(timeout=120) == 0
    assert not (out / LOCK_FILE).exists()
    assert CliRunner().invoke(main, ["verify", str(out)]).exit_code == 0


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path, capsys):
    inputs, out = raw_text(tmp_path, files=2), tmp_path / "out"
    pid = dead_pid()
    write_lock(out, pid=pid, process_start="123")
    prepare_corpus([inputs], out, CorpusConfig(progress=False, min_chars=10, workers=1))
    assert f"took over the lock left by process {pid} on this host, which is gone" in capsys.readouterr().err
    assert not (out / LOCK_FILE).exists()


def test_a_reused_pid_does_not_keep_a_dead_writers_lock(tmp_path):
    """The lock's process id now belongs to another process (this one): its start time tells them apart."""
    write_lock(tmp_path, pid=os.getpid(), process_start="1")  # not this process's start time
    with folder_lock(tmp_path, "prepare-corpus"):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_a_live_writer_keeps_its_lock_whatever_the_clock_says(tmp_path):
    """Clock skew: a lock stamped in the future (or long ago) by a live process is never expired by time."""
    from bertkit.fileio import _process_start

    for since in ("2099-01-01 00:00:00 UTC", "1999-01-01 00:00:00 UTC"):
        write_lock(tmp_path, pid=os.getpid(), process_start=_process_start(os.getpid()), since=since)
        with pytest.raises(FolderLockedError, match=f"process {os.getpid()} on this host .*since {since}"):
            with folder_lock(tmp_path, "prepare-corpus"):
                pass
    # and a dead writer's lock stamped in the future is still taken over
    write_lock(tmp_path, pid=dead_pid(), since="2099-01-01 00:00:00 UTC")
    with folder_lock(tmp_path, "prepare-corpus"):
        pass


def test_a_lock_from_another_host_is_refused_naming_it(tmp_path):
    write_lock(tmp_path / "run", host="node-7", pid=dead_pid())
    r = CliRunner().invoke(main, ["prepare-corpus", str(raw_text(tmp_path, 1)), "--out", str(tmp_path / "run"),
                                  "--no-progress"])
    assert r.exit_code == 1 and "being written by process" in r.output and "on host node-7" in r.output
    assert f"delete {tmp_path / 'run' / LOCK_FILE}" in r.output


def test_pretraining_holds_its_run_folder(tmp_path, clean_dist_env):
    from bertkit.fileio import _process_start
    from bertkit.pretrain import ConfigError, PretrainConfig, pretrain
    from tests.helpers import TINY, make_instances_dir

    inst = make_instances_dir(tmp_path / "inst", n=32, holdout=8, max_len=32)
    (tmp_path / "model.json").write_text(json.dumps(TINY))
    write_lock(tmp_path / "run", pid=os.getpid(), process_start=_process_start(os.getpid()), what="pretrain")
    with pytest.raises(ConfigError, match="run is being written by process .* on this host \\(pretrain"):
        pretrain(PretrainConfig(instances=str(inst), out=str(tmp_path / "run"), model=str(tmp_path / "model.json"),
                                max_steps=1, micro_batch=8, progress=False, num_workers=0, report_to="none"))
    assert not (tmp_path / "run" / "checkpoints").exists()
