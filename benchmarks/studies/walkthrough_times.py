"""How long README.ko.md's two walk-throughs take, as written, with their own defaults, on this machine.

Each bash block runs from an empty folder under bash -x with a timestamp per command; the seconds of every
bertkit/python command and the load average before and after go to results/walkthrough_ko.json (a finished block
is kept; rerunning does the others). README.ko.md states these times.

    python benchmarks/studies/walkthrough_times.py --work /tmp/walk [--block quickstart|modernbert]
"""
import argparse
import os
import re
import subprocess
import time
from pathlib import Path

import _lib_path  # noqa: F401  (benchmarks/lib on the import path)
from record import read_result, run_info, write_result

REPO = Path(__file__).resolve().parents[2]
BLOCKS = {"quickstart": "--splitter kss", "modernbert": "--recipe budget"}   # a line only that block holds


def block(name: str) -> str:
    text = (REPO / "README.ko.md").read_text(encoding="utf-8")
    return next(b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if BLOCKS[name] in b)


def stage_times(trace: str, end: float) -> list[dict]:
    """Each traced top-level command (PS4 '+ EPOCH ') and the seconds until the next one began."""
    marks = [(float(m.group(1)), m.group(2)) for m in re.finditer(r"^\+ (\d+\.\d+) (.*)$", trace, re.M)]
    rows = []
    for (start, command), nxt in zip(marks, [t for t, _ in marks[1:]] + [end]):
        if command.split()[0] in ("bertkit", "python"):
            rows.append({"command": command[:160], "seconds": round(nxt - start, 1)})
    return rows


def run_block(name: str, work: Path) -> dict:
    out = work / name
    env = {**os.environ, "OUT": str(out), "TQDM_DISABLE": "1"}
    before = list(os.getloadavg())
    start = time.time()
    # PS4 set in the script: bash run as root does not take it from the environment
    script = "PS4='+ $EPOCHREALTIME '\nset -x\n" + block(name)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True)
    end = time.time()
    (work / f"{name}.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"{name} failed ({done.returncode}): see {work / f'{name}.log'}")
    return {"total_min": round((end - start) / 60, 1), "load_before": before, "load_after": list(os.getloadavg()),
            "stages": stage_times(done.stderr, end)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--block", choices=sorted(BLOCKS), action="append")
    args = ap.parse_args()
    result = read_result("walkthrough_ko") or run_info("walkthrough_ko")
    for name in args.block or ["modernbert", "quickstart"]:
        if name in result.get("blocks", {}):
            continue
        args.work.mkdir(parents=True, exist_ok=True)
        result.setdefault("blocks", {})[name] = run_block(name, args.work)
        result.update({k: v for k, v in run_info("walkthrough_ko").items() if k in ("date", "commit")})
        write_result("walkthrough_ko", result)
        print(f"{'seconds':>8}  {name}")
        for row in result["blocks"][name]["stages"]:
            print(f"{row['seconds']:>8}  {row['command'][:100]}")


if __name__ == "__main__":
    main()
