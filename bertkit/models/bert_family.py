"""BERT's family spec: post-LN BERT as in the paper, pre-LN (MegatronBERT's layout) and RoBERTa's layout as its
options, and ELECTRA's generator + discriminator pair around BERT encoders as an objective it pretrains."""
from bertkit.models import bert_hf, electra
from bertkit.models.bert import BertForPreTraining
from bertkit.models.bert_config import PRESETS, BertConfig
from bertkit.models.family import Family, RunFlags, register


def build(cfg: BertConfig, objective: str, generator: dict | None):
    if objective == "electra":
        return electra.ElectraForPreTraining(cfg, **(generator or {}))
    return BertForPreTraining(cfg)


def load_weights(model, state: dict, source) -> None:
    state = bert_hf.repad_vocab(state, model.cfg)  # --pad-vocab-to may differ from the source's padding
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"weights do not fit the pretraining model (missing {missing[:5]}, unexpected "
                         f"{unexpected[:5]})")


def apply_flags(cfg: BertConfig, flags: RunFlags, recorded: dict, fixed_by: str | None, resumed: bool):
    """--dropout, --norm and --pad-vocab-to onto the config; returns the dropout an export writes. fixed_by: where
    the weights come from (they fix --norm)."""
    # --dropout is a pretraining choice: an export keeps the model's own dropout for fine-tuning (cramming's way)
    if flags.rope_theta is not None or flags.rope_theta_local is not None:
        raise ValueError("--rope-theta / --rope-theta-local: BERT learns its positions (no rotary embeddings); "
                         "drop them, or pretrain a ModernBERT (--model modernbert-base)")
    export_dropout = recorded.get("export_dropout")
    own = {"hidden": cfg.hidden_dropout, "attention": cfg.attention_dropout}
    if flags.dropout is not None and set(own.values()) != {flags.dropout}:
        cfg.set_dropout(flags.dropout)
        export_dropout = export_dropout or own
    if flags.norm is not None and flags.norm != cfg.norm:
        if fixed_by or resumed:
            raise ValueError(f"--norm {flags.norm}: the weights this run starts from "
                             f"({fixed_by or 'the run being resumed'}) are {cfg.norm}-LN; drop --norm")
        cfg.norm = flags.norm
    if flags.pad_vocab_to is not None and not resumed:
        cfg.vocab_pad_multiple = flags.pad_vocab_to
    return export_dropout


def save_hf(model, out_dir, tokenizer_dir=None, extra_config=None, safe_serialization=True, masked_lm_only=False):
    if isinstance(model, electra.ElectraForPreTraining):
        return electra.write_hf(model, out_dir, tokenizer_dir)
    return bert_hf.save_hf(model, out_dir, tokenizer_dir, extra_config, safe_serialization, masked_lm_only)


def encoder_configs(model) -> list:
    return [model.cfg] + ([model.gen_cfg] if isinstance(model, electra.ElectraForPreTraining) else [])


def kernel_shapes(model) -> list[dict]:
    """Attention and add+LayerNorm at each encoder's shape (ELECTRA: the generator's too)."""
    return [{"head_dim": c.head_dim, "hidden": c.hidden_size, "dropout": c.hidden_dropout or c.attention_dropout,
             "prenorm": c.norm == "pre"} for c in encoder_configs(model)]


BERT = register(Family(
    name="bert", title="BERT", model_types=("bert", "megatron-bert", "electra", "roberta"), presets=tuple(PRESETS),
    config_from_spec=BertConfig.from_spec, config_from_dict=BertConfig.from_dict, build=build,
    objectives=("nsp", "sop", "none", "electra"), load_weights=load_weights, apply_flags=apply_flags,
    fit_length=lambda cfg, tokens: tokens <= cfg.max_length,
    load_hf=lambda path, config, head, num_labels, require_head: bert_hf.load_hf(path, head, num_labels,
                                                                                 require_head),
    save_hf=save_hf, kernel_shapes=kernel_shapes, encoder_configs=encoder_configs,
    mean_pooling_unused=lambda model: getattr(getattr(model, "bert", None), "pooler", None),  # BERT's pooler
    recipe_overrides={"budget": {"lr": 1e-3}},  # BERT tiny's best rate under the budget recipe
    token_states=lambda encoder, ids, types, cu_seqlens, max_seqlen: encoder(
        ids, types, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, pool=False).last_hidden_state,
))
