"""BERT's HF format: load any HF BERT folder (post-LN BERT, pre-LN MegatronBERT, an ELECTRA discriminator) into
bertkit's BERT, save bertkit's BERT models that transformers loads. Also the model-folder reading every family
shares (weights files, config.json, the tokenizer files beside the model). bertkit.models.load_pretrained /
save_pretrained choose the family; this is the BERT family's part.

The HF layout differs from ours in three ways, all handled here:
- names (`encoder.layer.3.attention.output.LayerNorm.weight` vs `layers.3.attn_norm.weight`);
- our fused QKV projection, split into query/key/value on save and joined on load;
- our vocabulary padded to a multiple of 8, sliced on save and zero-padded on load.
RoBERTa's layout (KLUE's RoBERTa) is BERT's under other names: renamed to BERT's on load and back on save
(BertConfig.layout "roberta" keeps its position offset and single token type).
Tensors are read from model.safetensors (or a sharded index), or from pytorch_model.bin through
bertkit.safe_load (weights_only=True), which never unpickles arbitrary objects.
"""
import io
import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from bertkit.errors import regular_file
from bertkit.fileio import atomic_copy, atomic_write_bytes, atomic_write_json
from bertkit.formats import TOKENIZER_FILES, DamagedFileError, FormatError, listed_file
from bertkit.models.bert import (
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    build_model,
)
from bertkit.models.bert_config import BertConfig
from bertkit.safe_load import UnsafeCheckpointError, safe_load

log = logging.getLogger("bertkit.models")  # one logger for every family's loading


class ModelFolderError(FormatError):
    """A model folder bertkit cannot load (no config.json, a config that is not BERT-family, weights that do not fit
    it); the message names the file and what is wrong."""

ARCHITECTURES = {
    BertModel: "BertModel",
    BertForPreTraining: "BertForPreTraining",
    BertForSequenceClassification: "BertForSequenceClassification",
    BertForTokenClassification: "BertForTokenClassification",
    BertForQuestionAnswering: "BertForQuestionAnswering",
}
HEAD_OF_ARCHITECTURE = {
    "BertModel": None,
    "BertForPreTraining": "pretraining",
    "BertForMaskedLM": "pretraining",
    "BertLMHeadModel": "pretraining",
    "BertForNextSentencePrediction": "pretraining",
    "BertForSequenceClassification": "sequence_classification",
    "BertForTokenClassification": "token_classification",
    "BertForQuestionAnswering": "question_answering",
}
HEAD_OF_ARCHITECTURE.update({"Megatron" + k: v for k, v in HEAD_OF_ARCHITECTURE.items()})  # pre-LN: MegatronBert*
HEAD_OF_ARCHITECTURE.update({  # ELECTRA: the discriminator's replaced-token head has no bertkit form (unused)
    "ElectraModel": None, "ElectraForPreTraining": None, "ElectraForMaskedLM": "pretraining",
    "ElectraForSequenceClassification": "sequence_classification",
    "ElectraForTokenClassification": "token_classification", "ElectraForQuestionAnswering": "question_answering"})
HEAD_OF_ARCHITECTURE.update({  # RoBERTa (KLUE's): an MLM head only, its classifier reads <s> through dense + tanh
    "RobertaModel": None, "RobertaForMaskedLM": "pretraining",
    "RobertaForSequenceClassification": "sequence_classification",
    "RobertaForTokenClassification": "token_classification", "RobertaForQuestionAnswering": "question_answering"})
ROBERTA_ARCHITECTURES = {"BertModel": "RobertaModel", "BertForPreTraining": "RobertaForMaskedLM",
                         "BertForMaskedLM": "RobertaForMaskedLM"}
# RoBERTa's names for BERT's: its MLM head is lm_head; its sequence classifier's dense + tanh is BERT's pooler and its
# out_proj BERT's classifier (the same function of h[<s>]; RoBERTa adds a dropout before the dense when training)
ROBERTA_NAMES = {"roberta.": "bert.", "lm_head.dense.": "cls.predictions.transform.dense.",
                 "lm_head.layer_norm.": "cls.predictions.transform.LayerNorm.", "lm_head.bias": "cls.predictions.bias",
                 "lm_head.decoder.": "cls.predictions.decoder."}
ROBERTA_CLASSIFIER = {"classifier.dense.": "bert.pooler.dense.", "classifier.out_proj.": "classifier."}
# ELECTRA's generator head under BERT's names (its decoder is tied to the word embeddings, as BERT's)
ELECTRA_HEAD = {"generator_predictions.dense.": "cls.predictions.transform.dense.",
                "generator_predictions.LayerNorm.": "cls.predictions.transform.LayerNorm.",
                "generator_lm_head.bias": "cls.predictions.bias",
                "generator_lm_head.weight": "cls.predictions.decoder.weight"}
LAYER_PARTS = {
    "attn_out": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
# pre-LN (MegatronBERT): the LayerNorm before the attention, the one before the FFN, and the encoder's final one
PRE_LN_PARTS = {**LAYER_PARTS, "attn_norm": "attention.ln", "ffn_norm": "ln"}
HEAD_PARTS = {
    "mlm_dense": "cls.predictions.transform.dense",
    "mlm_norm": "cls.predictions.transform.LayerNorm",
    "nsp": "cls.seq_relationship",
    "classifier": "classifier",
    "qa_outputs": "qa_outputs",
}
VOCAB_PADDED = ("bert.embeddings.word_embeddings.weight", "mlm_bias")


def repad_vocab(state: dict, cfg: BertConfig) -> dict:
    """A state dict's vocabulary-sized tensors cut to vocab_size and zero-padded to cfg's padded size."""
    state = dict(state)
    for key in VOCAB_PADDED:
        if key in state:
            t = state[key][: cfg.vocab_size]
            pad = t.new_zeros((cfg.padded_vocab_size - cfg.vocab_size, *t.shape[1:]))
            state[key] = torch.cat([t, pad], 0)
    return state


# ---------------------------------------------------------------- names
def architecture(model, masked_lm_only: bool = False) -> str:
    """transformers' class name for a bertkit model: Bert* (post-LN), MegatronBert* (pre-LN) or Roberta*."""
    name = "BertForMaskedLM" if masked_lm_only else ARCHITECTURES[type(model)]
    if model.cfg.layout == "roberta":
        return ROBERTA_ARCHITECTURES.get(name, name.replace("Bert", "Roberta"))
    return "Megatron" + name if model.cfg.norm == "pre" else name


def renamed(tensors: dict, names: dict) -> dict:
    """Tensors with each name that starts with a key of `names` starting with its value instead."""
    out = {}
    for key, tensor in tensors.items():
        old = next((o for o in names if key.startswith(o)), None)
        out[names[old] + key[len(old):] if old else key] = tensor
    return out


def to_roberta_names(hf: dict, sequence_classification: bool) -> dict:
    """BERT-named HF tensors under RoBERTa's names (no NSP head or MLM pooler: RoBERTa has neither)."""
    if sequence_classification:
        hf = renamed(hf, {v: k for k, v in ROBERTA_CLASSIFIER.items()})
    hf = {k: v for k, v in hf.items() if not k.startswith(("cls.seq_relationship.", "bert.pooler."))}
    return renamed(hf, {v: k for k, v in ROBERTA_NAMES.items() if not k.startswith("lm_head.decoder.")})


def saved_name(name: str, cfg, head: str | None = None) -> str:
    """An HF name as the user's file spells it: RoBERTa's for a RoBERTa folder (bertkit reads them as BERT's)."""
    if cfg.layout != "roberta":
        return name
    names = {**ROBERTA_NAMES, **ROBERTA_CLASSIFIER} if head == "sequence_classification" else ROBERTA_NAMES
    back = {bert: theirs for theirs, bert in names.items()}
    prefix = max((b for b in back if name.startswith(b)), key=len, default="")
    return back[prefix] + name[len(prefix):] if prefix else name


def hf_names(key: str, norm: str = "post") -> list[str]:
    """HF tensor names for one of our (canonical, `bert.`-prefixed) parameter names; three for a fused QKV.
    norm "pre": MegatronBert's names for the LayerNorms."""
    if key == "mlm_bias":
        return ["cls.predictions.bias"]
    if not key.startswith("bert."):
        module, leaf = key.rsplit(".", 1)
        return [f"{HEAD_PARTS[module]}.{leaf}"]
    parts = key.split(".")
    if parts[1] == "layers":
        i, module, leaf = parts[2], parts[3], parts[4]
        prefix = f"bert.encoder.layer.{i}."
        if module == "qkv":
            return [f"{prefix}attention.self.{name}.{leaf}" for name in ("query", "key", "value")]
        return [f"{prefix}{(PRE_LN_PARTS if norm == 'pre' else LAYER_PARTS)[module]}.{leaf}"]
    if parts[1] == "final_norm":
        return [f"bert.encoder.ln.{parts[2]}"]
    if parts[1] == "pooler":
        return [f"bert.pooler.dense.{parts[2]}"]
    if parts[1:3] == ["embeddings", "norm"]:
        return [f"bert.embeddings.LayerNorm.{parts[3]}"]
    return [key]  # word/position/token_type embeddings keep their names


def _canonical_state(model) -> dict:
    """Our state dict with every encoder name under `bert.`, whether or not the model is a bare BertModel."""
    state = model.state_dict()
    if isinstance(model, BertModel):
        return {f"bert.{k}": v for k, v in state.items()}
    return dict(state)


def to_hf_state_dict(state: dict, cfg: BertConfig) -> dict:
    """Canonical bertkit tensors (parameters or their gradients) -> HF-named tensors."""
    out = {}
    for key, tensor in state.items():
        names = hf_names(key, cfg.norm)
        if key in VOCAB_PADDED:
            tensor = tensor[: cfg.vocab_size]
        pieces = tensor.chunk(len(names), dim=0) if len(names) > 1 else [tensor]
        for name, piece in zip(names, pieces):
            out[name] = piece.detach().contiguous().clone()
    return out


def _normalise_hf_keys(tensors: dict) -> dict:
    """Put every encoder tensor under `bert.` (ELECTRA's `electra.` too, and its generator head under BERT's MLM
    head names); TF-era LayerNorm gamma/beta -> weight/bias."""
    if any(k.startswith(("roberta.", "lm_head.")) for k in tensors):
        tensors = renamed(renamed(tensors, ROBERTA_CLASSIFIER), ROBERTA_NAMES)
    out = {}
    for key, tensor in tensors.items():
        if key.startswith("electra."):
            key = "bert." + key[len("electra."):]
        for theirs, ours in ELECTRA_HEAD.items():
            if key.startswith(theirs):
                key = ours + key[len(theirs):]
        if key.startswith(("embeddings.", "embeddings_project.", "encoder.", "pooler.")):
            key = "bert." + key
        if key.endswith(".gamma"):
            key = key[: -len("gamma")] + "weight"
        elif key.endswith(".beta"):
            key = key[: -len("beta")] + "bias"
        out[key] = tensor
    return out


# ---------------------------------------------------------------- reading
def _count_lines(path: Path) -> int:
    data = path.read_bytes()
    return data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)


def _load_safetensors(file: Path) -> dict:
    regular_file(file)
    try:
        return load_file(str(file))
    except Exception as e:  # safetensors' own errors: a cut-short or damaged file
        raise DamagedFileError(file, f"not a readable safetensors file ({str(e).splitlines()[0][:200]})",
                               f"`bertkit verify {file.parent}` checks an export's files; export it again") from None


def read_weights(path) -> dict:
    """All tensors of an HF checkpoint directory, as float32 on the CPU."""
    path = Path(path)
    if (path / "model.safetensors").exists():  # a pipe or device there is refused by name, not passed over
        tensors = _load_safetensors(path / "model.safetensors")
    elif (path / "model.safetensors.index.json").is_file():
        index_file = path / "model.safetensors.index.json"
        index = _read_json(index_file)
        shards = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(shards, dict) or not all(isinstance(v, str) for v in shards.values()):
            raise ModelFolderError(f"{index_file}: no 'weight_map' of tensor names to shard files")
        tensors = {}
        for shard in sorted(set(shards.values())):
            try:
                listed_file(path, shard, index_file)
            except FormatError as e:
                raise ModelFolderError(str(e)) from None
            if not (path / shard).is_file():
                raise ModelFolderError(f"{index_file}: names the shard {shard}, which is not in {path}")
            tensors.update(_load_safetensors(path / shard))
    elif (path / "pytorch_model.bin").exists():
        try:
            tensors = safe_load(path / "pytorch_model.bin")
        except UnsafeCheckpointError as e:  # pickled code, not plain tensors: refused, never executed
            raise ModelFolderError(str(e)) from None
        except Exception as e:
            raise ModelFolderError(f"{path / 'pytorch_model.bin'}: cannot be read as plain tensors "
                                   f"(torch.load weights_only=True): {e}") from e
        if isinstance(tensors, dict) and isinstance(tensors.get("state_dict"), dict):
            tensors = tensors["state_dict"]
        if not isinstance(tensors, dict) or not all(torch.is_tensor(t) for t in tensors.values()):
            raise ModelFolderError(f"{path / 'pytorch_model.bin'}: not a dictionary of tensors")
    else:
        raise ModelFolderError(f"{path}: no model.safetensors or pytorch_model.bin; is this an HF model folder? "
                               "(bertkit exports write model.safetensors beside config.json)")
    return {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}


def _read_json(path: Path):
    regular_file(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ModelFolderError(f"{path}: byte {e.start} is not UTF-8; not a JSON file") from None
    except json.JSONDecodeError as e:
        raise ModelFolderError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None


def read_config_or_none(path: Path, name: str = "config.json") -> dict | None:
    """config.json (or another JSON file) of a model folder as a dict, or None when there is none (the loader then
    says what is missing)."""
    config = Path(path) / name
    d = _read_json(config) if config.is_file() else None
    return d if isinstance(d, dict) else None


def read_checkpoint(path):
    """(BertConfig, HF config dict, HF-named tensors with `bert.`-prefixed encoder names) of a directory."""
    path = Path(path)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelFolderError(f"{config_path} not found: load_pretrained needs an HF-format BERT folder "
                               "(config.json + model.safetensors); export a bertkit training run first")
    hf_config = _read_json(config_path)
    if not isinstance(hf_config, dict):
        raise ModelFolderError(f"{config_path}: not a JSON object of settings")
    try:
        cfg = BertConfig.from_hf_dict(hf_config, source=str(config_path))
    except KeyError as e:
        raise ModelFolderError(f"{config_path}: no {e.args[0]!r}; not a BERT-family config.json") from None
    except (ValueError, TypeError) as e:
        message = str(e) if str(config_path) in str(e) else f"{config_path}: {e}"
        raise ModelFolderError(message) from None
    tensors = _normalise_hf_keys(read_weights(path))

    word = "bert.embeddings.word_embeddings.weight"
    if word not in tensors:
        found = ", ".join(sorted(tensors)[:5])
        raise ModelFolderError(f"{path}: no tensor {word!r} (or 'embeddings.word_embeddings.weight'); "
                               f"not a BERT checkpoint? It has: {found}, ...")
    rows = tuple(tensors[word].shape)
    if rows != (cfg.vocab_size, cfg.embedding_width):
        raise ModelFolderError(f"{path}: tensor {word!r} has shape {rows} but config.json says "
                               f"({cfg.vocab_size}, {cfg.embedding_width}) (vocab_size, embedding width)")
    if (path / "vocab.txt").is_file():
        n = _count_lines(path / "vocab.txt")
        if n != cfg.vocab_size:
            raise ModelFolderError(f"{path / 'vocab.txt'} has {n} tokens but tensor {word!r} has shape {rows}: "
                                   "the vocabulary does not match the embeddings")
    if (path / "tokenizer.json").is_file():  # its added tokens may reach past vocab.txt
        from bertkit.tokenization import TokenizerError, check_ids_fit, load_tokenizer

        try:
            check_ids_fit(load_tokenizer(path), cfg.vocab_size, path / "tokenizer.json", f"tensor {word!r}")
        except TokenizerError as e:
            raise ModelFolderError(str(e)) from None
    return cfg, hf_config, tensors


def infer_head(hf_config: dict, tensors: dict) -> str | None:
    for arch in hf_config.get("architectures") or []:
        if arch in HEAD_OF_ARCHITECTURE:
            return HEAD_OF_ARCHITECTURE[arch]
    if "qa_outputs.weight" in tensors:
        return "question_answering"
    if "cls.predictions.bias" in tensors:
        return "pretraining"
    return None


# ---------------------------------------------------------------- load / save
def load_hf(path, head: str | None = "auto", num_labels: int | None = None, require_head: bool = False):
    """Build a bertkit BERT from an HF BERT folder (or a bertkit export) and load its weights.

    head: None (bare encoder), "pretraining", "sequence_classification", "token_classification",
    "question_answering", or "auto" (from config.json's architectures). Heads missing from the checkpoint
    are initialised and logged (with require_head=True refused, except the NSP classifier and the pooler);
    encoder tensors must all be present. Returned in eval mode, fp32 on the CPU, with `model.loading_info` =
    {"head", "missing", "unused"} (HF tensor names as the file spells them) and `model.hf_config`.
    """
    path = Path(path)
    cfg, hf_config, tensors = read_checkpoint(path)
    saved_head = infer_head(hf_config, tensors)
    if head == "auto":
        head = saved_head
    if head in ("sequence_classification", "token_classification") and num_labels is None:
        num_labels = _saved_num_labels(path, head, saved_head, hf_config, tensors)
    _tie_decoder(path, tensors)
    with torch.device("meta"):  # every shape checked against the weights before any memory is taken
        skeleton = build_model(cfg, head, num_labels)
    _match_tensors(path, cfg, head, _canonical_state(skeleton), tensors, check_only=True)
    refuse_unplaced_layers(path / "config.json", cfg.num_layers, tensors, r"^bert\.encoder\.layer\.(\d+)\.")
    model = build_model(cfg, head, num_labels)
    loaded, missing, used = _match_tensors(path, cfg, head, _canonical_state(model), tensors)

    # the NSP classifier and the pooler are cheap to retrain; the MLM head, classifiers and QA outputs are the head
    # (RoBERTa's sequence classifier holds BERT's pooler)
    spare = ("cls.seq_relationship.",) if head == "sequence_classification" and cfg.layout == "roberta" else \
        ("cls.seq_relationship.", "bert.pooler.")
    essential = [n for n in missing if not n.startswith(spare)]
    missing, essential = ([saved_name(n, cfg, head) for n in names] for names in (missing, essential))
    if essential and require_head:
        raise ModelFolderError(f"{path} has no {head} head: it lacks {', '.join(essential)} "
                               f"(config.json architectures: {hf_config.get('architectures')})")
    if isinstance(model, BertModel):
        loaded = {k[len("bert."):]: v for k, v in loaded.items()}
    model.load_state_dict(loaded, strict=True)
    unused = sorted(saved_name(n, cfg, saved_head) for n in set(tensors) - used)
    if essential:
        log.warning("%s: no weights for %s; initialised them randomly (train before use)", path, ", ".join(essential))
    elif missing:  # the NSP classifier or the pooler: fill-mask and mean pooling never read them
        log.info("%s: no weights for %s (initialised; unused by fill-mask and mean pooling)", path, ", ".join(missing))
    if unused:
        log.info("%s: tensors not used by the %s model: %s", path, head or "encoder-only", ", ".join(unused))
    model.loading_info = {"head": head, "missing": missing, "unused": unused}
    model.hf_config = hf_config
    return model.eval()


def _saved_num_labels(path: Path, head: str, saved_head: str, hf_config: dict, tensors: dict) -> int:
    """A classifier's label count from its weights, else from config.json's id2label when the head is the saved one."""
    if "classifier.weight" in tensors:
        return tensors["classifier.weight"].shape[0]
    if saved_head == head and hf_config.get("id2label"):
        return len(hf_config["id2label"])
    raise ModelFolderError(f"{path} has no classifier; pass num_labels to build a {head} head")


def _tie_decoder(path: Path, tensors: dict) -> None:
    """HF files may carry the MLM decoder: it must be the embedding matrix (bertkit ties them), and its bias the MLM
    bias. Buffers some HF versions saved are dropped: they are not weights."""
    decoder = tensors.pop("cls.predictions.decoder.weight", None)
    decoder_bias = tensors.pop("cls.predictions.decoder.bias", None)
    if decoder_bias is not None and "cls.predictions.bias" not in tensors:
        tensors["cls.predictions.bias"] = decoder_bias
    if decoder is not None and not torch.equal(decoder, tensors["bert.embeddings.word_embeddings.weight"]):
        log.warning("%s: cls.predictions.decoder.weight differs from the word embeddings; bertkit ties them "
                    "and uses the embeddings", path)
    for buffer in ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids"):
        tensors.pop(buffer, None)


def refuse_unplaced_layers(config_json, num_layers: int, names, layer_pattern: str) -> None:
    """Weights of another number of layers than config.json's num_hidden_layers (layer i's tensors matching
    layer_pattern's group 1): a model built from fewer would drop the rest without a word. Every family's loader."""
    import re

    layers = {int(m.group(1)) for k in names if (m := re.search(layer_pattern, k))}
    if layers and max(layers) + 1 != num_layers:
        raise ModelFolderError(f"{config_json}: num_hidden_layers is {num_layers}, but the weights hold "
                               f"{max(layers) + 1} layers; the two do not belong together")


def _match_tensors(path: Path, cfg, head, state: dict, tensors: dict, check_only: bool = False):
    """(loaded state, missing HF names, used HF names): each of the model's tensors from its HF name(s), shapes
    checked; an encoder tensor the file lacks is refused, a head's is kept as initialised and reported missing.
    check_only: the shapes only (state may be a meta-device skeleton's)."""
    loaded, missing, used = {}, [], set()
    for key, current in state.items():
        names = hf_names(key, cfg.norm)
        absent = [n for n in names if n not in tensors]
        if absent:
            if key.startswith("bert.") and not (key.startswith("bert.pooler.")):
                raise ModelFolderError(f"{path}: checkpoint lacks tensor {saved_name(absent[0], cfg, head)!r} (needed "
                                       f"for {key!r}); is it a {cfg.layout.title()} checkpoint with this config.json?")
            missing.extend(absent)
            loaded[key] = current
            continue
        pieces = [tensors[n] for n in names]
        expected = list(current.shape)
        if key in VOCAB_PADDED:
            expected[0] = cfg.vocab_size
        expected[0] //= len(names)
        for n, t in zip(names, pieces):
            if list(t.shape) != expected:
                raise ModelFolderError(f"{path}: tensor {saved_name(n, cfg, head)!r} has shape {tuple(t.shape)}, "
                                       f"expected {tuple(expected)} for this config.json / head")
        if check_only:
            continue
        tensor = torch.cat(pieces, 0) if len(pieces) > 1 else pieces[0]
        if key in VOCAB_PADDED:
            tensor = torch.cat([tensor, current[cfg.vocab_size:].zero_()], 0)
        loaded[key] = tensor
        used.update(names)
    return loaded, missing, used


def save_hf(model, out_dir, tokenizer_dir=None, extra_config: dict | None = None,
            safe_serialization: bool = True, masked_lm_only: bool = False) -> Path:
    """Write `model` as an HF BERT folder: config.json, model.safetensors, and the tokenizer files.

    transformers' matching class (BertModel / BertForPreTraining / BertForSequenceClassification /
    BertForTokenClassification / BertForQuestionAnswering; MegatronBert* for a pre-LN model) loads it with no
    missing or unexpected keys.
    masked_lm_only (a BertForPreTraining trained without NSP): written as BertForMaskedLM, without the untrained
    next-sentence head and pooler. extra_config entries (e.g. id2label, label2id, finetuning task) are merged
    into config.json.
    """
    cfg = model.cfg
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is not None:
        check_tokenizer_dir(cfg, tokenizer_dir)  # before anything is written

    hf = to_hf_state_dict(_canonical_state(model), cfg)
    if isinstance(model, BertModel):  # HF's BertModel files carry no `bert.` prefix
        hf = {k[len("bert."):]: v for k, v in hf.items()}
    if masked_lm_only:
        if not isinstance(model, BertForPreTraining):
            raise ValueError("masked_lm_only needs a BertForPreTraining")
        hf = {k: v for k, v in hf.items() if not k.startswith(("cls.seq_relationship.", "bert.pooler."))}
    if cfg.layout == "roberta":
        hf = to_roberta_names(hf, isinstance(model, BertForSequenceClassification))

    config = cfg.to_hf_dict()
    config["architectures"] = [architecture(model, masked_lm_only)]
    num_labels = getattr(model, "num_labels", None)
    if num_labels is not None:
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(num_labels)}
        if num_labels == 1:
            config["problem_type"] = "regression"
    config.update(extra_config or {})
    if num_labels is not None and len(config["id2label"]) != num_labels:
        raise ValueError(f"extra_config id2label has {len(config['id2label'])} labels, the classifier {num_labels}")

    if safe_serialization:
        atomic_write_bytes(out_dir / "model.safetensors", save(hf, metadata={"format": "pt"}))
    else:
        buffer = io.BytesIO()
        torch.save(hf, buffer)
        atomic_write_bytes(out_dir / "pytorch_model.bin", buffer.getvalue())
    atomic_write_json(out_dir / "config.json", config)
    if tokenizer_dir is not None:
        copy_tokenizer_files(cfg, tokenizer_dir, out_dir)
        if cfg.layout == "roberta":  # one token type: transformers' tokenizer must not hand the model a pair's 1s
            settings = read_config_or_none(out_dir, "tokenizer_config.json") or {}
            atomic_write_json(out_dir / "tokenizer_config.json",
                              {**settings, "model_input_names": ["input_ids", "attention_mask"]})
    return out_dir


def check_tokenizer_dir(cfg: BertConfig, tokenizer_dir) -> None:
    """A tokenizer folder whose vocabulary fits the model's embeddings, or the error saying what is wrong."""
    tokenizer_dir = Path(tokenizer_dir)
    if not (tokenizer_dir / "vocab.txt").is_file() and not (tokenizer_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{tokenizer_dir}: no vocab.txt or tokenizer.json to copy beside the model")
    if (tokenizer_dir / "vocab.txt").is_file():
        n = _count_lines(tokenizer_dir / "vocab.txt")
        if n != cfg.vocab_size:
            raise ValueError(f"{tokenizer_dir / 'vocab.txt'} has {n} tokens but the model's word embeddings "
                             f"have shape ({cfg.vocab_size}, {cfg.embedding_width}): wrong tokenizer folder?")


def copy_tokenizer_files(cfg: BertConfig, tokenizer_dir, out_dir) -> None:
    """The tokenizer files beside a model, after checking the vocabulary fits its embeddings."""
    check_tokenizer_dir(cfg, tokenizer_dir)
    tokenizer_dir, out_dir = Path(tokenizer_dir), Path(out_dir)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            atomic_copy(tokenizer_dir / name, out_dir / name)
