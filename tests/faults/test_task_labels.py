"""Labels are checked against the task (issue 36, part 6): a GLUE file with a label outside the task's set stops
naming the file, line and label, before any model is loaded."""
import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.errors import DataError
from bertkit.finetune import glue


def write_task(root, folder, header, rows):
    d = root / folder
    d.mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        (d / name).write_text("\t".join(header) + "\n" + "".join("\t".join(r) + "\n" for r in rows))
    return d


@pytest.mark.parametrize("task,folder,header,bad,expected", [
    ("rte", "RTE", ["index", "sentence1", "sentence2", "label"], "contradiction", "'entailment' or 'not_entailment'"),
    ("sst2", "SST-2", ["sentence", "label"], "2", "'0' or '1'"),
    ("mrpc", "MRPC", ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"], "yes", "'0' or '1'"),
    ("stsb", "STS-B", ["index", "sentence1", "sentence2", "score"], "7.5", "a score from 0 to 5"),
])
def test_a_label_outside_the_task_is_named(tmp_path, task, folder, header, bad, expected):
    good = {"rte": "entailment", "sst2": "1", "mrpc": "1", "stsb": "3.2"}[task]

    def row(label):
        r = {"label": label, "Quality": label, "score": label}
        return [r.get(h, "a sentence") for h in header]

    write_task(tmp_path, folder, header, [row(good), row(good), row(bad)])
    with pytest.raises(DataError, match=rf"{folder}/train.tsv:4: label '{bad}' is not one of {folder}'s "
                                        rf"\({expected}\)"):
        glue.read_glue(task, tmp_path, "train")
    (tmp_path / "model").mkdir()  # the files are read before the model is opened
    r = CliRunner().invoke(main, ["finetune", "glue", "--task", task, "--data-dir", str(tmp_path), "--model",
                                  str(tmp_path / "model"), "--out", str(tmp_path / "out")])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"train.tsv:4: label '{bad}' is not one of {folder}'s" in r.output


def test_the_task_set_is_the_label_order():
    """MNLI/QNLI/RTE classes in the order label_list gave them, so a saved model's label ids keep their meaning."""
    from bertkit.finetune.classify import TextExample, label_list

    for spec in glue.GLUE_TASKS.values():
        if not spec.regression:
            assert list(spec.labels) == label_list([TextExample(1, "", None, y) for y in spec.labels])
