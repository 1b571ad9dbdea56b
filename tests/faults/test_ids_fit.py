"""Ids always fit the model (issue 36, part 4): a tokenizer file changed since its folder was written, a tokenizer
whose ids run past the model's embeddings, or a tokenizer.json with more ids than its vocab.txt stop with a message
before anything is written or trained."""

import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.pretrain import export
from bertkit.tokenization import build_tokenizer, vocab_text
from tests.helpers import TINY, tiny_run, toy_vocab, write_corpus


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("ids")
    _, run = tiny_run(root)
    return export(run, root / "export")


def copy_of(folder, tmp_path):
    import shutil

    shutil.copytree(folder, tmp_path / "model")
    return tmp_path / "model"


def test_a_tokenizer_file_changed_since_the_export_is_named(exported, tmp_path):
    """Same token count, other bytes: only the size the manifest recorded tells it."""
    model = copy_of(exported, tmp_path)
    tokens = (model / "vocab.txt").read_text().splitlines()
    tokens[-1] += "x"
    (model / "vocab.txt").write_text("\n".join(tokens) + "\n")
    r = CliRunner().invoke(main, ["fill-mask", "--model", str(model), "w1 [MASK] w2"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"{model / 'vocab.txt'}: " in r.output and "records" in r.output and "bertkit verify" in r.output


def test_a_tokenizer_with_more_ids_than_the_embeddings_is_refused(exported, tmp_path):
    model = copy_of(exported, tmp_path)
    (model / "manifest.json").unlink()  # as an HF folder: nothing recorded, the ids are what is checked
    tok = build_tokenizer({t: i for i, t in enumerate(toy_vocab())})
    tok.add_tokens([f"new{i}" for i in range(20)])
    (model / "tokenizer.json").write_text(tok.to_str())
    n = len(toy_vocab()) + 20
    r = CliRunner().invoke(main, ["fill-mask", "--model", str(model), "w1 [MASK] w2"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"tokenizer.json: gives token ids up to {n - 1}, but tensor 'bert.embeddings.word_embeddings.weight' " \
           f"has only {TINY['vocab_size']} word embeddings" in r.output
    (tmp_path / "t.tsv").write_text("sentence\tlabel\na b\t0\nc d\t1\n")
    f = CliRunner().invoke(main, ["finetune", "classify", "--model", str(model), "--train-file",
                                  str(tmp_path / "t.tsv"), "--dev-file", str(tmp_path / "t.tsv"), "--text-a",
                                  "sentence", "--out", str(tmp_path / "ft")])
    assert f.exit_code == 1 and "gives token ids up to" in f.output and "Traceback" not in f.output


def test_make_instances_refuses_a_tokenizer_json_with_ids_past_vocab_txt(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", [[["w1 w2 w3 w4.", "w5 w6 w7 w8."]] * 4])
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    (tok_dir / "vocab.txt").write_bytes(vocab_text(toy_vocab()))
    tok = build_tokenizer({t: i for i, t in enumerate(toy_vocab())})
    tok.add_tokens(["added1", "added2"])
    (tok_dir / "tokenizer.json").write_text(tok.to_str())
    r = CliRunner().invoke(main, ["make-instances", str(corpus), "--tokenizer", str(tok_dir), "--out",
                                  str(tmp_path / "inst")])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert f"gives token ids up to {len(toy_vocab()) + 1}, but its vocab.txt has only {len(toy_vocab())} tokens" \
        in r.output
    assert not (tmp_path / "inst").exists()
