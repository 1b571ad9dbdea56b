"""No command writes into a folder it does not own: each writes into a new or empty folder or its own earlier output
(to resume or overwrite), and refuses anything else naming what is there, leaving it untouched; a refused run
leaves no empty folder behind (bertkit.fileio.check_folder_owned, used by every writer)."""
import json
import re

import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.fileio import folder_kind
from tests.helpers import TINY, make_instances_dir, write_corpus


def stamp(path):
    """How bertkit.outputs records a file it wrote: its inode and modification time."""
    st = path.lstat()
    return [st.st_ino, st.st_mtime_ns]


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    """A corpus, an instances folder, a short run and its export, made once."""
    from bertkit.pretrain import PretrainConfig, export, pretrain

    root = tmp_path_factory.mktemp("owned")
    corpus = write_corpus(root / "corpus", [[["a b c d e f g h.", "i j k l m n o p."]] * 3])
    inst = make_instances_dir(root / "inst", n=64, holdout=8, max_len=32)
    (root / "model.json").write_text(json.dumps(TINY))
    with pytest.MonkeyPatch.context() as mp:
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            mp.delenv(k, raising=False)
        pretrain(PretrainConfig(instances=str(inst), out=str(root / "run"), model=str(root / "model.json"),
                                max_steps=2, micro_batch=8, optimizer="adamw", num_workers=0, eval_every=0,
                                save_every=2, progress=False, report_to="none"))
    export(root / "run", root / "export")
    user = root / "user-model"
    user.mkdir()
    (user / "config.json").write_text('{"model_type": "bert", "note": "mine"}')
    return {"corpus": corpus, "instances": inst, "run": root / "run", "export": root / "export", "user": user}


def test_each_folder_is_told_apart(stages):
    assert [folder_kind(stages[k]) for k in ("corpus", "instances", "run", "export", "user")] == \
        ["prepare-corpus", "make-instances", "pretrain", "export", ""]


@pytest.mark.parametrize("target", ["corpus", "instances", "run", "user"])
def test_export_refuses_a_folder_it_does_not_own(stages, target):
    before = snapshot(stages[target])
    r = CliRunner().invoke(main, ["export", str(stages["run"]), "--out", str(stages[target])])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    assert str(stages[target]) in r.output and "Choose another folder" in r.output
    assert {"corpus": "a corpus folder", "instances": "an instances folder", "run": "a pretraining run folder",
            "user": "files no bertkit command wrote there (config.json)"}[target] in r.output
    assert snapshot(stages[target]) == before


def test_export_again_into_its_own_folder(stages):
    r = CliRunner().invoke(main, ["export", str(stages["run"]), "--out", str(stages["export"])])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("command", [
    ["prepare-corpus", "{corpus}", "--out", "{target}"],
    ["train-tokenizer", "{corpus}", "--out", "{target}"],
    ["make-instances", "{corpus}", "--tokenizer", "{instances}", "--out", "{target}"],
])
@pytest.mark.parametrize("target", ["instances", "run", "export"])
def test_the_data_stages_refuse_other_stages_folders(stages, command, target):
    if command[0] == "make-instances" and target == "instances":
        return  # its own kind: resuming or overwriting is make-instances' own business
    before = snapshot(stages[target])
    args = [a.format(corpus=stages["corpus"], instances=stages["instances"], target=stages[target]) for a in command]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    assert "Choose another folder" in r.output
    assert snapshot(stages[target]) == before


def test_pretrain_refuses_an_export_and_finetune_refuses_a_run(stages, tmp_path, clean_dist_env):
    from tests.helpers import quick_finetune

    before = snapshot(stages["export"])
    r = CliRunner().invoke(main, ["pretrain", "--instances", str(stages["instances"]), "--out", str(stages["export"]),
                                  "--model", "tiny", "--max-steps", "1", "--no-progress"])
    assert r.exit_code == 1 and "an exported model folder" in r.output, r.output
    assert snapshot(stages["export"]) == before
    from bertkit.fileio import FolderNotOwnedError

    with pytest.raises(FolderNotOwnedError, match="a pretraining run folder"):
        quick_finetune(stages["export"], tmp_path / "data", run=stages["run"])
    assert quick_finetune(stages["export"], tmp_path / "ft")["epochs"]


def test_a_refused_run_leaves_no_empty_folder(stages, tmp_path):
    out = tmp_path / "new" / "corpus"
    r = CliRunner().invoke(main, ["prepare-corpus", str(tmp_path / "no-such-input"), "--out", str(out)])
    assert r.exit_code != 0
    assert not out.exists()


def test_report_replaces_only_its_own_page(stages):
    user_file = stages["user"] / "config.json"
    before = user_file.read_bytes()
    r = CliRunner().invoke(main, ["report", str(stages["run"]), "--out", str(user_file)])
    assert r.exit_code == 1 and "is not a page bertkit report wrote" in r.output, r.output
    assert user_file.read_bytes() == before
    for _ in range(2):  # the default page, written again over itself
        r = CliRunner().invoke(main, ["report", str(stages["run"])])
        assert r.exit_code == 0, r.output


def test_an_export_of_another_run_needs_overwrite_and_leaves_nothing_stale(stages, tmp_path):
    """Issue 36, part 3: another run's export is refused naming both runs; --overwrite replaces it whole (a stale
    generator/ of an ELECTRA export included); the same run's export is its own."""
    import shutil

    other, out = tmp_path / "other-run", tmp_path / "export"
    shutil.copytree(stages["run"], other)
    assert CliRunner().invoke(main, ["export", str(stages["run"]), "--out", str(out)]).exit_code == 0
    (out / "generator").mkdir()
    (out / "generator" / "config.json").write_text("{}")  # as an ELECTRA export leaves, and records
    record = json.loads((out / ".bertkit-written.json").read_text())
    record["files"]["generator/config.json"] = stamp(out / "generator" / "config.json")
    (out / ".bertkit-written.json").write_text(json.dumps(record))
    before = snapshot(out)
    r = CliRunner().invoke(main, ["export", str(other), "--out", str(out)])
    assert r.exit_code == 1 and "holds an earlier export of another run" in r.output, r.output
    # each run by its name and a digest of where it is (an export names no local path)
    assert re.search(r"run run \([0-9a-f]{16}\) \(this command: other-run \([0-9a-f]{16}\)\)", r.output), r.output
    assert "--overwrite" in r.output
    assert snapshot(out) == before
    r = CliRunner().invoke(main, ["export", str(other), "--out", str(out), "--overwrite"])
    assert r.exit_code == 0, r.output
    assert not (out / "generator").exists()
    assert json.loads((out / "manifest.json").read_text())["run"] == "other-run"   # by name: no local path
    (out / "generator").mkdir()  # made by hand: not bertkit's, so kept
    (out / "generator" / "notes.txt").write_text("mine")
    r = CliRunner().invoke(main, ["export", str(other), "--out", str(out)])  # its own: no flag
    assert r.exit_code == 0 and "kept generator/notes.txt (bertkit did not write them" in r.output, r.output
    assert (out / "generator" / "notes.txt").read_text() == "mine"
    assert CliRunner().invoke(main, ["verify", str(out)]).exit_code == 0


def test_a_fine_tuning_of_another_task_needs_overwrite(stages, tmp_path):
    from tests.helpers import quick_finetune

    out = tmp_path / "ft"
    out.mkdir()
    (out / "metrics.json").write_text(json.dumps({"task": "rte", "settings": {}, "best": {"accuracy": 0.6}}))
    (out / "predictions.json").write_text("{}")
    (out / ".bertkit-written.json").write_text(json.dumps(
        {"files": {name: stamp(out / name) for name in ("metrics.json", "predictions.json")}}))
    from bertkit.fileio import FolderNotOwnedError

    with pytest.raises(FolderNotOwnedError, match=r"holds an earlier fine-tuning of another task: task rte "
                                                  r"\(this command: classify\).*--overwrite"):
        quick_finetune(stages["export"], tmp_path / "data", run=out)
    assert (out / "predictions.json").exists()
    summary = quick_finetune(stages["export"], tmp_path / "data", run=out, overwrite=True)
    assert summary["task"] == "classify" and not (out / "predictions.json").exists()
