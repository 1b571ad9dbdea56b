"""ModernBERT (Warner et al. 2024), the encoder family people start from in 2026: no position or token-type
embeddings; rotary position embeddings (θ 160,000 in global layers, 10,000 in local ones); every third layer global,
the others attending to ±window/2 tokens; pre-LN with bias-free LayerNorms and linears (the first layer's attention
norm is the identity); GeGLU MLP; a final norm; an MLM head (dense → GELU → norm → decoder tied to the embedding)
computed only where a token is masked.

Module names are transformers' own (`ModernBertForMaskedLM`), so its weights load with no renaming: a bertkit
checkpoint saves as a folder transformers loads, and a transformers folder loads here. Batches are padded
(input_ids (B, L) + attention_mask) or packed (input_ids (T,) + cu_seqlens: documents end to end, positions
restarting at each, none attending across another). Attention goes through `bertkit.kernels` (--kernels), whose
Triton path turns q and k by their rotary angles and skips what a local layer's window cannot reach; the
LayerNorms (bias-free) stay PyTorch's.
"""
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bertkit import kernels
from bertkit.errors import regular_file
from bertkit.formats import IGNORE_INDEX
from bertkit.models.bert import (
    ClassifierOutput,
    PreTrainingOutput,
    QuestionAnsweringOutput,
    mean_over_tokens,
    span_output,
)
from bertkit.models.bert_config import BertConfig, check_fields
from bertkit.models.family import Family, RunFlags, register

# layers, hidden, heads, GLU width: base is ModernBERT-base; the smaller ones keep its proportions
PRESETS = {"tiny": (4, 128, 2, 192), "mini": (6, 256, 4, 384), "small": (12, 384, 6, 576),
           "medium": (16, 512, 8, 768), "base": (22, 768, 12, 1152)}


@dataclass
class ModernBertConfig:
    vocab_size: int
    hidden_size: int = 768
    num_layers: int = 22
    num_heads: int = 12
    intermediate_size: int = 1152       # the GLU's width (Wi projects to twice this)
    max_position_embeddings: int = 8192
    local_window: int = 128             # tokens a local layer sees: ±local_window // 2 around each token
    global_every: int = 3               # layer i is global when i % global_every == 0
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    initializer_range: float = 0.02
    embedding_dropout: float = 0.0
    attention_dropout: float = 0.0
    mlp_dropout: float = 0.0
    classifier_dropout: float = 0.0
    classifier_pooling: str = "mean"    # sequence classifiers read the mean over the tokens, or [CLS] ("cls")
    vocab_pad_multiple: int = 64        # embedding rows rounded up to this (trimmed on export)
    pad_token_id: int = 0
    cls_token_id: int = 2
    sep_token_id: int = 3

    def __post_init__(self):
        check_fields(self)
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        self.set_pooling(self.classifier_pooling)

    @property
    def max_length(self) -> int:
        """The longest sequence (RoPE has no table: the length it was configured for)."""
        return self.max_position_embeddings

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def set_dropout(self, hidden: float, attention: float | None = None) -> None:
        """BertConfig.set_dropout's meaning: hidden (embeddings, MLP) and attention dropout."""
        self.embedding_dropout = self.mlp_dropout = hidden
        self.attention_dropout = hidden if attention is None else attention

    set_pooling = BertConfig.set_pooling

    @classmethod
    def from_spec(cls, spec: str | None, vocab_size: int) -> "ModernBertConfig | None":
        """What --model names when it is a ModernBERT: a preset `modernbert-NAME`, or transformers' ModernBert
        config.json (or its folder); None for anything else."""
        from pathlib import Path

        if spec and spec.startswith("modernbert-"):
            return cls.preset(spec[len("modernbert-"):], vocab_size=vocab_size)
        if spec and Path(spec).exists():
            # a config.json given itself is the user's; one inside a model folder is read as untrusted
            p = regular_file(Path(spec) / "config.json") if Path(spec).is_dir() else Path(spec)
            d = json.loads(p.read_text())
            if d.get("model_type") == "modernbert":
                return cls.from_hf_dict(d, str(p))
            if d.get("family") == "modernbert":
                return cls.from_dict(d)
        return None

    @classmethod
    def preset(cls, name: str, **overrides) -> "ModernBertConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown ModernBERT preset {name!r}; choose one of {', '.join(PRESETS)}")
        layers, hidden, heads, glu = PRESETS[name]
        return cls(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=glu, **overrides)

    @property
    def padded_vocab_size(self) -> int:
        m = self.vocab_pad_multiple
        return (self.vocab_size + m - 1) // m * m

    def is_global(self, layer: int) -> bool:
        return layer % self.global_every == 0

    def to_dict(self) -> dict:
        return {"family": "modernbert", **asdict(self)}

    def shape(self) -> dict:
        """What the weights' shapes depend on (positions: none, RoPE has no table)."""
        return {k: getattr(self, k) for k in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                                              "intermediate_size")}

    @classmethod
    def from_dict(cls, d: dict) -> "ModernBertConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_hf_dict(self) -> dict:
        """config.json for transformers' ModernBert (both the 4.x keys and 5.x's layer_types / rope_parameters)."""
        layer_types = ["full_attention" if self.is_global(i) else "sliding_attention" for i in range(self.num_layers)]
        return {"architectures": ["ModernBertForMaskedLM"], "model_type": "modernbert",
                "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
                "num_attention_heads": self.num_heads, "max_position_embeddings": self.max_position_embeddings,
                "local_attention": self.local_window, "global_attn_every_n_layers": self.global_every,
                "global_rope_theta": self.global_rope_theta, "local_rope_theta": self.local_rope_theta,
                "layer_types": layer_types,
                "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": self.global_rope_theta},
                                    "sliding_attention": {"rope_type": "default",
                                                          "rope_theta": self.local_rope_theta}},
                "hidden_activation": "gelu", "classifier_activation": "gelu", "norm_eps": self.norm_eps,
                "norm_bias": False, "attention_bias": False, "mlp_bias": False, "classifier_bias": False,
                "decoder_bias": True, "initializer_range": self.initializer_range,
                "embedding_dropout": self.embedding_dropout, "attention_dropout": self.attention_dropout,
                "mlp_dropout": self.mlp_dropout, "classifier_dropout": self.classifier_dropout,
                "classifier_pooling": self.classifier_pooling, "pad_token_id": self.pad_token_id,
                "cls_token_id": self.cls_token_id, "bos_token_id": self.cls_token_id,
                "sep_token_id": self.sep_token_id, "eos_token_id": self.sep_token_id,
                "tie_word_embeddings": True}

    @classmethod
    def from_hf_dict(cls, d: dict, source: str = "config.json") -> "ModernBertConfig":
        """Read transformers' ModernBert config.json (4.x or 5.x keys); refuses what this model does not implement."""
        for key, ours in (("hidden_activation", "gelu"), ("norm_bias", False), ("attention_bias", False),
                          ("mlp_bias", False), ("classifier_bias", False), ("classifier_activation", "gelu")):
            if d.get(key, ours) != ours:
                raise ValueError(f"{source}: {key} = {d[key]!r}; bertkit's ModernBERT implements {ours!r} only")
        layers = d["num_hidden_layers"]
        every = d.get("global_attn_every_n_layers", 3)
        if d.get("layer_types"):
            globals_ = [i for i, t in enumerate(d["layer_types"]) if t == "full_attention"]
            every = globals_[1] - globals_[0] if len(globals_) > 1 else layers
            expected = [i for i in range(layers) if i % every == 0]
            if globals_ != expected:
                raise ValueError(f"{source}: layer_types puts global layers at {globals_}; bertkit's ModernBERT "
                                 f"needs one every n layers from the first")
        rope = d.get("rope_parameters") or {}
        return cls(vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], num_layers=layers,
                   num_heads=d["num_attention_heads"], intermediate_size=d["intermediate_size"],
                   max_position_embeddings=d.get("max_position_embeddings", 8192),
                   local_window=d.get("local_attention", 128), global_every=every,
                   global_rope_theta=(rope.get("full_attention") or {}).get(
                       "rope_theta", d.get("global_rope_theta", 160_000.0)),
                   local_rope_theta=(rope.get("sliding_attention") or {}).get(
                       "rope_theta", d.get("local_rope_theta", 10_000.0)),
                   norm_eps=d.get("norm_eps", 1e-5), initializer_range=d.get("initializer_range", 0.02),
                   embedding_dropout=d.get("embedding_dropout", 0.0),
                   attention_dropout=d.get("attention_dropout", 0.0), mlp_dropout=d.get("mlp_dropout", 0.0),
                   classifier_dropout=d.get("classifier_dropout", 0.0),
                   classifier_pooling=d.get("classifier_pooling", "cls"),
                   pad_token_id=d.get("pad_token_id", 0), cls_token_id=d.get("cls_token_id", 2),
                   sep_token_id=d.get("sep_token_id", 3))


# ---------------------------------------------------------------- where the sequences are

@dataclass
class Layout:
    """Where the sequences sit: packed end to end (cu_seqlens over the T tokens) or right-padded in a (B, L) grid
    (lengths). max_seqlen bounds every length on the host, so nothing is read back from the device. Rotary
    positions and local windows restart at each sequence (bertkit.kernels does both, inside the Triton kernels)."""
    max_seqlen: int
    cu_seqlens: torch.Tensor | None = None
    lengths: torch.Tensor | None = None


def padded_layout(attention_mask: torch.Tensor) -> Layout:
    return Layout(attention_mask.shape[1], lengths=attention_mask.sum(1).to(torch.int32))


def packed_layout(cu_seqlens: torch.Tensor, max_seqlen: int | None = None) -> Layout:
    """Documents end to end; none sees another. max_seqlen None: measured (one read from the device)."""
    if max_seqlen is None:
        max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if cu_seqlens.numel() > 1 else 0
    return Layout(int(max_seqlen), cu_seqlens=cu_seqlens.to(torch.int32))


# ---------------------------------------------------------------- the encoder

class ModernBertEmbeddings(nn.Module):
    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=False)
        self.drop = nn.Dropout(cfg.embedding_dropout)

    def forward(self, input_ids):
        return self.drop(self.norm(self.tok_embeddings(input_ids)))


class ModernBertAttention(nn.Module):
    def __init__(self, cfg: ModernBertConfig, layer: int):
        super().__init__()
        self.heads, self.head_dim = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        self.is_global = cfg.is_global(layer)
        self.theta = cfg.global_rope_theta if self.is_global else cfg.local_rope_theta
        self.window = None if self.is_global else cfg.local_window // 2   # ±keys a local layer's query sees
        self.dropout = cfg.attention_dropout
        self.Wqkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=False)
        self.Wo = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self.out_drop = nn.Dropout(cfg.attention_dropout)

    def forward(self, x, layout: Layout):
        q, k, v = self.Wqkv(x).view(*x.shape[:-1], 3, self.heads, self.head_dim).unbind(-3)
        p = self.dropout if self.training else 0.0
        if layout.cu_seqlens is not None:
            out = kernels.attention_varlen(q, k, v, layout.cu_seqlens, layout.max_seqlen, p, None,
                                           window=self.window, rope_theta=self.theta)
        else:
            out = kernels.attention(q, k, v, layout.lengths, p, None, window=self.window, rope_theta=self.theta)
        return self.out_drop(self.Wo(out.reshape(*x.shape[:-1], -1)))


class ModernBertMLP(nn.Module):
    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.Wi = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.drop = nn.Dropout(cfg.mlp_dropout)
        self.Wo = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        value, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.drop(F.gelu(value) * gate))


class ModernBertLayer(nn.Module):
    def __init__(self, cfg: ModernBertConfig, layer: int):
        super().__init__()
        self.attn_norm = nn.Identity() if layer == 0 else nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=False)
        self.attn = ModernBertAttention(cfg, layer)
        self.mlp_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=False)
        self.mlp = ModernBertMLP(cfg)

    def forward(self, x, layout: Layout):
        x = x + self.attn(self.attn_norm(x), layout)
        return x + self.mlp(self.mlp_norm(x))


class ModernBertModel(nn.Module):
    """The encoder: (B, L) ids with an attention mask, or (T,) packed ids with cu_seqlens -> hidden states of the
    same layout."""
    family = "modernbert"

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = ModernBertEmbeddings(cfg)
        self.layers = nn.ModuleList(ModernBertLayer(cfg, i) for i in range(cfg.num_layers))
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=False)

    def forward(self, input_ids, attention_mask=None, cu_seqlens=None, max_seqlen=None):
        if cu_seqlens is not None:
            layout = packed_layout(cu_seqlens, max_seqlen)
        else:
            layout = padded_layout(attention_mask if attention_mask is not None else torch.ones_like(input_ids))
        x = self.embeddings(input_ids)
        for layer in self.layers:
            x = layer(x, layout)
        return self.final_norm(x)


class ModernBertPredictionHead(nn.Module):
    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=False)

    def forward(self, x):
        return self.norm(F.gelu(self.dense(x)))


def init_weights(module: nn.Module, cfg: ModernBertConfig) -> None:
    """Truncated normal (±2 σ) weights as ModernBERT initialises them, σ = initializer_range; zero biases; unit
    norms. (ModernBERT scales σ per layer kind; the transformers port and this use one σ: fine-tuning and continued
    pretraining start from loaded weights anyway.)"""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(m.weight, std=cfg.initializer_range, a=-2 * cfg.initializer_range,
                                  b=2 * cfg.initializer_range)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)


class ModernBertForMaskedLM(nn.Module):
    """MLM only (ModernBERT has no sentence task). The head and decoder run only where a prediction is asked for
    (ModernBERT's sparse prediction): at mlm_positions (bertkit's pretraining batches, as BertForPreTraining takes
    them), or where per-token `labels` (transformers' layout) are not -100; else at every token."""
    family = "modernbert"

    def __init__(self, cfg: ModernBertConfig):
        super().__init__()
        self.cfg = cfg
        self.model = ModernBertModel(cfg)
        self.head = ModernBertPredictionHead(cfg)
        self.decoder = nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=True)
        init_weights(self, cfg)
        with torch.no_grad():  # rows past the vocabulary are padding: zero, never an input, never predicted
            self.model.embeddings.tok_embeddings.weight[cfg.vocab_size:] = 0
        self.decoder.weight = self.model.embeddings.tok_embeddings.weight

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, mlm_positions=None, mlm_labels=None,
                next_sentence_label=None, position_ids=None, cu_seqlens=None, max_seqlen=None,
                labels=None, doc_cu_seqlens=None) -> PreTrainingOutput:
        """doc_cu_seqlens (packed input): the documents inside the rows, each attending only to itself."""
        if next_sentence_label is not None:
            raise ValueError("ModernBERT is MLM-only: no next-sentence label (make-instances --objective none)")
        h = self.model(input_ids, attention_mask, doc_cu_seqlens if doc_cu_seqlens is not None else cu_seqlens,
                       max_seqlen)  # a row's bound also bounds the documents inside it
        if mlm_positions is not None and cu_seqlens is not None:
            h = h.index_select(0, mlm_positions.long())
        elif mlm_positions is not None:
            h = torch.gather(h, 1, mlm_positions.long().unsqueeze(-1).expand(-1, -1, h.shape[-1]))
        elif labels is not None:
            picked = labels != IGNORE_INDEX
            h, mlm_labels = h[picked], labels[picked]
        logits = self.decoder(self.head(h))[..., :self.cfg.vocab_size]  # padding rows are never predicted
        loss = None
        if mlm_labels is not None:
            loss = F.cross_entropy(logits.float().flatten(0, -2), mlm_labels.flatten().long(),
                                   ignore_index=IGNORE_INDEX)
        return PreTrainingOutput(loss, loss, None, logits, None)


class _WithHead(nn.Module):
    """The encoder, ModernBERT's prediction head (dense, GELU, norm), dropout and a linear classifier."""
    family = "modernbert"

    def __init__(self, cfg: ModernBertConfig, num_labels: int):
        super().__init__()
        self.cfg, self.num_labels = cfg, num_labels
        self.model = ModernBertModel(cfg)
        self.head = ModernBertPredictionHead(cfg)
        self.drop = nn.Dropout(cfg.classifier_dropout)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        init_weights(self, cfg)

    def classify(self, h):
        return self.classifier(self.drop(self.head(h)))


class ModernBertForSequenceClassification(_WithHead):
    """Reads [CLS] or the mean over the tokens (cfg.classifier_pooling); num_labels == 1 is regression (MSE)."""

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None, cu_seqlens=None,
                max_seqlen=None) -> ClassifierOutput:
        h = self.model(input_ids, attention_mask, cu_seqlens, max_seqlen)
        if self.cfg.classifier_pooling == "mean":
            pooled = mean_over_tokens(h, attention_mask, cu_seqlens)
        else:
            pooled = h[cu_seqlens[:-1].long()] if cu_seqlens is not None else h[:, 0]
        logits = self.classify(pooled)
        loss = None
        if labels is not None:
            loss = F.mse_loss(logits.squeeze(-1).float(), labels.float()) if self.num_labels == 1 else \
                F.cross_entropy(logits.float(), labels.long())
        return ClassifierOutput(loss, logits)


class ModernBertForTokenClassification(_WithHead):
    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None, cu_seqlens=None,
                max_seqlen=None) -> ClassifierOutput:
        logits = self.classify(self.model(input_ids, attention_mask, cu_seqlens, max_seqlen))
        loss = None if labels is None else F.cross_entropy(logits.float().flatten(0, -2), labels.flatten().long(),
                                                          ignore_index=IGNORE_INDEX)
        return ClassifierOutput(loss, logits)


class ModernBertForQuestionAnswering(_WithHead):
    """Start/end logits per token (padded positions masked); loss = mean of the two cross-entropies."""

    def __init__(self, cfg: ModernBertConfig, num_labels: int = 2):
        super().__init__(cfg, 2)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, start_positions=None,
                end_positions=None, cu_seqlens=None, max_seqlen=None) -> QuestionAnsweringOutput:
        start, end = self.classify(self.model(input_ids, attention_mask, cu_seqlens, max_seqlen)).unbind(-1)
        return span_output(start, end, attention_mask, cu_seqlens, max_seqlen, start_positions, end_positions)


HEADS = {None: ModernBertModel, "pretraining": ModernBertForMaskedLM, "masked_lm": ModernBertForMaskedLM,
         "sequence_classification": ModernBertForSequenceClassification,
         "token_classification": ModernBertForTokenClassification, "question_answering": ModernBertForQuestionAnswering}
ARCHITECTURES = {ModernBertModel: "ModernBertModel", ModernBertForMaskedLM: "ModernBertForMaskedLM",
                 ModernBertForSequenceClassification: "ModernBertForSequenceClassification",
                 ModernBertForTokenClassification: "ModernBertForTokenClassification",
                 ModernBertForQuestionAnswering: "ModernBertForQuestionAnswering"}


# ---------------------------------------------------------------- transformers' format

VOCAB_ROWS = ("model.embeddings.tok_embeddings.weight", "decoder.bias", "decoder.weight")


def hf_state_dict(model: nn.Module) -> dict:
    """transformers' tensors for the same class: the same names (a bare encoder's without `model.`), the
    vocabulary padding trimmed, the tied decoder weight left to the embedding (transformers ties it on load)."""
    n = model.cfg.vocab_size
    bare = isinstance(model, ModernBertModel)
    out = {}
    for name, t in model.state_dict().items():
        name = f"model.{name}" if bare else name
        if name == "decoder.weight":
            continue
        out[name[len("model."):] if bare else name] = (t[:n] if name in VOCAB_ROWS else t).contiguous()
    return out


def check_shapes(model: nn.Module, tensors: dict, source) -> None:
    """transformers' tensors against a model's shapes (a meta-device skeleton's: nothing allocated yet): a tensor of
    another shape, or layers config.json has no place for, are refused naming config.json."""
    from bertkit.models.bert_hf import refuse_unplaced_layers

    expected = model.state_dict()
    for name, t in _hf_state(model, tensors, pad=False).items():
        want = expected.get(name)
        if want is None:
            continue
        vocab = name.endswith(("tok_embeddings.weight", "decoder.bias"))  # rows: the vocabulary, padded either way
        fits = tuple(t.shape[1:]) == tuple(want.shape[1:]) and t.shape[0] >= model.cfg.vocab_size if vocab else \
            tuple(t.shape) == tuple(want.shape)
        if not fits:
            raise ValueError(f"{source}: tensor {name} has shape {tuple(t.shape)}, but config.json gives "
                             f"{tuple(want.shape)}; the two do not belong together")
    refuse_unplaced_layers(source, model.cfg.num_layers, tensors, r"layers\.(\d+)\.")


def _hf_state(model: nn.Module, tensors: dict, pad: bool = True) -> dict:
    """transformers' tensors under `model`'s names, the vocabulary rows padded to the model's (pad)."""
    cfg, state = model.cfg, {}
    if not any(k.startswith("model.") for k in tensors):
        tensors = {f"model.{k}": v for k, v in tensors.items()}
    for name, t in tensors.items():
        if name in VOCAB_ROWS and pad:  # whatever padding the source had, this model's own
            t = t[:cfg.vocab_size]
            t = torch.cat([t, t.new_zeros((cfg.padded_vocab_size - t.shape[0], *t.shape[1:]))])
        state[name] = t
    state.pop("decoder.weight", None)  # tied to the embedding
    if isinstance(model, ModernBertModel):
        state = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
    return state


def load_hf_state_dict(model: nn.Module, tensors: dict, source) -> tuple[list, list]:
    """Load transformers' tensors (any ModernBert class: `model.`-prefixed or a bare encoder's) into `model`,
    padding the vocabulary. Every encoder tensor must be there; returns (head tensors missing, tensors unused)."""
    state = _hf_state(model, tensors)
    missing, unused = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "decoder.weight"]
    encoder = [k for k in missing if k.startswith("model.") or isinstance(model, ModernBertModel)]
    if encoder:
        raise ValueError(f"{source}: lacks the encoder tensors {encoder[:3]}; not a ModernBERT of this config.json")
    return missing, list(unused)


def save_hf(model: nn.Module, out_dir, tokenizer_dir=None, extra_config: dict | None = None) -> Path:
    """A folder transformers' matching ModernBert class (and AutoModel*) loads: config.json (window, layer pattern,
    both RoPE bases, the tokenizer's special ids, labels), model.safetensors and the tokenizer files."""
    from safetensors.torch import save

    from bertkit.fileio import atomic_copy, atomic_write_bytes, atomic_write_json
    from bertkit.formats import TOKENIZER_FILES
    from bertkit.tokenization import read_vocab

    model = getattr(model, "module", model)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = model.cfg.to_hf_dict()
    config["architectures"] = [ARCHITECTURES[type(model)]]
    if getattr(model, "num_labels", None) is not None:
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(model.num_labels)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(model.num_labels)}
    if tokenizer_dir is not None and (Path(tokenizer_dir) / "vocab.txt").is_file():
        vocab = read_vocab(Path(tokenizer_dir) / "vocab.txt")
        if len(vocab) != model.cfg.vocab_size:
            raise ValueError(f"{tokenizer_dir}/vocab.txt has {len(vocab)} tokens, the model {model.cfg.vocab_size}")
        ids = {t: i for i, t in enumerate(vocab)}
        config.update(pad_token_id=ids["[PAD]"], cls_token_id=ids["[CLS]"], bos_token_id=ids["[CLS]"],
                      sep_token_id=ids["[SEP]"], eos_token_id=ids["[SEP]"])
    config.update(extra_config or {})
    atomic_write_bytes(out_dir / "model.safetensors", save(hf_state_dict(model), metadata={"format": "pt"}))
    atomic_write_json(out_dir / "config.json", config)
    for name in TOKENIZER_FILES if tokenizer_dir is not None else ():
        if (Path(tokenizer_dir) / name).is_file():
            atomic_copy(Path(tokenizer_dir) / name, out_dir / name)
    if (out_dir / "vocab.txt").is_file() and not (out_dir / "tokenizer.json").is_file():
        write_fast_tokenizer(out_dir)
    return out_dir


def write_fast_tokenizer(out_dir: Path) -> None:
    """tokenizer.json and tokenizer_config.json beside a vocab.txt alone: transformers has no ModernBERT tokenizer
    that reads a vocab.txt, so without them AutoTokenizer (and sentence-transformers) cannot load the folder."""
    from bertkit.fileio import atomic_write_bytes, atomic_write_json
    from bertkit.tokenization import tokenizer_from_vocab

    atomic_write_bytes(out_dir / "tokenizer.json", tokenizer_from_vocab(out_dir / "vocab.txt").to_str().encode())
    if not (out_dir / "tokenizer_config.json").is_file():
        atomic_write_json(out_dir / "tokenizer_config.json", {
            "tokenizer_class": "PreTrainedTokenizerFast", "model_input_names": ["input_ids", "attention_mask"],
            "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
            "mask_token": "[MASK]"})


def load_hf(path: Path, hf_config: dict, tensors: dict, head="auto", num_labels=None,
            require_head: bool = False) -> nn.Module:
    """bertkit.models.load_pretrained for a ModernBERT folder (transformers' or a bertkit export)."""
    import logging

    cfg = ModernBertConfig.from_hf_dict(hf_config, str(path / "config.json"))
    saved = {v: k for k, v in ARCHITECTURES.items()}.get((hf_config.get("architectures") or [""])[0])
    if head == "auto":
        head = next((h for h, cls in HEADS.items() if cls is saved), "pretraining")
    if head in ("sequence_classification", "token_classification") and num_labels is None:
        if "classifier.weight" in tensors:
            num_labels = tensors["classifier.weight"].shape[0]
        elif hf_config.get("id2label") and HEADS[head] is saved:
            num_labels = len(hf_config["id2label"])
        else:
            raise ValueError(f"{path} has no classifier; pass num_labels to build a {head} head")
    cls = HEADS[head]
    with torch.device("meta"):  # the shapes checked against the weights before any memory is taken
        skeleton = cls(cfg) if cls in (ModernBertModel, ModernBertForMaskedLM) else cls(cfg, num_labels or 2)
    check_shapes(skeleton, tensors, path / "config.json")
    model = cls(cfg) if cls in (ModernBertModel, ModernBertForMaskedLM) else cls(cfg, num_labels or 2)
    missing, unused = load_hf_state_dict(model, tensors, path)
    if missing and require_head:
        raise ValueError(f"{path}: has no trained {head} head (missing {missing[:3]})")
    if missing:
        logging.getLogger("bertkit.models").warning("%s: initialised the %s head (not in the checkpoint): %s", path,
                                                    head, ", ".join(missing))
    model.loading_info = {"head": head, "missing": missing, "unused": unused}
    model.hf_config = hf_config
    return model.eval()


# ---------------------------------------------------------------- the family spec

def apply_flags(cfg: ModernBertConfig, flags: RunFlags, recorded: dict, fixed_by: str | None, resumed: bool):
    """--dropout, --pad-vocab-to, --rope-theta and --rope-theta-local onto the config; --norm post and, with
    --kernels triton, heads whose width is not a power of two refused. An export writes the dropout the run trained
    with."""
    if flags.norm == "post":
        raise ValueError("--norm post: ModernBERT is pre-LN by design; drop --norm")
    if flags.kernels == "triton" and cfg.head_dim & (cfg.head_dim - 1):
        raise ValueError(f"--kernels triton: the Triton kernels turn RoPE in halves of a power-of-two head size; this "
                         f"model's heads are {cfg.head_dim} wide: use --kernels auto or torch")
    if flags.dropout is not None:
        cfg.set_dropout(flags.dropout)
    if flags.pad_vocab_to is not None:
        cfg.vocab_pad_multiple = flags.pad_vocab_to
    if flags.rope_theta is not None:  # a second, longer phase raises the global layers' base (ModernBERT: 160,000)
        cfg.global_rope_theta = flags.rope_theta
    if flags.rope_theta_local is not None:
        cfg.local_rope_theta = flags.rope_theta_local
    return None


def fit_length(cfg: ModernBertConfig, tokens: int) -> bool:
    cfg.max_position_embeddings = max(cfg.max_position_embeddings, tokens)  # RoPE has no table to outgrow
    return True


def load_folder(path: Path, hf_config: dict, head, num_labels, require_head) -> nn.Module:
    from bertkit.models.bert_hf import ModelFolderError, read_weights

    try:
        return load_hf(path, hf_config, read_weights(path), head, num_labels, require_head)
    except (ValueError, KeyError, TypeError) as e:
        raise ModelFolderError(str(e) if str(path) in str(e) else f"{path}: {e}") from None


def kernel_shapes(model) -> list[dict]:
    """Attention only (its bias-free norms are PyTorch's), in its global and its local layers."""
    c = model.cfg
    return [{"head_dim": c.head_dim, "hidden": c.hidden_size, "dropout": c.attention_dropout, "prenorm": True,
             "rope_theta": theta, "window": window, "layer_norm": False}
            for theta, window in ((c.global_rope_theta, None), (c.local_rope_theta, c.local_window // 2))]


def _load_weights(model, state: dict, source) -> None:
    load_hf_state_dict(model, state, source)


MODERNBERT = register(Family(
    name="modernbert", title="ModernBERT", model_types=("modernbert",),
    presets=tuple(f"modernbert-{p}" for p in PRESETS), config_from_spec=ModernBertConfig.from_spec,
    config_from_dict=ModernBertConfig.from_dict, build=lambda cfg, objective, generator: ModernBertForMaskedLM(cfg),
    objectives=("none",), load_weights=_load_weights, apply_flags=apply_flags, fit_length=fit_length,
    load_hf=load_folder, save_hf=lambda model, out, tok=None, extra=None, *_: save_hf(model, out, tok, extra),
    kernel_shapes=kernel_shapes, splits_documents=True,
    token_states=lambda encoder, ids, types, cu_seqlens, max_seqlen: encoder(ids, None, cu_seqlens, max_seqlen),
))
