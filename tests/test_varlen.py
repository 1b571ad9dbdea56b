"""The unpadded (packed, varlen) path: the same rows packed end to end give what the padded batch gives (the padded
path itself is checked against HF transformers in test_model.py), and `bertkit pretrain --unpadded` trains alike."""
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from bertkit import kernels
from bertkit.data import InstanceDataset, collate, collate_packed
from bertkit.models import bert as bm
from bertkit.models.bert_config import BertConfig
from tests.helpers import TINY, make_instances_dir

TOL = 1e-5


def rows_of(lengths, vocab_size, seed=0):
    """Instance rows (the loader's dict) of the given lengths, with a sentence pair and a few masked slots each."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in lengths:
        ids = rng.integers(5, vocab_size, size=n)
        token_type = np.zeros(n, dtype=np.int64)
        token_type[n // 2:] = 1
        positions = np.sort(rng.choice(np.arange(1, n), size=min(3, n - 1), replace=False))
        rows.append({"input_ids": ids, "token_type_ids": token_type, "mlm_positions": positions,
                     "mlm_labels": rng.integers(5, vocab_size, size=len(positions)),
                     "next_sentence_label": int(rng.integers(0, 2))})
    return rows


def test_collate_packed_lays_rows_end_to_end():
    rows = rows_of([9, 2, 13], 50)
    padded, packed = collate(rows), collate_packed(rows)
    assert packed["cu_seqlens"].tolist() == [0, 9, 11, 24] and packed["cu_seqlens"].dtype == torch.int32
    assert packed["max_seqlen"] == 16 and isinstance(packed["max_seqlen"], int)  # the bucket, rounded up to 8
    assert packed["input_ids"].shape == (24,)
    assert packed["position_ids"].tolist() == list(range(9)) + [0, 1] + list(range(13))
    assert torch.equal(bm.packed_position_ids(packed["cu_seqlens"], 24), packed["position_ids"])
    real = padded["attention_mask"].bool()
    assert torch.equal(packed["input_ids"], padded["input_ids"][real])
    assert torch.equal(packed["token_type_ids"], padded["token_type_ids"][real])
    # flat MLM positions point at the same tokens as the padded (row, position) slots, labels in the same order
    has = padded["mlm_labels"] != -100
    rows_idx = torch.arange(3)[:, None].expand_as(has)
    assert torch.equal(packed["input_ids"][packed["mlm_positions"]],
                       padded["input_ids"][rows_idx[has], padded["mlm_positions"][has]])
    assert torch.equal(packed["mlm_labels"], padded["mlm_labels"][has])
    assert torch.equal(packed["next_sentence_label"], padded["next_sentence_label"])


@pytest.mark.parametrize("lengths, total", [([9, 2, 13], 24), ([4, 0, 3], 7), ([5, 1], 9), ([1], 1)])
def test_packed_token_owner_and_position_against_a_loop(lengths, total):
    """Each packed token's sequence and position (the one lookup the model and the torch attention backend share)
    equal a plain walk over the sequences; a tail past cu_seqlens[-1] (rounded-up packing) belongs to row B at
    position 0, and an empty sequence owns no token."""
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    owner = [b for b, n in enumerate(lengths) for _ in range(n)] + [len(lengths)] * (total - int(cu[-1]))
    position = [p for n in lengths for p in range(n)] + [0] * (total - int(cu[-1]))
    row, pos = kernels.packed_rows_and_positions(cu, total)
    assert row.tolist() == owner and pos.tolist() == position


@pytest.mark.parametrize("checkpointing", [False, True])
def test_packed_forward_and_backward_match_padded(checkpointing):
    cfg = BertConfig(vocab_size=101, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                     max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    padded_model = bm.BertForPreTraining(cfg)
    with torch.no_grad():  # random biases and LayerNorm affine too, so a wrongly indexed tensor shows
        for p in padded_model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    packed_model = bm.BertForPreTraining(cfg)
    packed_model.load_state_dict(padded_model.state_dict())
    for m in (padded_model, packed_model):
        m.bert.gradient_checkpointing = checkpointing
    rows = rows_of([11, 4, 17, 1], cfg.vocab_size, seed=3)  # a 1-token row: [CLS] alone, no MLM slot
    padded, packed = collate(rows), collate_packed(rows)

    a = padded_model(**padded)
    b = packed_model(**packed)
    hp = padded_model.bert(padded["input_ids"], padded["token_type_ids"], padded["attention_mask"])
    hq = packed_model.bert(packed["input_ids"], packed["token_type_ids"], cu_seqlens=packed["cu_seqlens"],
                           max_seqlen=packed["max_seqlen"])  # position_ids derived from cu_seqlens
    real = padded["attention_mask"].bool()
    assert hq.last_hidden_state.shape == (sum(len(r["input_ids"]) for r in rows), cfg.hidden_size)
    torch.testing.assert_close(hq.last_hidden_state, hp.last_hidden_state[real], atol=TOL, rtol=0)
    torch.testing.assert_close(hq.pooler_output, hp.pooler_output, atol=TOL, rtol=0)
    has = padded["mlm_labels"] != -100
    torch.testing.assert_close(b.mlm_logits, a.mlm_logits[has], atol=TOL, rtol=0)
    torch.testing.assert_close(b.nsp_logits, a.nsp_logits, atol=TOL, rtol=0)
    for name in ("mlm_loss", "nsp_loss", "loss"):
        torch.testing.assert_close(getattr(b, name), getattr(a, name), atol=TOL, rtol=0, msg=name)

    a.loss.backward()
    b.loss.backward()
    grads_b = dict(packed_model.named_parameters())
    for name, p in padded_model.named_parameters():
        assert p.grad is not None and grads_b[name].grad is not None, name
        torch.testing.assert_close(grads_b[name].grad, p.grad, atol=TOL, rtol=0, msg=f"grad {name}")


def test_packed_input_errors():
    cfg = BertConfig(vocab_size=101, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64,
                     max_position_embeddings=16)
    model = bm.BertModel(cfg)
    packed = collate_packed(rows_of([5, 7], cfg.vocab_size))
    with pytest.raises(ValueError, match="16 positions"):
        model(packed["input_ids"], cu_seqlens=packed["cu_seqlens"], max_seqlen=24)
    with pytest.raises(ValueError, match="packed batch"):
        model(packed["input_ids"], cu_seqlens=packed["cu_seqlens"])


def read_metrics(run):
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if "loss" in r], [r for r in lines if "eval_loss" in r]


@pytest.mark.parametrize("zero_stage", [2, 3])  # ZeRO-3 gathers parameters around each module's forward
def test_pretrain_unpadded_logs_the_same_losses(tmp_path, clean_dist_env, zero_stage):
    from bertkit.cli import main

    inst = make_instances_dir(tmp_path / "inst", n=48, holdout=16, max_len=40)
    (tmp_path / "model.json").write_text(json.dumps(TINY))
    common = ["--instances", str(inst), "--model", str(tmp_path / "model.json"), "--max-steps", "6",
              "--micro-batch", "4", "--global-batch", "8", "--optimizer", "adamw", "--zero-stage", str(zero_stage),
              "--lr", "3e-3", "--warmup", "0", "--dropout", "0", "--log-every", "1", "--eval-every", "3",
              "--eval-batches", "2", "--save-every", "100",
              "--num-workers", "0", "--no-progress"]
    runner = CliRunner()
    for name, extra in (("padded", []), ("unpadded", ["--unpadded"])):
        result = runner.invoke(main, ["pretrain", *common, "--out", str(tmp_path / name), *extra])
        assert result.exit_code == 0, result.output + repr(result.exception)
    padded, padded_eval = read_metrics(tmp_path / "padded")
    packed, packed_eval = read_metrics(tmp_path / "unpadded")
    assert json.loads((tmp_path / "unpadded" / "config.json").read_text())["pretrain"]["unpadded"] is True
    assert [r["step"] for r in packed] == list(range(1, 7)) and len(padded_eval) == len(packed_eval) == 2
    for p, q in zip(padded, packed):
        for key in ("loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr"):
            assert q[key] == pytest.approx(p[key], rel=1e-4, abs=1e-6), (p["step"], key)
    for p, q in zip(padded_eval, packed_eval):
        assert q["eval_loss"] == pytest.approx(p["eval_loss"], rel=1e-4)
    # tokens/s counts only real tokens in both: tokens per sequence (rate / rate) is the data's mean length
    train = InstanceDataset(inst, "train")
    mean_len = np.mean([len(train[(0, i)]["input_ids"]) for i in range(len(train))])
    per_seq = [r["tokens_per_s"] / r["seq_per_s"] for r in packed + padded]
    assert all(8 < x < 40 for x in per_seq)
    assert np.mean([r["tokens_per_s"] / r["seq_per_s"] for r in packed]) == pytest.approx(mean_len, rel=1e-6)
    assert [r["tokens_per_s"] / r["seq_per_s"] for r in packed] == pytest.approx(
        [r["tokens_per_s"] / r["seq_per_s"] for r in padded], rel=1e-9)


def fine_tuning_model(family: str, head: str):
    """A small random model of either family with a fine-tuning head (head: span, cls, mean or tags); random
    biases and norms too, so a wrongly indexed tensor shows."""
    from bertkit.models import modernbert as mb

    if family == "bert":
        cfg = BertConfig(vocab_size=101, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                         max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0)
        heads = {"span": bm.BertForQuestionAnswering, "tags": bm.BertForTokenClassification,
                 "cls": bm.BertForSequenceClassification, "mean": bm.BertForSequenceClassification}
    else:
        cfg = mb.ModernBertConfig(vocab_size=101, hidden_size=32, num_layers=3, num_heads=2, intermediate_size=48,
                                  local_window=8, global_every=3)
        heads = {"span": mb.ModernBertForQuestionAnswering, "tags": mb.ModernBertForTokenClassification,
                 "cls": mb.ModernBertForSequenceClassification, "mean": mb.ModernBertForSequenceClassification}
    if head in ("cls", "mean"):
        cfg.classifier_pooling = head
    model = heads[head](cfg) if head == "span" else heads[head](cfg, 3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.mark.parametrize("head", ["span", "cls", "mean", "tags"])
@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_every_fine_tuning_head_packed_equals_padded(family, head):
    """finetune's packed batches (its default): the rows end to end, with a tail past cu_seqlens[-1] that rounds
    the batch's size, give the padded batch's outputs at every real token (or row), its loss and every parameter's
    gradient. SQuAD windows: a position past a window's end is ignored in both; tags: -100 ignored."""
    from bertkit.finetune.train import collate_features as ft_collate, pack_features as ft_collate_packed

    torch.manual_seed(0)
    padded_model = fine_tuning_model(family, head)
    packed_model = type(padded_model)(padded_model.cfg) if head == "span" else \
        type(padded_model)(padded_model.cfg, 3)
    packed_model.load_state_dict(padded_model.state_dict())
    gen = torch.Generator().manual_seed(5)
    rows = []
    for n, s, e in ((11, 3, 5), (4, 0, 0), (17, 20, 20), (9, 8, 8)):  # 20: an answer cut away
        row = {"input_ids": torch.randint(5, 101, (n,), generator=gen).tolist(),
               "token_type_ids": [0] * (n // 2) + [1] * (n - n // 2)}
        if head == "span":
            row.update(start_positions=s, end_positions=e)
        elif head == "tags":
            row["labels"] = [-100] + torch.randint(0, 3, (n - 2,), generator=gen).tolist() + [-100]
        else:
            row["labels"] = s % 3
        rows.append(row)
    padded, packed = ft_collate(rows), ft_collate_packed(rows)
    assert packed["max_seqlen"] == 24 and padded["input_ids"].shape[1] == 17  # the two grids differ in width
    assert packed["input_ids"].numel() == 42 and packed["cu_seqlens"][-1] == 41  # a one-token tail

    a, b = padded_model(**padded), packed_model(**packed)
    real = padded["attention_mask"].bool()
    if head == "span":
        torch.testing.assert_close(b.start_logits[:41], a.start_logits[real], atol=TOL, rtol=0)
        torch.testing.assert_close(b.end_logits[:41], a.end_logits[real], atol=TOL, rtol=0)
        assert 1 < a.loss.item() < 10  # the cut-away answer is ignored, not scored against a masked logit
    else:
        torch.testing.assert_close(b.logits[:41] if head == "tags" else b.logits,
                                   a.logits[real] if head == "tags" else a.logits, atol=TOL, rtol=0)
    torch.testing.assert_close(b.loss, a.loss, atol=TOL, rtol=0)
    a.loss.backward()
    b.loss.backward()
    grads_b = dict(packed_model.named_parameters())
    for name, p in padded_model.named_parameters():
        if p.grad is None:  # BERT's pooler under mean pooling: unused by both
            assert grads_b[name].grad is None, name
            continue
        torch.testing.assert_close(grads_b[name].grad, p.grad, atol=TOL, rtol=0, msg=f"grad {name}")
