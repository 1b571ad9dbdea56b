"""A sentence encoder: any family's bare encoder, its tokenizer and a pooling, on packed (unpadded) batches; saved
as a folder that transformers and sentence-transformers load and whose embeddings are these."""
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertkit.errors import DataError, regular_file
from bertkit.fileio import atomic_write_json
from bertkit.finetune.train import pack_features
from bertkit.models import family_of, load_pretrained, save_pretrained
from bertkit.models.bert import mean_over_tokens
from bertkit.models.sentence_embeddings import write_sentence_transformers_files

POOLINGS = ("mean", "cls", "last")
ST_POOLING = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token", "last": "pooling_mode_lasttoken"}


@dataclass
class EncoderConfig:
    pooling: str = "mean"        # mean | cls | last: what a sentence's vector is made of
    max_seq_length: int = 128    # longer texts are cut to this many tokens ([CLS] and [SEP] included)
    normalize: bool = False      # unit-length vectors out of encode (the folder then ends with a Normalize module)


def pool(states: torch.Tensor, cu_seqlens: torch.Tensor, how: str) -> torch.Tensor:
    """(B, H) from packed states (T, H): each sequence's mean, first ([CLS]) or last ([SEP]) token's vector."""
    if how == "cls":
        return states[cu_seqlens[:-1].long()]
    if how == "last":
        return states[cu_seqlens[1:].long() - 1]
    return mean_over_tokens(states, None, cu_seqlens)


# a text is cut to this many characters a token of max_seq_length before it is tokenized, so that memory follows the
# flag, not the input (one 20 MB line cost 3.7 GB whole): WordPiece reads a word of over 100 characters as one [UNK],
# so the first max_seq_length tokens are the same unless they average more than this
CHARS_PER_TOKEN = 100


class SentenceEncoder(nn.Module):
    def __init__(self, encoder: nn.Module, tokenizer, cfg: EncoderConfig, source: str = "", dense=()):
        super().__init__()
        if cfg.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {cfg.pooling!r}")
        self.family = family_of(encoder)
        if self.family.token_states is None:
            raise ValueError(f"{source}: {self.family.title} models cannot be trained as sentence encoders yet")
        positions = getattr(encoder.cfg, "max_length", None)
        if cfg.max_seq_length < 3:   # [CLS], a token, [SEP]
            raise DataError(f"a max sequence length of {cfg.max_seq_length} tokens leaves no room for a word")
        if positions and cfg.max_seq_length > positions:   # said now, not at the first long text hours later
            raise DataError(f"{source}: a max sequence length of {cfg.max_seq_length} tokens, for a model of "
                            f"{positions} positions; give --max-seq-length of at most {positions}")
        if dense and dense[0].linear.in_features != encoder.cfg.hidden_size:
            raise DataError(f"{source}: its first Dense module takes {dense[0].linear.in_features} features, the "
                            f"model gives {encoder.cfg.hidden_size}")
        self.encoder, self.tokenizer, self.cfg, self.source = encoder, tokenizer, cfg, source
        self.dense = nn.ModuleList(dense)   # sentence-transformers' Dense modules after the pooling (LaBSE's)

    @classmethod
    def from_folder(cls, path, cfg: EncoderConfig | None = None, max_seq_length: int | None = None,
                    training: bool = False) -> "SentenceEncoder":
        """A model folder (a bertkit export, transformers' BERT / RoBERTa / ModernBERT, or a sentence-transformers
        folder: then its pooling, length, Dense and Normalize modules unless `cfg` is given), cut at
        `max_seq_length` tokens when given. training: a folder with Dense modules is refused (finetune embed trains
        the encoder and its pooling; it would drop them)."""
        import dataclasses

        from bertkit.tokenization import load_tokenizer

        path = Path(path)
        recorded, dense = read_folder(path)
        if training and dense:
            raise DataError(f"{path}: has {len(dense)} Dense module(s) after its pooling, which finetune embed does "
                            "not train and would drop; train the folder with sentence-transformers, or give a model "
                            "without them")
        encoder = load_pretrained(path, head=None)
        if cfg is None:   # a folder's recorded length beyond its positions (a tokenizer's 8192 on a 512 BERT): cut
            cfg = recorded
            cfg.max_seq_length = min(cfg.max_seq_length, getattr(encoder.cfg, "max_length", cfg.max_seq_length))
        if max_seq_length:
            cfg = dataclasses.replace(cfg, max_seq_length=max_seq_length)
        return cls(encoder, load_tokenizer(path), cfg, str(path), dense)

    def features(self, texts: list[str]) -> list[dict]:
        limit = self.cfg.max_seq_length * CHARS_PER_TOKEN
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=self.cfg.max_seq_length)
        try:
            encodings = self.tokenizer.encode_batch([t[:limit] for t in texts], add_special_tokens=True)
        finally:
            self.tokenizer.no_truncation()
        return [{"input_ids": e.ids, "token_type_ids": [0] * len(e.ids)} for e in encodings]

    def forward(self, rows: list[dict] | dict) -> torch.Tensor:
        """(B, H) sentence vectors of tokenized rows, or of rows already packed (pack_features: a batch embedded
        twice, as gradient caching does, is packed once); not normalised (the loss normalises)."""
        device = next(self.encoder.parameters()).device
        batch = rows if isinstance(rows, dict) else pack_features(rows)
        cu_seqlens = batch["cu_seqlens"].to(device)
        states = self.family.token_states(self.encoder, batch["input_ids"].to(device),
                                          batch["token_type_ids"].to(device), cu_seqlens, batch["max_seqlen"])
        vectors = pool(states, cu_seqlens, self.cfg.pooling)
        for layer in self.dense:
            vectors = layer(vectors)
        return vectors

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 64, normalize: bool | None = None,
               progress=None) -> np.ndarray:
        """(N, H) float32 vectors of `texts`, in their order; batches are made of similar lengths (less padding
        to round up, fewer wasted tokens), and the model is put in eval mode for the call. A vector that is not
        finite (a diverged or damaged model) is refused: no score or file is made of it."""
        was_training = self.training
        self.eval()
        rows = self.features(texts)
        order = np.argsort([-len(r["input_ids"]) for r in rows], kind="stable")
        out = np.zeros((len(rows), self.dimension), dtype=np.float32)
        for i in range(0, len(rows), batch_size):
            take = order[i:i + batch_size]
            vectors = self([rows[j] for j in take]).float()
            if self.cfg.normalize if normalize is None else normalize:
                vectors = F.normalize(vectors, dim=-1)
            out[take] = vectors.cpu().numpy()
            if progress is not None:
                progress(len(take))
        self.train(was_training)
        bad = np.flatnonzero(~np.isfinite(out).all(axis=1))
        if len(bad):
            raise DataError(f"{self.source or 'the model'}: gives a vector that is not finite (NaN or infinity) for "
                            f"{len(bad)} of {len(out)} texts, the first text {bad[0] + 1}: its weights diverged or "
                            "are damaged (`bertkit verify` checks a folder); nothing was scored or written")
        return out

    @property
    def dimension(self) -> int:
        """The length of a sentence's vector: the last Dense module's, else the model's width."""
        return self.dense[-1].out_features if len(self.dense) else self.hidden_size

    @property
    def hidden_size(self) -> int:
        return self.encoder.cfg.hidden_size

    def save(self, out_dir, tokenizer_dir, extra_config: dict | None = None) -> Path:
        """A model folder (transformers' format) that is also a sentence-transformers model with this pooling."""
        out = save_pretrained(self.encoder, out_dir, tokenizer_dir=tokenizer_dir, extra_config=extra_config)
        write_sentence_transformers_files(out, self.hidden_size, self.cfg.max_seq_length, ST_POOLING[self.cfg.pooling],
                                          self.cfg.normalize)
        atomic_write_json(out / "bertkit_embedding.json", {"pooling": self.cfg.pooling,
                                                           "max_seq_length": self.cfg.max_seq_length,
                                                           "normalize": self.cfg.normalize})
        return out


def saved_config(path: Path) -> EncoderConfig:
    """The pooling, length and normalisation a folder records, read as sentence-transformers reads it (modules.json,
    each module's own config); a folder with none of its files: bertkit_embedding.json, else mean over 128 tokens.
    Where bertkit's file and sentence-transformers' disagree the folder is refused: its scores would not be those of
    the model sentence-transformers loads."""
    return read_folder(path)[0]


def read_folder(path: Path) -> tuple[EncoderConfig, list]:
    """(EncoderConfig, Dense layers after the pooling) of a model folder, every file checked before it is used."""
    path = Path(path)
    modules = _modules(path)
    ours = _bertkit_record(path)
    if not modules:
        return ours or EncoderConfig(), []
    cfg, dense = EncoderConfig(), []
    for i, m in enumerate(modules):
        kind, where = m["type"].rsplit(".", 1)[-1], path / m["path"] if m["path"] else path
        if i == 0 and kind == "Transformer":
            cfg.max_seq_length = _recorded_length(path) or cfg.max_seq_length
        elif i == 1 and kind == "Pooling":
            cfg.pooling = _pooling(where / "config.json")
        elif i >= 2 and kind == "Dense":
            dense.append(_dense(where, dense[-1].out_features if dense else None))
        elif i >= 2 and kind == "Normalize":
            cfg.normalize = True
        else:
            raise DataError(f"{path / 'modules.json'}: module {i} is {m['type']!r}; bertkit reads a Transformer, "
                            "then a Pooling, then Dense and Normalize modules. sentence-transformers' own library "
                            "reads this folder")
    if cfg.normalize and kind != "Normalize":
        raise DataError(f"{path / 'modules.json'}: a Normalize module before the last; bertkit normalises last")
    if ours is not None and ours != cfg:
        raise DataError(f"{path / 'bertkit_embedding.json'} says {ours}, but sentence-transformers' files (which "
                        f"SentenceTransformer follows) say {cfg}: one was edited. Make them agree, or remove "
                        "bertkit_embedding.json to read the folder as sentence-transformers does")
    return cfg, dense


def _json(path: Path, shape: type, what: str):
    """A folder's JSON file (None when absent), a regular file holding a `shape`, else one DataError naming it."""
    if not path.exists() and not path.is_symlink():
        return None
    regular_file(path)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not valid JSON ({e}); {what}") from None
    if not isinstance(value, shape):
        raise DataError(f"{path}: a JSON {type(value).__name__}, not {shape.__name__}; {what}")
    return value


def _bertkit_record(path: Path) -> EncoderConfig | None:
    mine = path / "bertkit_embedding.json"
    recorded = _json(mine, dict, "bertkit writes {pooling, max_seq_length, normalize}; remove it to read the "
                                 "folder by sentence-transformers' files")
    if recorded is None:
        return None
    recorded = {**asdict(EncoderConfig()), **recorded}
    if set(recorded) != {"pooling", "max_seq_length", "normalize"} or recorded["pooling"] not in POOLINGS or \
            not _length(recorded["max_seq_length"]) or not isinstance(recorded["normalize"], bool):
        raise DataError(f"{mine}: {recorded}: not the pooling record bertkit writes (pooling mean, cls or last, "
                        "max_seq_length a whole number, normalize true or false); remove it to read the folder by "
                        "sentence-transformers' files, or mean pooling over 128 tokens")
    return EncoderConfig(**recorded)


def _length(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 3 <= value <= 1 << 20


def _modules(path: Path) -> list:
    modules = _json(path / "modules.json", list, "sentence-transformers writes a list of modules")
    for m in modules or ():
        if not isinstance(m, dict) or not isinstance(m.get("type"), str) or not isinstance(m.get("path", ""), str) \
                or ".." in Path(m.get("path", "")).parts or Path(m.get("path", "")).is_absolute():
            raise DataError(f"{path / 'modules.json'}: module {m!r} is not {{type, path}} with a path inside the "
                            "folder, as sentence-transformers writes")
        m.setdefault("path", "")
    return modules or []


def _recorded_length(path: Path) -> int | None:
    """max_seq_length from sentence_bert_config.json, else the tokenizer's model_max_length (sentence-transformers 6
    keeps it there), else None."""
    st = _json(path / "sentence_bert_config.json", dict, "sentence-transformers writes {max_seq_length, ...}")
    if st is not None and st.get("max_seq_length") is not None:
        if not _length(st["max_seq_length"]):
            raise DataError(f"{path / 'sentence_bert_config.json'}: max_seq_length {st['max_seq_length']!r} is not "
                            "a whole number of tokens (3 or more)")
        return st["max_seq_length"]
    config = _json(path / "tokenizer_config.json", dict, "transformers writes an object")
    length = config.get("model_max_length") if config else None
    return int(length) if isinstance(length, (int, float)) and 3 <= length < 10 ** 6 else None   # 1e30: unset


def _pooling(config_path: Path) -> str:
    modes = _json(config_path, dict, "sentence-transformers writes the pooling's modes as an object")
    if modes is None:
        raise DataError(f"{config_path}: missing; modules.json names a Pooling module here")
    if isinstance(modes.get("pooling_mode"), str):   # sentence-transformers 6 names the mode
        chosen = [{"mean": "mean", "cls": "cls", "lasttoken": "last"}.get(modes["pooling_mode"])]
    else:                                            # earlier versions turn one flag on
        chosen = [how for how, key in ST_POOLING.items() if modes.get(key) is True]
        others = [k for k, v in modes.items() if k.startswith("pooling_mode") and v and k not in ST_POOLING.values()]
        chosen += [None] * len(others)
    if len(chosen) != 1 or chosen[0] is None:
        raise DataError(f"{config_path}: bertkit pools by mean, cls or lasttoken; this file asks for "
                        f"{[k for k, v in modes.items() if k.startswith('pooling_mode') and v] or 'none'}")
    return chosen[0]


DENSE_ACTIVATIONS = {"Tanh": torch.tanh, "Identity": lambda x: x, "ReLU": torch.relu, "GELU": F.gelu,
                     "Sigmoid": torch.sigmoid}


class Dense(nn.Module):
    """sentence-transformers' Dense module (LaBSE has one): a linear map and an activation after the pooling."""

    def __init__(self, linear: nn.Linear, activation: str):
        super().__init__()
        self.linear, self.activation = linear, activation
        self.out_features = linear.out_features

    def forward(self, x):
        return DENSE_ACTIVATIONS[self.activation](self.linear(x))


def _dense(folder: Path, in_features: int | None) -> Dense:
    from bertkit.safe_load import safe_load

    config = _json(folder / "config.json", dict, "sentence-transformers writes a Dense module's sizes")
    if config is None:
        raise DataError(f"{folder / 'config.json'}: missing; modules.json names a Dense module here")
    activation = str(config.get("activation_function", "")).rsplit(".", 1)[-1]
    sizes = [config.get("in_features"), config.get("out_features")]
    if activation not in DENSE_ACTIVATIONS or not all(isinstance(n, int) and 0 < n <= 1 << 20 for n in sizes) or \
            not isinstance(config.get("bias", True), bool) or (in_features is not None and sizes[0] != in_features):
        raise DataError(f"{folder / 'config.json'}: {config}: bertkit reads a Dense module of whole-number sizes "
                        f"(in_features {in_features or 'the width'}) and one of {', '.join(DENSE_ACTIVATIONS)}")
    linear = nn.Linear(sizes[0], sizes[1], bias=config.get("bias", True))
    from safetensors import SafetensorError

    weights = folder / "model.safetensors"
    try:
        if weights.exists() or weights.is_symlink():
            from safetensors.torch import load_file

            state = load_file(regular_file(weights))
        else:
            weights = folder / "pytorch_model.bin"
            state = safe_load(regular_file(weights))
        state = {k.removeprefix("linear."): v for k, v in state.items()}
        linear.load_state_dict(state)
    except (OSError, RuntimeError, KeyError, AttributeError, ValueError, SafetensorError) as e:
        raise DataError(f"{weights}: not the Dense weights its config.json describes ({str(e).splitlines()[0]})") \
            from None
    return Dense(linear, activation)


def write_embeddings(path: Path, texts: list[str], vectors: np.ndarray) -> None:
    """An Arrow file (atomic): text (string) and embedding (fixed-size list of float32), row i from texts[i]."""
    import pyarrow as pa

    from bertkit.fileio import atomic_write_arrow

    flat = pa.array(vectors.astype(np.float32).reshape(-1))
    table = pa.table({"text": pa.array(texts, pa.string()),
                      "embedding": pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])})
    atomic_write_arrow(path, table)
