"""A newcomer's first hour (issue 40, item 4): quiet, consistent messages. A busy port is one line saying what to
do; DeepSpeed's accelerator warning stays out of a CPU user's terminal; check-gpu writes no file unless asked."""
import json
import socket
import subprocess

from tests.helpers import BIN, TINY, env_without_dist, make_instances_dir


def test_a_busy_port_is_one_line(tmp_path):
    inst = make_instances_dir(tmp_path / "inst", n=32, holdout=4, max_len=32)
    (tmp_path / "model.json").write_text(json.dumps(TINY))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([str(BIN / "bertkit"), "pretrain", "--instances", str(inst), "--model",
                            str(tmp_path / "model.json"), "--out", str(tmp_path / "run"), "--max-steps", "1",
                            "--no-progress"], capture_output=True, text=True, timeout=300,
                           env=env_without_dist(MASTER_PORT=str(port), MASTER_ADDR="127.0.0.1"))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"port {port} is taken" in r.stderr and "--master_port" in r.stderr


def test_export_and_check_gpu_say_only_their_own_lines(tmp_path):
    from tests.helpers import tiny_run

    _, run = tiny_run(tmp_path)
    env = env_without_dist()
    env.pop("DS_ACCELERATOR", None)
    r = subprocess.run([str(BIN / "bertkit"), "export", str(run), "--out", str(tmp_path / "export")],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Setting accelerator" not in r.stdout + r.stderr
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert lines[0] == f"wrote {tmp_path / 'export'}" and len(lines) == 2 and lines[1].startswith("next: bertkit ")
    subprocess.run([str(BIN / "bertkit"), "check-gpu"], capture_output=True, text=True, timeout=300, env=env,
                   cwd=tmp_path)
    assert not (tmp_path / "check_gpu.json").exists()


def test_the_multi_rank_launch_runs_from_any_folder(tmp_path):
    """Issue 40, item 2: `deepspeed --module bertkit pretrain` needs no clone's cli.py."""
    from bertkit.testing import free_port

    inst = make_instances_dir(tmp_path / "inst", n=64, holdout=4, max_len=32)
    (tmp_path / "model.json").write_text(json.dumps(TINY))
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    r = subprocess.run([str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()), "--module",
                        "bertkit", "pretrain", "--instances", str(inst), "--model", str(tmp_path / "model.json"),
                        "--out", str(tmp_path / "run"), "--max-steps", "2", "--micro-batch", "4", "--optimizer",
                        "adamw", "--num-workers", "0", "--eval-every", "0", "--no-progress", "--report-to", "none"],
                       cwd=empty, capture_output=True, text=True, timeout=300, env=env_without_dist())
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["world_size"] == 2


def test_help_and_data_stages_never_import_torch():
    """`bertkit --help` (and any command that makes no process group) ends without importing torch: the ending
    that skips C++ teardown is looked up only where bertkit.distributed was loaded. It took 3 s; now 0.2 s."""
    code = ("import sys\nsys.argv = ['bertkit', 'finetune', 'korean', '--help']\nfrom bertkit.cli import entry\n"
            "try:\n    entry()\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "print('torch loaded:', 'torch' in sys.modules)")
    r = subprocess.run([str(BIN / "python"), "-c", code], capture_output=True, text=True, timeout=120,
                       env=env_without_dist())
    assert r.returncode == 0 and "--task" in r.stdout and "torch loaded: False" in r.stdout, r.stdout + r.stderr


def test_a_finished_pretraining_ends_with_its_summary(tmp_path):
    """Issue 81: a run ended printing only a path; it now says its steps and time, its last training loss and its
    last held-out loss and masked-token accuracy (equal to the ones metrics.jsonl records), then where it is."""
    import re

    inst = make_instances_dir(tmp_path / "inst", n=32, holdout=8, max_len=32)
    (tmp_path / "model.json").write_text(json.dumps(TINY))
    r = subprocess.run([str(BIN / "bertkit"), "pretrain", "--instances", str(inst), "--model",
                        str(tmp_path / "model.json"), "--out", str(tmp_path / "run"), "--max-steps", "3",
                        "--eval-every", "3", "--no-progress"], capture_output=True, text=True, timeout=300,
                       env=env_without_dist())
    assert r.returncode == 0, r.stderr[-2000:]
    held = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
            if "eval_loss" in line][-1]
    said = re.search(r"pretrained 3 steps in [\d.]+ min; training loss [\d.]+; held-out loss ([\d.]+) and masked-token "
                     r"accuracy ([\d.]+) % at step 3\. Whether it beats its own random start", r.stderr)
    assert said, r.stderr[-2000:]
    assert float(said[1]) == round(held["eval_loss"], 3)
    assert float(said[2]) == round(100 * held.get("eval_mlm_mask_acc", held["eval_mlm_acc"]), 1)
    assert "2 hours of modernbert-tiny were needed to beat its random start" in r.stderr   # what the study says
