"""Do two-rank pretraining runs end with the exit code they should, every time? (a benchmark: it counts)

A finished run that aborts at interpreter exit ("terminate called without an active exception", the launcher
exiting 250) happens rarely, so it is counted over many runs: N launches of `deepspeed --num_gpus 2 cli.py pretrain`
on two CPU ranks, cycling through the ways a run ends, each with the exit code a shell expects:

    end        runs to --max-steps                                    0
    signal     SIGTERM to the launcher's process group mid-run        not 0, and every rank saved first (each rank
                                                                      exits 143; DeepSpeed's launcher then exits 1)
    error      an injected NaN loss with --on-nonfinite stop          1   (a message, no traceback)
    rollback   an injected NaN loss with --on-nonfinite rollback      0

    python benchmarks/studies/stress_exit.py                  # 30 runs, the four endings in turn
    python benchmarks/studies/stress_exit.py --runs 8 --paths end

A run is bad when its exit code is not the expected one or its output holds "terminate called" or a traceback.
Finished runs are appended to benchmarks/results/stress_exit_partial.json, so a killed benchmark continues; the
summary goes to stress_exit.json.
"""
import argparse
import json
import os
import signal
import tempfile
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from record import RESULTS, run_info, write_result

from bertkit.testing import TINY, launch, make_instances_dir

EXPECTED = {"end": 0, "signal": "not 0", "error": 1, "rollback": 0}
SIGNS_OF_A_CRASH = ("terminate called", "Traceback (most recent call last)", "core dumped", "Aborted")


def flags(inst: Path, model: Path, out: Path, path: str) -> tuple[list[str], dict]:
    """The command line and extra environment for one ending."""
    args = ["--instances", inst, "--out", out, "--model", model, "--max-steps", 12, "--micro-batch", 8,
            "--global-batch", 16, "--optimizer", "adamw", "--lr", 3e-3, "--warmup", 2, "--log-every", 1,
            "--save-every", 4, "--eval-every", 6, "--eval-batches", 2, "--num-workers", 1, "--seed", 7,
            "--zero-stage", 2, "--no-progress"]
    env = {}
    if path == "signal":
        args[args.index("--max-steps") + 1] = 100000
    if path in ("error", "rollback"):
        env["BERTKIT_FAULT_STEPS"] = "6:nan"
        args += ["--on-nonfinite", "stop" if path == "error" else "rollback"]
    return [str(a) for a in args], env


def one_run(inst: Path, model: Path, work: Path, path: str, i: int) -> dict:
    out = work / f"run{i}-{path}"
    args, env = flags(inst, model, out, path)
    t0 = time.time()
    proc = launch(args, **env)
    if path == "signal":  # stop once training has logged a few steps
        log = out / "metrics.jsonl"
        deadline = time.time() + 120
        while (not log.exists() or len(log.read_text().splitlines()) < 3) and time.time() < deadline \
                and proc.poll() is None:
            time.sleep(0.05)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        output, _ = proc.communicate(timeout=300)
    except Exception:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    crash = [s for s in SIGNS_OF_A_CRASH if s in output]
    if path == "signal":
        ok = proc.returncode != 0 and output.count("stopped by signal at step") == 1 and (out / "checkpoints" /
                                                                                           "latest").is_file()
    else:
        ok = proc.returncode == EXPECTED[path]
    ok = ok and not crash
    return {"run": i, "path": path, "exit_code": proc.returncode, "expected": EXPECTED[path], "ok": ok,
            "crash_signs": crash, "seconds": round(time.time() - t0, 1), "tail": "" if ok else output[-6000:]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--paths", default="end,signal,error,rollback", help="the endings to cycle through")
    args = ap.parse_args(argv)
    paths = args.paths.split(",")
    unknown = set(paths) - set(EXPECTED)
    if unknown:
        raise SystemExit(f"--paths: unknown {sorted(unknown)}; choose from {sorted(EXPECTED)}")
    partial = RESULTS / "stress_exit_partial.json"
    runs = json.loads(partial.read_text())["runs"] if partial.is_file() else []
    with tempfile.TemporaryDirectory(prefix="bertkit-stress-exit-") as tmp:
        work = Path(tmp)
        inst = make_instances_dir(work / "inst", n=256, holdout=32, max_len=48)
        model = work / "model.json"
        model.write_text(json.dumps(TINY))
        for i in range(len(runs), args.runs):
            r = one_run(inst, model, work, paths[i % len(paths)], i)
            runs.append(r)
            partial.write_text(json.dumps({"runs": runs}, indent=1))
            print(f"run {i + 1:3d}/{args.runs} {r['path']:9} exit {r['exit_code']:4} (expected {r['expected']:>5}) "
                  f"{'ok' if r['ok'] else 'BAD ' + ','.join(r['crash_signs'])}  {r['seconds']:.0f} s", flush=True)
    bad = [r for r in runs if not r["ok"]]
    by_path = {p: {"runs": sum(r["path"] == p for r in runs), "bad": sum(r["path"] == p and not r["ok"] for r in runs)}
               for p in paths}
    print(f"\n{'ending':10} {'runs':>5} {'bad':>4}")
    for p, c in by_path.items():
        print(f"{p:10} {c['runs']:5} {c['bad']:4}")
    print(f"{len(bad)} of {len(runs)} runs ended badly")
    write_result("stress_exit", {**run_info("stress_exit"), "runs": len(runs), "bad": len(bad), "by_path": by_path,
                                 "bad_runs": bad, "all": [{k: v for k, v in r.items() if k != "tail"} for r in runs]})
    partial.unlink()


if __name__ == "__main__":
    main()
