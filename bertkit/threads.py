"""How many threads a process computes with: the cores it may use (its CPU affinity), less the cores other
processes keep busy right now, shared among this run's processes on the node; never more.

PyTorch's default is every core, so each OpenMP barrier waits on a core another job holds: with one busy neighbour
on two cores, one-process pretraining ran 4.7x and a short fine-tuning 26x slower than with one thread (issue 40).
`--threads N` or OMP_NUM_THREADS override the choice.
"""
import os
from dataclasses import asdict, dataclass


@dataclass
class ThreadChoice:
    threads: int
    cores: int          # the cores this process may run on (affinity)
    busy: float         # cores kept busy by other processes when measured
    processes: int      # this run's compute processes on the node (ranks)
    source: str         # auto | --threads | OMP_NUM_THREADS

    def describe(self) -> str:
        if self.source != "auto":
            return f"threads: {self.threads} (from {self.source})"
        return (f"threads: {self.threads} ({self.cores} core(s), {self.busy:.1f} kept busy by other processes, "
                f"{self.processes} process(es) of this run; --threads N overrides)")

    def record(self) -> dict:
        return asdict(self)


def busy_cores(seconds: float = 0.25) -> float:
    """Cores other processes keep busy, measured over `seconds` (this process idles meanwhile)."""
    try:
        import psutil
    except ImportError:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        return min(load, os.cpu_count() or 1)
    return psutil.cpu_percent(interval=seconds) / 100 * (psutil.cpu_count() or 1)


# more threads than this is never faster and, far beyond it, exhausts the machine's processes (1,000,000 crashed)
MAX_THREADS = 1024


def choose_threads(threads: int | None = None, processes: int | None = None) -> ThreadChoice:
    """Set torch's intra-op threads and say why: `threads` (--threads), else OMP_NUM_THREADS, else the free cores
    divided among `processes` (default: the launcher's LOCAL_SIZE / LOCAL_WORLD_SIZE, or 1)."""
    processes = processes or int(os.environ.get("LOCAL_SIZE") or os.environ.get("LOCAL_WORLD_SIZE") or 1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if threads and not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"--threads {threads}: choose 1 to {MAX_THREADS} (this machine has {cores} cores)")
    if threads:
        choice = ThreadChoice(threads, cores, 0.0, processes, "--threads")
    elif os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        choice = ThreadChoice(int(os.environ["OMP_NUM_THREADS"]), cores, 0.0, processes, "OMP_NUM_THREADS")
    else:
        busy = busy_cores()
        free = max(1, int(cores - busy + 0.5))  # a neighbour using 0.6 of a core counts as one
        choice = ThreadChoice(max(1, min(free, cores) // processes), cores, round(busy, 2), processes, "auto")
    import torch  # here: the CLI reads MAX_THREADS for its flags without loading torch

    torch.set_num_threads(choice.threads)
    return choice
