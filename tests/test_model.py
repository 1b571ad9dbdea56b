"""bertkit's BERT against HF transformers' BertModel and heads: same weights -> same outputs, losses, gradients."""
import pytest
import torch

from bertkit import kernels
from bertkit.models import bert as bm
from bertkit.models.bert_config import PRESETS, BertConfig
from bertkit.models.bert_hf import _canonical_state, to_hf_state_dict

transformers = pytest.importorskip("transformers")

TOL = 1e-5
VOCAB = 101  # not a multiple of 8: the embedding is padded to 104 rows
LENGTHS = [9, 6, 3]  # right padding in the batch


def tiny_config(**overrides):
    values = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                  max_position_embeddings=16)
    values.update(overrides)
    return BertConfig(**values)


def randomise(model, seed=0):
    """Random biases and LayerNorm affine too, so a wrong mapping of any tensor shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.05
            p.add_(noise)
            if name.endswith("word_embeddings.weight"):
                p[model.cfg.vocab_size:] = 0  # padded rows stay zero
            if name == "mlm_bias":
                p[model.cfg.vocab_size:] = 0


def hf_twin(model, hf_class, **config_extra):
    """The HF model with `model`'s weights (through the checkpoint name mapping); a pre-LN model's twin is a
    MegatronBert one."""
    config_class = transformers.MegatronBertConfig if model.cfg.norm == "pre" else transformers.BertConfig
    hf_cfg = config_class(**{k: v for k, v in model.cfg.to_hf_dict().items() if k != "model_type"}, **config_extra)
    hf_cfg._attn_implementation = "eager"
    hf = hf_class(hf_cfg)
    state = to_hf_state_dict(_canonical_state(model), model.cfg)
    if hf_class in (transformers.BertModel, transformers.MegatronBertModel):
        state = {k[len("bert."):]: v for k, v in state.items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected
    assert set(missing) <= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    return hf


def batch(cfg, seed=1):
    g = torch.Generator().manual_seed(seed)
    size, seq = len(LENGTHS), max(LENGTHS)
    input_ids = torch.randint(5, cfg.vocab_size, (size, seq), generator=g)
    attention_mask = torch.zeros(size, seq, dtype=torch.long)
    token_type_ids = torch.zeros(size, seq, dtype=torch.long)
    for i, n in enumerate(LENGTHS):
        attention_mask[i, :n] = 1
        token_type_ids[i, n // 2:n] = 1  # a sentence pair
    input_ids[attention_mask == 0] = 0
    return input_ids, token_type_ids, attention_mask


def assert_close(ours, theirs, what):
    diff = (ours.detach().float() - theirs.detach().float()).abs().max().item()
    assert diff <= TOL, f"{what}: max abs diff {diff}"


def assert_grads_match(model, hf):
    grads = {k: p.grad for k, p in _canonical_state_params(model).items()}
    ours = to_hf_state_dict(grads, model.cfg)
    if isinstance(hf, transformers.BertModel):
        ours = {k[len("bert."):]: v for k, v in ours.items()}
    theirs = {k: p.grad for k, p in hf.named_parameters()}
    assert set(theirs) <= set(ours), set(theirs) - set(ours)
    for name, grad in theirs.items():
        assert grad is not None and ours[name] is not None, name
        assert_close(ours[name], grad, f"grad {name}")
    word = model.bert.embeddings.word_embeddings if hasattr(model, "bert") else model.embeddings.word_embeddings
    assert word.weight.grad[model.cfg.vocab_size:].abs().max() == 0  # padded rows never used


def _canonical_state_params(model):
    params = dict(model.named_parameters())
    if isinstance(model, bm.BertModel):
        return {f"bert.{k}": v for k, v in params.items()}
    return params


# ------------------------------------------------------------------ config
def test_presets_follow_the_papers():
    expected = {"tiny": (2, 128, 2), "mini": (4, 256, 4), "small": (4, 512, 8), "medium": (8, 512, 8),
                "base": (12, 768, 12), "large": (24, 1024, 16)}
    assert set(PRESETS) == set(expected)
    for name, (layers, hidden, heads) in expected.items():
        cfg = BertConfig.preset(name, vocab_size=32000)
        assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads) == (layers, hidden, heads)
        assert cfg.intermediate_size == 4 * hidden
        assert (cfg.max_position_embeddings, cfg.type_vocab_size, cfg.layer_norm_eps) == (512, 2, 1e-12)
        assert (cfg.hidden_dropout, cfg.attention_dropout) == (0.1, 0.1)
    with pytest.raises(ValueError, match="unknown model preset 'huge'"):
        BertConfig.preset("huge", vocab_size=10)


def test_padded_vocab_and_hf_config_round_trip():
    assert BertConfig(vocab_size=30522).padded_vocab_size == 30528
    assert BertConfig(vocab_size=32000).padded_vocab_size == 32000
    cfg = BertConfig.preset("mini", vocab_size=777, hidden_dropout=0.2)
    assert BertConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    legacy = {k: v for k, v in cfg.to_hf_dict().items() if k != "model_type"}  # pre-2020 / google bert_config.json
    assert BertConfig.from_hf_dict(legacy) == cfg
    with pytest.raises(ValueError, match="not 'bert'"):
        BertConfig.from_hf_dict({**legacy, "architectures": ["DistilBertModel"]})
    hf = transformers.BertConfig(**cfg.to_hf_dict())
    assert (hf.num_hidden_layers, hf.hidden_size, hf.num_attention_heads, hf.vocab_size) == (4, 256, 4, 777)


@pytest.mark.parametrize("name,paper_millions", [("base", 110), ("large", 340)])
def test_parameter_counts(name, paper_millions):
    cfg = BertConfig.preset(name, vocab_size=30522)  # the paper's uncased WordPiece vocabulary
    hf_cfg = transformers.BertConfig(**cfg.to_hf_dict())
    with torch.device("meta"):  # shapes only, no memory
        ours, ours_pt = bm.BertModel(cfg), bm.BertForPreTraining(cfg)
        hf, hf_pt = transformers.BertModel(hf_cfg), transformers.BertForPreTraining(hf_cfg)
    assert bm.num_parameters(ours) == sum(p.numel() for p in hf.parameters())
    assert bm.num_parameters(ours_pt) == sum(p.numel() for p in hf_pt.parameters())
    assert abs(bm.num_parameters(ours) / 1e6 - paper_millions) / paper_millions < 0.02
    # the padding to a multiple of 8 adds 6 embedding rows (and 6 MLM biases)
    assert sum(p.numel() for p in ours.parameters()) - bm.num_parameters(ours) == 6 * cfg.hidden_size


# ------------------------------------------------------------------ encoder parity
def test_encoder_matches_hf_with_padding():
    torch.manual_seed(0)
    cfg = tiny_config()
    ours = bm.BertModel(cfg).eval()
    randomise(ours)
    hf = hf_twin(ours, transformers.BertModel).eval()
    input_ids, token_type_ids, attention_mask = batch(cfg)
    out = ours(input_ids, token_type_ids, attention_mask)
    ref = hf(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    valid = attention_mask.bool()
    assert_close(out.last_hidden_state[valid], ref.last_hidden_state[valid], "hidden states")
    assert_close(out.pooler_output, ref.pooler_output, "pooler")

    # each row alone, unpadded, gives the same states: padding never leaks into real tokens
    for i, n in enumerate(LENGTHS):
        alone = ours(input_ids[i:i + 1, :n], token_type_ids[i:i + 1, :n], attention_mask[i:i + 1, :n])
        assert_close(alone.last_hidden_state[0], out.last_hidden_state[i, :n], f"row {i} alone")
    # no mask = all tokens valid
    full = ours(input_ids[:1], token_type_ids[:1])
    assert_close(full.last_hidden_state, out.last_hidden_state[:1], "attention_mask=None")


def test_model_calls_only_the_kernel_api(monkeypatch):
    cfg = tiny_config(attention_dropout=0.25, hidden_dropout=0.125)
    model = bm.BertForPreTraining(cfg)
    calls = {"attention": [], "add_layer_norm": []}
    attention, add_layer_norm = kernels.attention, kernels.add_layer_norm

    def spy_attention(q, k, v, lengths, dropout_p=0.0, softmax_scale=None):
        calls["attention"].append((q, k, v, lengths, dropout_p))
        return attention(q, k, v, lengths, dropout_p, softmax_scale)

    def spy_add_layer_norm(x, residual, weight, bias, eps=1e-12, dropout_p=0.0):
        calls["add_layer_norm"].append((residual is None, eps, dropout_p))
        return add_layer_norm(x, residual, weight, bias, eps, dropout_p)

    monkeypatch.setattr(kernels, "attention", spy_attention)
    monkeypatch.setattr(kernels, "add_layer_norm", spy_add_layer_norm)
    input_ids, token_type_ids, attention_mask = batch(cfg)
    model.eval()(input_ids, token_type_ids, attention_mask)
    assert len(calls["attention"]) == cfg.num_layers
    q, k, v, lengths, p = calls["attention"][0]
    assert p == 0.0 and lengths.dtype == torch.int32 and lengths.tolist() == LENGTHS
    assert q.shape == (3, 9, cfg.num_heads, cfg.head_dim)
    assert not q.is_contiguous() and q.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    # embeddings + 2 per layer + MLM transform; all without dropout in eval
    assert len(calls["add_layer_norm"]) == 1 + 2 * cfg.num_layers + 1
    assert all(p == 0.0 and eps == cfg.layer_norm_eps for _, eps, p in calls["add_layer_norm"])

    calls["attention"].clear(), calls["add_layer_norm"].clear()
    model.train()(input_ids, token_type_ids, attention_mask)
    assert {c[4] for c in calls["attention"]} == {0.25}
    assert [p for _, _, p in calls["add_layer_norm"]] == [0.0] + [0.125] * 2 * cfg.num_layers + [0.0]


def test_dropout_only_in_training():
    cfg = tiny_config()
    model = bm.BertModel(cfg)
    input_ids, token_type_ids, attention_mask = batch(cfg)
    model.train()
    a = model(input_ids, token_type_ids, attention_mask).pooler_output
    b = model(input_ids, token_type_ids, attention_mask).pooler_output
    assert (a - b).abs().max() > 1e-4
    model.eval()
    a = model(input_ids, token_type_ids, attention_mask).pooler_output
    b = model(input_ids, token_type_ids, attention_mask).pooler_output
    assert torch.equal(a, b)


def test_gradient_checkpointing_gives_the_same_gradients():
    cfg = tiny_config(hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = bm.BertForSequenceClassification(cfg, num_labels=3).train()
    input_ids, token_type_ids, attention_mask = batch(cfg)
    labels = torch.tensor([0, 2, 1])
    model(input_ids, token_type_ids, attention_mask, labels=labels).loss.backward()
    plain = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    model.bert.gradient_checkpointing = True
    model(input_ids, token_type_ids, attention_mask, labels=labels).loss.backward()
    for k, p in model.named_parameters():
        assert_close(p.grad, plain[k], k)


# ------------------------------------------------------------------ heads: logits, losses, gradients
def test_pretraining_head_matches_hf():
    torch.manual_seed(0)
    cfg = tiny_config()
    ours = bm.BertForPreTraining(cfg).eval()
    randomise(ours)
    hf = hf_twin(ours, transformers.BertForPreTraining).eval()
    input_ids, token_type_ids, attention_mask = batch(cfg)
    # masked positions per row (within each length); row 2 has one unused slot (label -100)
    mlm_positions = torch.tensor([[1, 4, 8], [2, 3, 5], [1, 0, 0]])
    mlm_labels = torch.tensor([[7, 50, 100], [11, 12, 13], [99, -100, -100]])
    nsp = torch.tensor([0, 1, 1])
    out = ours(input_ids, token_type_ids, attention_mask, mlm_positions, mlm_labels, nsp)

    hf_labels = torch.full_like(input_ids, -100)
    for row in range(3):
        for pos, label in zip(mlm_positions[row].tolist(), mlm_labels[row].tolist()):
            if label != -100:
                hf_labels[row, pos] = label
    ref = hf(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
             labels=hf_labels, next_sentence_label=nsp)

    assert out.mlm_logits.shape == (3, 3, VOCAB)  # only at the masked positions, padded rows never predicted
    gathered = torch.stack([ref.prediction_logits[r, mlm_positions[r]] for r in range(3)])
    assert_close(out.mlm_logits, gathered, "MLM logits")
    assert_close(out.nsp_logits, ref.seq_relationship_logits, "NSP logits")
    assert_close(out.loss, ref.loss, "loss")
    mlm_ref = torch.nn.functional.cross_entropy(ref.prediction_logits.view(-1, VOCAB), hf_labels.view(-1))
    assert_close(out.mlm_loss, mlm_ref, "MLM loss")
    assert_close(out.mlm_loss + out.nsp_loss, out.loss, "loss = mlm + nsp")

    out.loss.backward()
    ref.loss.backward()
    assert_grads_match(ours, hf)

    # without positions: logits at every position, as HF
    every = ours(input_ids, token_type_ids, attention_mask).mlm_logits
    valid = attention_mask.bool()
    assert_close(every[valid], ref.prediction_logits[valid], "MLM logits at every position")


@pytest.mark.parametrize("num_labels", [3, 1])
def test_sequence_classification_matches_hf(num_labels):
    torch.manual_seed(0)
    cfg = tiny_config()
    ours = bm.BertForSequenceClassification(cfg, num_labels).eval()
    randomise(ours)
    hf = hf_twin(ours, transformers.BertForSequenceClassification, num_labels=num_labels).eval()
    input_ids, token_type_ids, attention_mask = batch(cfg)
    labels = torch.tensor([2, 0, 1]) if num_labels > 1 else torch.tensor([4.2, 0.5, 2.25])  # STS-B style
    out = ours(input_ids, token_type_ids, attention_mask, labels=labels)
    ref = hf(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, labels=labels)
    assert hf.config.problem_type == ("regression" if num_labels == 1 else "single_label_classification")
    assert out.logits.shape == (3, num_labels)
    assert_close(out.logits, ref.logits, "logits")
    assert_close(out.loss, ref.loss, "loss")
    out.loss.backward()
    ref.loss.backward()
    assert_grads_match(ours, hf)


def test_token_classification_matches_hf():
    torch.manual_seed(0)
    cfg = tiny_config()
    ours = bm.BertForTokenClassification(cfg, 5).eval()
    randomise(ours)
    hf = hf_twin(ours, transformers.BertForTokenClassification, num_labels=5).eval()
    input_ids, token_type_ids, attention_mask = batch(cfg)
    labels = torch.randint(0, 5, input_ids.shape, generator=torch.Generator().manual_seed(3))
    labels[attention_mask == 0] = -100
    labels[0, 3] = -100  # a sub-word continuation
    out = ours(input_ids, token_type_ids, attention_mask, labels=labels)
    ref = hf(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, labels=labels)
    valid = attention_mask.bool()
    assert_close(out.logits[valid], ref.logits[valid], "logits")
    assert_close(out.loss, ref.loss, "loss")
    out.loss.backward()
    ref.loss.backward()
    assert_grads_match(ours, hf)


def test_question_answering_matches_hf():
    torch.manual_seed(0)
    cfg = tiny_config()
    ours = bm.BertForQuestionAnswering(cfg).eval()
    randomise(ours)
    hf = hf_twin(ours, transformers.BertForQuestionAnswering).eval()
    input_ids, token_type_ids, attention_mask = batch(cfg)

    # unpadded batch: HF's own loss (a position past the end = answer truncated away, ignored).
    # No [PAD] ids here: HF freezes the [PAD] embedding row (padding_idx), BERT and bertkit do not.
    full = torch.ones_like(attention_mask)
    input_ids = input_ids.masked_fill(attention_mask == 0, 7)
    start, end = torch.tensor([3, 0, 12]), torch.tensor([5, 0, 12])
    out = ours(input_ids, token_type_ids, full, start_positions=start, end_positions=end)
    ref = hf(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=full,
             start_positions=start, end_positions=end)
    assert_close(out.start_logits, ref.start_logits, "start logits")
    assert_close(out.end_logits, ref.end_logits, "end logits")
    assert_close(out.loss, ref.loss, "loss")
    out.loss.backward()
    ref.loss.backward()
    assert_grads_match(ours, hf)

    # padded batch: same logits at tokens; padding is never an answer (HF leaves it scoreable)
    input_ids, token_type_ids, attention_mask = batch(cfg)
    start, end = torch.tensor([3, 1, 2]), torch.tensor([5, 4, 2])
    out = ours(input_ids, token_type_ids, attention_mask, start_positions=start, end_positions=end)
    ref = hf(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    valid = attention_mask.bool()
    assert_close(out.start_logits[valid], ref.start_logits[valid], "start logits (padded)")
    assert_close(out.end_logits[valid], ref.end_logits[valid], "end logits (padded)")
    assert (out.start_logits[~valid] == bm.MASKED_LOGIT).all() and (out.end_logits[~valid] == bm.MASKED_LOGIT).all()
    ce = torch.nn.functional.cross_entropy
    masked = [logits.masked_fill(~valid, bm.MASKED_LOGIT) for logits in (ref.start_logits, ref.end_logits)]
    assert_close(out.loss, (ce(masked[0], start) + ce(masked[1], end)) / 2, "loss (padded)")


def test_build_model_checks_its_arguments():
    cfg = tiny_config()
    assert isinstance(bm.build_model(cfg, "question_answering"), bm.BertForQuestionAnswering)
    with pytest.raises(ValueError, match="needs num_labels"):
        bm.build_model(cfg, "token_classification")
    with pytest.raises(ValueError, match="unknown head"):
        bm.build_model(cfg, "masked_lm")
    with pytest.raises(ValueError, match="sequence of 17 tokens; the model has 16 positions"):
        bm.BertModel(cfg)(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="not a multiple of num_heads"):
        BertConfig(hidden_size=100, num_heads=3)
