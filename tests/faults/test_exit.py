"""How a pretraining process ends: an error with loader workers running exits promptly with its message (it once
hung at interpreter exit, joining a worker that ignores SIGTERM), and the process group it made is destroyed at exit
on every way out (a gloo group left to interpreter finalization can abort a finished run: "terminate called without
an active exception"). Signal stops and their exit codes: tests/test_pretrain_dist.py; many two-rank runs:
benchmarks/studies/stress_exit.py."""
import json
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import BIN, TINY, env_without_dist, make_instances_dir

pytestmark = pytest.mark.slow  # starts bertkit pretrain processes


def test_an_error_with_loader_workers_exits_with_its_message(tmp_path):
    inst = make_instances_dir(tmp_path / "inst", n=128, holdout=16, max_len=32)
    (tmp_path / "model.json").write_text(json.dumps(TINY))
    cmd = [str(BIN / "bertkit"), "pretrain", "--instances", str(inst), "--out", str(tmp_path / "run"), "--model",
           str(tmp_path / "model.json"), "--max-steps", "20", "--micro-batch", "8", "--optimizer", "adamw",
           "--num-workers", "2", "--save-every", "2", "--eval-every", "0", "--no-progress"]
    proc = subprocess.run(cmd, env=env_without_dist(BERTKIT_FAULT_STEPS="4:nan"), capture_output=True, text=True,
                          timeout=120)  # the hang this guards against never ends: the timeout is the failure
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "loss is nan at step 4" in proc.stderr and "global_step2" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_process_group_is_destroyed_at_exit(tmp_path):
    """A process that made its group through pretrain() destroys it in an atexit hook, while the interpreter is
    whole, after a normal end and after an error alike; a second pretrain() in the same process still works."""
    inst = make_instances_dir(tmp_path / "inst", n=64, holdout=8, max_len=32)
    (tmp_path / "model.json").write_text(json.dumps(TINY))
    script = textwrap.dedent(f"""
        import atexit, os
        import torch.distributed as dist
        from bertkit.pretrain import PretrainConfig, TrainingError, pretrain

        def cfg(name):
            return PretrainConfig(instances={str(inst)!r}, out=os.path.join({str(tmp_path)!r}, name),
                                  model={str(tmp_path / "model.json")!r}, max_steps=3, micro_batch=8,
                                  optimizer="adamw", num_workers=0, eval_every=0, save_every=2, progress=False,
                                  report_to="none")

        def at_exit():  # registered first, so it runs after bertkit's hook
            print("initialized at exit:", dist.is_initialized(), flush=True)

        atexit.register(at_exit)
        print("steps", pretrain(cfg("a"))["step"], flush=True)
        os.environ["BERTKIT_FAULT_STEPS"] = "3:nan"
        try:
            pretrain(cfg("b"))
        except TrainingError as e:
            print("error:", str(e)[:24], flush=True)
        raise SystemExit(3)
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=env_without_dist(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "steps 3" in proc.stdout and "error: loss is nan at step 3" in proc.stdout
    assert "initialized at exit: False" in proc.stdout
