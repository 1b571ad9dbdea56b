"""Issue 72, classes 3 and 4: a folder from someone else is read, never trusted. No link out of it is followed and
nothing it links to is copied (bertkit.errors.regular_file); a config it carries never makes DeepSpeed write
outside the run (bertkit.pretrain.run.confine_outputs); a pickle is read under a budget tied to its size
(bertkit.safe_load.check_budget); a config.json is checked against bounds and the weights before any tensor is made
(bertkit.models.bert_config.check_fields, meta-device skeletons); token ids past the vocabulary are refused where a
tokenizer is read (bertkit.tokenization.check_dense_ids)."""
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch
from click.testing import CliRunner

from bertkit.cli import main
from tests.helpers import env_without_dist, tiny_model_folder, tiny_run

SECRET = "HF_TOKEN=hf_not_for_sharing\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("foreign"))[1]


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "environ"
    path.write_text(SECRET)
    return path


def holds_secret(folder) -> bool:
    return any(SECRET.strip() in p.read_text(errors="ignore") for p in folder.rglob("*") if p.is_file())


# ---------------------------------------------------------------- links

@pytest.mark.parametrize("target", ["secret", "/proc/self/environ"])
def test_an_export_copies_nothing_a_run_folder_links_to(run, tmp_path, secret, target):
    theirs = tmp_path / "theirs"
    shutil.copytree(run, theirs)
    (theirs / "tokenizer" / "tokenizer_config.json").unlink(missing_ok=True)
    (theirs / "tokenizer" / "tokenizer_config.json").symlink_to(secret if target == "secret" else target)
    r = CliRunner().invoke(main, ["export", str(theirs), "--out", str(tmp_path / "export")])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert f"{theirs / 'tokenizer' / 'tokenizer_config.json'}: a symbolic link to" in r.output
    assert "follows no link out of a folder" in r.output
    assert not (tmp_path / "export").exists() or not holds_secret(tmp_path / "export")


def test_a_run_whose_tokenizer_folder_is_a_link_is_refused(run, tmp_path, secret):
    theirs, elsewhere = tmp_path / "theirs", tmp_path / "elsewhere"
    shutil.copytree(run, theirs)
    shutil.move(theirs / "tokenizer", elsewhere)
    (theirs / "tokenizer").symlink_to(elsewhere)
    r = CliRunner().invoke(main, ["export", str(theirs), "--out", str(tmp_path / "export")])
    assert r.exit_code == 1 and f"{theirs / 'tokenizer'}: a symbolic link" in r.output, r.output


def test_make_instances_copies_nothing_a_tokenizer_folder_links_to(run, tmp_path, secret):
    from tests.helpers import write_corpus

    corpus = write_corpus(tmp_path / "corpus", [[["w1 w2 w3 w4.", "w5 w6 w7 w8."]] * 4])
    tok = tmp_path / "tok"
    shutil.copytree(run / "tokenizer", tok)
    (tok / "special_tokens_map.json").unlink(missing_ok=True)
    (tok / "special_tokens_map.json").symlink_to(secret)
    r = CliRunner().invoke(main, ["make-instances", str(corpus), "--tokenizer", str(tok), "--out",
                                  str(tmp_path / "inst"), "--max-seq-length", "16", "--no-progress"])
    assert r.exit_code == 1 and f"{tok / 'special_tokens_map.json'}: a symbolic link" in r.output, r.output
    assert not (tmp_path / "inst").exists() or not holds_secret(tmp_path / "inst")


def test_fill_mask_reads_no_linked_model_file(tmp_path, secret):
    model = tiny_model_folder(tmp_path)
    (model / "config.json").rename(tmp_path / "config.json")
    (model / "config.json").symlink_to(tmp_path / "config.json")
    r = CliRunner().invoke(main, ["fill-mask", "--model", str(model), "w1 [MASK] w2"])
    assert r.exit_code == 1 and f"{model / 'config.json'}: a symbolic link" in r.output, r.output


def test_a_hub_cache_snapshot_is_read_through_its_links(tmp_path):
    """The Hugging Face cache keeps every file in blobs/ and links to it from snapshots/REV/: not another's link."""
    from bertkit.models import load_pretrained

    model = tiny_model_folder(tmp_path)
    repo = tmp_path / "models--me--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    for i, f in enumerate(sorted(model.iterdir())):
        shutil.copy(f, repo / "blobs" / f"blob{i}")
        (snapshot / f.name).symlink_to(f"../../blobs/blob{i}")
    loaded = load_pretrained(snapshot, head="pretraining")
    assert loaded.cfg.vocab_size == 32


def test_a_fifo_for_weights_is_refused_not_read_for_ever(tmp_path):
    model = tiny_model_folder(tmp_path)
    (model / "model.safetensors").unlink()
    os.mkfifo(model / "model.safetensors")
    script = ("from bertkit.models import load_pretrained\n"
              f"load_pretrained({str(model)!r})")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120, env=env_without_dist())
    assert p.returncode == 1 and b"a named pipe (FIFO), not a file" in p.stderr, p.stderr[-2000:]


def test_an_export_whose_model_states_are_a_fifo_stops_at_once(run, tmp_path):
    theirs = tmp_path / "theirs"
    shutil.copytree(run, theirs)
    tag = (theirs / "checkpoints" / "latest").read_text().strip()
    for f in (theirs / "checkpoints" / tag).glob("*model_states.pt"):
        f.unlink()
        os.mkfifo(f)
    (theirs / "checkpoints" / tag / "checkpoint.json").unlink(missing_ok=True)  # a legacy checkpoint: no checksums
    p = subprocess.run([sys.executable, "-m", "bertkit", "export", str(theirs), "--out", str(tmp_path / "e")],
                       capture_output=True, timeout=120, env=env_without_dist())
    assert p.returncode == 1 and b"a named pipe (FIFO), not a file" in p.stderr, p.stderr[-2000:]
    assert b"Traceback" not in p.stderr


# ---------------------------------------------------------------- a DeepSpeed config that came with a folder

def test_a_resume_never_reads_the_deepspeed_config_path_a_run_names(run, tmp_path):
    from bertkit.formats import read_run_config
    from bertkit.pretrain import ConfigError, PretrainConfig
    from bertkit.pretrain.resume import inherit

    theirs = tmp_path / "theirs"
    shutil.copytree(run, theirs)
    config = json.loads((theirs / "config.json").read_text())
    config["pretrain"]["deepspeed_config"] = "/home/someone/ds.json"
    (theirs / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"began with --deepspeed-config /home/someone/ds.json, and keeps no copy "
                                          r"of it .* --resume --deepspeed-config FILE"):
        inherit(PretrainConfig(instances=None, out=str(theirs), resume=True), read_run_config(theirs), set())
    (theirs / "deepspeed_user_config.json").write_text("{}")
    resumed = inherit(PretrainConfig(instances=None, out=str(theirs), resume=True), read_run_config(theirs), set())
    assert resumed.deepspeed_config == str(theirs / "deepspeed_user_config.json")


def test_a_run_folders_deepspeed_config_writes_only_inside_the_run(run, tmp_path, clean_dist_env):
    """End to end: a run folder whose own DeepSpeed config points its TensorBoard monitor at a folder of the user's;
    resumed, the monitor writes inside the run and the user's folder stays as it was."""
    from bertkit.pretrain import PretrainConfig, pretrain

    theirs, victim = tmp_path / "theirs", tmp_path / "victim"
    victim.mkdir()
    shutil.copytree(run, theirs)
    (theirs / "deepspeed_user_config.json").write_text(json.dumps(
        {"tensorboard": {"enabled": True, "output_path": str(victim), "job_name": "x"}}))
    config = json.loads((theirs / "config.json").read_text())
    config["pretrain"]["deepspeed_config"] = "ds.json"
    (theirs / "config.json").write_text(json.dumps(config))
    pretrain(PretrainConfig(instances=None, out=str(theirs), resume=True, max_steps=3, progress=False),
             given={"out", "resume", "max_steps", "progress"})
    assert list(victim.iterdir()) == []
    assert (theirs / "deepspeed" / "victim").is_dir()


def test_confine_outputs_moves_every_output_path_inside(tmp_path):
    from bertkit.pretrain.run import confine_outputs

    said = []
    config = {"flops_profiler": {"enabled": True, "output_file": "/home/u/.bashrc"},
              "csv_monitor": {"output_path": "../../elsewhere/"}, "wandb": {"project": "p"},
              "tensorboard": {"output_path": "tb"}}
    out = confine_outputs(config, tmp_path, said.append)
    assert out["flops_profiler"]["output_file"] == str(tmp_path / "deepspeed" / ".bashrc")
    assert out["csv_monitor"]["output_path"] == str(tmp_path / "deepspeed" / "elsewhere")
    assert out["tensorboard"]["output_path"] == "tb" and out["wandb"] == {"project": "p"}  # inside, or no path
    assert len(said) == 2 and "flops_profiler.output_file named /home/u/.bashrc, outside the run" in said[0]


# ---------------------------------------------------------------- pickles under a budget

def torch_zip(obj) -> dict:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    archive = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    return {name: archive.read(name) for name in archive.namelist()}


def write_zip(path, records: dict, compress=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compress) as out:
        for name, data in records.items():
            out.writestr(name, data)


def bytearray_bomb(path, n=2 ** 31 - 1):
    records = torch_zip({"module": {}})
    pickled = next(k for k in records if k.endswith("data.pkl"))
    records[pickled] = b"\x80\x02c__builtin__\nbytearray\nJ" + n.to_bytes(4, "little") + b"\x85R."
    write_zip(path, records)


def test_a_kilobyte_pickle_cannot_ask_for_gigabytes(tmp_path):
    from bertkit.safe_load import UnsafeCheckpointError, safe_load

    bytearray_bomb(tmp_path / "bomb.pt")
    assert (tmp_path / "bomb.pt").stat().st_size < 2048
    with pytest.raises(UnsafeCheckpointError, match=r"asks for an object of 2,147,483,647 bytes, more than a file "
                                                    r"of [\d,]+ bytes holds"):
        safe_load(tmp_path / "bomb.pt")


def test_records_that_inflate_beyond_the_file_are_refused_unread(tmp_path):
    from bertkit.safe_load import UnsafeCheckpointError, safe_load

    write_zip(tmp_path / "zip.pt", torch_zip({"w": torch.zeros(4 << 20)}), zipfile.ZIP_DEFLATED)  # 16 MB of zeros
    assert (tmp_path / "zip.pt").stat().st_size < 100_000
    with pytest.raises(UnsafeCheckpointError, match="its records inflate to 16,"):
        safe_load(tmp_path / "zip.pt")
    torch.save({"w": torch.zeros(4 << 20)}, tmp_path / "plain.pt")  # the same tensors as torch writes them: read
    assert safe_load(tmp_path / "plain.pt")["w"].shape == (4 << 20,)


@pytest.mark.parametrize("where", ["export", "fill-mask"])
def test_a_bomb_in_a_folder_is_one_line(run, tmp_path, where):
    if where == "export":
        theirs = tmp_path / "theirs"
        shutil.copytree(run, theirs)
        tag = (theirs / "checkpoints" / "latest").read_text().strip()
        for f in (theirs / "checkpoints" / tag).glob("*model_states.pt"):
            bytearray_bomb(f)
        (theirs / "checkpoints" / tag / "checkpoint.json").unlink(missing_ok=True)
        r = CliRunner().invoke(main, ["export", str(theirs), "--out", str(tmp_path / "e")])
    else:
        model = tiny_model_folder(tmp_path)
        (model / "model.safetensors").unlink()
        bytearray_bomb(model / "pytorch_model.bin")
        r = CliRunner().invoke(main, ["fill-mask", "--model", str(model), "w1 [MASK]"])
    assert r.exit_code == 1 and "asks for an object of 2,147,483,647 bytes" in r.output, r.output


# ---------------------------------------------------------------- config.json checked before any tensor

def edited_model(tmp_path, **changes):
    model = tiny_model_folder(tmp_path)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **changes}))
    return model


@pytest.mark.parametrize("changes, said", [
    ({"num_hidden_layers": 5000}, "num_layers must be an integer from 1 to 256, got 5000"),
    ({"num_hidden_layers": 1}, "num_hidden_layers is 1, but the weights hold 2 layers"),
    ({"intermediate_size": 60000}, "has shape (512, 128), expected (60000, 128)"),
    ({"max_position_embeddings": 100000}, "has shape (512, 128), expected (100000, 128)"),
    ({"hidden_size": "128"}, "hidden_size must be an integer from 1 to 16,384, got '128'"),
    ({"num_attention_heads": -2}, "num_heads must be an integer from 1 to 256, got -2"),
    ({"layer_norm_eps": -1.0}, "layer_norm_eps must be a number in (0, 1), got -1.0"),
    ({"hidden_dropout_prob": 3}, "hidden_dropout must be a number in [0, 1), got 3"),
    ({"pad_token_id": 99}, "pad_token_id must be a token id below vocab_size 32, got 99"),
])
def test_a_config_is_checked_before_any_tensor(tmp_path, changes, said):
    model = edited_model(tmp_path, **changes)
    r = CliRunner().invoke(main, ["fill-mask", "--model", str(model), "w1 [MASK]"])
    assert r.exit_code == 1 and said in r.output and str(model) in r.output, r.output
    assert "fill-mask needs a model pretrained" not in r.output


def test_a_modernbert_config_is_checked_against_its_weights(tmp_path):
    from bertkit.models import ModelFolderError, load_pretrained, save_pretrained
    from bertkit.models.modernbert import ModernBertConfig, ModernBertForMaskedLM

    save_pretrained(ModernBertForMaskedLM(ModernBertConfig.preset("tiny", vocab_size=40)), tmp_path / "mb")
    config = json.loads((tmp_path / "mb" / "config.json").read_text())
    cases = [({"num_hidden_layers": 2, "layer_types": None}, "num_hidden_layers is 2, but the weights hold 4 layers"),
             ({"intermediate_size": 9000}, "but config.json gives (18000, 128)"),
             ({"global_rope_theta": 0, "rope_parameters": None}, "global_rope_theta must be a number in (1, 1e+12)"),
             ({"global_attn_every_n_layers": 0, "layer_types": None}, "global_every must be an integer from 1 to 256")]
    for changes, said in cases:
        (tmp_path / "mb" / "config.json").write_text(json.dumps({**config, **changes}))
        with pytest.raises(ModelFolderError, match=said.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
            load_pretrained(tmp_path / "mb")


def test_a_run_folders_model_is_checked_against_its_checkpoint(run, tmp_path):
    theirs = tmp_path / "theirs"
    shutil.copytree(run, theirs)
    config = json.loads((theirs / "config.json").read_text())
    config["model"]["intermediate_size"] = 60000
    (theirs / "config.json").write_text(json.dumps(config))
    r = CliRunner().invoke(main, ["export", str(theirs), "--out", str(tmp_path / "e")])
    assert r.exit_code == 1 and "gives bert.layers.0.ffn_in.weight the shape (60000, 32)" in r.output, r.output
    config["model"]["num_layers"] = 100000
    (theirs / "config.json").write_text(json.dumps(config))
    r = CliRunner().invoke(main, ["export", str(theirs), "--out", str(tmp_path / "e")])
    assert r.exit_code == 1 and "num_layers must be an integer from 1 to 256" in r.output, r.output


@pytest.mark.parametrize("flag, value", [("--pad-vocab-to", "3000000"), ("--threads", "1000000")])
def test_size_flags_have_an_upper_bound(flag, value):
    r = CliRunner().invoke(main, ["pretrain", flag, value])
    assert r.exit_code == 2 and f"Invalid value for '{flag}': {value} is not in the range 1<=x<=" in r.output


def test_the_python_api_bounds_them_too():
    from bertkit.pretrain import ConfigError, PretrainConfig
    from bertkit.threads import choose_threads

    with pytest.raises(ConfigError, match="--pad-vocab-to 3000000: choose 1 to 4096"):
        PretrainConfig(instances="x", out="o", pad_vocab_to=3_000_000).check()
    with pytest.raises(ValueError, match="--threads 1000000: choose 1 to 1024"):  # pretrain and finetune both
        choose_threads(1_000_000)
    assert torch.get_num_threads() < 1024


def test_a_users_own_files_given_by_path_may_be_links(run, tmp_path):
    """The rule is for folders from someone else: a vocab.txt, a config.json or a --deepspeed-config the user names
    by its own path is read through a link (dotfiles, shared checkouts)."""
    from bertkit.models.bert_config import BertConfig
    from bertkit.pretrain import PretrainConfig
    from bertkit.pretrain.run import read_user_deepspeed_config
    from bertkit.tokenization import load_tokenizer

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "ds.json").write_text('{"steps_per_print": 7}')
    (tmp_path / "ds.json").symlink_to(mine / "ds.json")
    cfg = PretrainConfig(instances="x", out=str(tmp_path / "run"), deepspeed_config=str(tmp_path / "ds.json"))
    assert read_user_deepspeed_config(cfg) == {"steps_per_print": 7}
    shutil.copy(run / "tokenizer" / "vocab.txt", mine / "vocab.txt")
    (tmp_path / "vocab.txt").symlink_to(mine / "vocab.txt")
    assert load_tokenizer(tmp_path / "vocab.txt").get_vocab_size() > 5
    (mine / "model.json").write_text(json.dumps({"vocab_size": 40, "hidden_size": 32, "num_layers": 1,
                                                 "num_heads": 2, "intermediate_size": 64}))
    (tmp_path / "model.json").symlink_to(mine / "model.json")
    assert BertConfig.from_spec(str(tmp_path / "model.json"), 40).num_layers == 1


# ---------------------------------------------------------------- 4. token ids past the vocabulary

def with_tokenizer_json(folder):
    from bertkit.tokenization import tokenizer_from_vocab

    if not (folder / "tokenizer.json").is_file():
        tokenizer_from_vocab(folder / "vocab.txt").save(str(folder / "tokenizer.json"))
    return json.loads((folder / "tokenizer.json").read_text())


def gapped_tokenizer(folder, top: int):
    """The folder's tokenizer.json with its last token moved to id `top`."""
    data = with_tokenizer_json(folder)
    vocab = data["model"]["vocab"]
    last = max(vocab, key=vocab.get)
    vocab[last] = top
    (folder / "tokenizer.json").write_text(json.dumps(data))
    return last


def test_fill_mask_with_an_id_past_the_vocabulary_is_refused(tmp_path):
    model = tiny_model_folder(tmp_path)
    from bertkit.tokenization import TokenizerError, load_tokenizer

    token = gapped_tokenizer(model, 99_999)
    with pytest.raises(TokenizerError, match=rf"the token {token!r} has id 99,999, but the vocabulary holds 32 "
                                             "tokens; ids must run from 0 to 31 without gaps"):
        load_tokenizer(model)
    r = CliRunner().invoke(main, ["fill-mask", "--model", str(model), "w1 [MASK]"])
    assert r.exit_code == 1 and "has id 99,999" in r.output and "Traceback" not in r.output, r.output


def test_make_instances_never_wraps_an_id(run, tmp_path):
    from tests.helpers import write_corpus

    corpus = write_corpus(tmp_path / "corpus", [[["w1 w2 w3 w4.", "w5 w6 w7 w8."]] * 4])
    tok = tmp_path / "tok"
    shutil.copytree(run / "tokenizer", tok)
    gapped_tokenizer(tok, 70_000)
    r = CliRunner().invoke(main, ["make-instances", str(corpus), "--tokenizer", str(tok), "--out",
                                  str(tmp_path / "inst"), "--max-seq-length", "16", "--no-progress"])
    assert r.exit_code == 1 and "has id 70,000" in r.output and "without gaps" in r.output, r.output
    assert not (tmp_path / "inst" / "manifest.json").exists()


def test_a_model_folders_added_token_past_the_embeddings_is_refused(tmp_path):
    from bertkit.models import ModelFolderError, load_pretrained

    model = tiny_model_folder(tmp_path)
    data = with_tokenizer_json(model)
    data["added_tokens"].append({"id": 32, "content": "[NEW]", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True})
    (model / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ModelFolderError, match=r"gives token ids up to 32, but tensor .* has only 32 word "
                                               "embeddings"):
        load_pretrained(model)

