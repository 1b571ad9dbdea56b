"""Where a data stage's tasks run: `--engine local` (this process, or a pool of --workers processes) or `--engine ray`
(Ray remote tasks on a cluster, `--ray-address`).

A stage cuts its work into deterministic tasks (prepare-corpus: one per input file, then one per dedup partition;
train-tokenizer: one per shard; make-instances: one per work unit). Each task writes its own files atomically and
returns a small record; the stage takes the records in task order and merges. So neither the engine, nor the number
of nodes or workers, nor the order in which tasks finish changes a byte of the output, and a task run twice (a Ray
retry after its worker died, a straggler of a killed run) only rewrites the same bytes.

    with Engine("ray", ray_address=None) as engine:           # None: a reachable cluster, else a local one
        for result in engine.map(fn, [(args...), ...], on_done=progress):
            ...                                               # results in task order
"""
import os
import re
import time
from concurrent.futures import ProcessPoolExecutor, TimeoutError as FutureTimeout

ENGINES = ("local", "ray")
RAY_RETRIES = 3          # reruns of a task whose worker process or node died (Ray's max_retries)
POLL_SECONDS = 0.1       # how often the driver wakes while it waits (progress from workers, Ctrl-C)
INSTALL_RAY = "pip install 'bertkit[ray]'"
# the commands' --engine / --ray-address help (bertkit/commands/corpus.py, tokenizer.py, instances.py)
ENGINE_HELP = ("Where the tasks run: local (this machine, --workers processes) or ray (a Ray cluster; "
               f"{INSTALL_RAY}). The output is byte-identical either way; paths must be on a file system every "
               "node sees.")
RAY_ADDRESS_HELP = ("--engine ray: the cluster's head node, HOST:PORT (ray://HOST:10001 for Ray Client). Default: "
                    "RAY_ADDRESS, or the cluster `ray start` made on this machine, else a new local one.")


def finished(output, **expected) -> bool:
    """Whether a task's output file and its record (the same name, .json) were written, the record holding the
    expected values: a task a killed run finished is not run again."""
    from pathlib import Path

    from bertkit.fileio import read_json_or_none

    record = read_json_or_none(Path(output).with_suffix(".json"))
    return bool(record) and Path(output).is_file() and all(record.get(k) == v for k, v in expected.items())


class EngineError(Exception):
    """The tasks could not run (no Ray, a worker or node lost for good, an object-store path). Says what to do."""


def check_engine(engine: str, error=ValueError) -> None:
    if engine not in ENGINES:
        raise error(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")


def check_available(engine: str) -> None:
    """Fail before a stage touches its output when --engine ray cannot run here."""
    if engine == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise EngineError(f"--engine ray needs Ray, which is not installed: {INSTALL_RAY}") from None


def check_shared_path(path, what: str = "path") -> None:
    """Every node reads and writes the stage's folders, so they must be on a shared file system (NFS, Lustre, a
    mounted bucket). Object-store URLs are refused: the stages rename files into place atomically and memory-map
    Arrow files, which object stores do not offer. (Path() turns 's3://b' into 's3:/b', hence ':/'.)"""
    match = re.match(r"([A-Za-z][A-Za-z0-9+.-]+):/", str(path))
    if match:
        raise EngineError(
            f"{what} {path}: {match.group(1)}:// paths are not supported: the data stages rename files into place "
            f"atomically and memory-map Arrow files, which object stores do not offer. Mount the bucket as a file "
            f"system on every node (s3fs, gcsfuse; Mountpoint for Amazon S3 for inputs only: it cannot rename "
            f"files) and give the mounted path.")


def _ray_call(fn, args, env, cwd):
    """A Ray task: one CPU (Ray's num_cpus=1), so tokenizers' own thread pool stays off, as in a --workers process;
    run from the driver's folder when this node sees it, so relative paths mean what they mean to the driver."""
    os.environ.update(env)
    if os.path.isdir(cwd):
        os.chdir(cwd)
    return fn(*args)


class Engine:
    """Runs a function over a list of tasks (tuples of arguments) and yields the results in task order.

    local: with one worker, or one task, in this process (exactly what the stages did before engines); else in a
    process pool made with `context`/`initializer` (the stage's choice). ray: as remote tasks, one CPU each,
    retried up to `retries` times when their worker process or node dies; a task that raises is not retried (the
    error is the stage's, e.g. a damaged file, and the same on any node).
    """

    def __init__(self, kind: str = "local", workers: int = 1, ray_address: str | None = None,
                 retries: int = RAY_RETRIES):
        check_engine(kind, EngineError)
        self.kind, self.workers, self.ray_address, self.retries = kind, workers, ray_address, retries
        self._ray, self._owns_ray, self._streams, self._on_error = None, False, [], []

    def __enter__(self):
        if self.kind == "ray":
            self._ray, self._owns_ray = connect_ray(self.ray_address)
        return self

    def __exit__(self, exc_type, *_):
        for stream in self._streams:
            stream.close()
        if exc_type is not None:  # the stage stopped reading (an error, Ctrl-C): stop the pools, cancel Ray tasks
            for stop in self._on_error:
                stop()
        if self._owns_ray:
            self._ray.shutdown()
            self._owns_ray = False

    def map(self, fn, tasks: list, *, on_done=None, on_wait=None, context: str = "spawn", initializer=None,
            initargs=(), env: dict | None = None):
        """Start fn(*task) for every task now; return an iterator over the results in task order.

        on_done(i, result) is called as each task finishes (ray: in the order they finish, so a progress bar
        moves; local: in task order); on_wait() every POLL_SECONDS while the driver waits (to drain a progress
        queue). context, initializer, initargs: the local pool's; env: variables set in each Ray task."""
        tasks = list(tasks)
        if self.kind == "ray":
            stream = self._map_ray(fn, tasks, on_done, on_wait, env or {})
        elif self.workers == 1 or len(tasks) <= 1:
            stream = self._map_here(fn, tasks, on_done)
        else:
            stream = self._map_pool(fn, tasks, on_done, on_wait, context, initializer, initargs)
        self._streams.append(stream)
        return stream

    @staticmethod
    def _map_here(fn, tasks, on_done):
        for i, task in enumerate(tasks):
            result = fn(*task)
            if on_done:
                on_done(i, result)
            yield result

    def _map_pool(self, fn, tasks, on_done, on_wait, context, initializer, initargs):
        import multiprocessing

        # fork where asked and available (Linux: workers start in milliseconds); spawn otherwise
        if context == "fork" and "fork" not in multiprocessing.get_all_start_methods():
            context = "spawn"
        executor = ProcessPoolExecutor(min(self.workers, len(tasks)), mp_context=multiprocessing.get_context(context),
                                       initializer=initializer, initargs=initargs)
        futures = [executor.submit(fn, *task) for task in tasks]
        self._on_error.append(lambda: executor.shutdown(wait=False, cancel_futures=True))
        return self._pool_results(executor, futures, on_done, on_wait, context)

    @staticmethod
    def _pool_results(executor, futures, on_done, on_wait, context):
        try:
            for i, future in enumerate(futures):
                while True:
                    try:
                        result = future.result(timeout=POLL_SECONDS)
                        break
                    except FutureTimeout:
                        pass
                    finally:
                        if on_wait:
                            on_wait()
                if on_done:
                    on_done(i, result)
                yield result
        except BaseException as e:   # also GeneratorExit: the stage stopped reading
            executor.shutdown(wait=False, cancel_futures=True)
            if type(e).__name__ == "BrokenProcessPool":
                # a spawned worker imports the caller's script anew: unguarded, the script's stage call runs again
                script = (" From a Python script, call bertkit under `if __name__ == \"__main__\":` (each worker "
                          "process imports the script anew)." if context == "spawn" else "")
                raise EngineError(f"a worker process died ({e}); out of memory? Re-run the same command to resume "
                                  f"(finished work is kept), perhaps with fewer --workers.{script}") from e
            raise
        executor.shutdown()

    def _map_ray(self, fn, tasks, on_done, on_wait, env):
        ray = self._ray
        remote = ray.remote(num_cpus=1, max_retries=self.retries, retry_exceptions=False)(_ray_call)
        fn_ref = ray.put(fn)   # shipped once, not once per task
        env = {"TOKENIZERS_PARALLELISM": "false", **env}
        refs = [remote.remote(fn_ref, task, env, os.getcwd()) for task in tasks]
        self._on_error.append(lambda: [ray.cancel(ref) for ref in refs])
        return self._ray_results(refs, on_done, on_wait)

    def _ray_results(self, refs, on_done, on_wait):
        ray = self._ray
        index = {ref: i for i, ref in enumerate(refs)}
        results, pending, next_i = {}, list(refs), 0
        try:
            while next_i < len(refs):
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_SECONDS)
                for ref in ready:
                    i = index[ref]
                    results[i] = self._get(ref, i)
                    if on_done:
                        on_done(i, results[i])
                if on_wait:
                    on_wait()
                while next_i in results:
                    yield results.pop(next_i)
                    next_i += 1
        except BaseException:
            for ref in pending:   # nothing waits for them any more (one already running may finish: same bytes)
                ray.cancel(ref)
            raise

    def _get(self, ref, i):
        ray = self._ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # the task raised: raise its own error (e.g. a CorpusError)
            cause = getattr(e, "cause", None)
            raise (cause if isinstance(cause, BaseException) else e) from e
        except ray.exceptions.RayError as e:       # worker or node lost more than `retries` times, out of memory
            raise EngineError(f"task {i} failed on the Ray cluster after {self.retries} retries "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). Re-run the same "
                              f"command to resume: finished work is kept") from e


def connect_ray(address: str | None):
    """(ray, owned): an already initialised Ray (a caller's script) is used as it is; else ray.init(address):
    None means a running cluster if one is reachable (RAY_ADDRESS, or the latest `ray start` on this machine),
    else a new local one."""
    try:
        import ray
    except ImportError:
        raise EngineError(f"--engine ray needs Ray, which is not installed: {INSTALL_RAY}") from None
    if ray.is_initialized():
        return ray, False
    import logging

    started = time.monotonic()
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise EngineError(f"could not connect to the Ray cluster at {address or 'the default address'}: {e}. "
                          f"Check --ray-address (host:port of the head node, e.g. 10.0.0.1:6379)") from None
    _say_connected(ray, time.monotonic() - started)
    return ray, True


_said = set()


def _say_connected(ray, seconds: float):
    """Once per cluster and process: what the tasks will run on."""
    import sys

    try:
        address = ray.get_runtime_context().gcs_address
        if address in _said:
            return
        _said.add(address)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        cpus = int(ray.cluster_resources().get("CPU", 0))
        print(f"ray: {len(nodes)} node(s), {cpus} CPU(s) ({seconds:.1f} s to connect)", file=sys.stderr)
    except Exception:  # informative only
        pass
