"""Issue 72, class 5: each case that did something else without a word, or gave a traceback, now says what happened
in one line naming the file or flag and the fix (or does the right thing)."""
import json
import shutil

import pytest
import torch
from click.testing import CliRunner

from bertkit.cli import main
from tests.helpers import TINY, make_instances_dir, quick_finetune, tiny_run_exported


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_run_exported(tmp_path_factory.mktemp("messages"))


def pretrain_args(inst, out, *more):
    return ["pretrain", "--instances", str(inst), "--out", str(out), "--max-steps", "2", "--micro-batch", "8",
            "--optimizer", "adamw", "--num-workers", "0", "--no-progress", "--report-to", "none", *more]


def test_a_modernbert_model_flag_beside_a_bert_init_from_is_refused(run, tmp_path, clean_dist_env):
    r = CliRunner().invoke(main, pretrain_args(run.parent / "inst", tmp_path / "r", "--model", "modernbert-tiny",
                                               "--init-from", str(run.parent / "model")))
    assert r.exit_code == 1 and "--model modernbert-tiny is a ModernBERT, but --init-from" in r.output, r.output
    assert "holds a BERT" in r.output and not (tmp_path / "r").exists()


def test_an_unknown_model_preset_is_one_line(run, tmp_path, clean_dist_env):
    r = CliRunner().invoke(main, pretrain_args(run.parent / "inst", tmp_path / "r", "--model", "huge"))
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert "--model huge: no such preset, file or folder; choose one of tiny, mini" in r.output


def test_eval_every_without_a_held_out_split_says_so(tmp_path, clean_dist_env):
    inst = make_instances_dir(tmp_path / "inst", n=64, holdout=0, max_len=32)
    (tmp_path / "model.json").write_text(json.dumps(TINY))
    r = CliRunner().invoke(main, pretrain_args(inst, tmp_path / "r", "--model", str(tmp_path / "model.json"),
                                               "--eval-every", "1"))
    assert r.exit_code == 0, r.output
    assert f"note: {inst} has no held-out split, so nothing is evaluated (--eval-every 1" in r.output


@pytest.mark.parametrize("states", [["not", "a", "dict"], {"module": "weights"}, {"optimizer": {}}])
def test_model_states_that_pass_the_scan_but_are_malformed_are_one_line(run, tmp_path, states):
    theirs = tmp_path / "theirs"
    shutil.copytree(run, theirs)
    tag = (theirs / "checkpoints" / "latest").read_text().strip()
    for f in (theirs / "checkpoints" / tag).glob("*.pt"):
        torch.save(states, f)
    (theirs / "checkpoints" / tag / "checkpoint.json").unlink(missing_ok=True)
    r = CliRunner().invoke(main, ["export", str(theirs), "--out", str(tmp_path / "e")])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert f"{theirs / 'checkpoints' / tag}: its model states" in r.output and "--checkpoint" in r.output


def test_fill_mask_on_a_run_folder_says_to_export_it(run):
    r = CliRunner().invoke(main, ["fill-mask", "--model", str(run), "w1 [MASK]"])
    assert r.exit_code == 1 and f"{run}: a pretraining run folder, not a model folder; export it first: bertkit " \
        f"export {run} --out MODEL_DIR" in r.output, r.output


@pytest.mark.parametrize("line, found", [("w3 NN B-PER extra", 4), ("w3 B-PER", 2)])
def test_a_ner_line_with_another_number_of_columns_is_refused(tmp_path, line, found):
    from bertkit.errors import DataError
    from bertkit.finetune.ner import read_conll

    (tmp_path / "train.txt").write_text(f"w1 NN O\nw2 NN B-LOC\n\n{line}\nw4 NN O\n")
    with pytest.raises(DataError, match=rf"train.txt:4: {found} whitespace-separated fields, but line 1 has 3; "
                                        "every word line needs the same columns"):
        read_conll(tmp_path / "train.txt")


def test_a_korquad_file_with_a_repeated_question_id_is_refused(tmp_path):
    from bertkit.finetune.squad import SquadFormatError, read_squad

    qa = {"id": "q1", "question": "무엇?", "answers": [{"text": "사과", "answer_start": 0}]}
    data = {"data": [{"title": "t", "paragraphs": [{"context": "사과는 과일이다.", "qas": [qa, dict(qa)]}]}]}
    (tmp_path / "dev.json").write_text(json.dumps(data, ensure_ascii=False))
    with pytest.raises(SquadFormatError, match=r"question id q1: the id q1 is given to an earlier question too"):
        read_squad(tmp_path / "dev.json", training=False)


def test_a_report_of_entity_types_holding_dollar_signs_draws_them_as_text(tmp_path):
    out = tmp_path / "ner"
    out.mkdir()
    kind = "f1 $\\frac$"  # an entity type as a tagged file may spell it; drawn as math, matplotlib cannot parse it
    (out / "metrics.json").write_text(json.dumps({"task": "ner", "settings": {}, "best_metric": "f1",
                                                  "epochs": [{"epoch": 1, "f1": 0.5, kind: 0.2}]}))
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, f"eval_{kind}": 0.1 * s}) + "\n"
                                               for s in (1, 2)))
    r = CliRunner().invoke(main, ["report", str(out)])
    assert r.exit_code == 0, r.output
    assert (out / "report.html").is_file()


@pytest.mark.parametrize("state", ["text", {"step": "3"}, "another model"])
def test_a_saved_fine_tuning_state_bertkit_did_not_write_is_named_and_kept(run, tmp_path, capsys, state):
    """A resume/state.pt that is not what bertkit writes may be the user's: named, kept, and the run stops before
    its first step (its next save would replace it). A state bertkit wrote for another model starts afresh."""
    from bertkit.fileio import FolderNotOwnedError

    out = tmp_path / "ft"
    (out / "resume").mkdir(parents=True)
    ours = state == "another model"
    if ours:
        quick_finetune(run.parent / "model", tmp_path / "data", run=tmp_path / "first")
        from bertkit.finetune.train import STATE_KEYS

        state = {k: kind() if isinstance(kind, type) else 0 for k, kind in STATE_KEYS.items()}
        state.update(summary=json.dumps({"task": "classify", "settings": {}}), model={"w": torch.zeros(3)})
    torch.save(state, out / "resume" / "state.pt")
    before = (out / "resume" / "state.pt").read_bytes()
    (out / "metrics.json").write_text(json.dumps({"task": "classify", "settings": {}}))
    path = out / "resume" / "state.pt"
    if ours:
        summary = quick_finetune(run.parent / "model", tmp_path / "data", run=out)
        assert summary["task"] == "classify"
        assert f"{path}: a fine-tuning state of another model (" in capsys.readouterr().out
        assert not (out / "resume").exists()   # bertkit's: removed when the run ended
        return
    with pytest.raises(FolderNotOwnedError, match="not a fine-tuning state bertkit wrote .*--checkpoint-minutes 0"):
        quick_finetune(run.parent / "model", tmp_path / "data", run=out)
    assert path.read_bytes() == before
