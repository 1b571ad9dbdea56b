"""--engine ray: the three data stages on a real two-node Ray cluster (two `ray start` processes on 127.0.0.1) give the
bytes of --engine local, also when a Ray worker or the driver is killed mid-stage; prepare-corpus's partitioned
deduplication and train-tokenizer's --sample-bytes; object-store paths refused; examples/cluster/slurm_data_stages.sh
run end to end under srun/scontrol shims.

The cluster is stopped by killing the sessions of the processes this file started (never `ray stop`, which stops
every Ray process of the machine by name, another test run's cluster included)."""
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

from bertkit.cli import main as cli
from bertkit.pipelines import corpus_merge, dedup, prepare_corpus as pc
from bertkit.pipelines.engine import Engine
from bertkit.pipelines.make_instances import InstancesConfig, make_instances
from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus
from bertkit.pipelines.train_tokenizer import TokenizerConfig, sample_buckets, train_tokenizer
from bertkit.testing import (
    free_port,
    kill_session,
    ray_env,
    session_alive,
    stage_outputs,
    start_ray_cluster,
    stop_ray_cluster,
)
from tests.helpers import BIN, REPO, write_corpus

# the small settings every run here uses (CI has 2 cores)
CORPUS = dict(shard_size=256 << 10, holdout=0.02)
TOKENIZER = dict(vocab_size=5000)
INSTANCES = dict(dupe=2, max_seq_length=64, unit_mb=0.25)
CORPUS_FLAGS = ["--shard-size", "256KB", "--holdout", "0.02"]
TOKENIZER_FLAGS = ["--vocab-size", "5000"]
SAMPLE = "400KB"
INSTANCES_FLAGS = ["--dupe", "2", "--max-seq-length", "64"]


run_env = ray_env


def bertkit(*args, check=True, **env):
    proc = subprocess.run([str(BIN / "bertkit"), *map(str, args)], cwd=REPO, env=run_env(**env),
                          capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


# ---------------------------------------------------------------- a two-node cluster on 127.0.0.1

@pytest.fixture(scope="module")
def ray_cluster():
    """host:port of a head node and a second node, one CPU each, as separate `ray start --block` processes."""
    pytest.importorskip("ray")
    temp = tempfile.mkdtemp(prefix="bkray", dir="/tmp")  # Ray's socket paths must stay short
    address, nodes = start_ray_cluster(2, temp)
    try:
        yield address
    finally:
        stop_ray_cluster(nodes, temp)


# ---------------------------------------------------------------- inputs and the local runs to compare with

@pytest.fixture(scope="module")
def raw(shared_data, tmp_path_factory):
    """Two English and one Korean Wikipedia files, and a copy of the first (all its documents are duplicates)."""
    root = tmp_path_factory.mktemp("raw")
    for name, source in (("en/wiki_00", "wikipedia_en_wikiextractor/text/AA/wiki_00"),
                         ("en/wiki_01", "wikipedia_en_wikiextractor/text/AA/wiki_01"),
                         ("ko/wiki_00", "wikipedia_ko_wikiextractor/text/AA/wiki_00"),
                         ("zz/copy_of_en_wiki_00", "wikipedia_en_wikiextractor/text/AA/wiki_00")):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shared_data / source, root / name)
    return root


@pytest.fixture(scope="module")
def local(raw, tmp_path_factory):
    """The three stages with --engine local (two workers), the reference for every Ray run."""
    root = tmp_path_factory.mktemp("local")
    prepare_corpus([raw], root / "corpus", CorpusConfig(workers=2, progress=False, **CORPUS))
    train_tokenizer(root / "corpus", root / "tok", TokenizerConfig(progress=False, **TOKENIZER))
    train_tokenizer(root / "corpus", root / "tok_sample", TokenizerConfig(progress=False, workers=2,
                                                                          sample_bytes=400 << 10, **TOKENIZER))
    make_instances(root / "corpus", root / "tok", root / "inst", InstancesConfig(workers=2, **INSTANCES),
                   progress=False)
    return root


# ---------------------------------------------------------------- the stages on Ray

@pytest.mark.slow
def test_every_stage_on_ray_writes_the_local_bytes(ray_cluster, raw, local, tmp_path):
    ray_flags = ["--engine", "ray", "--ray-address", ray_cluster, "--no-progress"]
    p = bertkit("prepare-corpus", raw, "--out", tmp_path / "corpus", *CORPUS_FLAGS, *ray_flags)
    assert "ray: 2 node(s), 2 CPU(s)" in p.stderr
    assert stage_outputs(tmp_path / "corpus") == stage_outputs(local / "corpus")
    assert (tmp_path / "corpus" / "manifest.json").read_text().count('"duplicate"') == 1
    # no --ray-address: RAY_ADDRESS names the running cluster
    bertkit("train-tokenizer", tmp_path / "corpus", "--out", tmp_path / "tok", *TOKENIZER_FLAGS, "--engine", "ray",
            "--no-progress", RAY_ADDRESS=ray_cluster)
    assert stage_outputs(tmp_path / "tok") == stage_outputs(local / "tok")
    bertkit("train-tokenizer", tmp_path / "corpus", "--out", tmp_path / "tok_sample", *TOKENIZER_FLAGS,
            "--sample-bytes", SAMPLE, *ray_flags)
    assert stage_outputs(tmp_path / "tok_sample") == stage_outputs(local / "tok_sample")
    assert stage_outputs(local / "tok_sample")["vocab.txt"] != stage_outputs(local / "tok")["vocab.txt"]
    # (make-instances' CLI has no --unit-mb: the Python function, with the local run's small units)
    script = (f"from bertkit.pipelines.make_instances import InstancesConfig, make_instances\n"
              f"make_instances({str(tmp_path / 'corpus')!r}, {str(tmp_path / 'tok')!r}, {str(tmp_path / 'inst')!r}, "
              f"InstancesConfig(engine='ray', ray_address={ray_cluster!r}, **{INSTANCES!r}), progress=False)\n")
    subprocess.run([sys.executable, "-c", script], env=run_env(), check=True, timeout=300)
    assert stage_outputs(tmp_path / "inst") == stage_outputs(local / "inst")
    assert len(stage_outputs(local / "inst")) > 10


@pytest.mark.slow
def test_the_cleaning_steps_on_ray_write_the_local_bytes(ray_cluster, raw, tmp_path):
    """Every cleaning step's tasks (near-duplicate signatures, buckets and checks; the filters, languages and
    personal data inside each file's task; the evaluation-text matches; the removed documents) on two Ray nodes:
    the bytes of two local workers; the copy of an English file is removed, each of its documents a cluster of two."""
    line = next(x for x in (raw / "en" / "wiki_00").read_text().splitlines() if len(x.split()) > 30)
    (tmp_path / "eval.txt").write_text(" ".join(line.split()[:20]) + "\n")   # an evaluation text the corpus holds
    options = dict(near_dedup=True, filters="fineweb2", pii="redact", languages=["en", "ko"], keep_removed=True,
                   decontaminate=[str(tmp_path / "eval.txt")])
    prepare_corpus([raw], tmp_path / "local", CorpusConfig(workers=2, progress=False, **options, **CORPUS))
    bertkit("prepare-corpus", raw, "--out", tmp_path / "ray", *CORPUS_FLAGS, "--near-dedup", "--filters", "fineweb2",
            "--pii", "redact", "--languages", "en,ko", "--keep-removed", "--decontaminate", tmp_path / "eval.txt",
            "--engine", "ray", "--ray-address", ray_cluster, "--no-progress")
    assert stage_outputs(tmp_path / "ray") == stage_outputs(tmp_path / "local")
    assert stage_outputs(tmp_path / "ray" / "removed") == stage_outputs(tmp_path / "local" / "removed")
    manifest = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    assert manifest["dropped"]["duplicate"] > 10 and manifest["totals"]["near_dedup"]["largest_cluster"] >= 2
    assert manifest["totals"]["decontamination"]["files"]["eval.txt"]["documents"] >= 1


# a driver whose tasks are slow and write "<task>-<pid>" files, so that the test can kill one of them (by its pid)
# or the driver itself mid-stage; the patched function travels to the Ray workers by value (cloudpickle)
SLOW_DRIVER = """
import os, sys, time
import bertkit.pipelines.{module} as stage
real, pids = stage.{function}, sys.argv[1]

def slow(*args):
    task = args[0] if {function!r} == "process_file" else "%s%d" % (args[0]["split"], args[0]["unit_index"])
    open(os.path.join(pids, "%s-%d" % (task, os.getpid())), "w").close()
    time.sleep({delay})
    return real(*args)

stage.{function} = slow
{call}
"""
def stage_call(stage, address, raw, local, out) -> tuple[str, str, str]:
    """(module, task function, the stage's call) for a driver script."""
    if stage == "prepare-corpus":
        return "prepare_corpus", "process_file", (
            f"stage.prepare_corpus([{str(raw)!r}], {str(out)!r}, stage.CorpusConfig(engine='ray', "
            f"ray_address={address!r}, progress=False, **{CORPUS!r}))")
    return "make_instances", "process_unit", (
        f"stage.make_instances({str(local / 'corpus')!r}, {str(local / 'tok')!r}, {str(out)!r}, "
        f"stage.InstancesConfig(engine='ray', ray_address={address!r}, **{INSTANCES!r}), progress=False)")


def slow_driver(stage, address, raw, local, out, pids, delay):
    module, function, call = stage_call(stage, address, raw, local, out)
    script = SLOW_DRIVER.format(module=module, function=function, delay=delay, call=call)
    pids.mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-c", script, str(pids)], env=run_env(), stderr=subprocess.PIPE,
                            text=True)


def wait_for(condition, timeout=120, proc=None):
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "timed out"
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the driver ended early: {proc.stderr.read()[-3000:]}")
        time.sleep(0.05)


def reference(stage, local):
    return local / ("corpus" if stage == "prepare-corpus" else "inst")


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["prepare-corpus", "make-instances"])
def test_a_killed_ray_worker_has_its_task_rerun(ray_cluster, raw, local, tmp_path, stage):
    pids = tmp_path / "pids"
    driver = slow_driver(stage, ray_cluster, raw, local, tmp_path / "out", pids, delay=1.5)
    wait_for(lambda: any(pids.iterdir()), proc=driver)
    victim = sorted(pids.iterdir(), key=lambda p: p.stat().st_mtime)[0]
    task, pid = victim.name.rsplit("-", 1)
    os.kill(int(pid), signal.SIGKILL)  # a worker of our own cluster, mid-task
    _, err = driver.communicate(timeout=300)
    assert driver.returncode == 0, err[-3000:]
    assert len([p for p in pids.iterdir() if p.name.rsplit("-", 1)[0] == task]) >= 2  # Ray ran it again
    assert stage_outputs(tmp_path / "out") == stage_outputs(reference(stage, local))


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["prepare-corpus", "make-instances"])
def test_a_killed_ray_driver_resumes_from_the_finished_tasks(ray_cluster, raw, local, tmp_path, stage):
    out, pids = tmp_path / "out", tmp_path / "pids"
    driver = slow_driver(stage, ray_cluster, raw, local, out, pids, delay=1.0)
    if stage == "prepare-corpus":
        done = lambda: len(list((out / ".work").glob("part-*.json"))) >= 1  # noqa: E731
    else:
        done = lambda: len(list((out / ".parts").glob("instances-*.json"))) >= 2  # noqa: E731
    wait_for(done, proc=driver)
    driver.kill()
    driver.communicate()
    assert not (out / "manifest.json").is_file() or '"complete": false' in (out / "manifest.json").read_text()
    module, _, call = stage_call(stage, ray_cluster, raw, local, out)  # the same call again, not slowed
    p = subprocess.run([sys.executable, "-c", f"import bertkit.pipelines.{module} as stage\n{call}"],
                       env=run_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    if stage == "prepare-corpus":
        assert "resuming:" in p.stderr
    assert stage_outputs(out) == stage_outputs(reference(stage, local))


# ---------------------------------------------------------------- prepare-corpus: partitioned deduplication

def one_set_rule(parts_ids) -> list[int]:
    """The rule before partitions: one set of every id in the main process; a seen id is a duplicate."""
    seen, dropped, position = set(), [], 0
    for ids in parts_ids:
        for doc_id in ids:
            key = int(doc_id, 16)
            if key in seen:
                dropped.append(position)
            seen.add(key)
            position += 1
    return dropped


def test_partitioned_dedup_drops_exactly_what_one_set_drops(tmp_path, monkeypatch):
    monkeypatch.setattr(pc, "PART_BATCH_ROWS", 50)  # several Arrow batches per part
    rng = random.Random(0)
    pool = [f"{rng.getrandbits(64):016x}" for _ in range(300)]
    parts_ids = [[rng.choice(pool) for _ in range(rng.randint(0, 400))] for _ in range(6)] + [[]]
    paths = []
    for k, ids in enumerate(parts_ids):
        writer = pc._PartWriter(tmp_path / f"part-{k:05d}.arrow")
        for doc_id in ids:
            writer.add(doc_id, "s", None, [f"text of {doc_id}"], None, None, 10)   # no language, no signals
        writer.close()
        paths.append(str(tmp_path / f"part-{k:05d}.arrow"))
    expected = one_set_rule(parts_ids)
    assert 100 < len(expected) < sum(map(len, parts_ids))
    for partitions in (1, 3, 7):
        found = []
        for p in range(partitions):
            out = tmp_path / f"dedup-{partitions}-{p}.npy"
            record = dedup.find_duplicates(paths, p, partitions, str(out))
            assert record["rows"] == sum(map(len, parts_ids))
            found += np.load(out).tolist()
        assert sorted(found) == expected, partitions


def test_id_keys_are_the_ids_as_numbers():
    ids = [f"{random.Random(i).getrandbits(64):016x}" for i in range(100)] + ["ffffffffffffffff", "0000000000000000"]
    assert dedup.id_keys(pa.array(ids)).tolist() == [int(i, 16) for i in ids]
    assert dedup.id_keys(pa.array(ids).slice(7, 20)).tolist() == [int(i, 16) for i in ids[7:27]]
    assert dedup.id_keys(pa.array(["abc", "0F"])).tolist() == [0xABC, 15]  # other widths: the plain conversion


def raw_with_duplicates(folder: Path) -> Path:
    """Five files of paragraphs; documents repeat within and across files."""
    rng = random.Random(3)
    words = "river stone light paper garden window music letter forest winter".split()
    docs = [f"Document {i} is about the {rng.choice(words)} and the {rng.choice(words)}. It was seen in year "
            f"{1000 + i} near the {rng.choice(words)}. Nobody forgot number {i}." for i in range(400)]
    for f in range(5):
        chosen = [docs[rng.randrange(len(docs))] for _ in range(120)]
        (folder / f"f{f}.txt").parent.mkdir(parents=True, exist_ok=True)
        (folder / f"f{f}.txt").write_text("\n\n".join(chosen) + "\n")
    return folder


def test_dedup_partitions_never_change_the_output_and_resume(tmp_path, monkeypatch):
    raw = raw_with_duplicates(tmp_path / "raw")
    options = dict(shard_size=4096, holdout=0.1, progress=False, min_chars=10)
    runs = {}
    for partitions, workers in ((1, 1), (3, 1), (7, 2)):
        out = tmp_path / f"p{partitions}"
        runs[partitions] = prepare_corpus([raw], out, CorpusConfig(dedup_partitions=partitions, workers=workers,
                                                                   **options))
        assert stage_outputs(out) == stage_outputs(tmp_path / "p1")
    assert runs[7].dropped["duplicate"] == runs[1].dropped["duplicate"] > 100
    assert runs[7].options == runs[1].options  # dedup_partitions is not an output option

    # killed while merging: the dedup results are kept, and a re-run uses them instead of redoing them
    real_flush = corpus_merge.ShardWriter.flush

    def flush_then_die(self):
        real_flush(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(corpus_merge.ShardWriter, "flush", flush_then_die)
    with pytest.raises(KeyboardInterrupt):
        prepare_corpus([raw], tmp_path / "resumed", CorpusConfig(dedup_partitions=3, **options))
    monkeypatch.setattr(corpus_merge.ShardWriter, "flush", real_flush)
    assert len(list((tmp_path / "resumed" / ".work").glob("dedup-00003-*.json"))) == 3

    def must_not_run(*args):
        raise AssertionError("the finished dedup partitions were redone")

    monkeypatch.setattr(dedup, "find_duplicates", must_not_run)
    prepare_corpus([raw], tmp_path / "resumed", CorpusConfig(dedup_partitions=3, **options))
    assert stage_outputs(tmp_path / "resumed") == stage_outputs(tmp_path / "p1")


# ---------------------------------------------------------------- train-tokenizer --sample-bytes

WORDS = ("alpha beta gamma delta epsilon river stone light paper garden window music letter forest winter summer "
         "morning evening station village mountain").split()


def test_sample_bytes_is_a_hash_sample_that_keeps_every_character(tmp_path):
    rng = random.Random(5)
    docs = [[" ".join(rng.choice(WORDS) + rng.choice(["", "s", "ing", "ed"]) for _ in range(10)) + "."
             for _ in range(4)] for _ in range(240)]
    docs[17][2] = "The rare letter sits in abʬcd and in ʬʬ."   # in one document only
    ids = [hashlib.sha1(repr(d).encode()).hexdigest()[:16] for d in docs]  # as tests.helpers.write_corpus
    buckets = sample_buckets(pa.array(ids))
    nbytes = np.array([sum(len(s.encode()) for s in d) for d in docs])
    # the sample: every document whose bucket is below document 17's, so document 17 is just outside it
    sample_bytes = int(nbytes[buckets < buckets[17]].sum())
    assert 0.2 < sample_bytes / nbytes.sum() < 0.8
    write_corpus(tmp_path / "c3", [docs[:80], docs[80:160], docs[160:]])
    write_corpus(tmp_path / "c2", [docs[::-1][:100], docs[::-1][100:]])   # other shards, other order
    config = dict(vocab_size=400, min_frequency=1, progress=False)
    vocabs = {}
    for name, corpus, workers, size in (("sample", "c3", 1, sample_bytes), ("sample-2-workers", "c3", 2, sample_bytes),
                                        ("sample-other-shards", "c2", 1, sample_bytes),
                                        ("all", "c3", 1, None), ("all-by-sample", "c3", 1, 10 ** 12)):
        m = train_tokenizer(tmp_path / corpus, tmp_path / name, TokenizerConfig(sample_bytes=size, workers=workers,
                                                                                **config))
        vocabs[name] = (tmp_path / name / "vocab.txt").read_text().split("\n")
        assert m.settings.get("sample_bytes") == size  # absent (None) for all the text: settings read as before
    assert vocabs["sample"] == vocabs["sample-2-workers"] == vocabs["sample-other-shards"]
    assert vocabs["all"] == vocabs["all-by-sample"]      # a sample bigger than the corpus is the corpus
    assert vocabs["sample"] != vocabs["all"]
    assert {"ʬ", "##ʬ"} <= set(vocabs["sample"])          # from the alphabet pass over every shard
    with pytest.raises(Exception, match="smaller than"):
        train_tokenizer(tmp_path / "c3", tmp_path / "tiny", TokenizerConfig(sample_bytes=10, **config))


def test_sample_bytes_auto_samples_only_a_corpus_larger_than_its_cap(tmp_path, monkeypatch):
    """The default: a corpus whose training shards exceed the cap learns its merges on a sample of the cap's size
    (the same vocabulary as asking for it, said on the terminal and recorded); a smaller corpus trains on all of it,
    byte for byte as --sample-bytes all, and an older folder made so (settings without sample_bytes) is finished."""
    import bertkit.pipelines.train_tokenizer as tt

    rng = random.Random(3)
    docs = [[" ".join(rng.choice(WORDS) + rng.choice(["", "s", "ing", "ed"]) for _ in range(10)) + "."
             for _ in range(4)] for _ in range(240)]
    corpus = write_corpus(tmp_path / "corpus", [docs[:120], docs[120:]])
    shard_bytes = sum((corpus / f).stat().st_size for f in ("shard-00000.arrow", "shard-00001.arrow"))
    flags = ["--vocab-size", "400", "--min-frequency", "1", "--no-progress"]

    def run(out, *extra):
        r = CliRunner().invoke(cli, ["train-tokenizer", str(corpus), "--out", str(tmp_path / out), *flags, *extra])
        assert r.exit_code == 0, r.output
        return r.output, (tmp_path / out / "vocab.txt").read_bytes()

    _, every_byte = run("all", "--sample-bytes", "all")
    said, below = run("below")                       # the default cap (1 GB) is far above this corpus
    assert below == every_byte and "--sample-bytes auto" not in said
    assert "sample_bytes" not in json.loads((tmp_path / "below" / "manifest.json").read_text())["settings"]
    cap = shard_bytes // 3
    monkeypatch.setattr(tt, "AUTO_SAMPLE_BYTES", {"plain": cap, "analyser": cap // 2})
    said, auto = run("auto")
    _, asked = run("asked", "--sample-bytes", str(cap))
    assert auto == asked != every_byte
    assert f"learnt on a {tt._size(cap)} sample (--sample-bytes auto" in said and tt._size(cap).endswith(" KB")
    assert json.loads((tmp_path / "auto" / "manifest.json").read_text())["settings"]["sample_bytes"] == cap
    run("auto")                                      # finished: the same resolution, nothing to do
    monkeypatch.setattr(tt, "AUTO_SAMPLE_BYTES", {"plain": shard_bytes, "analyser": 1})
    said, again = run("below")                       # not above the cap: all of it, the folder already finished
    assert again == every_byte
    kiwi = TokenizerConfig(pretokenize="kiwi")
    assert tt.auto_sample_bytes(corpus, kiwi) == (1, shard_bytes)   # an analyser's cap is its own


def test_a_killed_tokenizer_rescans_only_the_shards_it_had_not_finished(tmp_path, monkeypatch):
    """The alphabet pass keeps each shard's result (OUT/.scans) until the tokenizer is written: a run killed after
    two of four shards scans only the other two when run again, and writes what an unkilled run writes."""
    import bertkit.pipelines.train_tokenizer as tt

    rng = random.Random(4)
    docs = [[" ".join(rng.choice(WORDS) + rng.choice(["", "s", "ing", "ed"]) for _ in range(10)) + "."
             for _ in range(4)] for _ in range(200)]
    docs[150][0] = "Only here: ʬʬ and qʬ."
    corpus = write_corpus(tmp_path / "corpus", [docs[i::4] for i in range(4)])
    config = TokenizerConfig(vocab_size=300, min_frequency=1, progress=False, workers=1, sample_bytes=30_000)
    real, scanned = tt.scan_shard, []

    def killed_after_two(path, *args):
        if len(scanned) == 2:
            raise KeyboardInterrupt   # as a kill would, between two shards
        scanned.append(Path(path).name)
        return real(path, *args)

    monkeypatch.setattr(tt, "scan_shard", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        train_tokenizer(corpus, tmp_path / "tok", config)
    assert not (tmp_path / "tok" / "manifest.json").exists()
    monkeypatch.setattr(tt, "scan_shard", lambda path, *args: scanned.append(Path(path).name) or real(path, *args))
    train_tokenizer(corpus, tmp_path / "tok", config)
    assert sorted(scanned) == [f"shard-0000{i}.arrow" for i in range(4)]   # each shard scanned once in all
    assert not (tmp_path / "tok" / ".scans").exists()
    monkeypatch.undo()
    train_tokenizer(corpus, tmp_path / "clean", config)
    for name in ("vocab.txt", "tokenizer.json"):
        assert (tmp_path / "tok" / name).read_bytes() == (tmp_path / "clean" / name).read_bytes()
    assert "##ʬ" in (tmp_path / "tok" / "vocab.txt").read_text().split("\n")


# ---------------------------------------------------------------- engines, paths, Ray missing

def test_engine_yields_results_in_task_order_here_and_in_a_pool():
    for workers in (1, 2):
        done = []
        with Engine("local", workers) as engine:
            results = list(engine.map(pow, [(2, i) for i in range(7)], on_done=lambda i, r: done.append(i)))
        assert results == [2 ** i for i in range(7)] and done == list(range(7))


@pytest.mark.parametrize("args", [
    ["prepare-corpus", "s3://bucket/wiki/", "--out", "{tmp}/corpus"],
    ["prepare-corpus", "{tmp}/in.txt", "--out", "s3://bucket/corpus"],
    ["train-tokenizer", "s3://bucket/corpus", "--out", "{tmp}/tok"],
    ["make-instances", "{tmp}/corpus", "--tokenizer", "{tmp}/tok", "--out", "s3://bucket/instances"],
], ids=["input", "out", "tokenizer-corpus", "instances-out"])
def test_object_store_paths_are_refused_with_what_to_do(tmp_path, args):
    (tmp_path / "in.txt").write_text("Some text long enough to be a document of its own, twice over.\n")
    result = CliRunner().invoke(cli, [a.format(tmp=tmp_path) for a in args])
    assert result.exit_code != 0
    assert "s3:// paths are not supported" in result.output and "Mountpoint for Amazon S3" in result.output
    assert not (tmp_path / "corpus").exists() and not (tmp_path / "tok").exists()


def test_engine_ray_without_ray_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails
    (tmp_path / "in.txt").write_text("Some text long enough to be a document of its own, twice over.\n")
    result = CliRunner().invoke(cli, ["prepare-corpus", str(tmp_path / "in.txt"), "--out", str(tmp_path / "c"),
                                      "--engine", "ray"])
    assert result.exit_code != 0 and "pip install 'bertkit[ray]'" in result.output
    assert not (tmp_path / "c").exists()  # refused before touching the output
    result = CliRunner().invoke(cli, ["prepare-corpus", str(tmp_path / "in.txt"), "--ray-address", "1.2.3.4:6379"])
    assert result.exit_code != 0 and "--ray-address is for --engine ray" in result.output


# ---------------------------------------------------------------- examples/cluster/slurm_data_stages.sh

SRUN = '''#!{python}
"""srun for a fake allocation on this machine (nodes: SLURM_JOB_NODELIST, comma-separated): runs the command once per
node asked for (--nodes N, or -w NODE), with SLURM_NODEID / SLURM_PROCID set, each copy in its own session, written
to $SLURM_SHIM_STATE. `ray stop` ends those sessions, i.e. the Ray nodes this allocation started (the real one would
stop every Ray process of the machine)."""
import os, subprocess, sys
from bertkit.testing import kill_session
args, count, where = sys.argv[1:], None, None
while args and args[0].startswith("-"):
    name, _, value = args.pop(0).partition("=")
    if name in ("--nodes", "-N", "--ntasks", "-n", "--ntasks-per-node", "-w", "--nodelist", "-c") and not value:
        value = args.pop(0)
    if name in ("--nodes", "-N"):
        count = int(value)
    elif name in ("-w", "--nodelist"):
        where = value
nodes = os.environ["SLURM_JOB_NODELIST"].split(",")
state = os.environ["SLURM_SHIM_STATE"]
if args[:2] == ["ray", "stop"]:
    for sid in map(int, open(state).read().split() if os.path.exists(state) else []):
        kill_session(sid)
    sys.exit(0)
procs = []
for node in [nodes.index(where)] if where else range(count or len(nodes)):
    env = dict(os.environ, SLURM_NODEID=str(node), SLURM_PROCID=str(len(procs)), SLURMD_NODENAME=nodes[node])
    procs.append(subprocess.Popen(args, env=env, start_new_session=True))
    with open(state, "a") as f:
        f.write(f"{procs[-1].pid}\\n")
sys.exit(max(p.wait() for p in procs))
'''

SCONTROL = '''#!{python}
"""scontrol show hostnames [LIST]: the fake allocation's nodes, one a line."""
import os, sys
assert sys.argv[1:3] == ["show", "hostnames"], "this shim only knows `scontrol show hostnames`"
print("\\n".join((sys.argv[3] if len(sys.argv) > 3 else os.environ["SLURM_JOB_NODELIST"]).split(",")))
'''


@pytest.mark.slow
def test_slurm_script_runs_the_stages_on_a_two_node_allocation(shared_data, tmp_path):
    pytest.importorskip("ray")
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (shims / name).write_text(text.replace("{python}", sys.executable))
        (shims / name).chmod(0o755)
    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copyfile(shared_data / "wikipedia_en_wikiextractor/text/AA/wiki_00", raw / "wiki_00")
    shutil.copyfile(shared_data / "wikipedia_en_wikiextractor/text/AA/wiki_00", raw / "wiki_00_again")
    temp, state = tempfile.mkdtemp(prefix="bkslurm", dir="/tmp"), tmp_path / "sessions"
    env = run_env(PATH=f"{shims}:{BIN}:{os.environ['PATH']}", SLURM_JOB_NODELIST="127.0.0.1,127.0.0.1",
                  SLURM_CPUS_PER_TASK="1", SLURM_SHIM_STATE=str(state), INPUT=str(raw), OUT=str(tmp_path / "out"),
                  VOCAB_SIZE="2000", SAMPLE_BYTES="300KB", SHARD_SIZE="256KB", MAX_SEQ_LENGTH="64", DUPE="1",
                  RAY_PORT=str(free_port()), RAY_TEMP_DIR=temp,
                  RAY_START_ARGS=f"--node-ip-address 127.0.0.1 --object-store-memory {100 << 20} --disable-usage-stats",
                  RAY_HEAD_ARGS=f"--include-dashboard false --ray-client-server-port {free_port()}")
    try:
        proc = subprocess.run(["bash", str(REPO / "examples/cluster/slurm_data_stages.sh")], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "Ray cluster: 2 node(s), 2 CPU(s)" in proc.stdout
        sessions = [int(s) for s in state.read_text().split()]
        assert len(sessions) == 2                                  # the head and one worker node, via srun
        assert not any(session_alive(s) for s in sessions)         # and `ray stop` ended them
    finally:
        for sid in [int(s) for s in state.read_text().split()] if state.exists() else []:
            kill_session(sid)
        stop_ray_cluster([], temp)  # (the nodes' sessions are ended above): Ray's temp folder
    local = tmp_path / "local"
    prepare_corpus([raw], local / "corpus", CorpusConfig(shard_size=256 << 10, progress=False))
    train_tokenizer(local / "corpus", local / "tokenizer", TokenizerConfig(vocab_size=2000, sample_bytes=300 << 10,
                                                                           progress=False))
    make_instances(local / "corpus", local / "tokenizer", local / "instances",
                   InstancesConfig(max_seq_length=64, dupe=1), progress=False)
    for stage in ("corpus", "tokenizer", "instances"):
        assert stage_outputs(tmp_path / "out" / stage) == stage_outputs(local / stage), stage
