"""Two "nodes" on one machine: two `deepspeed` launchers on 127.0.0.1 (--no_ssh, node ranks 0 and 1, one CPU rank
each over gloo) training into one shared run folder. Killed with SIGKILL after a checkpoint and resumed on both
nodes, the run logs the uninterrupted run's losses step for step. Then examples/cluster/slurm_pretrain.sh under
srun/scontrol shims that emulate a 2-node allocation.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bertkit.testing import free_port
from tests.helpers import BIN, REPO, TINY, env_without_dist, make_instances_dir

pytestmark = pytest.mark.slow  # launches DeepSpeed ranks

STEPS = 20


def metrics(run) -> dict[int, dict]:
    """Training records by step; a resumed run appends, so later lines win."""
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("multinode")
    inst = make_instances_dir(root / "inst", n=256, holdout=16, max_len=32)
    (root / "model.json").write_text(json.dumps(TINY))
    # --no_ssh uses the names only to count nodes and slots: each node's launcher starts its own slots
    (root / "hostfile").write_text("node0 slots=1\nnode1 slots=1\n")
    return root, inst


@pytest.fixture
def groups():
    """Process groups a test starts; whatever is still running at the end is killed (a failed test leaves no ranks)."""
    started = []
    yield started
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def pretrain_args(root, inst, out, *extra):
    args = {"--instances": inst, "--out": out, "--model": root / "model.json", "--max-steps": STEPS,
            "--micro-batch": 8, "--global-batch": 16, "--optimizer": "adamw", "--lr": 3e-3, "--warmup": 3,
            "--log-every": 1, "--save-every": 5, "--keep-last": 2, "--eval-every": 0, "--num-workers": 0,
            "--seed": 7, "--zero-stage": 2, "--report-to": "none"}
    return [str(x) for kv in args.items() for x in kv] + ["--no-progress", *extra]


def start_nodes(groups, root, args, name):
    """Node ranks 0 and 1, each its own launcher in its own process group, output to root/NAME-nodeR.log."""
    port, procs = free_port(), []
    for node in (0, 1):
        cmd = [BIN / "deepspeed", "--hostfile", root / "hostfile", "--no_ssh", "--node_rank", node,
               "--master_addr", "127.0.0.1", "--master_port", port, "cli.py", "pretrain", *args]
        with open(root / f"{name}-node{node}.log", "w") as log:
            procs.append(subprocess.Popen(list(map(str, cmd)), cwd=REPO, env=env_without_dist(), stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        procs[-1].log = root / f"{name}-node{node}.log"
    groups.extend(procs)
    return procs


def finish_nodes(procs, timeout=240):
    for p in procs:
        p.wait(timeout=timeout)
    logs = [p.log.read_text() for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n\n".join(log[-3000:] for log in logs)
    return logs


def test_two_nodes_kill_resume_matches(setup, groups):
    root, inst = setup
    ref, killed = root / "ref", root / "killed"
    # the reference and the run to be killed start together: 4 launchers, one rank each
    p_ref = start_nodes(groups, root, pretrain_args(root, inst, ref), "ref")
    p_kill = start_nodes(groups, root, pretrain_args(root, inst, killed), "killed")
    latest = killed / "checkpoints" / "latest"
    deadline = time.time() + 240
    while not latest.exists() and all(p.poll() is None for p in p_kill) and time.time() < deadline:
        time.sleep(0.05)
    for p in p_kill:  # both launchers and their ranks, no chance to save
        os.killpg(p.pid, signal.SIGKILL)
    for p in p_kill:
        p.wait()
    finish_nodes(p_ref)
    assert latest.exists(), "the killed run never wrote a checkpoint: " + p_kill[0].log.read_text()[-3000:]
    resumed_from = int(latest.read_text().strip()[len("global_step"):])
    assert resumed_from < STEPS

    ref_m = metrics(ref)
    assert sorted(ref_m) == list(range(1, STEPS + 1))
    assert sorted(p.name for p in (ref / "checkpoints").glob("global_step*")) == ["global_step15", "global_step20"]

    # the lock the killed rank 0 left is taken over (same host, process gone); every rank reads global_stepN
    logs = finish_nodes(start_nodes(groups, root, pretrain_args(root, inst, killed, "--resume"), "resume"))
    assert "took over the lock" in logs[0]
    got = metrics(killed)
    for s in range(resumed_from + 1, STEPS + 1):
        for key in ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr"):
            assert got[s][key] == pytest.approx(ref_m[s][key], rel=1e-6, abs=1e-9), (s, key, logs[0][-2000:])

    # one checkpoint.json, written by global rank 0, lists both ranks' files; nothing half-written is left
    ckpt = killed / "checkpoints"
    marker = json.loads((ckpt / f"global_step{STEPS}" / "checkpoint.json").read_text())
    assert marker["world_size"] == 2
    for rank in (0, 1):
        assert f"rng_rank{rank}.pt" in marker["files"]
        assert any(f"zero_pp_rank_{rank}_" in name for name in marker["files"]), sorted(marker["files"])
    assert not list(ckpt.glob("*.partial"))
    assert json.loads((killed / "config.json").read_text())["world_size"] == 2
    verdict = subprocess.run([str(BIN / "bertkit"), "verify", str(killed)], env=env_without_dist(),
                             capture_output=True, text=True, timeout=120)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr


SRUN = f"""#!{sys.executable}
# srun for tests: the command once per node of a SLURM_JOB_NUM_NODES-node allocation, in parallel, with the
# variables Slurm gives each task; options (all written --name=value) are ignored
import os, subprocess, sys
args = sys.argv[1:]
while args[0].startswith("-"):
    args.pop(0)
n = int(os.environ["SLURM_JOB_NUM_NODES"])
procs = [subprocess.Popen(args, env={{**os.environ, "SLURM_NODEID": str(i), "SLURM_PROCID": str(i),
                                     "SLURM_LOCALID": "0", "SLURM_NTASKS": str(n)}}) for i in range(n)]
sys.exit(max(abs(p.wait()) for p in procs))
"""

SCONTROL = """#!/bin/bash
# scontrol for tests: `scontrol show hostnames LIST` prints the comma-separated LIST one host a line
[[ "$1 $2" == "show hostnames" ]] && tr , '\\n' <<< "$3"
"""


def test_slurm_script_runs_two_nodes_and_a_requeued_job_continues(setup, tmp_path, groups):
    root, inst = setup
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    run = tmp_path / "run"
    # two names for this machine: DeepSpeed's hostfile wants distinct hosts; the first is the master address
    env = env_without_dist(SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="127.0.0.1,localhost", SLURM_JOB_NUM_NODES="2",
                           SLURM_SUBMIT_DIR=str(REPO), RUN=str(run), INSTANCES=str(inst),
                           MODEL=str(root / "model.json"), MAX_STEPS="4", MICRO_BATCH="8", GLOBAL_BATCH="16",
                           LR="1e-3", GPUS_PER_NODE="1", MASTER_PORT=str(free_port()),
                           PRETRAIN_ARGS="--optimizer adamw --zero-stage 2 --save-every 2 --log-every 1 "
                                         "--eval-every 0 --num-workers 0 --report-to none --no-progress")
    env["PATH"] = f"{shims}:{env['PATH']}"

    def sbatch(**more):
        proc = subprocess.Popen(["bash", str(REPO / "examples" / "cluster" / "slurm_pretrain.sh")], cwd=tmp_path,
                                env={**env, **more}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        groups.append(proc)
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out[-4000:]
        return out

    sbatch()
    marker = json.loads((run / "checkpoints" / "global_step4" / "checkpoint.json").read_text())
    assert marker["world_size"] == 2 and {"rng_rank0.pt", "rng_rank1.pt"} <= set(marker["files"])

    # requeued (same job id) after its rank 0 died on a node the new allocation lacks: the script drops that lock
    (run / ".bertkit.lock").write_text(json.dumps({"host": "gone-node", "pid": 1, "what": "pretrain"}))
    out = sbatch(MAX_STEPS="6", SLURM_RESTART_COUNT="1")
    assert "resuming" in out
    assert sorted(metrics(run)) == [1, 2, 3, 4, 5, 6]
    assert (run / "checkpoints" / "latest").read_text() == "global_step6"
