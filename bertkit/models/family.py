"""What makes an encoder family a family: one `Family` spec per family module, registered here. Pretraining, export,
loading, the kernel guard and fine-tuning ask a model's (or a folder's, or a --model name's) spec, never a family's
name or class, so a new family is one module that calls `register`. Torch-free: the built-in families (whose
modules import torch) are imported at the first lookup, so the CLI starts without torch."""
import importlib
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class RunFlags:
    """The pretrain flags that change a model's shape or settings, as a family applies them (None: not given)."""
    dropout: float | None = None
    norm: str | None = None            # post | pre
    pad_vocab_to: int | None = None
    rope_theta: float | None = None
    kernels: str = "auto"              # auto | torch | triton
    rope_theta_local: float | None = None


@dataclass(frozen=True)
class Family:
    name: str                          # a run folder's config.json records it under model["family"]
    title: str                         # how messages name it
    model_types: tuple[str, ...]       # config.json model_type values (transformers' format) it loads
    presets: tuple[str, ...]           # the --model names it owns
    # (--model spec, vocab size) -> its config, or None when the spec is not this family's
    config_from_spec: Callable
    config_from_dict: Callable         # a run's recorded model dict (describe) -> its config
    # (config, objective, recorded model dict, generator settings) -> the pretraining model, fresh weights
    build: Callable
    objectives: tuple[str, ...]        # instance objectives it pretrains on (none: MLM alone; nsp, sop; electra)
    # (pretraining model, a same-family model's state dict, source) -> None; ValueError when they do not fit
    load_weights: Callable
    # (config, RunFlags, recorded model dict, what fixes the weights or None) -> the dropout an export writes
    # (None: the config's); ValueError naming the flag when the family cannot take it
    apply_flags: Callable
    fit_length: Callable               # (config, tokens) -> whether it takes sequences that long (may grow to them)
    load_hf: Callable                  # (folder, config.json dict, head, num_labels, require_head) -> model
    # (model, out, tokenizer folder, extra config, safe_serialization, masked_lm_only) -> out
    save_hf: Callable
    kernel_shapes: Callable            # model -> [dict of kernel_guard.KernelUse's shape fields], [] for none
    encoder_configs: Callable = lambda model: [model.cfg]   # every encoder's config (ELECTRA: and its generator's)
    mean_pooling_unused: Callable = lambda model: None      # the module a mean-pooled classifier never reads
    splits_documents: bool = False     # packed pretraining rows attend within each [SEP]-ended document only
    recipe_overrides: dict = field(default_factory=dict)    # recipe name -> the settings measured for this family
    # (bare encoder, packed input_ids (T,), token_type_ids (T,), cu_seqlens, max_seqlen) -> last layer's states (T, H),
    # what a sentence embedding pools; None: the family cannot be trained as a sentence encoder
    token_states: Callable | None = None


FAMILIES: dict[str, Family] = {}
DEFAULT = "bert"   # the family of a model dict without "family" and of a --model no other family claims
BUILT_IN = ("bert_family", "modernbert")   # modules in this package that register a family when imported


def families() -> dict[str, Family]:
    """Every registered family, the built-in ones imported first (once; Python caches the modules), BERT first and
    the others in the order they registered (which module a program imports first must not change messages)."""
    for module in BUILT_IN:
        importlib.import_module(f"{__package__}.{module}")
    return {name: FAMILIES[name] for name in sorted(FAMILIES, key=lambda name: name != DEFAULT)}


def register(family: Family) -> Family:
    FAMILIES[family.name] = family
    return family


def family_named(name: str) -> Family:
    if name not in families():
        raise ValueError(f"model family {name!r} is not registered (bertkit knows {', '.join(FAMILIES)}); a run or "
                         "model of a family from a plugin needs that plugin imported first")
    return FAMILIES[name]


def family_of(model) -> Family:
    """The family of a model (through DDP / DeepSpeed wrappers) or of a run's recorded model dict."""
    if isinstance(model, dict):
        return family_named(model.get("family", DEFAULT))
    return family_named(getattr(getattr(model, "module", model), "family", DEFAULT))


def family_of_spec(spec: str | None) -> Family:
    """The family whose preset, config.json or model folder --model names (read, nothing built)."""
    for family in families().values():
        if family.name != DEFAULT and family.config_from_spec(spec, 64) is not None:
            return family
    return FAMILIES[DEFAULT]


def family_of_model_type(model_type: str | None) -> Family:
    """The family that loads transformers' config.json of this model_type (none given: BERT's old configs)."""
    for family in families().values():
        if model_type in family.model_types:
            return family
    return FAMILIES[DEFAULT]


def preset_names() -> list[str]:
    return [p for family in families().values() for p in family.presets]
