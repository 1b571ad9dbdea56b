"""A worker process killed mid-stage (the OOM killer, say): the stage stops with a message saying the same command
resumes, and it does, to the bytes of an undisturbed run. (A killed main process: tests/test_prepare_corpus.py; a
rank killed mid-checkpoint leaves no checkpoint.json: tests/faults/test_checkpoints.py.)"""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus
from tests.helpers import REPO


def test_a_killed_prepare_corpus_worker(tmp_path):
    for i in range(8):
        text = "\n\n".join(" ".join(f"word{(i * 13 + j * 5 + k) % 91}" for k in range(25)) + "." for j in range(40))
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / f"f{i}.txt").write_text(text + "\n")
    cfg = dict(min_chars=10, shard_size=4096, holdout=0.1, progress=False)
    clean = prepare_corpus([tmp_path / "in"], tmp_path / "clean", CorpusConfig(workers=1, **cfg))
    out = tmp_path / "out"
    script = (f"import sys, time; sys.path.insert(0, {str(REPO)!r}); import bertkit.pipelines.prepare_corpus as pc\n"
              "real = pc.process_file\n"
              "def slow(*a):\n    time.sleep(0.4); return real(*a)\n"
              "pc.process_file = slow\n"
              f"pc.prepare_corpus([{str(tmp_path / 'in')!r}], {str(out)!r}, pc.CorpusConfig(workers=2, **{cfg!r}))\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.time() + 60
    while time.time() < deadline and not (children.exists() and len(children.read_text().split()) >= 2 and
                                          list((out / ".work").glob("part-*.json"))):
        time.sleep(0.02)
    os.kill(int(children.read_text().split()[-1]), signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "a worker process died" in err and "Re-run the same command to resume" in err
    resumed = prepare_corpus([tmp_path / "in"], out, CorpusConfig(workers=2, **cfg))
    assert [s.checksum for s in resumed.shards] == [s.checksum for s in clean.shards]


def test_an_unguarded_script_is_told_about_the_main_guard(tmp_path):
    """Spawned workers import the calling script again; without `if __name__ == "__main__":` its stage call runs in
    each worker, which dies. The message says what to change rather than only guessing at memory."""
    head = f"import sys; sys.path.insert(0, {str(REPO)!r})\nfrom bertkit.pipelines.engine import Engine\n"
    run = "with Engine(workers=2) as engine:\n    print(list(engine.map(abs, [(-1,), (-2,)], context='spawn')))\n"
    (tmp_path / "unguarded.py").write_text(head + run)
    (tmp_path / "guarded.py").write_text(head + "if __name__ == '__main__':\n" + textwrap.indent(run, "    "))
    unguarded, guarded = (subprocess.run([sys.executable, str(tmp_path / name)], capture_output=True, text=True,
                                         timeout=120) for name in ("unguarded.py", "guarded.py"))
    assert unguarded.returncode != 0
    assert "a worker process died" in unguarded.stderr and 'if __name__ == "__main__":' in unguarded.stderr
    assert guarded.returncode == 0 and guarded.stdout.strip() == "[1, 2]"
