"""The pre-LN encoder (BertConfig.norm="pre", pretrain --norm pre) against transformers' MegatronBert: the same
weights give the same hidden states, MLM/NSP logits, losses and gradients (fp32, 1e-5), padded and packed; its
save loads in transformers with no missing or unexpected keys, and transformers' saves load in bertkit."""
import pytest
import torch

from bertkit.models import bert as bm, load_pretrained, save_pretrained
from bertkit.models.bert_hf import to_hf_state_dict
from tests.test_model import LENGTHS, _canonical_state_params, assert_close, batch, hf_twin, randomise, tiny_config

transformers = pytest.importorskip("transformers")


def test_pre_ln_matches_megatron_bert_forward_and_backward():
    model = bm.BertForPreTraining(tiny_config(norm="pre", hidden_dropout=0.0, attention_dropout=0.0))
    randomise(model)
    assert model.bert.embeddings.norm is None and model.bert.final_norm is not None
    hf = hf_twin(model, transformers.MegatronBertForPreTraining)
    ids, types, mask = batch(model.cfg)
    labels = torch.where(torch.rand(ids.shape, generator=torch.Generator().manual_seed(2)) < 0.3, ids, -100)
    labels[mask == 0] = -100
    nsp = torch.tensor([0, 1, 0])
    theirs = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels, next_sentence_label=nsp,
                output_hidden_states=True)
    ours = model(ids, types, mask, next_sentence_label=nsp)
    hidden = model.bert(ids, types, mask).last_hidden_state
    for i, n in enumerate(LENGTHS):  # padded rows are not meaningful (see bertkit.models.bert)
        assert_close(hidden[i, :n], theirs.hidden_states[-1][i, :n], f"hidden row {i}")
        assert_close(ours.mlm_logits[i, :n], theirs.prediction_logits[i, :n], f"MLM logits row {i}")
    assert_close(ours.nsp_logits, theirs.seq_relationship_logits, "NSP logits")

    # losses and gradients: our MLM loss at the labelled positions equals transformers' token-level one
    pos = [torch.nonzero(labels[i] != -100).flatten() for i in range(len(LENGTHS))]
    width = max(len(p) for p in pos)
    positions = torch.stack([torch.cat([p, p.new_zeros(width - len(p))]) for p in pos])
    mlm_labels = torch.stack([torch.cat([labels[i, p], p.new_full((width - len(p),), -100)])
                              for i, p in enumerate(pos)])
    out = model(ids, types, mask, mlm_positions=positions, mlm_labels=mlm_labels, next_sentence_label=nsp)
    assert_close(out.loss, theirs.loss, "loss")
    out.loss.backward()
    theirs.loss.backward()
    ours_grads = to_hf_state_dict({k: p.grad for k, p in _canonical_state_params(model).items()}, model.cfg)
    for name, p in hf.named_parameters():
        assert_close(ours_grads[name], p.grad, f"grad {name}")


def test_pre_ln_packed_equals_padded():
    cfg = tiny_config(norm="pre", hidden_dropout=0.0, attention_dropout=0.0)
    model = bm.BertModel(cfg)
    randomise(model)
    ids, types, mask = batch(cfg)
    padded = model(ids, types, mask).last_hidden_state
    flat = torch.cat([ids[i, :n] for i, n in enumerate(LENGTHS)])
    flat_types = torch.cat([types[i, :n] for i, n in enumerate(LENGTHS)])
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    packed = model(flat, flat_types, cu_seqlens=cu, max_seqlen=max(LENGTHS)).last_hidden_state
    for i, n in enumerate(LENGTHS):
        assert_close(packed[cu[i]:cu[i + 1]], padded[i, :n], f"row {i}")


@pytest.mark.parametrize("head,hf_class,masked_lm_only", [
    ("pretraining", "MegatronBertForPreTraining", False),
    ("pretraining", "MegatronBertForMaskedLM", True),
    ("sequence_classification", "MegatronBertForSequenceClassification", False),
    ("token_classification", "MegatronBertForTokenClassification", False),
    ("question_answering", "MegatronBertForQuestionAnswering", False),
])
def test_pre_ln_saves_load_in_transformers_both_ways(tmp_path, head, hf_class, masked_lm_only):
    cfg = tiny_config(norm="pre")
    model = bm.build_model(cfg, head, 3 if "classification" in head else None).eval()
    randomise(model)
    save_pretrained(model, tmp_path / "ours", masked_lm_only=masked_lm_only)
    cls = getattr(transformers, hf_class)
    theirs, info = cls.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids, types, mask = batch(cfg)
    if head == "pretraining":
        a = model(ids, types, mask).mlm_logits
        b = theirs.eval()(input_ids=ids, token_type_ids=types, attention_mask=mask)
        b = b.prediction_logits if hasattr(b, "prediction_logits") else b.logits
    elif head == "question_answering":
        a = model(ids, types, mask).start_logits
        b = theirs.eval()(input_ids=ids, token_type_ids=types, attention_mask=mask).start_logits
    else:
        a = model(ids, types, mask).logits
        b = theirs.eval()(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
    valid = mask.bool() if head != "sequence_classification" else slice(None)  # padded rows mean nothing
    assert_close(a[valid], b[valid], f"{hf_class} output")

    # and back: transformers' save of it loads in bertkit as pre-LN with every tensor used
    theirs.save_pretrained(tmp_path / "theirs")
    back = load_pretrained(tmp_path / "theirs", head=head)
    assert back.cfg.norm == "pre" and not back.loading_info["unused"]


@pytest.mark.slow
def test_pre_ln_on_two_ranks_trains_resumes_exports_and_fine_tunes(tmp_path):
    """`deepspeed --num_gpus 2 cli.py pretrain --norm pre` under ZeRO-2: the loss falls, a resume logs the
    uninterrupted run's losses step for step, the export is a MegatronBertForPreTraining that transformers loads and
    agrees with, and fine-tuning starts from it."""
    import json
    import os
    import signal
    import time

    from bertkit.pretrain import export
    from tests.helpers import TINY, finish, launch, make_instances_dir, quick_finetune
    from tests.test_pretrain_dist import common, metrics

    inst = make_instances_dir(tmp_path / "inst", n=512, holdout=48, max_len=48)
    (tmp_path / "model.json").write_text(json.dumps(TINY))
    flags = ["--norm", "pre", "--dropout", "0"]
    finish(launch(common(inst, tmp_path, tmp_path / "ref", max_steps=16, save_every=4) + flags))
    killed = launch(common(inst, tmp_path, tmp_path / "cut", max_steps=16, save_every=4) + flags)
    latest = tmp_path / "cut" / "checkpoints" / "latest"
    deadline = time.time() + 150
    while not latest.exists() and killed.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(killed.pid, signal.SIGKILL)  # the launcher and both ranks, no chance to save
    killed.wait()
    resumed_from = int(latest.read_text()[len("global_step"):])
    finish(launch(common(inst, tmp_path, tmp_path / "cut", max_steps=16, save_every=4) + flags + ["--resume"]))
    ref, cut = metrics(tmp_path / "ref"), metrics(tmp_path / "cut")
    assert ref[16]["loss"] < ref[1]["loss"] - 0.1 and resumed_from < 16
    for s in range(resumed_from + 1, 17):
        assert cut[s]["loss"] == pytest.approx(ref[s]["loss"], rel=1e-6), s
    run_config = json.loads((tmp_path / "ref" / "config.json").read_text())
    assert run_config["model"]["norm"] == "pre" and run_config["pretrain"]["norm"] == "pre"

    out = export(tmp_path / "cut", tmp_path / "export")
    theirs, info = transformers.MegatronBertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ours = load_pretrained(out, head="pretraining")
    ids, types, mask = (t[:, :9] for t in batch(ours.cfg))
    ids = ids.clamp(max=ours.cfg.vocab_size - 1)
    assert_close(ours(ids, types, mask).mlm_logits[mask.bool()],
                 theirs.eval()(input_ids=ids, token_type_ids=types, attention_mask=mask).prediction_logits[mask.bool()],
                 "export against transformers")

    summary = quick_finetune(out, tmp_path / "ft")
    assert summary["settings"]["train_rows"] == 32 and summary["epochs"][0]["train_loss"] > 0
