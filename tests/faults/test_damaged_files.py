"""Damage to bertkit's own files: every one is a one-line message naming the file and the fix (never a library
traceback), `bertkit verify` names it, and re-running the stage as told repairs it byte for byte."""
import json
import random
import shutil

import pytest
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.formats import DamagedFileError, FormatError, read_instances_manifest
from bertkit.pipelines.make_instances import InstancesConfig, make_instances
from bertkit.pipelines.prepare_corpus import CorpusConfig, prepare_corpus
from tests.helpers import toy_vocab

WORDS = [f"w{i}" for i in range(120)]


@pytest.fixture
def stages(tmp_path):
    """Raw text -> corpus -> instances over the toy vocabulary, all through bertkit's stages."""
    rng = random.Random(0)
    text = "\n\n".join(" ".join(" ".join(rng.choices(WORDS, k=rng.randint(4, 10))) + "." for _ in range(6))
                       for _ in range(80))
    (tmp_path / "raw.txt").write_text(text + "\n")
    (tmp_path / "vocab.txt").write_text("\n".join(toy_vocab()) + "\n")
    corpus, inst = tmp_path / "corpus", tmp_path / "inst"
    corpus_cfg = CorpusConfig(min_chars=10, holdout=0.1, shard_size=4096, progress=False, workers=1)
    prepare_corpus([tmp_path / "raw.txt"], corpus, corpus_cfg)
    make_instances(corpus, tmp_path / "vocab.txt", inst, InstancesConfig(max_seq_length=32, dupe=2, workers=1),
                   progress=False)
    return tmp_path, corpus, inst, corpus_cfg


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def flip_byte(path, at=0.6):
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


def test_truncated_corpus_shard(stages):
    """The issue's first case: make-instances used to die in pyarrow."""
    root, corpus, _, corpus_cfg = stages
    shard = corpus / "shard-00001.arrow"
    truncate(shard)
    r = cli("make-instances", corpus, "--tokenizer", root / "vocab.txt", "--out", root / "inst2", "--no-progress")
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"{shard}: " in r.output and "cut short or replaced" in r.output and "--overwrite" in r.output
    v = cli("verify", corpus)
    assert v.exit_code == 1 and f"DAMAGED {shard}" in v.output
    # the same prepare-corpus command says so too, and --overwrite rebuilds it from the inputs, byte for byte
    with pytest.raises(DamagedFileError, match="--overwrite"):
        prepare_corpus([root / "raw.txt"], corpus, corpus_cfg)
    shutil.copytree(corpus, root / "before", ignore=shutil.ignore_patterns("shard-00001.arrow"))
    prepare_corpus([root / "raw.txt"], corpus, CorpusConfig(**{**corpus_cfg.__dict__, "overwrite": True}))
    assert cli("verify", corpus).exit_code == 0
    assert (corpus / "shard-00000.arrow").read_bytes() == (root / "before" / "shard-00000.arrow").read_bytes()


def test_bit_flip_in_an_instances_shard_is_found_and_repaired(stages):
    """Same size, one bit off: the cheap check on opening cannot see it, verify does, and re-running
    make-instances rewrites exactly that file."""
    root, corpus, inst, _ = stages
    target = inst / "instances-00001.arrow"
    original = target.read_bytes()
    flip_byte(target)
    v = cli("verify", inst)
    assert v.exit_code == 1 and f"DAMAGED {target}: contents differ" in v.output
    others = {p.name: p.stat().st_mtime_ns for p in inst.glob("*.arrow") if p != target}
    make_instances(corpus, root / "vocab.txt", inst, InstancesConfig(max_seq_length=32, dupe=2, workers=1),
                   progress=False)
    assert target.read_bytes() == original
    assert {p.name: p.stat().st_mtime_ns for p in inst.glob("*.arrow") if p != target} == others
    assert cli("verify", inst).exit_code == 0


def test_truncated_instances_shard_stops_pretraining_with_its_name(stages, clean_dist_env):
    root, _, inst, _ = stages
    shard = inst / "instances-00000.arrow"
    truncate(shard, 0.9)
    with pytest.raises(DamagedFileError, match="instances-00000.arrow: .* bytes, but manifest.json says"):
        read_instances_manifest(inst)
    (root / "model.json").write_text(json.dumps({"vocab_size": len(toy_vocab()), "hidden_size": 32, "num_layers": 1,
                                                 "num_heads": 2, "intermediate_size": 64}))
    r = cli("pretrain", "--instances", inst, "--model", root / "model.json", "--out", root / "run", "--max-steps",
            "2", "--no-progress")
    assert r.exit_code == 1 and "Traceback" not in r.output and "instances-00000.arrow" in r.output
    assert "running the same make-instances command again" in r.output


def test_unreadable_arrow_file_is_the_projects_error(stages):
    """A file that is not Arrow at all (same size as recorded): the loader's own error, naming it."""
    from bertkit.data import InstanceDataset
    from bertkit.fileio import read_arrow

    _, _, inst, _ = stages
    path = inst / "instances-00000.arrow"
    path.write_bytes(b"\0" * path.stat().st_size)
    with pytest.raises(DamagedFileError, match="instances-00000.arrow: not a readable Arrow file"):
        read_arrow(path)
    with pytest.raises(DamagedFileError, match="instances-00000.arrow: not a readable Arrow file"):
        InstanceDataset(inst, "train")


def test_half_written_manifest(stages):
    _, corpus, inst, _ = stages
    text = (inst / "manifest.json").read_text()
    (inst / "manifest.json").write_text(text[: len(text) // 2])
    with pytest.raises(FormatError, match="manifest.json: not valid JSON"):
        read_instances_manifest(inst)
    v = cli("verify", inst)
    assert v.exit_code == 1 and "manifest.json: not valid JSON or not a bertkit manifest" in v.output


def test_damaged_tokenizer_file_is_found(tmp_path, stages):
    from bertkit.pipelines.train_tokenizer import TokenizerConfig, train_tokenizer

    _, corpus, _, _ = stages
    tok = tmp_path / "tok"
    train_tokenizer(corpus, tok, TokenizerConfig(vocab_size=200, min_frequency=1, progress=False))
    assert cli("verify", tok).exit_code == 0
    text = (tok / "tokenizer.json").read_text()
    (tok / "tokenizer.json").write_text(text.replace('"##', '"#!', 1))
    v = cli("verify", tok)
    assert v.exit_code == 1 and f"DAMAGED {tok / 'tokenizer.json'}" in v.output
