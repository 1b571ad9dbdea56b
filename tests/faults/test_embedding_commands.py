"""Reliability, round 6 (issue 80): the embedding commands (`finetune embed`, `encode`, `evaluate-embeddings`)
write only inside the folder given and never through a link, record only the files they wrote, read a
sentence-transformers folder as sentence-transformers does (or refuse it, naming the module), keep memory to their
flags, refuse what is not finite, read a checkpoint as untrusted input, end a full disk with one line and nothing
half-written, and read their input files line by line as they say."""
import errno
import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.embeddings.encoder import SentenceEncoder
from bertkit.errors import DataError, LinkedFileError
from tests.helpers import tiny_model_folder

st = pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return tiny_model_folder(tmp_path_factory.mktemp("bert"))


def texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(f"w{i}" for i in rng.integers(0, 27, rng.integers(3, 9))) + f" w{k % 27}" for k in range(n)]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    path.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n"
                            for a, p in zip(texts(16, 1), texts(16, 2))))
    return path


def embed(model, pairs, out, *flags):
    return CliRunner().invoke(main, ["finetune", "embed", "--model", str(model), "--pairs", str(pairs), "--out",
                                     str(out), "--batch-size", "4", "--mini-batch", "2", "--max-steps", "3",
                                     "--save-every", "2", "--lr", "1e-3", *flags])


def ok(result):
    assert result.exit_code == 0, result.output
    return result


def refused(result, *said):
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    for words in said:
        assert words in result.output, result.output
    return result


# ---------------------------------------------------------------- 1. no write through a link, no user's file replaced

def snapshot(path):
    """What a victim holds: a file's bytes, or a folder's every file and its bytes."""
    if path.is_dir():
        return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    return path.read_bytes()


def plant(place, how, victims):
    """Replace `place` (a file or folder of an output) with a link to a file, a link to a folder, or a user's file;
    return what must survive the next run unchanged."""
    if place.is_dir() and not place.is_symlink():
        shutil.rmtree(place)
    elif place.exists() or place.is_symlink():
        place.unlink()
    if how == "users file":
        place.write_text("the user's own notes\n")
        return place
    victim = victims / "victim"
    if how == "link to a file":
        victim.write_text("someone else's file\n")
    else:
        victim.mkdir()
        (victim / "theirs.txt").write_text("someone else's folder\n")
    place.symlink_to(victim)
    return victim


def output_names(folder):
    """Every file and folder a command wrote into `folder`, nested ones too; of a hidden work folder (make-instances'
    .parts/) the folder itself, not the names inside it, and bertkit's hidden lock and record not (their names are
    reserved)."""
    return sorted(n for p in folder.rglob("*") if not (n := p.relative_to(folder).as_posix()).startswith(".bertkit")
                  and not (n.startswith(".") and "/" in n))


# Every command that writes, with how to run it into an output (a folder or a file) under a root. A command added to
# `bertkit` must be walked here, or named in WALKED_ELSEWHERE / WRITES_NOTHING with where and why.
def _embed_command(root, bert_dir, pairs):
    return lambda: embed(bert_dir, pairs, root / "out"), root / "out"


def _encode_command(root, bert_dir, pairs):
    (root / "t.txt").write_text("w1 w2\nw3 w4 w5\n")
    return lambda: CliRunner().invoke(main, ["encode", str(bert_dir), str(root / "t.txt"), "--out",
                                             str(root / "e.arrow")]), root / "e.arrow"


def _evaluate_command(root, bert_dir, pairs):
    sts = root / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{i % 5}\n" for i, (a, b) in
                                                               enumerate(zip(texts(8, 3), texts(8, 4)))))
    return lambda: CliRunner().invoke(main, ["evaluate-embeddings", str(bert_dir), "--sts", str(sts), "--out",
                                             str(root / "scores.json")]), root / "scores.json"


def _classify_command(root, bert_dir, pairs):
    rows = ["text\tlabel"] + [f"w{i % 27} w{(i * 7) % 27}\t{i % 2}" for i in range(16)]
    (root / "train.tsv").write_text("\n".join(rows) + "\n")
    return lambda: CliRunner().invoke(main, [
        "finetune", "classify", "--model", str(bert_dir), "--out", str(root / "out"), "--train-file",
        str(root / "train.tsv"), "--dev-file", str(root / "train.tsv"), "--text-a", "text", "--epochs", "1",
        "--batch-size", "8", "--max-seq-length", "16", "--report-to", "none"]), root / "out"


def _export_command(root, bert_dir, pairs, run=[]):   # noqa: B006 (one pretraining run for every case)
    from tests.helpers import tiny_run

    if not run:
        run.append(tiny_run(root.parent / "pretrained")[1])
    return lambda: CliRunner().invoke(main, ["export", str(run[0]), "--out", str(root / "out")]), root / "out"


def _prepare_corpus_command(root, bert_dir, pairs):
    (root / "raw").mkdir()
    (root / "raw" / "a.txt").write_text("".join(
        f"Document {i} begins here with a sentence long enough to be kept. " * 6 + "\n\n" for i in range(12)))
    return lambda: CliRunner().invoke(main, ["prepare-corpus", str(root / "raw"), "--out", str(root / "out"),
                                             "--workers", "1", "--no-progress"]), root / "out"


def _corpus(root):
    from tests.helpers import write_corpus

    docs = [[[f"w{(d + i) % 27} w{(d * i) % 27} w{i % 27} w{d % 27}." for i in range(6)]] for d in range(16)]
    return write_corpus(root / "corpus", docs)


def _tokenizer_command(root, bert_dir, pairs):
    corpus = _corpus(root)
    return lambda: CliRunner().invoke(main, ["train-tokenizer", str(corpus), "--out", str(root / "out"),
                                             "--vocab-size", "120", "--no-progress"]), root / "out"


def _instances_command(root, bert_dir, pairs):
    corpus = _corpus(root)
    return lambda: CliRunner().invoke(main, ["make-instances", str(corpus), "--tokenizer", str(bert_dir), "--out",
                                             str(root / "out"), "--max-seq-length", "32", "--dupe", "1",
                                             "--workers", "1", "--no-progress"]), root / "out"


WALKED = {"finetune embed": _embed_command, "encode": _encode_command, "evaluate-embeddings": _evaluate_command,
          "finetune classify": _classify_command, "export": _export_command,
          "prepare-corpus": _prepare_corpus_command, "train-tokenizer": _tokenizer_command,
          "make-instances": _instances_command}
WALKED_ELSEWHERE = {   # round 5's tests of these: links in test_links.py, the user's files in test_users_files.py
    "pretrain": "test_links.py::test_resume_over_links_in_the_run_folder",
    "report": "test_users_files.py::test_a_full_disk_in_report_is_one_line (one file, refuse_to_replace's rule)",
    # the other fine-tunings share classify's folder (train.fine_tuning_folder, outputs.Output)
    "finetune squad": "finetune classify's walk", "finetune glue": "finetune classify's walk",
    "finetune ner": "finetune classify's walk", "finetune korean": "finetune classify's walk",
    "finetune compare": "finetune classify's walk",
    "predict": "one --out file, never replaced unless --overwrite (tests/test_predict.py)",
    "merge": "writes only into a new or empty folder, never through a link (tests/test_merge.py)",
    "extend-vocab": "writes only into a new or empty folder, never through a link (tests/test_extend_vocab.py)",
}
WRITES_NOTHING = {"verify": "reads only", "fill-mask": "prints", "check-gpu": "prints"}
REBUILT = {   # by design, make-instances rebuilds by name a damaged file of its own folder (every file there is one
    # its manifest lists: the shards, the tokenizer copies, the manifest itself)
    "make-instances": lambda out: [p.name for p in out.iterdir() if p.is_file() and not p.name.startswith(".")]}
EXTRA_NAMES = {"finetune embed": ["checkpoint"], "finetune classify": ["resume"],   # written only mid-run
               "prepare-corpus": [".work"]}


def leaf_commands(group=main, prefix=""):
    import click

    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from leaf_commands(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}"


def test_every_command_that_writes_is_walked():
    unknown = set(leaf_commands()) - set(WALKED) - set(WALKED_ELSEWHERE) - set(WRITES_NOTHING)
    assert not unknown, f"walk these commands' outputs with links and users' files: {sorted(unknown)}"


@pytest.mark.parametrize("command", sorted(WALKED))
def test_every_output_name_premade_as_a_link_or_a_users_file(command, bert_dir, pairs, tmp_path):
    """Each name a command writes, pre-made (after a first run, so the folder is the command's own) as a link to a
    file, a link to a folder, or a file of the user's: the next run never writes through the link (what it points
    at is unchanged) and never replaces or removes the user's file (a log may be appended to); when it stops, it
    says so in one line."""
    root = tmp_path / "first"
    root.mkdir()
    run, out = WALKED[command](root, bert_dir, pairs)
    ok(run())
    names = output_names(out) + EXTRA_NAMES.get(command, []) if out.is_dir() else [""]
    assert names, out
    for i, name in enumerate(names):
        for how in ("link to a file", "link to a folder", "users file"):
            root = tmp_path / f"{i}-{how.replace(' ', '-')}"
            root.mkdir()
            run, out = WALKED[command](root, bert_dir, pairs)
            ok(run())
            place = out / name if name else out
            if not place.parent.is_dir():
                continue
            if how == "users file" and name in REBUILT.get(command, lambda out: ())(out):
                continue   # a file its manifest lists, changed since: damage, rebuilt by design (faults.md: bit flip)
            victim = plant(place, how, root)
            before = snapshot(victim)
            result = run()
            assert "Traceback" not in result.output and result.exit_code in (0, 1, 2), (name, how, result.output)
            if how == "users file":   # kept (a log of bertkit's name may have been appended to: nothing lost)
                assert place.is_file() and place.read_bytes().startswith(before), (name, how, result.output)
            else:
                assert snapshot(victim) == before, (name, how, result.output)
            if result.exit_code:
                assert str(place) in result.output or str(out) in result.output, (name, how, result.output)


# ---------------------------------------------------------------- 2. the record lists only what bertkit wrote

def test_a_file_saved_into_the_folder_during_a_run_is_the_users(bert_dir, pairs, tmp_path, monkeypatch):
    """notes.md saved beside a running `finetune embed` is not recorded as bertkit's, so a new run (other settings:
    bertkit's earlier files go) keeps it; before, every file new since the command began was recorded as its own."""
    import bertkit.embeddings.train as train

    real, out = train.cached_step, tmp_path / "out"

    def user_saves_notes(*a, **k):
        (out / "notes.md").write_text("my analysis\n")
        return real(*a, **k)

    monkeypatch.setattr(train, "cached_step", user_saves_notes)
    ok(embed(bert_dir, pairs, out))
    monkeypatch.setattr(train, "cached_step", real)
    record = json.loads((out / ".bertkit-written.json").read_text())["files"]
    assert "notes.md" not in record and "model/model.safetensors" in record and "summary.json" in record
    ok(embed(bert_dir, pairs, out, "--temperature", "0.1"))
    assert (out / "notes.md").read_text() == "my analysis\n"
    assert "notes.md" not in json.loads((out / ".bertkit-written.json").read_text())["files"]


def test_a_file_of_bertkits_replaced_during_a_run_is_neither_removed_nor_recorded(tmp_path):
    """A record's file found bertkit's when a command began, then replaced by the user while it ran: the command
    neither removes it nor records it as bertkit's (it was checked only by name before)."""
    from bertkit.fileio import atomic_write_json
    from bertkit.outputs import WRITTEN, Output

    first = Output(tmp_path, "test")
    atomic_write_json(tmp_path / "summary.json", {"bertkit": 1})
    first.finish()
    second = Output(tmp_path, "test")
    assert second.ours() == {"summary.json"}
    (tmp_path / "summary.json").unlink()
    (tmp_path / "summary.json").write_text("the user's own summary\n")
    second.remove_earlier()
    assert second.finish() is not None   # said as kept
    assert (tmp_path / "summary.json").read_text() == "the user's own summary\n"
    assert "summary.json" not in json.loads((tmp_path / WRITTEN).read_text())["files"]


def test_a_normalized_model_is_replaced_by_a_fresh_run_into_its_folder(bert_dir, pairs, tmp_path):
    """--normalize writes an empty 2_Normalize/ folder, which no file removal empties: a fresh run into the same
    folder (other settings) still replaces the model."""
    ok(embed(bert_dir, pairs, tmp_path / "out", "--normalize"))
    assert (tmp_path / "out" / "model" / "2_Normalize").is_dir()
    ok(embed(bert_dir, pairs, tmp_path / "out", "--normalize", "--temperature", "0.1"))
    settings = json.loads((tmp_path / "out" / "model" / "config.json").read_text())["bertkit_embedding"]
    assert settings["scale"] == pytest.approx(10.0)


def test_a_rerun_from_another_model_leaves_no_file_of_the_first(bert_dir, pairs, tmp_path):
    """A model folder with a tokenizer.json, then one without: the second model/ holds exactly what a fresh run from
    the second writes (a stale tokenizer.json, which transformers prefers to vocab.txt, would read other ids)."""
    from bertkit.tokenization import load_tokenizer

    with_json = tmp_path / "with-json"
    shutil.copytree(bert_dir, with_json)
    (with_json / "tokenizer.json").write_text(load_tokenizer(bert_dir).to_str())
    ok(embed(with_json, pairs, tmp_path / "out"))
    assert (tmp_path / "out" / "model" / "tokenizer.json").is_file()
    ok(embed(bert_dir, pairs, tmp_path / "out"))
    ok(embed(bert_dir, pairs, tmp_path / "fresh"))
    assert output_names(tmp_path / "out" / "model") == output_names(tmp_path / "fresh" / "model")
    assert ok(CliRunner().invoke(main, ["verify", str(tmp_path / "out")]))


# ---------------------------------------------------------------- 3. a sentence-transformers folder, as it reads

def st_folder(bert_dir, path, dense_out=5, normalize=True):
    from sentence_transformers import models

    model = st.SentenceTransformer(str(bert_dir), device="cpu")
    torch.manual_seed(3)
    modules = [model[0], model[1], models.Dense(model.get_sentence_embedding_dimension(), dense_out)]
    st.SentenceTransformer(modules=modules + ([models.Normalize()] if normalize else []),
                           device="cpu").save(str(path))
    return path


def test_a_dense_module_is_applied_as_sentence_transformers_applies_it(bert_dir, tmp_path):
    folder = st_folder(bert_dir, tmp_path / "labse-like")
    sample = texts(7, 5) + ["w1 " * 40]
    theirs = st.SentenceTransformer(str(folder), device="cpu").encode(sample, convert_to_numpy=True)
    ours = SentenceEncoder.from_folder(folder).encode(sample, batch_size=3)
    assert ours.shape == theirs.shape == (8, 5)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    (tmp_path / "p.jsonl").write_text('{"anchor": "w1 w2", "positive": "w3"}\n{"anchor": "w4", "positive": "w5"}\n')
    refused(embed(folder, tmp_path / "p.jsonl", tmp_path / "o"), "Dense module(s)", "would drop")


def test_bertkits_record_and_sentence_transformers_files_must_agree(bert_dir, pairs, tmp_path):
    ok(embed(bert_dir, pairs, tmp_path / "out", "--pooling", "cls"))
    model = tmp_path / "out" / "model"
    pooling = json.loads((model / "1_Pooling" / "config.json").read_text())
    pooling.update(pooling_mode_cls_token=False, pooling_mode_mean_tokens=True)
    (model / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (tmp_path / "t.txt").write_text("w1 w2\n")
    refused(CliRunner().invoke(main, ["encode", str(model), str(tmp_path / "t.txt"), "--out",
                                      str(tmp_path / "e.arrow")]), "bertkit_embedding.json says", "one was edited")
    (model / "bertkit_embedding.json").unlink()   # sentence-transformers' files alone: read as it reads them
    theirs = st.SentenceTransformer(str(model), device="cpu").encode(["w1 w2 w3"], convert_to_numpy=True)
    np.testing.assert_allclose(SentenceEncoder.from_folder(model).encode(["w1 w2 w3"]), theirs, atol=1e-5)


@pytest.mark.parametrize("crafted", [
    ("1_Pooling/config.json", "[1, 2]"), ("modules.json", '{"a": 1}'), ("modules.json", '[{"type": null}]'),
    ("modules.json", '[{"type": "x.Transformer", "path": "../../etc"}]'),
    ("sentence_bert_config.json", '{"max_seq_length": "64"}'), ("sentence_bert_config.json", "not json"),
    ("1_Pooling/config.json", "\xff"), ("2_Dense/config.json", '{"in_features": 128, "out_features": -1}'),
    ("2_Dense/config.json", '{"in_features": 128, "out_features": 5, "activation_function": "os.system"}'),
    ("2_Dense/model.safetensors", "not weights"), ("modules.json", '[{"type": "x.WordEmbeddings", "path": ""}]'),
    ("bertkit_embedding.json", '{"pooling": "mean", "max_seq_length": 1e9}')])
def test_a_crafted_sentence_transformers_folder_is_one_line(bert_dir, tmp_path, crafted):
    folder = st_folder(bert_dir, tmp_path / "st")
    name, content = crafted
    (folder / name).write_text(content, encoding="utf-8", errors="surrogateescape")
    (tmp_path / "t.txt").write_text("w1 w2\n")
    r = CliRunner().invoke(main, ["encode", str(folder), str(tmp_path / "t.txt"), "--out", str(tmp_path / "e.arrow")])
    refused(r, str(folder))
    assert not (tmp_path / "e.arrow").exists()


def test_a_link_out_of_a_sentence_transformers_folder_is_not_followed(bert_dir, tmp_path):
    folder = st_folder(bert_dir, tmp_path / "st")
    secret = tmp_path / "secret.json"
    secret.write_text('{"pooling_mode_mean_tokens": true}')
    (folder / "1_Pooling" / "config.json").unlink()
    (folder / "1_Pooling" / "config.json").symlink_to(secret)
    with pytest.raises(LinkedFileError, match="outside"):
        SentenceEncoder.from_folder(folder)


# ---------------------------------------------------------------- 4. memory follows the flags

def peak_rss_mb(code: str) -> float:
    import subprocess
    import sys

    probe = code + "\nimport resource; print('RSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split("RSS")[-1]) / 1024


def test_a_long_line_costs_memory_by_the_length_not_by_the_line(bert_dir):
    """One line of 8 MB: tokenized whole it cost ~160 bytes a byte (1.3 GB here); cut first, its vector is the same
    as its first max_seq_length * 100 characters' and memory stays as a short line's."""
    encoder = SentenceEncoder.from_folder(bert_dir)
    long = "w1 w2 w3 " * 30_000
    np.testing.assert_array_equal(encoder.encode([long]), encoder.encode([long[:128 * 100]]))
    code = (f"from bertkit.embeddings.encoder import SentenceEncoder\n"
            f"e = SentenceEncoder.from_folder({str(bert_dir)!r})\n"
            "e.encode(['w1 w2 w3 ' * {n}])")
    short, huge = peak_rss_mb(code.format(n=10)), peak_rss_mb(code.format(n=900_000))
    assert huge - short < 200, (short, huge)


def test_steps_are_counted_without_building_every_epoch(bert_dir, pairs, tmp_path):
    """--epochs 100000000 --max-steps 2 built a hundred million epochs' batches first; now the steps are counted
    (as the built list's length, for texts in one row each and for repeated texts) and epochs drawn one by one."""
    from bertkit.embeddings.train import EmbedConfig, batches_without_duplicates, count_steps, training_batches

    distinct = [(a, b) for a, b in zip(texts(23, 1), texts(23, 2)) if a != b]
    repeated = [("w1 w2", "w3"), ("w1 w2", "w4"), ("w5", "w3")] + distinct[:9]
    for rows in (distinct, repeated):
        for epochs, max_steps, batch in ((3, None, 4), (2, 5, 5), (4, None, 3)):
            cfg = EmbedConfig(out_dir="-", epochs=epochs, max_steps=max_steps, batch_size=batch, seed=7)
            rng = np.random.default_rng(7)
            built = [b for _ in range(epochs) for b in batches_without_duplicates(rows, batch, rng)][:max_steps]
            assert count_steps(rows, cfg) == len(built)
            assert [b for _, b in training_batches(rows, cfg, len(built), 0)] == built
            assert [b for _, b in training_batches(rows, cfg, len(built), 2)] == built[2:]
    code = ("from click.testing import CliRunner\nfrom bertkit.cli import main\n"
            f"r = CliRunner().invoke(main, ['finetune', 'embed', '--model', {str(bert_dir)!r}, '--pairs', "
            f"{str(pairs)!r}, '--out', {str(tmp_path)!r} + '/{{out}}', '--batch-size', '4', '--epochs', '{{epochs}}', "
            "'--max-steps', '2'])\nassert r.exit_code == 0, r.output")
    one, many = (peak_rss_mb(code.format(out=f"o{epochs}", epochs=epochs)) for epochs in (1, 100_000_000))
    assert many - one < 200, (one, many)   # before: a hundred million epochs' batches built (never finished)
    assert json.loads((tmp_path / "o100000000" / "summary.json").read_text())["steps"] == 2


# ---------------------------------------------------------------- 5. what is not finite is refused

@pytest.mark.parametrize("flag,value", [("--temperature", "1e-300"), ("--weight-decay", "1e300"), ("--lr", "1e300"),
                                        ("--seed", "100000000000000000000"), ("--temperature", "nan")])
def test_flags_that_only_make_nan_are_usage_errors(bert_dir, pairs, tmp_path, flag, value):
    r = embed(bert_dir, pairs, tmp_path / "o", flag, value)
    assert r.exit_code == 2 and flag in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("score", ["nan", "inf", "-inf"])
def test_a_gold_score_that_is_not_finite_names_its_line(bert_dir, tmp_path, score):
    sts = tmp_path / "sts.tsv"
    sts.write_text(f"sentence1\tsentence2\tscore\nw1\tw2\t1\nw3\tw4\t{score}\nw5\tw6\t3\n")
    r = CliRunner().invoke(main, ["evaluate-embeddings", str(bert_dir), "--sts", str(sts), "--out",
                                  str(tmp_path / "s.json")])
    refused(r, f"{sts}:3: score {score!r} is not a finite number")
    assert not (tmp_path / "s.json").exists()
    sts.write_text("sentence1\tsentence2\tscore\nw1\tw2\t1\n")
    refused(CliRunner().invoke(main, ["evaluate-embeddings", "--floors-only", "--sts", str(sts)]),
            "a correlation needs two pairs")


def test_a_loss_that_is_not_finite_stops_the_run_and_nothing_is_complete(bert_dir, pairs, tmp_path, monkeypatch):
    import bertkit.embeddings.train as train

    real, calls = train.cached_step, []

    def diverges_at_step_3(*a, **k):
        calls.append(1)
        return float("nan") if len(calls) == 3 else real(*a, **k)

    monkeypatch.setattr(train, "cached_step", diverges_at_step_3)
    refused(embed(bert_dir, pairs, tmp_path / "o"), "the loss is nan at step 3", "Lower --lr")
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["complete"] is False
    assert not (tmp_path / "o" / "model").exists() and not (tmp_path / "o" / "summary.json").exists()


@pytest.fixture(scope="module")
def nan_model(bert_dir, tmp_path_factory):
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("nan") / "model"
    shutil.copytree(bert_dir, folder)
    weights = load_file(folder / "model.safetensors")
    weights = {k: torch.full_like(v, float("nan")) if "encoder.layer.1.output.dense.weight" in k else v
               for k, v in weights.items()}
    save_file(weights, folder / "model.safetensors")
    return folder


def test_a_model_giving_nan_vectors_writes_and_scores_nothing(nan_model, tmp_path):
    (tmp_path / "t.txt").write_text("w1 w2\nw3\n")
    refused(CliRunner().invoke(main, ["encode", str(nan_model), str(tmp_path / "t.txt"), "--out",
                                      str(tmp_path / "e.arrow")]), "not finite (NaN or infinity) for 2 of 2 texts")
    assert not (tmp_path / "e.arrow").exists()
    squad = {"data": [{"title": "t", "paragraphs": [{"context": c, "qas": [{"id": str(i), "question": c[:5],
                                                                             "answers": []}]}
                                                    for i, c in enumerate(texts(6, 8))]}]}
    (tmp_path / "squad.json").write_text(json.dumps(squad))
    refused(CliRunner().invoke(main, ["evaluate-embeddings", str(nan_model), "--retrieval",
                                      str(tmp_path / "squad.json")]), "not finite")


def test_json_written_by_bertkit_never_holds_nan(tmp_path):
    """NaN and infinity (a correlation of constant predictions) are written as null: the file parses as strict
    JSON, which has neither (Python wrote the token NaN, which jq and JSON.parse refuse)."""
    from bertkit.fileio import atomic_write_json

    def strict(token):
        raise ValueError(f"{token} is not JSON")

    atomic_write_json(tmp_path / "x.json", {"spearman": float("nan"), "runs": [1.5, float("-inf")], "n": (2, 3)})
    assert json.loads((tmp_path / "x.json").read_text(), parse_constant=strict) == \
        {"spearman": None, "runs": [1.5, None], "n": [2, 3]}


# ---------------------------------------------------------------- 6. a checkpoint is untrusted input

@pytest.fixture
def killed_run(bert_dir, pairs, tmp_path, monkeypatch):
    """A finetune embed killed at step 3, its checkpoint of step 2 in OUT/checkpoint/."""
    import bertkit.embeddings.train as train

    real, calls = train.cached_step, []

    class Killed(Exception):
        pass

    def killed_at_step_3(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise Killed
        return real(*a, **k)

    monkeypatch.setattr(train, "cached_step", killed_at_step_3)
    with pytest.raises(Killed):
        CliRunner().invoke(main, ["finetune", "embed", "--model", str(bert_dir), "--pairs", str(pairs), "--out",
                                  str(tmp_path / "o"), "--batch-size", "4", "--mini-batch", "2", "--max-steps", "3",
                                  "--save-every", "2", "--lr", "1e-3"], catch_exceptions=False)
    monkeypatch.setattr(train, "cached_step", real)
    return tmp_path / "o"


def _step(folder, value):
    progress = json.loads((folder / "progress.json").read_text())
    (folder / "progress.json").write_text(json.dumps({**progress, "step": value}))


def _weights(folder, _):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(3)}, folder / "weights.safetensors")


CORRUPTIONS = {
    "a step past the run's": (lambda f: _step(f, 10 ** 9), "records step 1000000000, and this run has 3 steps"),
    "a step that is text": (lambda f: _step(f, "2"), "records step '2'"),
    "another model's weights": (lambda f: _weights(f, None), "not this model's"),
    "weights cut short": (lambda f: (f / "weights.safetensors").write_bytes(b"\x08\x00"), "cannot be resumed"),
    "a state that is not one": (lambda f: torch.save({"optimizer": 1}, f / "state.pt"), "cannot be resumed"),
    "progress not JSON": (lambda f: (f / "progress.json").write_text("{"), "not a checkpoint finetune embed wrote"),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_damaged_or_foreign_checkpoint_is_one_message(killed_run, bert_dir, pairs, corruption):
    damage, said = CORRUPTIONS[corruption]
    damage(killed_run / "checkpoint")
    refused(embed(bert_dir, pairs, killed_run), f"{killed_run / 'checkpoint'}", said)
    assert not (killed_run / "model").exists()


def test_a_linked_checkpoint_folder_is_refused(killed_run, bert_dir, pairs, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.move(killed_run / "checkpoint", elsewhere)
    (killed_run / "checkpoint").symlink_to(elsewhere)
    before = snapshot(elsewhere)
    refused(embed(bert_dir, pairs, killed_run), "not a checkpoint finetune embed wrote")
    assert snapshot(elsewhere) == before


def test_the_killed_run_resumes_to_the_uninterrupted_weights(killed_run, bert_dir, pairs, tmp_path):
    from safetensors.torch import load_file

    ok(embed(bert_dir, pairs, killed_run))
    ok(embed(bert_dir, pairs, tmp_path / "whole"))
    a, b = (load_file(f / "model" / "model.safetensors") for f in (killed_run, tmp_path / "whole"))
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- 7. a full disk

def enospc(path, *a, **k):
    raise OSError(errno.ENOSPC, "No space left on device", str(path))


@pytest.mark.parametrize("failing", ["state.pt", "model.safetensors"])
def test_a_full_disk_in_finetune_embed_is_one_line_and_leaves_nothing_half_written(bert_dir, pairs, tmp_path,
                                                                                   monkeypatch, failing):
    import bertkit.embeddings.train as train
    import bertkit.fileio as fileio
    import bertkit.models.bert_hf as bert_hf

    real = fileio.atomic_write_bytes

    def full(path, *a, **k):
        return enospc(path) if path.name == failing else real(path, *a, **k)
    for module in (fileio, train, bert_hf):   # every writer a save goes through
        monkeypatch.setattr(module, "atomic_write_bytes", full)
    out = tmp_path / "o"
    refused(embed(bert_dir, pairs, out), f"{out}: no space left on the device", "run the same command again")
    assert not list(out.glob(".bertkit-staging-*")) and not (out / "model").exists()
    assert not (out / "checkpoint").exists() or failing != "state.pt"
    assert json.loads((out / "manifest.json").read_text())["complete"] is False


def test_a_full_disk_in_encode_and_evaluate_embeddings_is_one_line(bert_dir, tmp_path, monkeypatch):
    import bertkit.fileio as fileio

    monkeypatch.setattr(fileio, "atomic_write_bytes", enospc)
    monkeypatch.setattr(fileio, "atomic_write_arrow", enospc)
    (tmp_path / "t.txt").write_text("w1 w2\n")
    refused(CliRunner().invoke(main, ["encode", str(bert_dir), str(tmp_path / "t.txt"), "--out",
                                      str(tmp_path / "e.arrow")]), "no space left on the device")
    sts = tmp_path / "sts.tsv"
    sts.write_text("sentence1\tsentence2\tscore\nw1\tw2\t1\nw3\tw4\t2\nw5 w6\tw6\t3\n")
    refused(CliRunner().invoke(main, ["evaluate-embeddings", str(bert_dir), "--sts", str(sts), "--out",
                                      str(tmp_path / "s.json")]), "no space left on the device")
    assert not (tmp_path / "e.arrow").exists() and not (tmp_path / "s.json").exists()


# ---------------------------------------------------------------- 8. inputs read as the help says

def test_encode_splits_lines_on_newlines_only(bert_dir, tmp_path):
    import pyarrow as pa

    lines = ["w1\fw2", "w3\u2028w4", "w5\rw6", "w7 w8", "", "w9\x85w10"]
    (tmp_path / "t.txt").write_bytes(("\n".join(lines[:3]) + "\r\n" + "\n".join(lines[3:]) + "\n").encode())
    ok(CliRunner().invoke(main, ["encode", str(bert_dir), str(tmp_path / "t.txt"), "--out",
                                 str(tmp_path / "e.arrow")]))
    table = pa.ipc.open_file(pa.memory_map(str(tmp_path / "e.arrow"))).read_all()
    assert table.column("text").to_pylist() == lines


@pytest.mark.parametrize("value", ["null", "5", '["x"]', '{"a": 1}', "true"])
def test_a_json_value_that_is_not_text_is_refused_with_its_line(bert_dir, tmp_path, value):
    from bertkit.embeddings.data import read_pairs

    path = tmp_path / "p.jsonl"
    path.write_text(f'{{"anchor": "w1", "positive": "w2"}}\n{{"anchor": {value}, "positive": "w3"}}\n')
    with pytest.raises(DataError, match=r"p.jsonl:2: 'anchor' is .*, not a text"):
        read_pairs(path)


def test_a_tsv_row_with_more_fields_than_its_header_is_refused(tmp_path):
    from bertkit.embeddings.data import read_pairs

    path = tmp_path / "p.tsv"
    path.write_text("anchor\tpositive\nw1\tw2\nw3\tw4\tw5 lost\n")
    with pytest.raises(DataError, match=r"p.tsv:3: 3 fields, the header has 2"):
        read_pairs(path)
    quoted = tmp_path / "p.csv"
    quoted.write_text('anchor,positive\nw1,w2\n"w3, w4","w5\nw6"\n')
    assert read_pairs(quoted) == [("w1", "w2"), ("w3, w4", "w5\nw6")]
