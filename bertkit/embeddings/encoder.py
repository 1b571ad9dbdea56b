"""A sentence encoder: any family's bare encoder, its tokenizer and a pooling, on packed (unpadded) batches; saved
as a folder that transformers and sentence-transformers load and whose embeddings are these."""
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertkit.errors import DataError
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


class SentenceEncoder(nn.Module):
    def __init__(self, encoder: nn.Module, tokenizer, cfg: EncoderConfig, source: str = ""):
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
        self.encoder, self.tokenizer, self.cfg = encoder, tokenizer, cfg

    @classmethod
    def from_folder(cls, path, cfg: EncoderConfig | None = None) -> "SentenceEncoder":
        """A model folder (a bertkit export, transformers' BERT / RoBERTa / ModernBERT, or a folder this class saved:
        then its pooling and length unless `cfg` is given)."""
        from bertkit.tokenization import load_tokenizer

        path = Path(path)
        encoder = load_pretrained(path, head=None)
        if cfg is None:   # a folder's recorded length beyond its positions (a tokenizer's 8192 on a 512 BERT): cut
            cfg = saved_config(path)
            cfg.max_seq_length = min(cfg.max_seq_length, getattr(encoder.cfg, "max_length", cfg.max_seq_length))
        return cls(encoder, load_tokenizer(path), cfg, str(path))

    def features(self, texts: list[str]) -> list[dict]:
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=self.cfg.max_seq_length)
        try:
            encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=True)
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
        return pool(states, cu_seqlens, self.cfg.pooling)

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 64, normalize: bool | None = None,
               progress=None) -> np.ndarray:
        """(N, H) float32 vectors of `texts`, in their order; batches are made of similar lengths (less padding
        to round up, fewer wasted tokens), and the model is put in eval mode for the call."""
        was_training = self.training
        self.eval()
        rows = self.features(texts)
        order = np.argsort([-len(r["input_ids"]) for r in rows], kind="stable")
        out = np.zeros((len(rows), self.hidden_size), dtype=np.float32)
        for i in range(0, len(rows), batch_size):
            take = order[i:i + batch_size]
            vectors = self([rows[j] for j in take]).float()
            if self.cfg.normalize if normalize is None else normalize:
                vectors = F.normalize(vectors, dim=-1)
            out[take] = vectors.cpu().numpy()
            if progress is not None:
                progress(len(take))
        self.train(was_training)
        return out

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
    """The pooling a folder records (bertkit's file, else sentence-transformers' files), else mean over 128 tokens."""
    mine = path / "bertkit_embedding.json"
    if mine.is_file():
        try:
            recorded = json.loads(mine.read_text())
            cfg = EncoderConfig(**recorded)
        except (ValueError, TypeError) as e:
            raise DataError(f"{mine}: not the pooling record bertkit writes ({e}); remove it to read the folder "
                            "with sentence-transformers' files, or mean pooling over 128 tokens") from None
        if cfg.pooling not in POOLINGS or not isinstance(cfg.max_seq_length, int) or \
                not isinstance(cfg.normalize, bool):
            raise DataError(f"{mine}: pooling {cfg.pooling!r}, max_seq_length {cfg.max_seq_length!r}, normalize "
                            f"{cfg.normalize!r}: bertkit writes mean, cls or last, a whole number and true or false")
        return cfg
    cfg = EncoderConfig()
    st_pooling, st_model = path / "1_Pooling" / "config.json", path / "sentence_bert_config.json"
    if st_pooling.is_file():
        modes = json.loads(st_pooling.read_text())
        if isinstance(modes.get("pooling_mode"), str):   # sentence-transformers 6 names the mode
            chosen = [{"mean": "mean", "cls": "cls", "lasttoken": "last"}.get(modes["pooling_mode"])]
        else:                                            # earlier versions turn one flag on
            chosen = [how for how, key in ST_POOLING.items() if modes.get(key)]
        if len(chosen) != 1 or chosen[0] is None:
            raise DataError(f"{st_pooling}: bertkit pools by mean, cls or lasttoken; this file asks for "
                            f"{[v for k, v in modes.items() if k.startswith('pooling_mode') and v] or 'none'}")
        cfg.pooling = chosen[0]
    if st_model.is_file():
        cfg.max_seq_length = int(json.loads(st_model.read_text()).get("max_seq_length") or _tokenizer_length(path)
                                 or cfg.max_seq_length)
    cfg.normalize = any(m.get("type", "").endswith("Normalize") for m in _modules(path))
    return cfg


def _tokenizer_length(path: Path) -> int | None:
    """sentence-transformers 6 keeps the length in the tokenizer's model_max_length, not in its own file."""
    config = path / "tokenizer_config.json"
    length = json.loads(config.read_text()).get("model_max_length") if config.is_file() else None
    return int(length) if isinstance(length, (int, float)) and 0 < length < 10 ** 6 else None   # 1e30: unset


def _modules(path: Path) -> list:
    modules = path / "modules.json"
    return json.loads(modules.read_text()) if modules.is_file() else []


def write_embeddings(path: Path, texts: list[str], vectors: np.ndarray) -> None:
    """An Arrow file (atomic): text (string) and embedding (fixed-size list of float32), row i from texts[i]."""
    import pyarrow as pa

    from bertkit.fileio import atomic_write_arrow

    flat = pa.array(vectors.astype(np.float32).reshape(-1))
    table = pa.table({"text": pa.array(texts, pa.string()),
                      "embedding": pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])})
    atomic_write_arrow(path, table)
