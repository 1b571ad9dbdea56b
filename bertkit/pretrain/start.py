"""What a pretraining run starts from: the model of its family (BERT post-/pre-LN, ELECTRA's pair, ModernBERT), sized
to the instances' vocabulary, with the weights of --init-from (a run folder or a model folder) when given, or the
shape of the run being resumed (whose weights then come from its checkpoint)."""
import json
from pathlib import Path

from bertkit.config import BertConfig
from bertkit.fileio import sha256_file
from bertkit.formats import InstancesManifest, RunConfig, read_run_config
from bertkit.models import FAMILIES, Family, family_of, load_pretrained, modernbert
from bertkit.models.bert import BertForPreTraining
from bertkit.models.bert_hf import repad_vocab
from bertkit.models.electra import ElectraForPreTraining
from bertkit.models.modernbert import ModernBertConfig, ModernBertForMaskedLM
from bertkit.pretrain.checkpoints import load_run_state_dict
from bertkit.pretrain.config import ConfigError, PretrainConfig
from bertkit.pretrain.metrics import say


def planned_family(cfg: PretrainConfig, manifest: InstancesManifest, previous_run: RunConfig | None) -> Family:
    """The family the run will build, known before the model is: the resumed run's, --init-from's, or the preset's."""
    if previous_run is not None:
        return family_of(previous_run.model)
    return FAMILIES[spec_family(cfg.model, cfg.init_from)]


def spec_family(model: str | None, init_from: str | None = None) -> str:
    """"modernbert" or "bert": the family --init-from, else --model, names (read, nothing built)."""
    if init_from:
        return "modernbert" if is_modernbert(Path(init_from)) else "bert"
    return "modernbert" if ModernBertConfig.from_spec(model, vocab_size=64) else "bert"


def build_model(cfg: PretrainConfig, manifest: InstancesManifest, previous_run: RunConfig | None,
                objective: str = "nsp"):
    """(model, BertConfig, init source description): the run's own shape on --resume (weights come from the
    checkpoint), --init-from's weights, an HF config, or a preset sized to the instances' vocabulary. ELECTRA
    (objective "electra") builds the generator and discriminator pair, the BertConfig being the discriminator's."""
    if previous_run is None and cfg.init_from and cfg.model:
        check_model_flag(cfg, manifest)
    if previous_run is not None and family_of(previous_run.model).name == "modernbert":
        return build_modernbert(cfg, manifest, ModernBertConfig.from_dict(previous_run.model), objective,
                                previous_run.init_from)
    if previous_run is None and not cfg.init_from and (mb := ModernBertConfig.from_spec(cfg.model,
                                                                                       manifest.vocab_size)):
        return build_modernbert(cfg, manifest, mb, objective, "random initialisation")
    if previous_run is None and cfg.init_from and (start := modernbert_start(Path(cfg.init_from), say)):
        mb, tensors, source, init_sha = start
        check_same_vocabulary(cfg, manifest, init_sha)
        model, mb, source = build_modernbert(cfg, manifest, mb, objective, source)
        modernbert.load_hf_state_dict(model, tensors, cfg.init_from)
        return model, mb, source

    bert_cfg, state, source, recorded = bert_start(cfg, manifest, previous_run, objective)
    export_dropout = apply_model_flags(cfg, manifest, bert_cfg, recorded, source if state is not None else None,
                                       resumed=previous_run is not None)
    # ELECTRA's generator: the resumed (or --init-from) run's own, else from the flags
    generator = recorded.get("electra") or {"generator_size": cfg.generator_size, "disc_weight": cfg.disc_weight}
    model = ElectraForPreTraining(bert_cfg, **generator) if objective == "electra" else BertForPreTraining(bert_cfg)
    model.export_dropout = export_dropout  # describe() records it in the run's config.json; export writes it
    if state is not None:
        state = repad_vocab(state, bert_cfg)  # --pad-vocab-to may differ from the source's padding
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ConfigError(f"--init-from {cfg.init_from}: weights do not fit the pretraining model "
                              f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    return model, bert_cfg, source


def check_model_flag(cfg: PretrainConfig, manifest: InstancesManifest) -> None:
    """--model beside --init-from: the run continues --init-from's model (its family and shape), so a --model of
    another family is refused rather than silently ignored; one of the same family is said to be unused."""
    named = "modernbert" if ModernBertConfig.from_spec(cfg.model, manifest.vocab_size) else "bert"
    held = spec_family(None, cfg.init_from)
    if named != held:
        names = {"bert": "BERT", "modernbert": "ModernBERT"}
        raise ConfigError(f"--model {cfg.model} is a {names[named]}, but --init-from {cfg.init_from} holds a "
                          f"{names[held]}: a run continues --init-from's model (its family and shape). Drop "
                          "--model, or leave out --init-from to start a new model from random weights")
    say(f"note: --model {cfg.model} is not used: the run continues --init-from {cfg.init_from}'s model and shape")


def bert_start(cfg: PretrainConfig, manifest: InstancesManifest, previous_run: RunConfig | None, objective: str):
    """(BertConfig, weights or None, source, the recorded model dict or {}) for a BERT or ELECTRA run: the resumed
    run's shape, --init-from's run folder or model folder, or the preset sized to the instances' vocabulary."""
    if previous_run is not None:
        return BertConfig.from_dict(previous_run.model), None, previous_run.init_from, previous_run.model
    if not cfg.init_from:
        return BertConfig.from_spec(cfg.model, manifest.vocab_size), None, "random initialisation", {}
    init = Path(cfg.init_from)
    if (init / "checkpoints").is_dir():
        state, run, tag = load_run_state_dict(init, say=say)
        if (run.objective == "electra") != (objective == "electra"):
            raise ConfigError(f"--init-from {init}: an {run.objective} run cannot start this {objective} run")
        check_same_vocabulary(cfg, manifest, run.vocab_sha256)
        return BertConfig.from_dict(run.model), state, f"{init} ({tag})", run.model
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


def apply_model_flags(cfg: PretrainConfig, manifest: InstancesManifest, bert_cfg: BertConfig, recorded: dict,
                      weights_from: str | None, resumed: bool):
    """--dropout, --norm and --pad-vocab-to onto the BERT config, then its fit to the instances checked; returns the
    dropout an export should write. weights_from: --init-from's weights (they, or a resumed run's, fix --norm)."""
    # --dropout is a pretraining choice: an export keeps the model's own dropout for fine-tuning (cramming's way)
    export_dropout = recorded.get("export_dropout")
    own = {"hidden": bert_cfg.hidden_dropout, "attention": bert_cfg.attention_dropout}
    if cfg.dropout is not None and set(own.values()) != {cfg.dropout}:
        bert_cfg.set_dropout(cfg.dropout)
        export_dropout = export_dropout or own
    if cfg.norm is not None and cfg.norm != bert_cfg.norm:
        if weights_from or resumed:
            raise ConfigError(f"--norm {cfg.norm}: the weights this run starts from "
                              f"({weights_from or 'the run being resumed'}) are {bert_cfg.norm}-LN; drop --norm")
        bert_cfg.norm = cfg.norm
    if cfg.pad_vocab_to is not None and not resumed:
        bert_cfg.vocab_pad_multiple = cfg.pad_vocab_to
    if bert_cfg.vocab_size != manifest.vocab_size:
        raise ConfigError(f"the model's vocabulary has {bert_cfg.vocab_size} tokens ({weights_from or cfg.model})"
                          f" but {cfg.instances} was made with {manifest.vocab_size} (manifest vocab_size): use "
                          "instances made with the model's tokenizer, or a model config with the instances' "
                          "vocab_size")
    if manifest.max_seq_length > bert_cfg.max_length:
        raise ConfigError(f"{cfg.instances} has sequences of {manifest.max_seq_length} tokens but the model has only "
                          f"{bert_cfg.max_length} positions")
    return export_dropout


def build_modernbert(cfg: PretrainConfig, manifest: InstancesManifest, mb: ModernBertConfig, objective: str,
                     source: str):
    """(model, config, init source) for the ModernBERT family: MLM only, pre-LN by design."""
    if objective != "none":
        raise ConfigError(f"ModernBERT is MLM-only, but {cfg.instances} holds {objective.upper()} instances: make them "
                          "with `bertkit make-instances --objective none`, or pretrain with --objective mlm")
    if cfg.norm == "post":
        raise ConfigError("--norm post: ModernBERT is pre-LN by design; drop --norm")
    if cfg.kernels == "triton" and mb.head_dim & (mb.head_dim - 1):
        raise ConfigError(f"--kernels triton: the Triton kernels turn RoPE in halves of a power-of-two head size; this "
                          f"model's heads are {mb.head_dim} wide: use --kernels auto or torch")
    if cfg.dropout is not None:
        mb.set_dropout(cfg.dropout)
    if cfg.pad_vocab_to is not None:
        mb.vocab_pad_multiple = cfg.pad_vocab_to
    if cfg.rope_theta is not None:  # a second, longer phase raises the global layers' base (ModernBERT: 160,000)
        mb.global_rope_theta = cfg.rope_theta
    mb.max_position_embeddings = max(mb.max_position_embeddings, manifest.max_seq_length)  # RoPE has no table
    if mb.vocab_size != manifest.vocab_size:
        raise ConfigError(f"the model's vocabulary has {mb.vocab_size} tokens but {cfg.instances} was made with "
                          f"{manifest.vocab_size}: use instances made with the model's tokenizer")
    return ModernBertForMaskedLM(mb), mb, source


def is_modernbert(init: Path) -> bool:
    """Whether --init-from names a ModernBERT run folder or model folder (read, nothing loaded)."""
    if (init / "checkpoints").is_dir():
        return family_of(read_run_config(init).model).name == "modernbert"
    try:
        return json.loads((init / "config.json").read_text()).get("model_type") == "modernbert"
    except (OSError, ValueError, AttributeError):
        return False


def modernbert_start(init: Path, say=None) -> tuple | None:
    """(config, tensors in transformers' names, source, vocab sha256 or None) when `init` (--init-from) is a
    ModernBERT run folder or model folder, else None."""
    if not is_modernbert(init):
        return None
    if (init / "checkpoints").is_dir():
        state, run, tag = load_run_state_dict(init, say=say)
        return ModernBertConfig.from_dict(run.model), state, f"{init} ({tag})", run.vocab_sha256
    loaded = load_pretrained(init, head="pretraining")
    vocab = init / "vocab.txt"
    return loaded.cfg, modernbert.hf_state_dict(loaded), str(init), sha256_file(vocab) if vocab.is_file() else None
