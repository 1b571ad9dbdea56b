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
    if cfg.init_from:
        return FAMILIES["modernbert" if is_modernbert(Path(cfg.init_from)) else "bert"]
    return FAMILIES["modernbert" if ModernBertConfig.from_spec(cfg.model, manifest.vocab_size) else "bert"]


def build_model(cfg: PretrainConfig, manifest: InstancesManifest, previous_run: RunConfig | None,
                objective: str = "nsp"):
    """(model, BertConfig, init source description): the run's own shape on --resume (weights come from the
    checkpoint), --init-from's weights, an HF config, or a preset sized to the instances' vocabulary. ELECTRA
    (objective "electra") builds the generator and discriminator pair, the BertConfig being the discriminator's."""
    vocab_size = manifest.vocab_size
    if previous_run is not None and family_of(previous_run.model).name == "modernbert":
        return build_modernbert(cfg, manifest, ModernBertConfig.from_dict(previous_run.model), objective,
                                previous_run.init_from)
    if previous_run is None and not cfg.init_from and (mb := ModernBertConfig.from_spec(cfg.model, vocab_size)):
        return build_modernbert(cfg, manifest, mb, objective, "random initialisation")
    if previous_run is None and cfg.init_from and (start := modernbert_start(Path(cfg.init_from), say)):
        mb, tensors, source, init_sha = start
        if init_sha and manifest.vocab_sha256 and init_sha != manifest.vocab_sha256:
            raise ConfigError(f"--init-from {cfg.init_from} was trained with another vocabulary than --instances "
                              f"{cfg.instances}; make the instances with the tokenizer of the first phase")
        model, mb, source = build_modernbert(cfg, manifest, mb, objective, source)
        modernbert.load_hf_state_dict(model, tensors, cfg.init_from)
        return model, mb, source
    state, source, init_model = None, "random initialisation", {}
    if previous_run is not None:
        bert_cfg, source = BertConfig.from_dict(previous_run.model), previous_run.init_from
    elif cfg.init_from:
        init = Path(cfg.init_from)
        if (init / "checkpoints").is_dir():
            state, run, tag = load_run_state_dict(init, say=say)
            if (run.objective == "electra") != (objective == "electra"):
                raise ConfigError(f"--init-from {init}: an {run.objective} run cannot start this {objective} run")
            bert_cfg, init_model = BertConfig.from_dict(run.model), run.model
            source = f"{init} ({tag})"
            init_sha = run.vocab_sha256
        elif objective == "electra":
            raise ConfigError(f"--init-from {init}: ELECTRA continues from its run folder (the one with "
                              "checkpoints/), which holds both the generator and the discriminator")
        else:
            loaded = load_pretrained(init, head="pretraining")
            bert_cfg, state, source = loaded.cfg, loaded.state_dict(), str(init)
            init_sha = sha256_file(init / "vocab.txt") if (init / "vocab.txt").is_file() else None
        if init_sha and manifest.vocab_sha256 and init_sha != manifest.vocab_sha256:
            raise ConfigError(f"--init-from {init} was trained with another vocabulary (vocab.txt sha256 "
                              f"{init_sha[:12]}...) than --instances {cfg.instances} ({manifest.vocab_sha256[:12]}"
                              "...); make the instances with the tokenizer of the first phase")
    else:
        bert_cfg = BertConfig.from_spec(cfg.model, vocab_size)
    # --dropout is a pretraining choice: an export keeps the model's own dropout for fine-tuning (cramming's way)
    recorded = (previous_run.model if previous_run else init_model).get("export_dropout")
    export_dropout = recorded
    own = {"hidden": bert_cfg.hidden_dropout, "attention": bert_cfg.attention_dropout}
    if cfg.dropout is not None and set(own.values()) != {cfg.dropout}:
        bert_cfg.set_dropout(cfg.dropout)
        export_dropout = recorded or own
    if cfg.norm is not None and cfg.norm != bert_cfg.norm:
        if state is not None or previous_run is not None:
            origin = source if state is not None else "the run being resumed"
            raise ConfigError(f"--norm {cfg.norm}: the weights this run starts from ({origin}) are "
                              f"{bert_cfg.norm}-LN; drop --norm")
        bert_cfg.norm = cfg.norm
    if cfg.pad_vocab_to is not None and previous_run is None:
        bert_cfg.vocab_pad_multiple = cfg.pad_vocab_to
    if bert_cfg.vocab_size != vocab_size:
        raise ConfigError(f"the model's vocabulary has {bert_cfg.vocab_size} tokens ({source if state else cfg.model})"
                          f" but {cfg.instances} was made with {vocab_size} (manifest vocab_size): use instances "
                          "made with the model's tokenizer, or a model config with the instances' vocab_size")
    if manifest.max_seq_length > bert_cfg.max_position_embeddings:
        raise ConfigError(f"{cfg.instances} has sequences of {manifest.max_seq_length} tokens but the model has only "
                          f"{bert_cfg.max_position_embeddings} positions")
    # ELECTRA's generator: the resumed (or --init-from) run's own, else from the flags
    recorded = (previous_run.model if previous_run else init_model).get("electra")
    generator = recorded or {"generator_size": cfg.generator_size, "disc_weight": cfg.disc_weight}
    model = ElectraForPreTraining(bert_cfg, **generator) if objective == "electra" else BertForPreTraining(bert_cfg)
    model.export_dropout = export_dropout  # describe() records it in the run's config.json; export writes it
    if state is not None:
        state = repad_vocab(state, bert_cfg)  # --pad-vocab-to may differ from the source's padding
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ConfigError(f"--init-from {cfg.init_from}: weights do not fit the pretraining model "
                              f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    return model, bert_cfg, source


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
