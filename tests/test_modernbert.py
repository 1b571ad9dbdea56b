"""ModernBERT equals transformers' ModernBertForMaskedLM (built small and random with transformers itself, no hub):
logits within 1e-5 in fp32 on padded batches longer than the local window, packed batches equal to padded ones, the
sparse MLM loss equal to transformers', and a bertkit model's tensors load into transformers with no missing or
unexpected keys."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from bertkit.models.modernbert import (  # noqa: E402
    ModernBertConfig,
    ModernBertForMaskedLM,
    hf_state_dict,
    load_hf_state_dict,
)

VOCAB = 97


def hf_config(**kw):
    args = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=2,
                max_position_embeddings=128, local_attention=8, global_attn_every_n_layers=3,
                global_rope_theta=160_000.0, local_rope_theta=10_000.0, pad_token_id=0, bos_token_id=2,
                eos_token_id=3, cls_token_id=2, sep_token_id=3, attn_implementation="sdpa")
    return transformers.ModernBertConfig(**{**args, **kw})


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    hf = transformers.ModernBertForMaskedLM(hf_config()).eval()
    cfg = ModernBertConfig.from_hf_dict(hf.config.to_dict())
    ours = ModernBertForMaskedLM(cfg).eval()
    load_hf_state_dict(ours, hf.state_dict(), "test")
    return hf, ours


def batch(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(4, VOCAB, (n,), generator=g)
        mask[i, :n] = 1
    return ids, mask


def test_the_config_round_trips_through_transformers():
    cfg = ModernBertConfig.from_hf_dict(hf_config().to_dict())
    assert (cfg.local_window, cfg.global_every, cfg.global_rope_theta, cfg.local_rope_theta) == (8, 3, 160_000.0,
                                                                                                  10_000.0)
    back = transformers.ModernBertConfig(**cfg.to_hf_dict())
    assert back.layer_types == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    assert back.sliding_window == 4 and back.rope_parameters["sliding_attention"]["rope_theta"] == 10_000.0


@pytest.mark.parametrize("lengths", [[30, 17, 5], [64], [9, 9]])
def test_logits_equal_transformers_on_padded_batches(pair, lengths):
    hf, ours = pair
    ids, mask = batch(lengths)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).mlm_logits
    valid = mask.bool()
    assert got.shape == want.shape
    torch.testing.assert_close(got[valid], want[valid], rtol=0, atol=1e-5)


def test_packed_equals_padded(pair):
    _, ours = pair
    lengths = [30, 17, 5]
    ids, mask = batch(lengths)
    packed = ids[mask.bool()]
    cu = torch.tensor([0, 30, 47, 52], dtype=torch.int32)
    with torch.no_grad():
        padded = ours(ids, attention_mask=mask).mlm_logits[mask.bool()]
        flat = ours(packed, cu_seqlens=cu).mlm_logits
    torch.testing.assert_close(flat, padded, rtol=0, atol=1e-5)


def test_the_sparse_mlm_loss_equals_transformers(pair):
    hf, ours = pair
    ids, mask = batch([30, 17])
    labels = torch.full_like(ids, -100)
    labels[0, [3, 20, 29]] = ids[0, [3, 20, 29]]
    labels[1, [0, 16]] = ids[1, [0, 16]]
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, labels=labels).loss
        out = ours(ids, attention_mask=mask, labels=labels)
    assert out.mlm_logits.shape == (5, VOCAB)  # only the masked positions reach the head
    torch.testing.assert_close(out.loss, want, rtol=0, atol=1e-5)


def test_a_bertkit_model_loads_into_transformers_with_every_key(pair):
    torch.manual_seed(3)
    cfg = ModernBertConfig.preset("tiny", vocab_size=VOCAB, local_window=8, max_position_embeddings=128)
    ours = ModernBertForMaskedLM(cfg).eval()
    assert ours.decoder.weight.shape[0] == 128  # padded to 64
    hf = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**cfg.to_hf_dict(),
                                                                          attn_implementation="sdpa")).eval()
    missing, unexpected = hf.load_state_dict(hf_state_dict(ours), strict=False)
    assert unexpected == [] and set(missing) <= {"decoder.weight"}
    hf.tie_weights()
    ids, mask = batch([40, 12])
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).logits[mask.bool()]
        torch.testing.assert_close(ours(ids, attention_mask=mask).mlm_logits[mask.bool()], want, rtol=0, atol=1e-5)


def test_pretrain_a_modernbert_then_export_it_for_transformers(tmp_path, clean_dist_env):
    """`pretrain --model modernbert-tiny` trains (padded and packed), refuses NSP instances unless --objective mlm,
    and its export loads in transformers' ModernBertForMaskedLM giving the checkpoint's logits."""
    import json

    from bertkit.models import build_pretraining
    from bertkit.pretrain import ConfigError, PretrainConfig, export, load_run_state_dict, pretrain
    from tests.helpers import make_instances_dir

    inst = make_instances_dir(tmp_path / "inst", n=64, holdout=8, max_len=48)
    args = dict(instances=str(inst), model="modernbert-tiny", micro_batch=8, max_steps=4, save_every=4, log_every=1,
                eval_every=0, num_workers=0, optimizer="adamw", lr=1e-3, progress=False, report_to="none")
    with pytest.raises(ConfigError, match="ModernBERT is MLM-only.*--objective none"):
        pretrain(PretrainConfig(out=str(tmp_path / "nsp"), **args))
    for unpadded in (False, True):
        run = tmp_path / f"run{int(unpadded)}"
        result = pretrain(PretrainConfig(out=str(run), objective="mlm", unpadded=unpadded, **args))
        assert result["step"] == 4 and result["loss"] < 6.0
        config = json.loads((run / "config.json").read_text())
        assert config["model"]["family"] == "modernbert" and config["kernels"] == "torch"
    out = export(tmp_path / "run1", tmp_path / "export")
    hf_cfg = json.loads((out / "config.json").read_text())
    assert hf_cfg["model_type"] == "modernbert" and hf_cfg["local_attention"] == 128
    assert hf_cfg["pad_token_id"] == 0 and hf_cfg["cls_token_id"] == 2 and hf_cfg["sep_token_id"] == 3
    hf, info = transformers.ModernBertForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    state, run_cfg, _ = load_run_state_dict(tmp_path / "run1")
    ours = build_pretraining(run_cfg.model, run_cfg.objective)
    ours.load_state_dict(state, strict=False)
    ids, mask = batch([40, 12])
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(ids, attention_mask=mask).mlm_logits[mask.bool()],
                                   hf.eval()(input_ids=ids, attention_mask=mask).logits[mask.bool()],
                                   rtol=0, atol=1e-5)


@pytest.mark.parametrize("cls_name,head,pooling", [
    ("ModernBertForSequenceClassification", "sequence_classification", "mean"),
    ("ModernBertForSequenceClassification", "sequence_classification", "cls"),
    ("ModernBertForTokenClassification", "token_classification", "mean"),
    ("ModernBertForQuestionAnswering", "question_answering", "mean"),
])
def test_the_heads_equal_transformers_both_ways(tmp_path, cls_name, head, pooling):
    from bertkit.models import load_pretrained, save_pretrained

    torch.manual_seed(5)
    labels = 2 if head == "question_answering" else 3
    hf = getattr(transformers, cls_name)(hf_config(num_labels=labels, classifier_pooling=pooling)).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = load_pretrained(tmp_path / "hf", head="auto")
    assert ours.loading_info["head"] == head and not ours.loading_info["missing"]
    ids, mask = batch([30, 11])

    def outputs(model, **kw):
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, **kw)
        if head == "question_answering":
            return torch.stack([out.start_logits, out.end_logits], -1)[mask.bool()]
        return out.logits[mask.bool()] if head == "token_classification" else out.logits

    torch.testing.assert_close(outputs(ours), outputs(hf), rtol=0, atol=1e-5)
    save_pretrained(ours, tmp_path / "ours")
    back = getattr(transformers, cls_name).from_pretrained(tmp_path / "ours").eval()
    torch.testing.assert_close(outputs(back), outputs(hf), rtol=0, atol=1e-5)


def test_fine_tuning_and_fill_mask_start_from_a_modernbert_export(tmp_path, clean_dist_env):
    from click.testing import CliRunner

    from bertkit.cli import main
    from bertkit.pretrain import export
    from tests.helpers import quick_finetune, tiny_run

    _, run = tiny_run(tmp_path, model="modernbert-tiny", objective="mlm", max_steps=2)
    out = export(run, tmp_path / "export")
    summary = quick_finetune(out, tmp_path / "ft")
    assert summary["epochs"] and 0.0 <= summary["epochs"][-1]["accuracy"] <= 1.0
    r = CliRunner().invoke(main, ["fill-mask", "--model", str(out), "w1 [MASK] w2"])
    assert r.exit_code == 0, r.output
    assert "1. " in r.output


def test_long_mlm_only_instances_for_modernbert(tmp_path, clean_dist_env):
    """make-instances goes past BERT's 512 positions with --objective none (up to 8,192), refuses it with NSP, and a
    ModernBERT pretrains on 1,024-token rows, packed."""
    from click.testing import CliRunner

    from bertkit.cli import main
    from bertkit.formats import read_instances_manifest
    from bertkit.pretrain import PretrainConfig, pretrain
    from tests.helpers import make_instances_dir, write_corpus

    tok = make_instances_dir(tmp_path / "tok", n=8, holdout=2, max_len=16)  # a folder holding the toy vocab.txt
    doc = [" ".join(f"w{(7 * i + j) % 120}" for j in range(40)) + "." for i in range(30)]
    corpus = write_corpus(tmp_path / "corpus", [[doc] * 6], holdout=[[doc]])
    r = CliRunner().invoke(main, ["make-instances", str(corpus), "--tokenizer", str(tok), "--out",
                                  str(tmp_path / "nsp"), "--max-seq-length", "1024", "--no-progress"])
    assert r.exit_code != 0 and "up to 8,192 with --objective none" in r.output
    r = CliRunner().invoke(main, ["make-instances", str(corpus), "--tokenizer", str(tok), "--out",
                                  str(tmp_path / "long"), "--max-seq-length", "1024", "--objective", "none",
                                  "--mode", "dynamic", "--no-progress"])
    assert r.exit_code == 0, r.output
    manifest = read_instances_manifest(tmp_path / "long")
    assert manifest.max_seq_length == 1024 and manifest.stats["mean_length"] > 512
    result = pretrain(PretrainConfig(instances=str(tmp_path / "long"), out=str(tmp_path / "run"),
                                     model="modernbert-tiny", micro_batch=2, max_steps=2, save_every=2, eval_every=0,
                                     num_workers=0, optimizer="adamw", unpadded=True, progress=False,
                                     report_to="none"))
    assert result["step"] == 2


def test_a_token_budget_fills_each_micro_batch_and_resumes_exactly(tmp_path, clean_dist_env):
    """--token-budget: packed micro batches filled by best fit (each at most the budget, documents of any length), and
    a run stopped half way and resumed logs the same losses as one that never stopped."""
    import json

    from bertkit.pretrain import ConfigError, PretrainConfig, pretrain
    from tests.helpers import make_instances_dir

    inst = make_instances_dir(tmp_path / "inst", n=96, holdout=8, max_len=48)
    # a constant rate (wsd without its decay): the halves' schedule then does not depend on their --max-steps
    args = dict(instances=str(inst), model="modernbert-tiny", token_budget=160, unpadded=True, save_every=2,
                log_every=1, eval_every=0, num_workers=0, optimizer="adamw", lr=1e-3, schedule="wsd", decay=0.0,
                warmup=0, progress=False, report_to="none", objective="mlm")
    with pytest.raises(ConfigError, match="--token-budget 40: an instance has 48 tokens"):
        pretrain(PretrainConfig(out=str(tmp_path / "small"), **{**args, "token_budget": 40}))

    def losses(run):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: r["loss"] for r in rows if "loss" in r}

    pretrain(PretrainConfig(out=str(tmp_path / "whole"), max_steps=4, **args))
    pretrain(PretrainConfig(out=str(tmp_path / "halves"), max_steps=2, **args))
    pretrain(PretrainConfig(out=str(tmp_path / "halves"), max_steps=4, resume=True, **args))
    assert losses(tmp_path / "whole") == losses(tmp_path / "halves")
    assert len(losses(tmp_path / "whole")) == 4
    with pytest.raises(ConfigError, match="token_budget"):
        pretrain(PretrainConfig(out=str(tmp_path / "halves"), max_steps=6, resume=True,
                                **{**args, "token_budget": 200}))


def test_documents_in_a_packed_row_never_attend_across_each_other(pair):
    """An MLM-only row holds several documents, each ending in [SEP]: collate_packed cuts them apart
    (doc_cu_seqlens), and ModernBERT's logits for each equal those of the document on its own."""
    import numpy as np

    from bertkit.data import collate_packed

    _, ours = pair
    sep = 3
    docs = [[2, 11, 12, 13, 14, 15, 16, 17, 18, 19, sep], [21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, sep],
            [41, 42, sep]]
    row = {"input_ids": np.array(sum(docs, [])), "token_type_ids": np.zeros(27, dtype=np.int64),
           "mlm_positions": np.array([1, 14]), "mlm_labels": np.array([11, 23]), "next_sentence_label": 0}
    batch = collate_packed([row, row], split_at=sep)
    assert batch["cu_seqlens"].tolist() == [0, 27, 54]
    assert batch["doc_cu_seqlens"].tolist() == [0, 11, 24, 27, 38, 51, 54]
    with torch.no_grad():
        together = ours(batch["input_ids"], doc_cu_seqlens=batch["doc_cu_seqlens"],
                        cu_seqlens=batch["cu_seqlens"]).mlm_logits
        alone = torch.cat([ours(torch.tensor([d])).mlm_logits[0] for d in docs])
    torch.testing.assert_close(together[:27], alone, rtol=0, atol=1e-5)
    with torch.no_grad():  # without the cuts the documents would see each other (the local window spans them)
        joined = ours(batch["input_ids"], cu_seqlens=batch["cu_seqlens"]).mlm_logits
    assert (joined[:27] - alone).abs().max() > 1e-4  # far beyond the 1e-5 the cut rows meet


def test_a_second_phase_starts_from_a_modernbert_run_or_export(tmp_path, clean_dist_env):
    """--init-from a ModernBERT run folder or its export continues from its weights, with the second phase's own
    RoPE bases (--rope-theta for the global layers, --rope-theta-local for the sliding-window ones) and longer
    instances; a BERT refuses both flags."""
    from bertkit.formats import read_instances_manifest
    from bertkit.pretrain import PretrainConfig, export, load_run_state_dict
    from bertkit.pretrain.start import build_model
    from tests.helpers import make_instances_dir, tiny_run

    _, run = tiny_run(tmp_path, model="modernbert-tiny", objective="mlm", max_steps=2)
    out = export(run, tmp_path / "export")
    longer = make_instances_dir(tmp_path / "long", n=16, holdout=2, max_len=96)
    first, _, _ = load_run_state_dict(run)
    for source, local in ((run, None), (out, 20_000.0)):
        cfg = PretrainConfig(instances=str(longer), out=str(tmp_path / "p2"), init_from=str(source),
                             rope_theta=320_000.0, objective="mlm", rope_theta_local=local)
        model, mb, described = build_model(cfg, read_instances_manifest(longer), None, "none")
        local = local or 10_000.0   # the model's own
        assert mb.global_rope_theta == 320_000.0 and mb.local_rope_theta == local
        layers = [m for m in model.modules() if hasattr(m, "is_global") and hasattr(m, "theta")]
        assert {(m.is_global, m.theta) for m in layers} == {(True, 320_000.0), (False, local)}
        assert str(source) in described
        state = model.state_dict()
        for name in ("model.layers.1.attn.Wqkv.weight", "model.embeddings.tok_embeddings.weight", "head.dense.weight"):
            n = 133 if "tok_embeddings" in name else state[name].shape[0]  # the vocabulary's rows
            torch.testing.assert_close(state[name][:n], first[name][:n].float(), rtol=0, atol=0)
    _, bert_run = tiny_run(tmp_path / "bert", max_steps=1)
    for flag in ({"rope_theta": 320_000.0}, {"rope_theta_local": 20_000.0}):
        cfg = PretrainConfig(instances=str(longer), out=str(tmp_path / "b2"), init_from=str(bert_run), **flag)
        with pytest.raises(ValueError, match="BERT learns its positions"):
            build_model(cfg, read_instances_manifest(longer), None, "none")


def test_a_second_phase_from_a_modernbert_trains_packed(tmp_path, clean_dist_env):
    """--init-from a ModernBERT run (or export) without --unpadded still trains packed, each document attending only
    to itself, as a first phase does: the family decides, not the flag."""
    from bertkit.formats import read_instances_manifest, read_run_config
    from bertkit.pretrain import PretrainConfig, export
    from bertkit.pretrain.start import planned_family
    from tests.helpers import tiny_run

    inst, run = tiny_run(tmp_path, model="modernbert-tiny", objective="mlm", max_steps=2)
    out = export(run, tmp_path / "export")
    for source in (run, out):
        cfg = PretrainConfig(instances=str(inst), out=str(tmp_path / "p2"), init_from=str(source))
        assert planned_family(cfg, read_instances_manifest(inst), None).splits_documents
    _, second = tiny_run(tmp_path, out="phase2", init_from=str(out), model=None, objective="mlm", max_steps=2)
    assert read_run_config(second).pretrain["unpadded"] is True
