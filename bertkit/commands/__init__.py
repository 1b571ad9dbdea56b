"""One module per stage's click command(s); bertkit/cli.py gathers them into the `bertkit` group."""
import os


def default_workers() -> int:
    """Worker processes for the parallel stages: the CPUs this process may use, at most 8."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(8, cpus))
