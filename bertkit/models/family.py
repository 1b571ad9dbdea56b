"""What makes an encoder family a family: one `Family` spec per family module, registered here. Pretraining, export,
loading, the kernel guard and fine-tuning ask a model's (or a folder's, or a --model name's) spec, never a family's
name or class, so a new family is one module that calls `register`. Torch-free: the CLI lists presets without it."""
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


FAMILIES: dict[str, Family] = {}
DEFAULT = "bert"   # the family of a model dict without "family" and of a --model no other family claims


def register(family: Family) -> Family:
    FAMILIES[family.name] = family
    return family


def family_named(name: str) -> Family:
    if name not in FAMILIES:
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
    for family in FAMILIES.values():
        if family.name != DEFAULT and family.config_from_spec(spec, 64) is not None:
            return family
    return FAMILIES[DEFAULT]


def family_of_model_type(model_type: str | None) -> Family:
    """The family that loads transformers' config.json of this model_type (none given: BERT's old configs)."""
    for family in FAMILIES.values():
        if model_type in family.model_types:
            return family
    return FAMILIES[DEFAULT]


def preset_names() -> list[str]:
    return [p for family in FAMILIES.values() for p in family.presets]
