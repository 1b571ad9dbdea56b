"""The encoder families, each in its own module, behind one interface that pretraining, checkpoints, export,
fine-tuning and fill-mask call without knowing which family a model is:

- bert: BERT as in the paper, post-LN, or pre-LN (MegatronBERT's layout); `bert_hf` its transformers format
- electra: ELECTRA's generator + discriminator pair around BERT encoders (its discriminator loads as BERT)
- modernbert: ModernBERT (RoPE, GeGLU, local/global attention), in transformers' own module names

A family is one module that registers its `Family` spec (family.py): its configs and presets, build, flags and
checks, transformers' format, kernel use. Code outside this package asks the spec, never a family's name or class.
A model says its family by a `family` attribute (BERT's and ELECTRA's classes have none: "bert"); a run folder's
config.json records it under model["family"].

Importing this package does not import torch (the CLI and `bert_config` rely on that): the family modules load at
the first lookup (family.families) or call below.
"""
from pathlib import Path

from bertkit.models.family import (  # noqa: F401  re-exported
    FAMILIES,
    Family,
    RunFlags,
    families,
    family_named,
    family_of,
    family_of_model_type,
    family_of_spec,
    preset_names,
    register,
)


def __getattr__(name):
    if name == "ModelFolderError":  # bert_hf imports torch: only when asked for
        from bertkit.models.bert_hf import ModelFolderError

        return ModelFolderError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_pretrained(path, head: str | None = "auto", num_labels: int | None = None, require_head: bool = False):
    """A bertkit model from a folder in transformers' format (any family, a bertkit export included), weights
    loaded. head: None (bare encoder), "pretraining", "sequence_classification", "token_classification",
    "question_answering", or "auto" (config.json's architectures). Heads missing from the checkpoint are initialised
    and logged (require_head=True refuses them, except BERT's NSP classifier and pooler); encoder tensors must all
    be there. Returned in eval mode, fp32 on the CPU, with `model.loading_info` = {"head", "missing", "unused"}."""
    from bertkit.models import bert_hf
    from bertkit.models.bert_hf import ModelFolderError

    path = Path(path)
    config = bert_hf.read_config_or_none(path)
    if config is not None and config.get("stage") == "pretrain" and "model_type" not in config:
        raise ModelFolderError(f"{path}: a pretraining run folder, not a model folder; export it first: bertkit "
                               f"export {path} --out MODEL_DIR, then give MODEL_DIR")
    model_type = (config or {}).get("model_type")
    known = [t for family in families().values() for t in family.model_types]
    if model_type is not None and model_type not in known:
        raise ModelFolderError(f"{path / 'config.json'}: model_type is {model_type!r} (architectures "
                               f"{config.get('architectures')}), not one of {', '.join(map(repr, known))}; bertkit "
                               "loads these families' checkpoints only")
    return family_of_model_type(model_type).load_hf(path, config, head, num_labels, require_head)


def save_pretrained(model, out_dir, tokenizer_dir=None, extra_config: dict | None = None,
                    safe_serialization: bool = True, masked_lm_only: bool = False) -> Path:
    """`model` as a folder transformers' matching class loads with no missing or unexpected keys: config.json, the
    weights and the tokenizer files (an ELECTRA pair: the discriminator, its generator in generator/).
    masked_lm_only: a BERT pretrained without NSP is written as BertForMaskedLM. extra_config entries (labels, the
    fine-tuning task, bertkit's provenance) are merged into config.json."""
    model = getattr(model, "module", model)  # DDP / DeepSpeed engine wrappers
    return family_of(model).save_hf(model, out_dir, tokenizer_dir, extra_config, safe_serialization, masked_lm_only)


def build_pretraining(model_dict: dict, objective: str):
    """The pretraining model a run folder's config.json describes (see describe), with fresh weights."""
    family = family_of(model_dict)
    return family.build(family.config_from_dict(model_dict), objective, model_dict.get("electra"))


def describe(model) -> dict:
    """A pretraining model's shape as a run folder records it (build_pretraining reads it back): its config (with
    the family), for ELECTRA the generator's settings under "electra", and under "export_dropout" the model's own
    dropout when --dropout changed it for pretraining (the dropout an export writes)."""
    from bertkit.models import electra

    d = model.cfg.to_dict()
    if getattr(model, "export_dropout", None):
        d["export_dropout"] = model.export_dropout
    if isinstance(model, electra.ElectraForPreTraining):
        d["electra"] = {"generator_size": model.generator_size, "disc_weight": model.disc_weight}
    return d
