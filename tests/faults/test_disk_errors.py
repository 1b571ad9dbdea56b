"""A full disk or an I/O error while a stage writes: a one-line message naming the folder and what to do, nothing
left marked complete, and the same command afterwards resumes to the bytes of an undisturbed run. (A checkpoint
that meets one: tests/faults/test_checkpoints.py.)"""
import errno
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
    import bertkit.pipelines.prepare_corpus as pc

    inputs = raw(tmp_path)
    cfg = CorpusConfig(min_chars=10, shard_size=2048, holdout=0.1, progress=False, workers=1)
    clean = prepare_corpus([inputs], tmp_path / "clean", cfg)
    calls = fail_on_nth_write(monkeypatch, pc, 2, errno.ENOSPC)
    out = tmp_path / "out"
    with pytest.raises(DiskError, match=rf"{out}: no space left on the device while writing .*\.arrow\)\. Nothing "
                                        r"unfinished was marked complete: free space .*run the same command again"):
        prepare_corpus([inputs], out, cfg)
    assert calls["n"] == 2 and not read_corpus_manifest_ok(out)
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
