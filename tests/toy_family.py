"""A toy encoder family, registered from here alone: PyTorch's own transformer layers, learned positions, a masked-LM
head and a sequence classifier, saved as its own folder format (config.json model_type "bertkit-toy"). Importing
this module registers it; tests/test_toy_family.py runs it through pretrain, export, load and a fine-tune, proving
that a family is one module (no edit in bertkit/)."""
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.formats import IGNORE_INDEX, TOKENIZER_FILES
from bertkit.models import Family, RunFlags, register
from bertkit.models.bert import ClassifierOutput, PreTrainingOutput


@dataclass
class ToyConfig:
    vocab_size: int
    hidden_size: int = 32
    num_layers: int = 1
    num_heads: int = 2
    max_position_embeddings: int = 64
    dropout: float = 0.1
    classifier_pooling: str = "cls"
    vocab_pad_multiple: int = 1   # --pad-vocab-to is taken and ignored: the toy never pads its embedding

    @property
    def max_length(self) -> int:
        return self.max_position_embeddings

    def set_dropout(self, hidden: float, attention: float | None = None) -> None:
        self.dropout = hidden

    def set_pooling(self, pooling: str) -> None:
        self.classifier_pooling = pooling

    def shape(self) -> dict:
        return {k: getattr(self, k) for k in ("vocab_size", "hidden_size", "num_layers", "num_heads")}

    def to_dict(self) -> dict:
        return {"family": "toy", **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "ToyConfig":
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    @classmethod
    def from_spec(cls, spec: str | None, vocab_size: int) -> "ToyConfig | None":
        return cls(vocab_size=vocab_size) if spec == "toy-tiny" else None


class ToyEncoder(nn.Module):
    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.positions = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        layer = nn.TransformerEncoderLayer(cfg.hidden_size, cfg.num_heads, 2 * cfg.hidden_size, cfg.dropout,
                                           batch_first=True, norm_first=True)
        self.layers = nn.TransformerEncoder(layer, cfg.num_layers, enable_nested_tensor=False)

    def forward(self, input_ids, attention_mask=None, cu_seqlens=None):
        """(B, L, H) for padded rows; packed rows (input_ids (T,), cu_seqlens) are padded here and returned (T, H)."""
        packed, total = cu_seqlens is not None, len(input_ids)
        if packed:  # (a packed batch may end in a tail that belongs to no row)
            lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
            rows = torch.split(input_ids[:sum(lengths)], lengths)
            input_ids = nn.utils.rnn.pad_sequence(list(rows), batch_first=True)
            attention_mask = nn.utils.rnn.pad_sequence([torch.ones_like(r) for r in rows], batch_first=True)
        if attention_mask is None:
            attention_mask = (input_ids != 0).long()
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.layers(self.tokens(input_ids) + self.positions(positions), src_key_padding_mask=attention_mask == 0)
        if not packed:
            return h
        h = h[attention_mask.bool()]
        return torch.cat([h, h.new_zeros(total - len(h), h.shape[-1])])


class ToyForMaskedLM(nn.Module):
    family = "toy"

    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.cfg, self.encoder = cfg, ToyEncoder(cfg)
        self.decoder = nn.Linear(cfg.hidden_size, cfg.vocab_size)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, mlm_positions=None, mlm_labels=None,
                next_sentence_label=None, cu_seqlens=None, max_seqlen=None, **_):
        h = self.encoder(input_ids, attention_mask, cu_seqlens)
        if mlm_positions is not None and cu_seqlens is None:
            h = torch.gather(h, 1, mlm_positions.long().unsqueeze(-1).expand(-1, -1, h.shape[-1]))
        elif mlm_positions is not None:
            h = h.index_select(0, mlm_positions.long())
        logits = self.decoder(h)
        loss = None if mlm_labels is None else F.cross_entropy(logits.flatten(0, -2).float(),
                                                               mlm_labels.flatten().long(), ignore_index=IGNORE_INDEX)
        return PreTrainingOutput(loss, loss, None, logits, None)


class ToyForSequenceClassification(nn.Module):
    family = "toy"

    def __init__(self, cfg: ToyConfig, num_labels: int = 2):
        super().__init__()
        self.cfg, self.num_labels, self.encoder = cfg, num_labels, ToyEncoder(cfg)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None, cu_seqlens=None,
                max_seqlen=None):
        if cu_seqlens is not None:
            starts = cu_seqlens[:-1].long()
            h = self.encoder(input_ids, None, cu_seqlens)
            pooled = h[starts] if self.cfg.classifier_pooling == "cls" else torch.stack(
                [h[a:b].mean(0) for a, b in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())])
        else:
            mask = (input_ids != 0) if attention_mask is None else attention_mask.bool()
            h = self.encoder(input_ids, mask.long())
            pooled = h[:, 0] if self.cfg.classifier_pooling == "cls" else \
                (h * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        logits = self.classifier(pooled)
        loss = None if labels is None else F.cross_entropy(logits.float(), labels.long())
        return ClassifierOutput(loss, logits)


HEADS = {"pretraining": ToyForMaskedLM, "masked_lm": ToyForMaskedLM,
         "sequence_classification": ToyForSequenceClassification}


def build(cfg: ToyConfig, objective: str, generator) -> nn.Module:
    return ToyForMaskedLM(cfg)


def load_weights(model, state: dict, source) -> None:
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"not a toy model's weights (missing {missing[:3]}, unexpected {unexpected[:3]})")


def apply_flags(cfg: ToyConfig, flags: RunFlags, recorded: dict, fixed_by, resumed: bool):
    if flags.norm == "post":
        raise ValueError("--norm post: the toy is pre-LN; drop --norm")
    if flags.dropout is not None:
        cfg.set_dropout(flags.dropout)
    return None


def save_hf(model, out_dir, tokenizer_dir=None, extra_config=None, *_) -> Path:
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out_dir / "model.safetensors")
    config = {"model_type": "bertkit-toy", "architectures": [type(model).__name__], **model.cfg.to_dict(),
              **({"num_labels": model.num_labels} if hasattr(model, "num_labels") else {}), **(extra_config or {})}
    (out_dir / "config.json").write_text(json.dumps(config))
    for name in TOKENIZER_FILES if tokenizer_dir is not None else ():
        if (Path(tokenizer_dir) / name).is_file():
            (out_dir / name).write_bytes((Path(tokenizer_dir) / name).read_bytes())
    return out_dir


def load_hf(path: Path, config: dict, head, num_labels, require_head) -> nn.Module:
    from bertkit.models.bert_hf import read_weights

    saved = next((h for h, cls in HEADS.items() if cls.__name__ == config["architectures"][0]), "pretraining")
    head = saved if head == "auto" else head
    cfg = ToyConfig.from_dict(config)
    model = HEADS[head](cfg) if HEADS[head] is ToyForMaskedLM else \
        HEADS[head](cfg, num_labels or config.get("num_labels", 2))
    missing, unused = model.load_state_dict(read_weights(path), strict=False)
    if any(k.startswith("encoder.") for k in missing) or (missing and require_head):
        raise ValueError(f"{path}: lacks {missing[:3]}")
    model.loading_info = {"head": head, "missing": missing, "unused": unused}
    return model.eval()


TOY = register(Family(
    name="toy", title="Toy", model_types=("bertkit-toy",), presets=("toy-tiny",),
    config_from_spec=ToyConfig.from_spec, config_from_dict=ToyConfig.from_dict, build=build, objectives=("none",),
    load_weights=load_weights, apply_flags=apply_flags, fit_length=lambda cfg, tokens: tokens <= cfg.max_length,
    load_hf=load_hf, save_hf=save_hf, kernel_shapes=lambda model: [],
))
