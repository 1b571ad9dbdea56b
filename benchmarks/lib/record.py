"""What every CPU benchmark records beside its numbers (date, machine, load, commit), and where it writes them."""
import collections
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from bertkit.fileio import atomic_write_bytes

RESULTS = Path(__file__).resolve().parents[1] / "results"


def run_info(benchmark: str) -> dict:
    """The header of a result: the load average is measured, not assumed, since the machine may be shared."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=RESULTS.parent).stdout.strip()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"benchmark": benchmark, "date": time.strftime("%Y-%m-%d"),
            "machine": f"{os.cpu_count()}-core CPU", "load_average_1_5_15min": load,
            "cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
            "commit": commit}


def read_result(name: str) -> dict:
    """results/NAME.json as written last (by this run or another sharing the file), or {} when there is none."""
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def write_result(name: str, result: dict) -> Path:
    out = RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    # atomic: two sweeps sharing a results file read it back before each save
    atomic_write_bytes(out, (json.dumps(result, indent=2, ensure_ascii=False) + "\n").encode())
    print(f"wrote {out}")
    return out


def best_ms(fn, repeats: int = 5, warmup: int = 1) -> float:
    """Milliseconds of the fastest of `repeats` calls after `warmup` untimed ones (the least disturbed by a shared
    machine)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * min(times)


def cell_in_own_process(script, argv: list) -> dict:
    """Runs `python script --cell ARGV...` (its peak memory its own, progress bars off) and returns the dict the
    child printed on its "CELL {json}" line. The child's other lines pass through, indented, as they come (a cell
    can run for hours: the log shows it resuming, its epochs); a child that printed no CELL line stops the
    benchmark with its output's tail."""
    tail, cell = collections.deque(maxlen=60), None
    with subprocess.Popen([sys.executable, str(script), "--cell", *map(str, argv)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env={**os.environ, "TQDM_DISABLE": "1"}) as proc:
        for line in proc.stdout:
            if line.startswith("CELL "):
                cell = json.loads(line[5:])
                continue
            tail.append(line)
            print("  " + line, end="", flush=True)
    if cell is None:
        sys.exit(f"{' '.join(map(str, argv))} failed (exit status {proc.returncode}):\n{''.join(tail)}")
    return cell
