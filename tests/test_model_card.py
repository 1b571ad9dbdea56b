"""An export is ready to publish: a model card (README.md with the Hub's metadata header and what the run's records
say), and no path of the machine that made it in any of its files."""
import json

import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.outputs import WRITTEN, _stamp
from bertkit.pretrain.model_card import languages
from tests.helpers import tiny_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("card")
    _, run = tiny_run(root)
    _, other = tiny_run(root / "elsewhere", out="run")   # another run of the same folder name
    return root, run, other


def test_an_export_has_a_card_and_no_local_path(runs):
    root, run, _ = runs
    out = root / "model"
    r = CliRunner().invoke(main, ["export", str(run), "--out", str(out)])
    assert r.exit_code == 0, r.output
    card = (out / "README.md").read_text(encoding="utf-8")
    header = card.split("---\n")[1].splitlines()
    assert header[:3] == ["language: [en]", "library_name: transformers", "pipeline_tag: fill-mask"]
    assert "# A BERT encoder pretrained with bertkit" in card and "2 steps (global_step2)" in card
    assert "AutoModelForMaskedLM.from_pretrained" in card and "## Limits" in card
    manifest = json.loads((out / "manifest.json").read_text())
    assert "README.md" in manifest["files"] and manifest["run"] == "run"
    places = {str(root), str(root.resolve())}
    for f in out.rglob("*"):
        if f.is_file():
            text = f.read_bytes().decode("utf-8", "replace")
            assert not any(p in text for p in places), f"{f.name} names a local path"


def test_another_run_of_the_same_name_is_still_another_run(runs):
    root, run, other = runs
    out = root / "model-b"
    assert CliRunner().invoke(main, ["export", str(run), "--out", str(out)]).exit_code == 0
    again = CliRunner().invoke(main, ["export", str(run), "--out", str(out)])
    assert again.exit_code == 0, again.output   # the same run again: replaced without asking
    r = CliRunner().invoke(main, ["export", str(other), "--out", str(out)])
    assert r.exit_code == 1 and "--overwrite" in r.output, r.output


def rewrite_as_bertkit(folder, name, data):
    """A file of an earlier export changed as that bertkit version would have written it (the record follows)."""
    (folder / name).write_text(json.dumps(data))
    record = json.loads((folder / WRITTEN).read_text())
    record["files"][name] = _stamp(folder / name)
    (folder / WRITTEN).write_text(json.dumps(record))


def test_an_export_from_before_recorded_the_runs_path_and_is_still_known(runs):
    root, run, other = runs
    out = root / "model-old"
    assert CliRunner().invoke(main, ["export", str(run), "--out", str(out)]).exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.pop("run_id")
    manifest["run"] = str(run.resolve())   # how exports recorded their run until 2026-12-02
    rewrite_as_bertkit(out, "manifest.json", manifest)
    same = CliRunner().invoke(main, ["export", str(run), "--out", str(out)])
    assert same.exit_code == 0, same.output
    manifest["run"] = str(other.resolve())
    manifest.pop("run_id", None)
    rewrite_as_bertkit(out, "manifest.json", manifest)
    r = CliRunner().invoke(main, ["export", str(run), "--out", str(out)])
    assert r.exit_code == 1 and "--overwrite" in r.output, r.output


def test_a_random_start_says_it_is_untrained(runs):
    root, run, _ = runs
    out = root / "random"
    assert CliRunner().invoke(main, ["export", str(run), "--out", str(out), "--random-weights"]).exit_code == 0
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "random-weights]" in card and "**Untrained**" in card and "steps (" not in card


def test_languages_come_from_the_vocabularys_scripts():
    korean = ["[PAD]", "[UNK]", "대한", "##민국", "##의", "서울", "ㅠ", "##ㅠ"]
    assert languages(korean) == ["ko"]
    assert languages(korean + ["the", "##ing", "seoul", "capital"]) == ["en", "ko"]   # most letters first
    assert languages(["[PAD]", "東京", "##は", "です"]) == ["ja"]
    assert languages(["[PAD]", "[UNK]"]) == []
