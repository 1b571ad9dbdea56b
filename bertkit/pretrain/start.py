"""What a pretraining run starts from: the model of its family (bertkit.models' specs: BERT post-/pre-LN, ELECTRA's
pair, ModernBERT, or a registered one), sized to the instances' vocabulary, with the weights of --init-from (a run
folder or a model folder) when given, or the shape of the run being resumed (whose weights then come from its
checkpoint). Nothing here knows a family: it asks the spec."""
import json
import os
from pathlib import Path

import torch

from bertkit.fileio import sha256_file
from bertkit.formats import InstancesManifest, RunConfig, read_run_config
from bertkit.models import Family, RunFlags, family_of, family_of_model_type, family_of_spec, load_pretrained
from bertkit.pretrain.checkpoints import load_run_state_dict
from bertkit.pretrain.config import ConfigError, PretrainConfig
from bertkit.pretrain.metrics import say


def planned_family(cfg: PretrainConfig, manifest: InstancesManifest, previous_run: RunConfig | None) -> Family:
    """The family the run will build, known before the model is: the resumed run's, --init-from's, or the preset's."""
    if previous_run is not None:
        return family_of(previous_run.model)
    return spec_family(cfg.model, cfg.init_from)


def spec_family(model: str | None, init_from: str | None = None) -> Family:
    """The family --init-from, else --model, names (read, nothing built)."""
    return folder_family(Path(init_from)) if init_from else family_of_spec(model)


def folder_family(init: Path) -> Family:
    """The family of a run folder (its recorded model) or a model folder (config.json's model_type)."""
    if (init / "checkpoints").is_dir():
        return family_of(read_run_config(init).model)
    try:
        return family_of_model_type(json.loads((init / "config.json").read_text()).get("model_type"))
    except (OSError, ValueError, AttributeError):
        return family_of_model_type(None)


def build_model(cfg: PretrainConfig, manifest: InstancesManifest, previous_run: RunConfig | None,
                objective: str = "nsp"):
    """(model, its config, init source description): the run's own shape on --resume (weights come from the
    checkpoint), --init-from's weights, a config file, or a preset sized to the instances' vocabulary. ELECTRA
    (objective "electra") builds the generator and discriminator pair, the config being the discriminator's."""
    family = planned_family(cfg, manifest, previous_run)
    if previous_run is None and cfg.init_from and cfg.model:
        check_model_flag(cfg, family)
    if objective not in family.objectives:
        raise ConfigError(f"{family.title} is MLM-only, but {cfg.instances} holds {objective.upper()} instances: make "
                          "them with `bertkit make-instances --objective none`, or pretrain with --objective mlm"
                          if family.objectives == ("none",) else
                          f"{family.title} does not pretrain with objective {objective}; it takes "
                          f"{', '.join(family.objectives)}")
    model_cfg, state, source, recorded = starting_point(cfg, manifest, previous_run, objective, family)
    weights_from = source if state is not None else None
    flags = RunFlags(cfg.dropout, cfg.norm, cfg.pad_vocab_to, cfg.rope_theta, cfg.kernels, cfg.rope_theta_local)
    try:
        export_dropout = family.apply_flags(model_cfg, flags, recorded, weights_from, previous_run is not None)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_fits(cfg, manifest, family, model_cfg, weights_from)
    # ELECTRA's generator: the resumed (or --init-from) run's own, else from the flags
    generator = recorded.get("electra") or {"generator_size": cfg.generator_size, "disc_weight": cfg.disc_weight}
    model = family.build(model_cfg, objective, generator)
    model.export_dropout = export_dropout  # describe() records it in the run's config.json; export writes it
    if state is not None:
        try:
            family.load_weights(model, state, cfg.init_from)
        except ValueError as e:
            raise ConfigError(f"--init-from {cfg.init_from}: {e}") from None
    if cfg.train_only:
        train_only(model, cfg.train_only, objective)
    return model, model_cfg, source


def train_only(model, parts, objective: str) -> int:
    """--train-only: every parameter frozen but the head's (those outside the encoder, the largest module) and, with
    "embeddings", the word-embedding matrix (the decoder's too: they are tied). Returns how many train."""
    if objective == "electra":
        raise ConfigError("--train-only: ELECTRA trains a generator and a discriminator together; leave it out")
    encoder = max(model.children(), key=lambda m: sum(p.numel() for p in m.parameters()))
    in_encoder = {id(p) for p in encoder.parameters()}
    words = next(m.weight for m in encoder.modules() if isinstance(m, torch.nn.Embedding)
                 and m.num_embeddings == model.cfg.padded_vocab_size)
    for p in model.parameters():
        p.requires_grad_(("head" in parts and id(p) not in in_encoder) or ("embeddings" in parts and p is words))
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if os.environ.get("RANK", "0") == "0":
        say(f"--train-only {','.join(parts)}: {trained:,} of {sum(p.numel() for p in model.parameters()):,} "
            "parameters train; the rest are frozen")
    return trained


def check_model_flag(cfg: PretrainConfig, held: Family) -> None:
    """--model beside --init-from: the run continues --init-from's model (its family and shape), so a --model of
    another family is refused rather than silently ignored; one of the same family is said to be unused."""
    named = family_of_spec(cfg.model)
    if named is not held:
        raise ConfigError(f"--model {cfg.model} is a {named.title}, but --init-from {cfg.init_from} holds a "
                          f"{held.title}: a run continues --init-from's model (its family and shape). Drop "
                          "--model, or leave out --init-from to start a new model from random weights")
    say(f"note: --model {cfg.model} is not used: the run continues --init-from {cfg.init_from}'s model and shape")


def starting_point(cfg: PretrainConfig, manifest: InstancesManifest, previous_run: RunConfig | None, objective: str,
                   family: Family):
    """(config, weights or None, source, the recorded model dict or {}): the resumed run's shape, --init-from's run
    folder or model folder, or the preset sized to the instances' vocabulary."""
    if previous_run is not None:
        return family.config_from_dict(previous_run.model), None, previous_run.init_from, previous_run.model
    if not cfg.init_from:
        return family.config_from_spec(cfg.model, manifest.vocab_size), None, "random initialisation", {}
    init = Path(cfg.init_from)
    if (init / "checkpoints").is_dir():
        state, run, tag = load_run_state_dict(init, say=say)
        if (run.objective == "electra") != (objective == "electra"):
            raise ConfigError(f"--init-from {init}: an {run.objective} run cannot start this {objective} run")
        check_same_vocabulary(cfg, manifest, run.vocab_sha256)
        return family.config_from_dict(run.model), state, f"{init} ({tag})", run.model
    if objective == "electra":
        raise ConfigError(f"--init-from {init}: ELECTRA continues from its run folder (the one with "
                          "checkpoints/), which holds both the generator and the discriminator")
    loaded = load_pretrained(init, head="pretraining")
    check_same_vocabulary(cfg, manifest, sha256_file(init / "vocab.txt") if (init / "vocab.txt").is_file() else None)
    return loaded.cfg, loaded.state_dict(), str(init), {}


def check_same_vocabulary(cfg: PretrainConfig, manifest: InstancesManifest, init_sha: str | None) -> None:
    """--init-from's vocabulary must be the instances' (ids would mean other tokens)."""
    if init_sha and manifest.vocab_sha256 and init_sha != manifest.vocab_sha256:
        raise ConfigError(f"--init-from {cfg.init_from} was trained with another vocabulary (vocab.txt sha256 "
                          f"{init_sha[:12]}...) than --instances {cfg.instances} ({manifest.vocab_sha256[:12]}"
                          "...); make the instances with the tokenizer of the first phase")


def check_fits(cfg: PretrainConfig, manifest: InstancesManifest, family: Family, model_cfg, weights_from):
    """The model's vocabulary is the instances', and it takes their sequence length (a family may grow to it)."""
    if model_cfg.vocab_size != manifest.vocab_size:
        raise ConfigError(f"the model's vocabulary has {model_cfg.vocab_size} tokens ({weights_from or cfg.model})"
                          f" but {cfg.instances} was made with {manifest.vocab_size} (manifest vocab_size): use "
                          "instances made with the model's tokenizer, or a model config with the instances' "
                          "vocab_size")
    if not family.fit_length(model_cfg, manifest.max_seq_length):
        raise ConfigError(f"{cfg.instances} has sequences of {manifest.max_seq_length} tokens but the model has only "
                          f"{model_cfg.max_length} positions")
