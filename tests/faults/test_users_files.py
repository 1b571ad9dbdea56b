"""Issue 72, classes 1 and 2: bertkit deletes only what it wrote, replaces an output without ever emptying it, lets
one writer at a time into a folder, and meets a full disk with one line (bertkit.outputs, bertkit.fileio)."""
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.fileio import FolderNotOwnedError
from tests.helpers import env_without_dist, quick_finetune, tiny_run_exported


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_run_exported(tmp_path_factory.mktemp("users"))


def visible_files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
            and not p.relative_to(folder).parts[0].startswith(".")}


def export_cli(run_dir, out, *flags):
    return CliRunner().invoke(main, ["export", str(run_dir), "--out", str(out), *flags])


def glue_dir(root, model):
    vocab = (model / "vocab.txt").read_text().split()
    rows = ["sentence\tlabel"] + [f"{vocab[10 + i % 40]} {vocab[30 + i % 7]}\t{i % 2}" for i in range(24)]
    (root / "SST-2").mkdir(parents=True, exist_ok=True)
    for name in ("train.tsv", "dev.tsv"):
        (root / "SST-2" / name).write_text("\n".join(rows) + "\n")
    return root


def finetune_glue(data, model, out, *flags):
    return CliRunner().invoke(main, ["finetune", "glue", "--task", "sst2", "--data-dir", str(data), "--model",
                                     str(model), "--out", str(out), "--epochs", "1", "--batch-size", "8",
                                     "--max-seq-length", "16", "--report-to", "none", *flags])


# ---------------------------------------------------------------- 1. only bertkit's own files go

def test_a_re_export_keeps_the_users_files_beside_it(run, tmp_path):
    out = tmp_path / "export"
    assert export_cli(run, out).exit_code == 0
    (out / "README.md").write_text("my model card\n")
    (out / "notes").mkdir()
    (out / "notes" / "eval.txt").write_text("dev 0.81\n")
    r = export_cli(run, out)
    assert r.exit_code == 0, r.output
    assert (out / "README.md").read_text() == "my model card\n"
    assert (out / "notes" / "eval.txt").read_text() == "dev 0.81\n"
    assert "kept README.md, notes/eval.txt (bertkit did not write them" in r.output
    assert "is yours: kept, and bertkit's model card not written" in r.output
    assert CliRunner().invoke(main, ["verify", str(out)]).exit_code == 0


def test_a_re_export_over_another_run_replaces_only_bertkits_files(run, tmp_path):
    import shutil

    out, other = tmp_path / "export", tmp_path / "other"
    shutil.copytree(run, other)
    assert export_cli(run, out).exit_code == 0
    (out / "thesis.tex").write_text("\\chapter{}\n")
    r = export_cli(other, out, "--overwrite")
    assert r.exit_code == 0, r.output
    assert (out / "thesis.tex").read_text() == "\\chapter{}\n"
    assert json.loads((out / "manifest.json").read_text())["run"] == "other"   # its name: no local path


def test_the_same_fine_tuning_again_keeps_the_users_analysis(run, tmp_path):
    model = run.parent / "model"
    out = tmp_path / "ft"
    quick_finetune(model, tmp_path / "data", run=out)
    (out / "analysis.md").write_text("why epoch 1 won\n")
    quick_finetune(model, tmp_path / "data", run=out)  # finished: the same command again redoes it
    assert (out / "analysis.md").read_text() == "why epoch 1 won\n"
    record = json.loads((out / ".bertkit-written.json").read_text())["files"]
    assert "metrics.json" in record and "analysis.md" not in record


def test_a_fine_tuning_removes_only_its_own_saved_state(run, tmp_path):
    """OUT/resume/ holds the state a killed fine-tuning resumes from, removed when it ends: a user's folder of that
    name (a CV, say), in a run folder or one given with --overwrite, keeps its files."""
    model = run.parent / "model"
    out, mine = tmp_path / "ft", tmp_path / "mine"
    quick_finetune(model, tmp_path / "data", run=out)
    (out / "resume").mkdir()
    (out / "resume" / "cv.md").write_text("my CV\n")
    quick_finetune(model, tmp_path / "data", run=out)
    assert (out / "resume" / "cv.md").read_text() == "my CV\n"
    # where the state would go: a file of the user's, or a link to a folder elsewhere: refused, nothing written
    (mine / "resume").mkdir(parents=True)
    (mine / "resume" / "state.pt").write_text("not a fine-tuning's state\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "resume").symlink_to(elsewhere)
    for folder in (mine, tmp_path / "linked"):
        with pytest.raises(FolderNotOwnedError, match="resume: holds files bertkit did not write.*"
                                                      "--checkpoint-minutes 0"):
            quick_finetune(model, tmp_path / "data", run=folder, overwrite=True)
    assert (mine / "resume" / "state.pt").read_text() == "not a fine-tuning's state\n"
    assert not any(elsewhere.iterdir())


def test_prepare_corpus_removes_only_its_own_work_folder(tmp_path):
    """OUT/.work holds an unfinished prepare-corpus' parts and goes when it ends: a hidden folder of the user's of
    that name (in a folder that otherwise looks empty), or a link there, is refused and kept; a run's own goes."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("A first document with enough words in it to be kept.\n\n"
                                           "A second document, also long enough to be kept here.\n")
    out = tmp_path / "out"
    (out / ".work").mkdir(parents=True)
    (out / ".work" / "notes.txt").write_text("mine\n")
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / ".work").symlink_to(out / ".work")
    for folder in (out, tmp_path / "linked"):
        r = CliRunner().invoke(main, ["prepare-corpus", str(tmp_path / "in"), "--out", str(folder)])
        assert r.exit_code == 1 and ".work: holds files prepare-corpus did not write" in r.output, r.output
    assert (out / ".work" / "notes.txt").read_text() == "mine\n"
    (out / ".work" / "notes.txt").unlink()   # an empty one is taken, and removed at the end
    r = CliRunner().invoke(main, ["prepare-corpus", str(tmp_path / "in"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert (out / "manifest.json").is_file() and not (out / ".work").exists()
    # a file dropped into a run's own work folder is not one of its names: it stays, with the folder
    from bertkit.pipelines.prepare_corpus import remove_work

    work = tmp_path / "again" / ".work"
    work.mkdir(parents=True)
    (work / "state.json").write_text('{"fingerprint": {}}')
    for name in ("part-00000.arrow", "part-00000.json", "dedup-00001-00000.npy", ".x.json.abc.tmp", "mine.txt"):
        (work / name).write_text("x")
    remove_work(work)
    assert sorted(p.name for p in work.iterdir()) == ["mine.txt"]


def test_a_record_proves_nothing_it_cannot_show(run, tmp_path):
    """A file bertkit wrote that the user edited since, a record from someone else naming the user's files, a name
    reached through a link, a folder: none of them is removed; only files still exactly as bertkit wrote them go."""
    out, elsewhere = tmp_path / "ft", tmp_path / "elsewhere"
    quick_finetune(run.parent / "model", tmp_path / "data", run=out)
    (out / "metrics.jsonl").write_text("my edit\n")  # bertkit wrote it; the user changed it since
    (out / "thesis.tex").write_text("\\chapter{}\n")
    (out / "mine").mkdir()
    (out / "mine" / "data.csv").write_text("1\n")
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("keep\n")
    (out / "linked").symlink_to(elsewhere)
    record = json.loads((out / ".bertkit-written.json").read_text())
    st = (out / "thesis.tex").lstat()
    record["files"].update({"thesis.tex": [st.st_ino + 1, st.st_mtime_ns], "mine": [0, 0],
                            "linked/precious.txt": list(record["files"]["metrics.json"]), "../elsewhere": [0, 0]})
    (out / ".bertkit-written.json").write_text(json.dumps(record))
    quick_finetune(run.parent / "model", tmp_path / "data", run=out)
    assert (out / "thesis.tex").read_text() == "\\chapter{}\n" and (out / "mine" / "data.csv").read_text() == "1\n"
    assert (elsewhere / "precious.txt").read_text() == "keep\n"
    assert json.loads((out / "metrics.json").read_text())["task"] == "classify"
    assert (out / "metrics.jsonl").read_text().startswith("my edit\n")  # kept, and appended to by name


def test_train_tokenizer_removes_only_its_own_scans(tmp_path):
    """OUT/.scans/KEY/ folders the alphabet pass made (they hold its mark) go when the tokenizer is written; a folder
    there without the mark is someone else's and stays, with its files."""
    from bertkit.pipelines.train_tokenizer import TokenizerConfig, train_tokenizer
    from tests.helpers import write_corpus

    corpus = write_corpus(tmp_path / "corpus", [[["the cat sat on the mat", "a dog ran"]] * 20])
    out = tmp_path / "tok"
    mine = out / ".scans" / "mine"
    mine.mkdir(parents=True)
    (mine / "notes.arrow.json").write_text("{}")
    old = out / ".scans" / "0123456789abcdef"   # as a killed run of other options leaves it: marked
    old.mkdir()
    (old / ".bertkit-scans").touch()
    (old / "shard-00000.arrow.json").write_text("{}")
    listed = out / ".scans" / "fedcba9876543210"   # a marked folder that lists its scans; a file of yours beside
    listed.mkdir()
    (listed / ".bertkit-scans").write_text('["shard-00001.arrow.json"]')
    (listed / "shard-00001.arrow.json").write_text("{}")
    (listed / "yours.arrow.json").write_text("keep")
    train_tokenizer(corpus, out, TokenizerConfig(vocab_size=200, progress=False))
    assert (mine / "notes.arrow.json").read_text() == "{}"
    assert (listed / "yours.arrow.json").read_text() == "keep" and sorted(p.name for p in listed.iterdir()) == [
        "yours.arrow.json"]
    assert not old.exists() and sorted(p.name for p in (out / ".scans").iterdir()) == ["fedcba9876543210", "mine"]


def test_staging_removes_only_its_own_leftovers(run, tmp_path):
    out = tmp_path / "export"
    assert export_cli(run, out).exit_code == 0
    (out / ".bertkit-staging-notes.txt").write_text("not a folder: stays\n")
    (out / ".bertkit-staging-old").mkdir()  # as a killed export leaves: marked
    (out / ".bertkit-staging-old" / ".bertkit-staging").touch()
    (out / ".bertkit-staging-mine").mkdir()  # a user's folder of that name: no mark, stays with its file
    (out / ".bertkit-staging-mine" / "keep.txt").write_text("mine\n")
    assert export_cli(run, out).exit_code == 0
    assert (out / ".bertkit-staging-notes.txt").read_text() == "not a folder: stays\n"
    assert sorted(p.name for p in out.glob(".bertkit-staging*")) == [".bertkit-staging-mine",
                                                                    ".bertkit-staging-notes.txt"]
    assert (out / ".bertkit-staging-mine" / "keep.txt").read_text() == "mine\n"


def test_overwrite_over_a_stray_metrics_file_deletes_nothing_of_the_users(run, tmp_path):
    out = tmp_path / "thesis"
    out.mkdir()
    (out / "metrics.json").write_text(json.dumps({"task": "classify", "settings": {}}))  # looks like a fine-tuning
    (out / "thesis.tex").write_text("\\chapter{}\n")
    quick_finetune(run.parent / "model", tmp_path / "data", run=out, overwrite=True)
    assert (out / "thesis.tex").read_text() == "\\chapter{}\n"


def test_a_folder_of_the_users_needs_overwrite_and_keeps_its_files(run, tmp_path):
    data, out = glue_dir(tmp_path / "glue", run.parent / "model"), tmp_path / "mine"
    out.mkdir()
    (out / "paper.pdf").write_bytes(b"%PDF-1.4\n")
    r = finetune_glue(data, run.parent / "model", out)
    assert r.exit_code == 1 and "files no bertkit command wrote there (paper.pdf)" in r.output, r.output
    r = finetune_glue(data, run.parent / "model", out, "--overwrite")
    assert r.exit_code == 0, r.output
    assert (out / "paper.pdf").read_bytes() == b"%PDF-1.4\n" and (out / "metrics.json").is_file()


# ---------------------------------------------------------------- 2. replace, never empty; one writer at a time

def test_a_re_export_killed_after_its_lock_leaves_the_previous_export_whole(run, tmp_path):
    out = tmp_path / "export"
    assert export_cli(run, out).exit_code == 0
    before = visible_files(out)
    script = textwrap.dedent(f"""
        import os, signal
        import bertkit.pretrain.checkpoints as c
        real = c.save_pretrained
        def dying(model, out_dir, **kw):
            real(model, out_dir, **kw)      # half of the new export written...
            os.kill(os.getpid(), signal.SIGKILL)
        c.save_pretrained = dying
        c.export({str(run)!r}, {str(out)!r})
    """)
    p = subprocess.run([sys.executable, "-c", script], env=env_without_dist(), capture_output=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr.decode()[-2000:]
    assert visible_files(out) == before  # the old export, whole; the new one's files only in the hidden staging folder
    assert CliRunner().invoke(main, ["verify", str(out)]).exit_code == 0
    r = export_cli(run, out)  # the same command again: the dead process's lock taken over, the staging replaced
    assert r.exit_code == 0, r.output
    assert not list(out.glob(".bertkit-staging*"))


def test_two_fine_tunings_into_one_folder_one_refuses_naming_the_other(run, tmp_path):
    from bertkit.fileio import FolderLockedError, _process_start

    out = tmp_path / "ft"
    out.mkdir()
    other = subprocess.Popen(["sleep", "60"])
    try:
        (out / ".bertkit.lock").write_text(json.dumps({
            "host": os.uname().nodename, "pid": other.pid, "process_start": _process_start(other.pid),
            "what": "finetune", "since": "now", "command": "bertkit finetune glue --out ft"}))
        with pytest.raises(FolderLockedError, match=rf"{out} is being written by process {other.pid} on this host "
                                                    r"\(finetune, since now: bertkit finetune glue --out ft\)"):
            quick_finetune(run.parent / "model", tmp_path / "data", run=out)
        assert sorted(p.name for p in out.iterdir()) == [".bertkit.lock"]
    finally:
        other.kill()
        other.wait()
    summary = quick_finetune(run.parent / "model", tmp_path / "data", run=out)  # a dead writer's lock is taken over
    assert summary["task"] == "classify" and not (out / ".bertkit.lock").exists()


def test_a_pretraining_stopped_by_its_launcher_before_training_leaves_no_folder(run, tmp_path):
    """A launcher stops a rank with SIGTERM when another fails (a bad --init-from): the folder it made goes."""
    out = tmp_path / "run2"
    script = textwrap.dedent(f"""
        import os, signal
        import bertkit.pretrain.run as r
        def stopped(*a, **k):
            os.kill(os.getpid(), signal.SIGTERM)
        r.build_model = stopped
        from bertkit.pretrain import PretrainConfig, pretrain
        pretrain(PretrainConfig(instances={str(run.parent / 'inst')!r}, out={str(out)!r},
                                init_from={str(run.parent / 'model')!r}, max_steps=2, micro_batch=8,
                                optimizer="adamw", num_workers=0, progress=False, report_to="none"))
    """)
    p = subprocess.run([sys.executable, "-c", script], env=env_without_dist(), capture_output=True, timeout=300)
    assert p.returncode == 128 + signal.SIGTERM, p.stderr.decode()[-2000:]
    assert not out.exists()


def test_a_full_disk_in_finetune_glue_is_one_line(run, tmp_path, monkeypatch):
    import bertkit.finetune.train as train

    data = glue_dir(tmp_path / "glue", run.parent / "model")
    real = train.atomic_write_json

    def full(path, *a, **k):
        if path.name == "metrics.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, *a, **k)
    monkeypatch.setattr(train, "atomic_write_json", full)
    r = finetune_glue(data, run.parent / "model", tmp_path / "ft")
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert f"{tmp_path / 'ft'}: no space left on the device while writing ({tmp_path / 'ft' / 'metrics.json'})" \
        in r.output and "run the same command again" in r.output


def test_a_full_disk_in_a_korean_evaluation_is_one_line(tmp_path, monkeypatch):
    import bertkit.fileio as fileio
    from bertkit.fileio import DiskError
    from bertkit.finetune.korean import evaluate

    def fine_tune(task, folder, rate, seed):
        raise OSError(errno.ENOSPC, "No space left on device", str(folder / "metrics.json"))
    with pytest.raises(DiskError, match=rf"{tmp_path / 'eval'}: no space left on the device while writing .*"
                                        r"finished tasks are kept"):
        evaluate(tmp_path / "eval", ["nsmc"], fine_tune, {"model": "m"}, say=lambda m: None)
    real = fileio.atomic_write_bytes
    monkeypatch.setattr(fileio, "atomic_write_bytes", lambda *a, **k: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(DiskError):
        evaluate(tmp_path / "eval2", ["nsmc"], fine_tune, {"model": "m"}, say=lambda m: None)
    monkeypatch.setattr(fileio, "atomic_write_bytes", real)


def test_a_full_disk_in_report_is_one_line(run, tmp_path, monkeypatch):
    import bertkit.fileio as fileio

    monkeypatch.setattr(fileio, "atomic_write_bytes", lambda path, *a, **k: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device", str(path))))
    r = CliRunner().invoke(main, ["report", str(run), "--out", str(tmp_path / "page.html")])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert f"{tmp_path}: no space left on the device while writing" in r.output
    assert not (tmp_path / "page.html").exists()


def test_a_corpus_overwrite_removes_only_the_removed_shards_it_listed(tmp_path):
    """prepare-corpus --overwrite takes away an earlier run's shards (--keep-removed's too) by its manifest (a user's
    file of such a name, or one changed since, stays); the cleaning steps' folders are never links."""
    from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus

    docs = ["A sentence of some length here. Another one follows it.", "x", "A sentence of some length here. "
            "Another one follows it."]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    config = dict(holdout=0, min_chars=10, progress=False, keep_removed=True)
    prepare_corpus([tmp_path / "in.jsonl"], tmp_path / "out", CorpusConfig(**config))
    (tmp_path / "out" / "removed" / "removed-00007.arrow").write_text("mine\n")   # the user's, of that name
    (tmp_path / "out" / "holdout-00009.arrow").write_text("mine too\n")            # not in the manifest either
    prepare_corpus([tmp_path / "in.jsonl"], tmp_path / "out", CorpusConfig(**{**config, "keep_removed": False},
                                                                          overwrite=True))
    assert [p.name for p in (tmp_path / "out" / "removed").iterdir()] == ["removed-00007.arrow"]
    assert (tmp_path / "out" / "holdout-00009.arrow").read_text() == "mine too\n"


def test_an_overwrite_after_a_kill_mid_merge_leaves_no_stale_shard(tmp_path, monkeypatch):
    """Shards the merge put in place before a kill are listed in the unfinished manifest at once, so --overwrite with
    other options (fewer shards) takes them away: nothing of the killed run stays beside the new output."""
    from bertkit.pipelines import corpus_merge
    from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus

    docs = [f"Document {i} holds a sentence of some length. And a second sentence {i * 7} here." for i in range(60)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    real_flush, flushed = corpus_merge.ShardWriter.flush, []

    def killed_on_the_third(self):
        if self.writer is not None:
            flushed.append(self.split)
            if len(flushed) == 3:
                raise KeyboardInterrupt   # as a kill would stop it
        return real_flush(self)

    monkeypatch.setattr(corpus_merge.ShardWriter, "flush", killed_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        prepare_corpus([tmp_path / "in.jsonl"], tmp_path / "out", CorpusConfig(holdout=0, progress=False,
                                                                                shard_size=1024))
    monkeypatch.setattr(corpus_merge.ShardWriter, "flush", real_flush)
    assert sorted(p.name for p in (tmp_path / "out").glob("*.arrow")) == ["shard-00000.arrow", "shard-00001.arrow"]
    prepare_corpus([tmp_path / "in.jsonl"], tmp_path / "out", CorpusConfig(holdout=0, progress=False,
                                                                            shard_size=1 << 20, overwrite=True))
    assert sorted(p.name for p in (tmp_path / "out").glob("*.arrow")) == ["shard-00000.arrow"]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["complete"] is True
