"""No write goes through a link, and no listed name leaves its folder (issue 36, part 2): a symlink planted where
bertkit writes (an export's tokenizer files, a run's tokenizer/ and metrics.jsonl) is replaced by a new file and
what it pointed at is untouched; a manifest, checkpoint.json or weights index naming `../x` or an absolute path is
refused naming the entry."""
import json
import shutil

import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.fileio import atomic_copy, file_entry
from bertkit.pretrain import PretrainConfig, export, pretrain
from tests.helpers import tiny_run, write_corpus


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("links"))


def config(inst, out, **kw):
    args = dict(instances=str(inst), out=str(out), model=str(inst.parent / "model.json"), max_steps=2, micro_batch=8,
                optimizer="adamw", num_workers=0, eval_every=0, save_every=2, progress=False, report_to="none")
    return PretrainConfig(**{**args, **kw})


def victim_file(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file\n")
    return victim


def test_atomic_copy_replaces_a_link(tmp_path):
    victim, src = victim_file(tmp_path), tmp_path / "src.txt"
    src.write_text("new\n")
    (tmp_path / "dst.txt").symlink_to(victim)
    atomic_copy(src, tmp_path / "dst.txt")
    assert not (tmp_path / "dst.txt").is_symlink() and (tmp_path / "dst.txt").read_text() == "new\n"
    assert victim.read_text() == "someone else's file\n"


def test_export_over_a_link_replaces_it(run, tmp_path):
    _, run_dir = run
    victim, out = victim_file(tmp_path), tmp_path / "export"
    export(run_dir, out)
    for name in ("vocab.txt", "config.json", "model.safetensors"):
        (out / name).unlink()
        (out / name).symlink_to(victim)
    export(run_dir, out)
    assert victim.read_text() == "someone else's file\n"
    for name in ("vocab.txt", "config.json", "model.safetensors"):
        assert not (out / name).is_symlink()
    assert CliRunner().invoke(main, ["verify", str(out)]).exit_code == 0


def test_resume_over_links_in_the_run_folder(run, tmp_path, clean_dist_env, capfd):
    inst, run_dir = run
    victim, mine = victim_file(tmp_path), tmp_path / "run"
    shutil.copytree(run_dir, mine)
    for path in (mine / "metrics.jsonl", mine / "tokenizer" / "vocab.txt"):
        path.unlink()
        path.symlink_to(victim)
    pretrain(config(inst, mine, max_steps=4, resume=True))
    assert victim.read_text() == "someone else's file\n"
    assert not (mine / "metrics.jsonl").is_symlink() and not (mine / "tokenizer" / "vocab.txt").is_symlink()
    assert "metrics.jsonl was a symbolic link; replaced by a new file" in capfd.readouterr().err
    assert json.loads((mine / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 4


@pytest.mark.parametrize("name", ["../outside.arrow", "/etc/passwd", "a/../../b"])
def test_a_manifest_entry_outside_its_folder_is_refused(tmp_path, name):
    corpus = write_corpus(tmp_path / "corpus", [[["a b c d.", "e f g h."]] * 2])
    manifest = json.loads((corpus / "manifest.json").read_text())
    manifest["shards"][0]["file"] = name
    (corpus / "manifest.json").write_text(json.dumps(manifest))
    r = CliRunner().invoke(main, ["train-tokenizer", str(corpus), "--out", str(tmp_path / "tok"),
                                  "--vocab-size", "200"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"lists the file {name!r}, which is not inside {corpus}" in r.output
    v = CliRunner().invoke(main, ["verify", str(corpus)])
    assert v.exit_code == 1 and f"lists the file {name!r}" in v.output


def test_a_checkpoint_entry_outside_its_folder_is_refused(run, tmp_path):
    _, run_dir = run
    mine = tmp_path / "run"
    shutil.copytree(run_dir, mine)
    victim = victim_file(tmp_path)
    marker = mine / "checkpoints" / "global_step2" / "checkpoint.json"
    meta = json.loads(marker.read_text())
    meta["files"]["../../../victim.txt"] = file_entry(victim)
    marker.write_text(json.dumps(meta))
    r = CliRunner().invoke(main, ["export", str(mine), "--out", str(tmp_path / "e")])
    assert r.exit_code == 1 and "lists the file '../../../victim.txt', which is not inside" in r.output


def test_a_weights_index_naming_a_file_outside_is_refused(run, tmp_path):
    _, run_dir = run
    out = tmp_path / "export"
    export(run_dir, out)
    (out / "model.safetensors").rename(tmp_path / "elsewhere.safetensors")
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"bert.embeddings.word_embeddings.weight": str(tmp_path / "elsewhere.safetensors")}}))
    r = CliRunner().invoke(main, ["fill-mask", "--model", str(out), "w1 [MASK] w2"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "model.safetensors.index.json: lists the file" in r.output and "which is not inside" in r.output
