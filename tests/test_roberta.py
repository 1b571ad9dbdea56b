"""RoBERTa's layout (KLUE's RoBERTa: BERT's encoder with RoBERTa's names, positions from pad_token_id + 1 and one token
type) loads into bertkit's BERT and back: every head's outputs equal transformers' within 1e-5 in fp32 (models built
small and random with transformers itself, no hub), padded and packed, a pair's type ids ignored as RoBERTa's
tokenizer gives none, the usable length the position table less its offset, and a bertkit model saved in this layout
loads into transformers' Roberta* class with no missing or unexpected keys."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from bertkit.models import (  # noqa: E402
    bert as bm,
    load_pretrained,
    save_pretrained,
)

VOCAB, PAD, LENGTH = 61, 1, 24
HEADS = [
    (None, "RobertaModel", {}),
    ("pretraining", "RobertaForMaskedLM", {}),
    ("sequence_classification", "RobertaForSequenceClassification", {"num_labels": 3}),
    ("token_classification", "RobertaForTokenClassification", {"num_labels": 4}),
    ("question_answering", "RobertaForQuestionAnswering", {}),
]


def random_roberta(cls_name, seed=0, **extra):
    torch.manual_seed(seed)
    config = transformers.RobertaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=32, max_position_embeddings=LENGTH + PAD + 1,
                                        type_vocab_size=1, pad_token_id=PAD, bos_token_id=0, eos_token_id=2,
                                        layer_norm_eps=1e-5, attn_implementation="eager", **extra)
    hf = getattr(transformers, cls_name)(config)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # biases and LayerNorms away from their 0 / 1 starts
    return hf.eval()


def batch():
    """A pair (its second segment typed 1, as a BERT template gives it) and a single text right-padded with PAD."""
    ids = torch.tensor([[0, 9, 17, 33, 2, 40, 41, 2], [0, 12, 60, 2, PAD, PAD, PAD, PAD]])
    types = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1], [0] * 8])
    return ids, types, (ids != PAD).long()


def head_output(out, head):
    """What a head gives, from either library's output (bertkit names the MLM head's logits mlm_logits)."""
    if head is None:
        return out.last_hidden_state
    if head == "question_answering":
        return torch.stack([out.start_logits, out.end_logits], -1)
    return out.mlm_logits if hasattr(out, "mlm_logits") else out.logits


def hf_outputs(hf, head):
    ids, _, mask = batch()
    with torch.no_grad():
        return head_output(hf(input_ids=ids, attention_mask=mask), head)  # RoBERTa's tokenizer gives no type ids


def our_outputs(model, head):
    ids, types, mask = batch()
    with torch.no_grad():
        return head_output(model(ids, token_type_ids=types, attention_mask=mask), head)


@pytest.mark.parametrize("head,cls_name,extra", HEADS)
def test_every_roberta_head_equals_transformers_both_ways(tmp_path, head, cls_name, extra):
    hf = random_roberta(cls_name, **extra)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_pretrained(tmp_path / "hf", head="auto")
    assert ours.loading_info["head"] == head and ours.cfg.layout == "roberta" and ours.cfg.position_offset == 2
    spare = ("cls.seq_relationship", "roberta.pooler")  # BERT's NSP head and pooler: RobertaForMaskedLM has neither
    essential = [n for n in ours.loading_info["missing"] if not n.startswith(spare)]
    assert not essential and not ours.loading_info["unused"]
    valid = batch()[2].bool()
    at_tokens = head not in ("sequence_classification",)
    want, got = hf_outputs(hf, head), our_outputs(ours, head)
    torch.testing.assert_close(got[valid] if at_tokens else got, want[valid] if at_tokens else want, rtol=0, atol=1e-5)

    save_pretrained(ours, tmp_path / "ours")
    back, info = getattr(transformers, cls_name).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    back_out = hf_outputs(back.eval(), head)
    torch.testing.assert_close(back_out[valid] if at_tokens else back_out, want[valid] if at_tokens else want,
                               rtol=0, atol=1e-5)


def test_packed_roberta_equals_padded_and_the_length_is_the_table_less_its_offset(tmp_path):
    hf = random_roberta("RobertaForMaskedLM")
    hf.save_pretrained(tmp_path / "hf")
    ours = load_pretrained(tmp_path / "hf")
    ids, types, mask = batch()
    lengths = mask.sum(1)
    packed = torch.cat([row[:n] for row, n in zip(ids, lengths)])
    cu = torch.tensor([0, *lengths.cumsum(0).tolist()], dtype=torch.int32)
    with torch.no_grad():
        padded = ours.bert(ids, token_type_ids=types, attention_mask=mask).last_hidden_state[mask.bool()]
        flat = ours.bert(packed, cu_seqlens=cu, max_seqlen=int(lengths.max())).last_hidden_state
    torch.testing.assert_close(flat, padded, rtol=0, atol=1e-5)

    assert ours.cfg.max_length == LENGTH  # 24 + pad_token_id + 1 rows in the table
    longest = torch.full((1, LENGTH), 5)
    with torch.no_grad():
        ours(longest)  # fills the table exactly
        with pytest.raises(ValueError, match=rf"{LENGTH + 1} tokens; the model has {LENGTH} positions"):
            ours(torch.full((1, LENGTH + 1), 5))


def test_a_bert_model_keeps_bert_s_positions_and_names():
    """The layout is RoBERTa's only where the file says so: a BERT model reads position 0 from row 0."""
    from bertkit.models.bert_config import BertConfig

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                     pad_token_id=PAD)
    assert cfg.position_offset == 0 and cfg.max_length == cfg.max_position_embeddings
    assert cfg.to_hf_dict()["model_type"] == "bert"
    roberta = BertConfig.from_hf_dict(random_roberta("RobertaModel").config.to_dict())
    assert roberta.to_hf_dict()["model_type"] == "roberta" and roberta.type_vocab_size == 1
    with pytest.raises(ValueError, match="layout must be 'bert', or 'roberta' with norm 'post'"):
        BertConfig(layout="roberta", norm="pre")
    assert isinstance(bm.build_model(roberta, "pretraining"), bm.BertForPreTraining)


def test_a_roberta_folder_s_faults_are_told_in_roberta_s_names(tmp_path):
    """A user greps their file for the names a message gives: RoBERTa's, not the BERT names bertkit reads them as."""
    from safetensors.torch import load_file, save_file

    from bertkit.models.bert_hf import ModelFolderError

    random_roberta("RobertaForSequenceClassification", num_labels=3).save_pretrained(tmp_path / "cls")
    with pytest.raises(ModelFolderError, match=r"'classifier\.out_proj\.weight' has shape \(3, 16\), expected \(5, "):
        load_pretrained(tmp_path / "cls", head="sequence_classification", num_labels=5)

    random_roberta("RobertaForMaskedLM").save_pretrained(tmp_path / "mlm")
    mlm = load_pretrained(tmp_path / "mlm", head="sequence_classification", num_labels=2)
    assert set(mlm.loading_info["missing"]) == {f"classifier.{p}.{w}" for p in ("dense", "out_proj")
                                                for w in ("weight", "bias")}
    assert "lm_head.dense.weight" in mlm.loading_info["unused"]
    with pytest.raises(ModelFolderError, match=r"lacks classifier\.dense\.weight, classifier\.dense\.bias, "):
        load_pretrained(tmp_path / "mlm", head="sequence_classification", num_labels=2, require_head=True)

    weights = load_file(tmp_path / "mlm" / "model.safetensors")
    del weights["roberta.encoder.layer.1.attention.self.query.weight"]
    save_file(weights, tmp_path / "mlm" / "model.safetensors")
    with pytest.raises(ModelFolderError, match=r"lacks tensor 'roberta\.encoder\.layer\.1\.attention\.self\.query"
                                               r"\.weight'.*a Roberta checkpoint"):
        load_pretrained(tmp_path / "mlm", head="pretraining")


def test_a_korean_fine_tune_from_a_roberta_folder_saves_what_transformers_loads(tmp_path):
    """KLUE's RoBERTa as a user has it (RoBERTa weights, a WordPiece vocab.txt with [CLS]=0 and [PAD]=1): `finetune
    korean --task nsmc` trains from it (packed, its default), and best/ is a RobertaForSequenceClassification that
    transformers loads whole and that scores as bertkit does."""
    import json

    from click.testing import CliRunner

    from bertkit.cli import main
    from bertkit.tokenization import load_tokenizer

    texts = ["정말 재미있는 영화", "지루하고 별로였다", "배우 연기가 좋다", "다시는 안 본다"] * 4
    syllables = sorted({c for t in texts for c in t if c != " "})
    vocab = ["[CLS]", "[PAD]", "[SEP]", "[UNK]", "[MASK]"] + syllables + [f"##{c}" for c in syllables]
    hf = random_roberta("RobertaForMaskedLM")
    hf.resize_token_embeddings(len(vocab))
    model = tmp_path / "klue-roberta"
    hf.save_pretrained(model)
    (model / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (model / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "strip_accents": False}))
    rows = tmp_path / "nsmc.txt"
    rows.write_text("id\tdocument\tlabel\n" + "".join(f"{i}\t{t}\t{int(i % 4 in (0, 2))}\n"
                                                       for i, t in enumerate(texts)), encoding="utf-8")
    out = tmp_path / "ft"
    r = CliRunner().invoke(main, ["finetune", "korean", "--task", "nsmc", "--train-file", str(rows), "--dev-file",
                                  str(rows), "--model", str(model), "--out", str(out), "--epochs", "1",
                                  "--batch-size", "4", "--max-seq-length", str(LENGTH), "--report-to", "none"])
    assert r.exit_code == 0, r.output
    longer = CliRunner().invoke(main, ["finetune", "korean", "--task", "nsmc", "--train-file", str(rows),
                                       "--dev-file", str(rows), "--model", str(model), "--out", str(tmp_path / "long"),
                                       "--max-seq-length", str(LENGTH + 1), "--report-to", "none"])
    assert longer.exit_code == 1 and f"--max-seq-length {LENGTH + 1} is longer than the {LENGTH} positions" in \
        longer.output, longer.output  # the table's 26 rows hold 24 tokens
    back, info = transformers.RobertaForSequenceClassification.from_pretrained(out / "best", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ours = load_pretrained(out / "best")
    enc = load_tokenizer(out / "best").encode(texts[0], texts[1])  # a pair: types 0 and 1, which ours ignores
    theirs = transformers.AutoTokenizer.from_pretrained(out / "best")(texts[0], texts[1], return_tensors="pt")
    assert theirs["input_ids"][0].tolist() == enc.ids and "token_type_ids" not in theirs  # WordPiece, one type
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(**theirs).logits, ours(torch.tensor([enc.ids]),
                                   token_type_ids=torch.tensor([enc.type_ids])).logits, rtol=0, atol=1e-5)
    said = CliRunner().invoke(main, ["fill-mask", "--model", str(model), "--top-k", "2", "정말 [MASK] 영화"])
    assert said.exit_code == 0 and len(said.output.splitlines()) == 3, said.output


def test_continued_pretraining_from_a_roberta_exports_a_roberta(tmp_path, clean_dist_env):
    """Domain-adaptive pretraining as a Korean team does it: --init-from KLUE's RoBERTa on one's own instances, then
    export: transformers loads a RobertaForMaskedLM whole, trained away from the start; instances longer than the
    position table less its offset are refused before any step."""
    import os

    from bertkit.pretrain import PretrainConfig, export, pretrain
    from bertkit.pretrain.config import ConfigError
    from tests.helpers import make_instances_dir, toy_vocab

    start = random_roberta("RobertaForMaskedLM")
    start.resize_token_embeddings(len(toy_vocab()))
    start.save_pretrained(tmp_path / "roberta")
    (tmp_path / "roberta" / "vocab.txt").write_text("\n".join(toy_vocab()) + "\n")
    args = dict(out=str(tmp_path / "run"), init_from=str(tmp_path / "roberta"), objective="mlm", max_steps=3,
                micro_batch=8, optimizer="adamw", lr=1e-3, num_workers=0, eval_every=0, save_every=3, progress=False,
                report_to="none", precision="fp32")
    saved = dict(os.environ)
    try:
        with pytest.raises(ConfigError, match=f"sequences of {LENGTH + 8} tokens but the model has only {LENGTH}"):
            pretrain(PretrainConfig(instances=str(make_instances_dir(tmp_path / "long", n=16, holdout=2,
                                                                      max_len=LENGTH + 8)), **args))
        pretrain(PretrainConfig(instances=str(make_instances_dir(tmp_path / "inst", n=32, holdout=4, max_len=LENGTH)),
                                **{**args, "out": str(tmp_path / "run2")}))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    out = export(tmp_path / "run2", tmp_path / "export")
    back, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert type(back).__name__ == "RobertaForMaskedLM" and not info["missing_keys"] and not info["unexpected_keys"]
    rows = (back.roberta.embeddings.position_embeddings.weight - start.roberta.embeddings.position_embeddings.weight)
    moved = rows.abs().amax(1)
    assert moved[PAD + 1] > 1e-4  # position 0 is row pad_token_id + 1: three steps at 1e-3 trained it
    assert moved[:PAD + 1].max() < 1e-5  # rows below the offset are never read: weight decay's drift only
