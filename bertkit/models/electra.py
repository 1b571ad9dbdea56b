"""ELECTRA (Clark et al. 2020): replaced-token detection, the pretraining objective that learns from every token.

A small generator (a BERT masked LM, `generator_size` x the discriminator's width, the same depth) fills the masked
positions of an instance with tokens sampled from its own predictions; the discriminator (the model kept for
fine-tuning) labels every real token of the result as original or replaced. A sampled token equal to the original
counts as original. Both share the token, position and segment embeddings (and their LayerNorm), as in the paper;
the generator reads them through its own projection to its width. Loss = generator MLM + disc_weight x the
discriminator's binary cross-entropy (disc_weight 50, the paper's lambda). Sampling draws from torch's generator,
so a resumed run (which restores the RNG) samples what the uninterrupted run would have.

Export (`write_hf`) writes the discriminator as transformers' ElectraForPreTraining and the generator, in a
`generator/` subfolder, as ElectraForMaskedLM; bertkit.models.load_pretrained reads both (fine-tuning starts from the
discriminator, fill-mask from the generator).
"""
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from bertkit import kernels
from bertkit.formats import IGNORE_INDEX
from bertkit.models.bert import BertModel, Embeddings, init_weights, packed_position_ids
from bertkit.models.bert_config import BertConfig
from bertkit.models.bert_hf import copy_tokenizer_files, to_hf_state_dict

GENERATOR_FOLDER = "generator"  # inside an ELECTRA export: the generator, as ElectraForMaskedLM


def generator_config(cfg: BertConfig, size: float) -> BertConfig:
    """The generator's shape: size x the discriminator's hidden width (a multiple of 8), heads of at most 64 wide,
    a 4x FFN, the same depth; it reads the discriminator's embeddings (embedding_size = its hidden width)."""
    if not 0 < size <= 1:
        raise ValueError(f"generator size must be in (0, 1], got {size}")
    hidden = max(8, round(cfg.hidden_size * size / 8) * 8)
    heads = max(1, hidden // 64)
    while hidden % heads:
        heads -= 1
    return replace(cfg, hidden_size=hidden, num_heads=heads, intermediate_size=4 * hidden,
                   embedding_size=cfg.hidden_size)


class ElectraOutput(NamedTuple):
    loss: torch.Tensor             # mlm_loss + disc_weight * disc_loss
    mlm_loss: torch.Tensor         # the generator's masked-LM loss
    disc_loss: torch.Tensor        # the discriminator's binary cross-entropy over real tokens
    mlm_logits: torch.Tensor       # the generator's, at mlm_positions
    disc_logits: torch.Tensor      # (B, S) or packed (T,): > 0 means "replaced"
    rtd: torch.Tensor              # float64 [correct, tokens, true positives, false positives, false negatives]


class ElectraForPreTraining(nn.Module):
    def __init__(self, cfg: BertConfig, generator_size: float = 0.25, disc_weight: float = 50.0):
        super().__init__()
        if cfg.norm != "post":
            raise ValueError("ELECTRA is post-LN (transformers' Electra classes have no pre-LN form); drop --norm pre")
        self.cfg, self.generator_size, self.disc_weight = cfg, generator_size, disc_weight
        self.gen_cfg = generator_config(cfg, generator_size)
        self.embeddings = Embeddings(cfg)  # shared by both
        self.generator = BertModel(self.gen_cfg, add_pooling_layer=False, embeddings=False)
        self.discriminator = BertModel(cfg, add_pooling_layer=False, embeddings=False)
        h, e = cfg.hidden_size, self.gen_cfg.hidden_size
        self.gen_dense = nn.Linear(e, h)
        self.gen_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.gen_bias = nn.Parameter(torch.zeros(cfg.padded_vocab_size))
        self.disc_dense = nn.Linear(h, h)
        self.disc_out = nn.Linear(h, 1)
        init_weights(self, cfg)

    def generator_logits(self, h):
        h = F.gelu(self.gen_dense(h))
        h = kernels.add_layer_norm(h, None, self.gen_norm.weight, self.gen_norm.bias, self.cfg.layer_norm_eps, 0.0)
        return F.linear(h, self.embeddings.word_embeddings.weight, self.gen_bias)[..., : self.cfg.vocab_size]

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, mlm_positions=None, mlm_labels=None,
                next_sentence_label=None, position_ids=None, cu_seqlens=None, max_seqlen=None) -> ElectraOutput:
        """A masked batch as BertForPreTraining takes it (padded or packed); next_sentence_label is not used."""
        packed = cu_seqlens is not None
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if packed and position_ids is None:
            position_ids = packed_position_ids(cu_seqlens, input_ids.shape[0])
        encoder_args = (token_type_ids, attention_mask, position_ids, cu_seqlens, max_seqlen)

        g = self.generator(input_ids, *encoder_args,
                           inputs_embeds=self.embeddings(input_ids, token_type_ids, position_ids)).last_hidden_state
        flat = flat_positions(mlm_positions, input_ids)  # (P,) or (B, P) -> indices into input_ids.view(-1)
        mlm_logits = self.generator_logits(g.reshape(-1, g.shape[-1])[flat])
        mlm_loss = F.cross_entropy(mlm_logits.float().flatten(0, -2), mlm_labels.flatten().long(),
                                   ignore_index=IGNORE_INDEX)

        slots = mlm_labels != IGNORE_INDEX  # the real masked slots: a padded batch's padding slots get no sample
        disc_ids, replaced = corrupt(input_ids, flat[slots], mlm_labels[slots], sample(mlm_logits[slots]))
        d = self.discriminator(disc_ids, *encoder_args,
                               inputs_embeds=self.embeddings(disc_ids, token_type_ids, position_ids)).last_hidden_state
        disc_logits = self.disc_out(F.gelu(self.disc_dense(d))).squeeze(-1).float()
        real = torch.ones_like(replaced) if packed or attention_mask is None else attention_mask.bool()
        disc_loss = F.binary_cross_entropy_with_logits(disc_logits[real], replaced[real].float())
        return ElectraOutput(mlm_loss + self.disc_weight * disc_loss, mlm_loss, disc_loss, mlm_logits, disc_logits,
                             rtd_counts(disc_logits.detach(), replaced, real))


def flat_positions(mlm_positions, input_ids):
    """Masked positions as indices into input_ids.view(-1): packed positions already are; padded (B, P) rows are
    offset by their row. Padding slots (label -100) point at position 0 of their row: read, never written."""
    pos = mlm_positions.long()
    if input_ids.dim() == 1:
        return pos
    return pos + torch.arange(input_ids.shape[0], device=pos.device)[:, None] * input_ids.shape[1]


@torch.no_grad()
def sample(logits):
    """One token per masked position (logits: (N, vocab)) from the generator's softmax (temperature 1), with torch's
    generator."""
    return torch.multinomial(torch.softmax(logits.float(), -1), 1).view(-1)


@torch.no_grad()
def corrupt(input_ids, flat, originals, sampled):
    """(the discriminator's input: the sampled tokens written at the flat masked positions, the labels: True where
    that token differs from the original; a sample equal to the original is labelled original). flat, originals and
    sampled hold the real masked slots only, as 1-D tensors."""
    ids = input_ids.reshape(-1).clone()
    replaced = torch.zeros_like(ids, dtype=torch.bool)
    ids[flat] = sampled.to(ids.dtype)
    replaced[flat] = sampled != originals
    return ids.view(input_ids.shape), replaced.view(input_ids.shape)


def rtd_counts(logits, replaced, real):
    predicted = logits > 0
    tp = (predicted & replaced & real).sum()
    fp = (predicted & ~replaced & real).sum()
    fn = (~predicted & replaced & real).sum()
    correct = ((predicted == replaced) & real).sum()
    return torch.stack([correct, real.sum(), tp, fp, fn]).double()


def rtd_metrics(correct, count, tp, fp, fn) -> dict:
    """Replaced-token detection accuracy and F1 (positive = replaced) from summed counts."""
    return {"rtd_acc": correct / max(count, 1), "rtd_f1": 2 * tp / max(2 * tp + fp + fn, 1)}


# ---------------------------------------------------------------- transformers' Electra format

def hf_config(cfg: BertConfig, architecture: str) -> dict:
    d = replace(cfg, embedding_size=None).to_hf_dict()  # BERT's fields; ELECTRA adds the embeddings' own width
    d.update(model_type="electra", embedding_size=cfg.embedding_width, architectures=[architecture],
             summary_type="first", summary_use_proj=True, summary_activation="gelu", summary_last_dropout=0.1)
    return d


def hf_state_dicts(model: ElectraForPreTraining) -> tuple[dict, dict]:
    """(discriminator tensors as ElectraForPreTraining names them, generator tensors as ElectraForMaskedLM does)."""
    state, v = model.state_dict(), model.cfg.vocab_size
    emb = {f"electra.embeddings.{name}": state[f"embeddings.{name}"] for name in
           ("word_embeddings.weight", "position_embeddings.weight", "token_type_embeddings.weight")}
    emb["electra.embeddings.word_embeddings.weight"] = emb["electra.embeddings.word_embeddings.weight"][:v]
    emb["electra.embeddings.LayerNorm.weight"] = state["embeddings.norm.weight"]
    emb["electra.embeddings.LayerNorm.bias"] = state["embeddings.norm.bias"]

    def encoder(prefix, cfg):
        layers = {f"bert.{k[len(prefix):]}": t for k, t in state.items() if k.startswith(prefix + "layers.")}
        return {"electra." + k[len("bert."):]: t for k, t in to_hf_state_dict(layers, cfg).items()}

    disc = {**emb, **encoder("discriminator.", model.cfg),
            "discriminator_predictions.dense.weight": state["disc_dense.weight"],
            "discriminator_predictions.dense.bias": state["disc_dense.bias"],
            "discriminator_predictions.dense_prediction.weight": state["disc_out.weight"],
            "discriminator_predictions.dense_prediction.bias": state["disc_out.bias"]}
    gen = {**emb, **encoder("generator.", model.gen_cfg),
           "electra.embeddings_project.weight": state["generator.embeddings_project.weight"],
           "electra.embeddings_project.bias": state["generator.embeddings_project.bias"],
           "generator_predictions.dense.weight": state["gen_dense.weight"],
           "generator_predictions.dense.bias": state["gen_dense.bias"],
           "generator_predictions.LayerNorm.weight": state["gen_norm.weight"],
           "generator_predictions.LayerNorm.bias": state["gen_norm.bias"],
           "generator_lm_head.bias": state["gen_bias"][:v]}
    return ({k: t.detach().contiguous().clone() for k, t in disc.items()},
            {k: t.detach().contiguous().clone() for k, t in gen.items()})


def write_hf(model: ElectraForPreTraining, out_dir, tokenizer_dir=None) -> Path:
    """out_dir: the discriminator (ElectraForPreTraining); out_dir/generator: the generator (ElectraForMaskedLM);
    each with config.json, model.safetensors and the tokenizer files."""
    from safetensors.torch import save

    from bertkit.fileio import atomic_write_bytes, atomic_write_json

    out_dir = Path(out_dir)
    disc, gen = hf_state_dicts(model)
    for folder, tensors, cfg, arch in ((out_dir, disc, model.cfg, "ElectraForPreTraining"),
                                       (out_dir / GENERATOR_FOLDER, gen, model.gen_cfg, "ElectraForMaskedLM")):
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(folder / "model.safetensors", save(tensors, metadata={"format": "pt"}))
        atomic_write_json(folder / "config.json", hf_config(cfg, arch))
        if tokenizer_dir is not None:
            copy_tokenizer_files(model.cfg, tokenizer_dir, folder)
    return out_dir
