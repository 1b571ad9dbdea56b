"""bertkit merge: the weighted mean tensor by tensor, TIES against a plain numpy TIES, a folder transformers loads and
bertkit verify passes, and models of another shape or vocabulary refused."""
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.merge import MergeError, merge, ties
from bertkit.models.bert_hf import read_weights

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(27)]


def model_folder(root, name, seed, hidden=None, vocab=VOCAB):
    from bertkit.models import save_pretrained
    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig

    tokenizer = root / f"tok-{vocab[-1]}"
    tokenizer.mkdir(exist_ok=True)
    (tokenizer / "vocab.txt").write_text("\n".join(vocab) + "\n")
    cfg = BertConfig.preset("tiny", vocab_size=len(vocab))
    if hidden:
        cfg = BertConfig.preset("mini", vocab_size=len(vocab))
    torch.manual_seed(seed)
    return save_pretrained(BertForPreTraining(cfg), root / name, tokenizer_dir=tokenizer)


def test_the_weighted_mean_tensor_by_tensor_in_a_folder_transformers_loads(tmp_path):
    a, b = model_folder(tmp_path, "a", 0), model_folder(tmp_path, "b", 1)
    r = CliRunner().invoke(main, ["merge", str(a), str(b), "--out", str(tmp_path / "m"), "--weights", "3,1"])
    assert r.exit_code == 0, r.output
    wa, wb, merged = read_weights(a), read_weights(b), read_weights(tmp_path / "m")
    assert set(merged) == set(wa)
    assert all(torch.allclose(merged[k], (3 * wa[k] + wb[k]) / 4, atol=1e-7) for k in wa if wa[k].is_floating_point())
    transformers = pytest.importorskip("transformers", reason="transformers (the dev extra) is not installed")
    loaded = transformers.AutoModelForPreTraining.from_pretrained(str(tmp_path / "m"))
    ours = dict(loaded.state_dict())
    assert torch.allclose(ours["bert.embeddings.word_embeddings.weight"][:len(VOCAB)],
                          merged["bert.embeddings.word_embeddings.weight"][:len(VOCAB)])
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert [s["folder"] for s in manifest["merged_from"]] == ["a", "b"] and manifest["merge"]["weights"] == [3.0, 1.0]
    assert CliRunner().invoke(main, ["verify", str(tmp_path / "m")]).exit_code == 0
    assert "not trained" in (tmp_path / "m" / "README.md").read_text()


def numpy_ties(base, models, density):
    deltas = [m - base for m in models]
    trimmed = []
    for d in deltas:
        k = max(1, int(round(density * d.size)))
        cut = np.sort(np.abs(d).ravel())[::-1][k - 1]
        trimmed.append(np.where(np.abs(d) >= cut, d, 0.0))
    sign = np.sign(sum(trimmed))
    out = np.zeros_like(base)
    for index in np.ndindex(base.shape):
        agreeing = [t[index] for t in trimmed if t[index] != 0 and np.sign(t[index]) == sign[index]]
        out[index] = base[index] + (np.mean(agreeing) if agreeing else 0.0)
    return out


def test_ties_equals_a_plain_numpy_ties():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(6, 5)).astype(np.float32)
    models = [base + rng.normal(size=(6, 5)).astype(np.float32) for _ in range(3)]
    for density in (0.2, 0.5, 1.0):
        got = ties({"w": torch.from_numpy(base)}, [{"w": torch.from_numpy(m)} for m in models], density)["w"]
        assert np.allclose(got.numpy(), numpy_ties(base, models, density), atol=1e-6), density


def test_models_that_cannot_be_merged_are_refused(tmp_path):
    a, b = model_folder(tmp_path, "a", 0), model_folder(tmp_path, "b", 1)
    wide = model_folder(tmp_path, "wide", 2, hidden=256)
    other = model_folder(tmp_path, "other", 3, vocab=VOCAB[:-1] + ["x26"])   # one size, other tokens
    with pytest.raises(MergeError, match="another architecture"):
        merge([a, wide], tmp_path / "x")
    with pytest.raises(MergeError, match="another vocabulary"):
        merge([a, other], tmp_path / "y")
    with pytest.raises(MergeError, match="takes --base"):
        merge([a, b], tmp_path / "z", method="ties")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(MergeError, match="not empty"):
        merge([a, b], tmp_path / "full")
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    with pytest.raises(MergeError, match="is a link"):   # it would write where the link points
        merge([a, b], tmp_path / "link")
    assert not any((tmp_path / "empty").iterdir())
    assert merge([a, b], tmp_path / "t", method="ties", base=a, density=0.5).is_dir()


def test_vocabularies_held_only_in_tokenizer_json_are_compared(tmp_path):
    """A released ModernBERT has no vocab.txt: its tokenizer.json is the vocabulary, and two of them are compared."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordPiece

    def with_tokenizer_json(folder, vocab):
        (folder / "vocab.txt").unlink()
        tokenizer = Tokenizer(WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
        tokenizer.save(str(folder / "tokenizer.json"))
        return folder

    a = with_tokenizer_json(model_folder(tmp_path, "a", 0), VOCAB)
    same = with_tokenizer_json(model_folder(tmp_path, "same", 1), VOCAB)
    other = with_tokenizer_json(model_folder(tmp_path, "other", 2), VOCAB[:-1] + ["x26"])
    with pytest.raises(MergeError, match="another vocabulary"):
        merge([a, other], tmp_path / "x")
    assert (merge([a, same], tmp_path / "m") / "tokenizer.json").is_file()
    (same / "tokenizer.json").unlink()   # one folder says its vocabulary, the other does not
    with pytest.raises(MergeError, match="another vocabulary"):
        merge([a, same], tmp_path / "y")


def test_ties_against_a_released_base_whose_config_spells_things_otherwise(tmp_path):
    """A released folder and bertkit's exports of models trained from it differ in config.json where the weights do
    not (initialisation, dropout, storage type, a fine-tuning head's pooling, a default left out): TIES against it
    is merged; a setting that changes what the same-shaped weights compute (the activation) is refused."""
    a, b = model_folder(tmp_path, "a", 0), model_folder(tmp_path, "b", 1)

    def base_with(name, **changes):
        folder = model_folder(tmp_path, name, 2)
        config = json.loads((folder / "config.json").read_text())
        config = {k: v for k, v in {**config, **changes}.items() if v != "leave out"}
        (folder / "config.json").write_text(json.dumps(config))
        return folder

    spelled = base_with("released", classifier_pooling="cls", classifier_dropout=0.3, initializer_range=0.05,
                        hidden_dropout_prob=0.0, torch_dtype="bfloat16", transformers_version="5.0",
                        layer_norm_eps="leave out", position_embedding_type=None)
    assert merge([a, b], tmp_path / "t", method="ties", base=spelled, density=0.5).is_dir()
    with pytest.raises(MergeError, match="another architecture.*hidden_act"):
        merge([a, b], tmp_path / "u", method="ties", base=base_with("relu", hidden_act="relu"))
