"""The encoder families, each in its own module, behind one interface that pretraining, checkpoints, export,
fine-tuning and fill-mask call without knowing which family a model is:

- bert: BERT as in the paper, post-LN, or pre-LN (MegatronBERT's layout); `bert_hf` its transformers format
- electra: ELECTRA's generator + discriminator pair around BERT encoders (its discriminator loads as BERT)
- modernbert: ModernBERT (RoPE, GeGLU, local/global attention), in transformers' own module names

A new family is a new module here plus a row in FAMILIES. A model says its family by a `family` attribute (BERT's
and ELECTRA's classes have none: "bert"); a run folder's config.json records it under model["family"].
"""
from dataclasses import dataclass
from pathlib import Path

from bertkit.models import bert_hf, electra, modernbert
from bertkit.models.bert_hf import ModelFolderError


@dataclass(frozen=True)
class Family:
    name: str
    model_type: str            # config.json's model_type in transformers' format (BERT's: bert, megatron-bert)
    uses_kernels: bool         # calls bertkit.kernels (ModernBERT: its attention only; its norms are PyTorch's)
    splits_documents: bool     # packed pretraining rows attend within each [SEP]-ended document only


FAMILIES = {
    "bert": Family("bert", "bert", uses_kernels=True, splits_documents=False),
    "modernbert": Family("modernbert", "modernbert", uses_kernels=True, splits_documents=True),
}


def family_of(model) -> Family:
    """The family of a model (through DDP / DeepSpeed wrappers) or of a run's recorded model dict."""
    if isinstance(model, dict):
        return FAMILIES[model.get("family", "bert")]
    return FAMILIES[getattr(getattr(model, "module", model), "family", "bert")]


def load_pretrained(path, head: str | None = "auto", num_labels: int | None = None, require_head: bool = False):
    """A bertkit model from a folder in transformers' format (any family, a bertkit export included), weights
    loaded. head: None (bare encoder), "pretraining", "sequence_classification", "token_classification",
    "question_answering", or "auto" (config.json's architectures). Heads missing from the checkpoint are initialised
    and logged (require_head=True refuses them, except BERT's NSP classifier and pooler); encoder tensors must all
    be there. Returned in eval mode, fp32 on the CPU, with `model.loading_info` = {"head", "missing", "unused"}."""
    path = Path(path)
    config = bert_hf.read_config_or_none(path)
    if config is not None and config.get("stage") == "pretrain" and "model_type" not in config:
        raise ModelFolderError(f"{path}: a pretraining run folder, not a model folder; export it first: bertkit "
                               f"export {path} --out MODEL_DIR, then give MODEL_DIR")
    if config is not None and config.get("model_type") == FAMILIES["modernbert"].model_type:
        try:
            return modernbert.load_hf(path, config, bert_hf.read_weights(path), head, num_labels, require_head)
        except (ValueError, KeyError, TypeError) as e:
            raise ModelFolderError(str(e) if str(path) in str(e) else f"{path}: {e}") from None
    return bert_hf.load_hf(path, head, num_labels, require_head)


def save_pretrained(model, out_dir, tokenizer_dir=None, extra_config: dict | None = None,
                    safe_serialization: bool = True, masked_lm_only: bool = False) -> Path:
    """`model` as a folder transformers' matching class loads with no missing or unexpected keys: config.json, the
    weights and the tokenizer files (an ELECTRA pair: the discriminator, its generator in generator/).
    masked_lm_only: a BERT pretrained without NSP is written as BertForMaskedLM. extra_config entries (labels, the
    fine-tuning task, bertkit's provenance) are merged into config.json."""
    model = getattr(model, "module", model)  # DDP / DeepSpeed engine wrappers
    if family_of(model).name == "modernbert":
        return modernbert.save_hf(model, out_dir, tokenizer_dir, extra_config)
    if isinstance(model, electra.ElectraForPreTraining):
        return electra.write_hf(model, out_dir, tokenizer_dir)
    return bert_hf.save_hf(model, out_dir, tokenizer_dir, extra_config, safe_serialization, masked_lm_only)


def build_pretraining(model_dict: dict, objective: str):
    """The pretraining model a run folder's config.json describes (see describe), with fresh weights."""
    if family_of(model_dict).name == "modernbert":
        return modernbert.ModernBertForMaskedLM(modernbert.ModernBertConfig.from_dict(model_dict))
    return electra.build(model_dict, objective)


def describe(model) -> dict:
    """A pretraining model's shape as a run folder records it (build_pretraining reads it back): its config (with
    the family), for ELECTRA the generator's settings under "electra", and under "export_dropout" the model's own
    dropout when --dropout changed it for pretraining (the dropout an export writes)."""
    d = model.cfg.to_dict()
    if getattr(model, "export_dropout", None):
        d["export_dropout"] = model.export_dropout
    if isinstance(model, electra.ElectraForPreTraining):
        d["electra"] = {"generator_size": model.generator_size, "disc_weight": model.disc_weight}
    return d
