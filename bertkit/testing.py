"""What the tests and the benchmarks share, so that neither imports the other: processes found and stopped by
session (Ray's workers leave their process group, not their session), a free port, and a local Ray cluster of
one-CPU nodes on 127.0.0.1, each node a `ray start --block` process in its own session. Standard library only."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def session_members(sid: int) -> list[int]:
    """The live processes of session `sid`."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid and fields[0] != "Z":
                    members.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return members


def session_alive(sid: int) -> bool:
    return bool(session_members(sid))


def kill_session(sid: int) -> None:
    """SIGKILL every process of the session, again until none is left (one may be forking)."""
    for _ in range(100):
        members = session_members(sid)
        if not members:
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_env(**extra) -> dict:
    """The environment a local cluster and its drivers run in: no RAY_ADDRESS inherited, no usage reports."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({"PATH": f"{BIN}:{env.get('PATH', '')}", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1",
                **extra})
    return env


def wait_for_nodes(address: str, n: int, timeout: float = 120) -> None:
    script = textwrap.dedent(f"""
        import time, ray
        ray.init(address={address!r}, logging_level="WARNING", log_to_driver=False)
        deadline = time.time() + {timeout}
        while sum(n["Alive"] for n in ray.nodes()) < {n}:
            assert time.time() < deadline, "the Ray nodes did not come up"
            time.sleep(0.5)
    """)
    subprocess.run([sys.executable, "-c", script], env=ray_env(), check=True, timeout=timeout + 60,
                   capture_output=True)


def start_ray_cluster(nodes: int, temp: str, object_store_mb: int = 100) -> tuple[str, list]:
    """(host:port, the node processes): a head node and nodes - 1 more, one CPU each. `temp` holds Ray's sockets
    (keep its path short). Stop it with stop_ray_cluster, never `ray stop` (it stops every Ray process of the
    machine, another run's cluster included)."""
    port, procs = free_port(), []
    common = ["--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--object-store-memory",
              str(object_store_mb << 20), "--disable-usage-stats", "--block"]
    try:
        for k in range(nodes):
            where = ["--head", "--port", str(port), "--include-dashboard", "false", "--ray-client-server-port",
                     str(free_port()), "--temp-dir", temp] if k == 0 else ["--address", f"127.0.0.1:{port}"]
            procs.append(subprocess.Popen([str(BIN / "ray"), "start", *where, *common], env=ray_env(),
                                          start_new_session=True, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
            wait_for_nodes(f"127.0.0.1:{port}", k + 1)
    except BaseException:
        stop_ray_cluster(procs, temp)
        raise
    return f"127.0.0.1:{port}", procs


def stop_ray_cluster(procs: list, temp: str) -> None:
    """SIGKILL every process of the nodes' sessions, then remove Ray's temp folder."""
    for p in procs:
        kill_session(p.pid)
        p.wait(timeout=30)
    for _ in range(20):  # a Ray process killed a moment ago may still be closing files
        shutil.rmtree(temp, ignore_errors=True)
        if not os.path.exists(temp):
            return
        time.sleep(0.1)


class SessionCPU:
    """CPU seconds of every process of some sessions (a local Ray cluster's raylets, GCS and workers), sampled every
    0.1 s by a thread: Ray ends a job's workers when its driver disconnects and nobody accounts their time
    afterwards, so each process counts up to its last sample (a worker's last < 0.1 s is lost)."""

    def __init__(self, sessions: set):
        self.sessions, self.seen, self.tick, self.own = sessions, {}, os.sysconf("SC_CLK_TCK"), 0.0
        self.lock = threading.Lock()
        if sessions:
            threading.Thread(target=self._run, daemon=True).start()

    def _sample(self):
        for entry in os.listdir("/proc"):
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) in self.sessions:  # (pid, start time) tells a reused pid apart
                    with self.lock:
                        self.seen[(entry, fields[19])] = (int(fields[11]) + int(fields[12])) / self.tick
            except (OSError, ValueError, IndexError):
                pass

    def _run(self):
        while True:
            self._sample()
            self.own = time.thread_time()  # the sampler's own CPU, not the measured processes'
            time.sleep(0.1)

    def total(self) -> float:
        if self.sessions:
            self._sample()
        with self.lock:
            return sum(self.seen.values())
