"""BertConfig: the shape of a BERT encoder, its presets, and the mapping to/from HF's config.json."""
import math
from dataclasses import asdict, dataclass, fields

# (num_layers, hidden_size, num_heads) as in the BERT paper and Turc et al. 2019 ("Well-read students").
PRESETS = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


# Upper bounds on a config's sizes: far beyond any published encoder, far below what a typo or a crafted
# config.json needs to exhaust memory before the weights could say it is wrong.
SIZE_LIMITS = {"vocab_size": 1 << 21, "hidden_size": 1 << 14, "num_layers": 256, "num_heads": 256,
               "intermediate_size": 1 << 16, "max_position_embeddings": 1 << 17, "type_vocab_size": 1 << 10,
               "embedding_size": 1 << 14, "vocab_pad_multiple": 1 << 12, "local_window": 1 << 17, "global_every": 256}
# floats: (low, high, low included)
FLOAT_RANGES = {"dropout": (0.0, 1.0, True), "eps": (0.0, 1.0, False), "initializer_range": (0.0, 10.0, True),
                "theta": (1.0, 1e12, False)}


def check_fields(cfg) -> None:
    """Every size of a config dataclass a positive integer within SIZE_LIMITS, every token id inside the
    vocabulary, every dropout, epsilon and RoPE base a number in its range: ValueError naming the field, before
    any tensor is made (a string is not a size, a negative eps gives NaN, a zero base divides by zero)."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in SIZE_LIMITS and value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= SIZE_LIMITS[f.name]:
                raise ValueError(f"{f.name} must be an integer from 1 to {SIZE_LIMITS[f.name]:,}, got {value!r}")
        elif f.name.endswith("token_id"):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < cfg.vocab_size:
                raise ValueError(f"{f.name} must be a token id below vocab_size {cfg.vocab_size}, got {value!r}")
        kind = next((k for k in FLOAT_RANGES if f.name.endswith(k)), None)
        if kind and value is not None:
            low, high, closed = FLOAT_RANGES[kind]
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not number or not (low <= value < high if closed else low < value < high):
                raise ValueError(f"{f.name} must be a number in {'[' if closed else '('}{low:g}, {high:g}), got "
                                 f"{value!r}")


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    classifier_dropout: float | None = None  # None: use hidden_dropout (as HF does)
    vocab_pad_multiple: int = 8              # embedding rows rounded up to this (pretrain --pad-vocab-to); never in HF
    embedding_size: int | None = None        # None: hidden_size; else embeddings of this width projected to hidden
                                             # (ELECTRA's generator reads the discriminator's embeddings so)
    norm: str = "post"                       # post: BERT's LayerNorm after each residual add; pre: before each
                                             # sub-layer, plus a final one (MegatronBERT's; HF model_type megatron-bert)
    classifier_pooling: str = "cls"          # what a sequence classifier reads: cls, tanh(dense(h[CLS])) as BERT; mean,
                                             # the mean of the last layer over the tokens (ModernBERT's option)
    layout: str = "bert"                     # the HF layout it loads from and saves to: bert, or roberta (RoBERTa's
                                             # names, positions counted from pad_token_id + 1, one token type; KLUE's
                                             # RoBERTa is this encoder with a WordPiece vocabulary)

    def __post_init__(self):
        check_fields(self)
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        if self.norm not in ("post", "pre"):
            raise ValueError(f"norm must be 'post' or 'pre', got {self.norm!r}")
        if self.layout not in ("bert", "roberta") or (self.layout == "roberta" and self.norm != "post"):
            raise ValueError(f"layout must be 'bert', or 'roberta' with norm 'post'; got {self.layout!r} with norm "
                             f"{self.norm!r}")
        self.set_pooling(self.classifier_pooling)

    def set_dropout(self, hidden: float, attention: float | None = None) -> None:
        """Hidden and attention dropout (attention: hidden's unless given). Modules read the shared config at each
        forward, so this changes a built model's dropout too."""
        self.hidden_dropout = hidden
        self.attention_dropout = hidden if attention is None else attention

    def set_pooling(self, pooling: str) -> None:
        """What a sequence classifier reads (see classifier_pooling); like set_dropout, changes a built model too."""
        if pooling not in ("cls", "mean"):
            raise ValueError(f"classifier pooling must be 'cls' or 'mean', got {pooling!r}")
        self.classifier_pooling = pooling

    @property
    def embedding_width(self) -> int:
        return self.embedding_size or self.hidden_size

    @property
    def position_offset(self) -> int:
        """The first position's row of the position table: RoBERTa counts positions from pad_token_id + 1."""
        return self.pad_token_id + 1 if self.layout == "roberta" else 0

    @property
    def max_length(self) -> int:
        """The longest sequence the position table holds."""
        return self.max_position_embeddings - self.position_offset

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def padded_vocab_size(self) -> int:
        """The embedding rows: vocab_size rounded up to a multiple of vocab_pad_multiple (8: tensor-core friendly
        matmuls; MosaicBERT and ModernBERT use 64). The extra rows are zero, never inputs, never predicted."""
        m = self.vocab_pad_multiple
        return (self.vocab_size + m - 1) // m * m

    @classmethod
    def preset(cls, name: str, **overrides) -> "BertConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
        layers, hidden, heads = PRESETS[name]
        values = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=4 * hidden)
        values.update(overrides)
        return cls(**values)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_hf_dict(self) -> dict:
        """The fields of a transformers BertConfig (config.json), without architectures/labels."""
        if self.embedding_width != self.hidden_size:
            raise ValueError(f"embeddings of width {self.embedding_width} projected to {self.hidden_size} have no BERT "
                             "form in transformers; an ELECTRA generator is written by bertkit.models.electra.write_hf")
        pooling = {} if self.classifier_pooling == "cls" else {"classifier_pooling": self.classifier_pooling}
        return {
            "model_type": "roberta" if self.layout == "roberta" else "bert" if self.norm == "post" else "megatron-bert",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "gelu",
            "hidden_dropout_prob": self.hidden_dropout,
            "attention_probs_dropout_prob": self.attention_dropout,
            "max_position_embeddings": self.max_position_embeddings,
            "type_vocab_size": self.type_vocab_size,
            "initializer_range": self.initializer_range,
            "layer_norm_eps": self.layer_norm_eps,
            "pad_token_id": self.pad_token_id,
            "position_embedding_type": "absolute",
            "classifier_dropout": self.classifier_dropout,
            **pooling,  # transformers' BertConfig keeps it but its BertForSequenceClassification reads [CLS]
            # a RoBERTa here has a WordPiece vocabulary (KLUE's): AutoTokenizer would take RoBERTa's BPE otherwise
            **({"tokenizer_class": "BertTokenizer"} if self.layout == "roberta" else {}),
        }

    @classmethod
    def from_hf_dict(cls, d: dict, source: str = "config.json") -> "BertConfig":
        """Read an HF BERT (or pre-LN MegatronBERT) config.json dict; refuses settings this model does not implement."""
        model_type = d.get("model_type")
        archs = d.get("architectures") or []
        # configs from before HF wrote model_type (and google-research's bert_config.json) have none
        prefix = {"megatron-bert": "MegatronBert", "electra": "Electra", "roberta": "Roberta"}.get(model_type, "Bert")
        if model_type not in ("bert", "megatron-bert", "electra", "roberta", None) or not all(
                a.startswith(prefix) for a in archs):
            raise ValueError(
                f"{source}: model_type is {model_type!r} (architectures {archs}), not 'bert', 'megatron-bert', "
                "'electra' or 'roberta' (BERT's family)"
            )
        unsupported = {
            "hidden_act": (d.get("hidden_act", "gelu"), ("gelu",)),
            "position_embedding_type": (d.get("position_embedding_type", "absolute"), ("absolute",)),
            "is_decoder": (d.get("is_decoder", False), (False,)),
            "add_cross_attention": (d.get("add_cross_attention", False), (False,)),
        }
        for key, (value, allowed) in unsupported.items():
            if value not in allowed:
                raise ValueError(f"{source}: {key}={value!r} is not supported (bertkit implements {allowed[0]!r})")
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=d["num_attention_heads"],
            intermediate_size=d["intermediate_size"],
            max_position_embeddings=d.get("max_position_embeddings", 512),
            type_vocab_size=d.get("type_vocab_size", 2),
            hidden_dropout=d.get("hidden_dropout_prob", 0.1),
            attention_dropout=d.get("attention_probs_dropout_prob", 0.1),
            layer_norm_eps=d.get("layer_norm_eps", 1e-12),
            initializer_range=d.get("initializer_range", 0.02),
            pad_token_id=d.get("pad_token_id") or 0,
            classifier_dropout=d.get("classifier_dropout"),
            classifier_pooling=d.get("classifier_pooling", "cls"),
            norm="pre" if model_type == "megatron-bert" else "post",
            layout="roberta" if model_type == "roberta" else "bert",
            embedding_size=None if d.get("embedding_size") in (None, d["hidden_size"]) else d["embedding_size"],
        )

    @classmethod
    def from_dict(cls, d: dict) -> "BertConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def from_spec(cls, spec: str | None, vocab_size: int) -> "BertConfig":
        """What --model names: an HF config.json (or its folder), a bertkit model dict, or a preset (None: base)
        sized to the vocabulary."""
        import json
        from pathlib import Path

        if spec and Path(spec).exists():
            from bertkit.errors import regular_file

            # a config.json given itself is the user's; one inside a model folder is read as untrusted
            p = regular_file(Path(spec) / "config.json") if Path(spec).is_dir() else Path(spec)
            d = json.loads(p.read_text())
            return cls.from_hf_dict(d, str(p)) if "model_type" in d else cls.from_dict(d)
        return cls.preset(spec or "base", vocab_size=vocab_size)

    def shape(self) -> dict:
        """What the weights' shapes depend on (two specs naming the same shape are the same model)."""
        return {k: getattr(self, k) for k in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                                              "intermediate_size", "max_position_embeddings", "embedding_size")}
