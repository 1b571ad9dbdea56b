"""A full disk or an I/O error while a stage writes: a one-line message naming the folder and what to do, nothing
left marked complete, and the same command afterwards resumes to the bytes of an undisturbed run. (A checkpoint
that meets one: tests/faults/test_checkpoints.py.)"""
import errno
import os
import random

import pytest
from click.testing import CliRunner

import bertkit.fileio as fileio
from bertkit.cli import main
from bertkit.fileio import DiskError
from bertkit.formats import read_corpus_manifest
from bertkit.pipelines.make_instances import InstancesConfig, make_instances
from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus
from tests.helpers import toy_vocab


def raw(tmp_path):
    rng = random.Random(1)
    for i in range(4):
        text = "\n\n".join(" ".join(f"w{rng.randrange(120)}" for _ in range(30)) + "." for _ in range(40))
        (tmp_path / "in" / f"f{i}.txt").parent.mkdir(exist_ok=True)
        (tmp_path / "in" / f"f{i}.txt").write_text(text + "\n")
    return tmp_path / "in"


def fail_on_nth_write(monkeypatch, module, n, code):
    """Make the n-th atomic write of `module` raise OSError(code), as a full or failing disk would."""
    real, calls = module.atomic_write_arrow if hasattr(module, "atomic_write_arrow") else None, {"n": 0}
    real_bytes = fileio.atomic_write_bytes

    def failing_bytes(path, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise OSError(code, "simulated", str(path))
        return real_bytes(path, *args, **kwargs)

    monkeypatch.setattr(module, "atomic_write_bytes", failing_bytes, raising=False)
    if real is not None:
        def failing_arrow(path, table):
            calls["n"] += 1
            if calls["n"] == n:
                raise OSError(code, "simulated", str(path))
            return real(path, table)
        monkeypatch.setattr(module, "atomic_write_arrow", failing_arrow)
    return calls


def test_disk_full_in_prepare_corpus_then_the_same_command_resumes(tmp_path, monkeypatch):
    from bertkit.pipelines import corpus_merge  # where the shards are written

    inputs = raw(tmp_path)
    cfg = CorpusConfig(min_chars=10, shard_size=2048, holdout=0.1, progress=False, workers=1)
    clean = prepare_corpus([inputs], tmp_path / "clean", cfg)
    real_write, calls = corpus_merge.ShardWriter._write, {"n": 0}

    def full_on_the_second_shard(self, table):  # as Arrow reports it: the errno, no file name
        if self.entries or calls["n"]:
            calls["n"] += 1
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
        return real_write(self, table)

    monkeypatch.setattr(corpus_merge.ShardWriter, "_write", full_on_the_second_shard)
    out = tmp_path / "out"
    with pytest.raises(DiskError, match=rf"{out}: no space left on the device while writing .*shard-00001\.arrow"
                                        r"\.tmp\)\. Nothing unfinished was marked complete: free space .*run the "
                                        r"same command again"):
        prepare_corpus([inputs], out, cfg)
    assert calls["n"] == 1 and not read_corpus_manifest_ok(out)
    monkeypatch.undo()
    resumed = prepare_corpus([inputs], out, cfg)
    assert [s.checksum for s in resumed.shards] == [s.checksum for s in clean.shards]


def read_corpus_manifest_ok(folder) -> bool:
    try:
        read_corpus_manifest(folder)
        return True
    except Exception:  # noqa: BLE001
        return False


def test_io_error_in_make_instances_is_a_message_then_resumes(tmp_path, monkeypatch):
    import bertkit.pipelines.make_instances as mi

    inputs = raw(tmp_path)
    prepare_corpus([inputs], tmp_path / "corpus", CorpusConfig(min_chars=10, progress=False, workers=1))
    (tmp_path / "vocab.txt").write_text("\n".join(toy_vocab()) + "\n")
    cfg = InstancesConfig(max_seq_length=32, dupe=3, workers=1)
    clean = make_instances(tmp_path / "corpus", tmp_path / "vocab.txt", tmp_path / "clean", cfg, progress=False)
    fail_on_nth_write(monkeypatch, mi, 3, errno.EIO)
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["make-instances", str(tmp_path / "corpus"), "--tokenizer",
                                  str(tmp_path / "vocab.txt"), "--out", str(out), "--max-seq-length", "32", "--dupe",
                                  "3", "-j", "1", "--no-progress"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"{out}: an input/output error (a failing disk or network file system) while writing" in r.output
    assert not (out / "manifest.json").exists()
    monkeypatch.undo()
    resumed = make_instances(tmp_path / "corpus", tmp_path / "vocab.txt", out, cfg, progress=False)
    assert [s.checksum for s in resumed.shards] == [s.checksum for s in clean.shards]


# ---------------------------------------------------------------- a real full device (issue 36, part 5)

@pytest.fixture
def small_tmpfs(tmp_path):
    """A tmpfs of a given size (KiB), mounted for the test; skipped where mounting is not allowed (not root)."""
    import subprocess

    mounted = []

    def mount(kib: int):
        where = tmp_path / f"tmpfs{len(mounted)}"
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(where)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip()}); needs root")
        mounted.append(where)
        return where

    yield mount
    import gc

    gc.collect()  # a failed write's traceback holds torch's file writer until collected
    for where in mounted:
        held = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                if str(where) in os.path.realpath(f"/proc/self/fd/{fd}")] if os.path.isdir("/proc/self/fd") else []
        held += [line.split()[-1] for line in open("/proc/self/maps") if str(where) in line]
        subprocess.run(["umount", "-l", str(where)], check=True)
        assert not held, f"files left open on the full device: {held}"


def test_a_full_device_during_a_checkpoint_save_and_an_export_is_the_one_message(tmp_path, small_tmpfs,
                                                                                 clean_dist_env):
    """torch reports ENOSPC as a RuntimeError ("unexpected pos"); both become the DiskError the README promises,
    with no .partial checkpoint left behind and no export marked complete."""
    import json

    from tests.helpers import TINY, make_instances_dir

    inst = make_instances_dir(tmp_path / "inst", n=64, holdout=8, max_len=32)
    (tmp_path / "model.json").write_text(json.dumps(TINY))
    args = ["pretrain", "--instances", str(inst), "--model", str(tmp_path / "model.json"), "--max-steps", "2",
            "--save-every", "2", "--micro-batch", "8", "--optimizer", "adamw", "--zero-stage", "0",
            "--num-workers", "0", "--no-progress", "--report-to", "none"]
    small = small_tmpfs(300)  # the run's files fit, its 360 kB checkpoint does not
    r = CliRunner().invoke(main, [*args, "--out", str(small / "run")])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert f"{small / 'run'}: no space left on the device while writing" in r.output
    assert "then resume with --resume" in r.output
    assert not list((small / "run" / "checkpoints").glob("*")), "a .partial checkpoint was left"

    r = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    tiny = small_tmpfs(48)
    e = CliRunner().invoke(main, ["export", str(tmp_path / "run"), "--out", str(tiny / "export")])
    assert e.exit_code == 1 and "Traceback" not in e.output, e.output
    assert f"{tiny / 'export'}: no space left on the device while writing" in e.output
    assert not (tiny / "export" / "manifest.json").exists()
