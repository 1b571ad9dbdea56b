"""BERT (Devlin et al. 2019): embeddings, post-LN encoder, pooler, and the pretraining / fine-tuning heads.
With BertConfig.norm == "pre", the encoder is pre-LN as in MegatronBERT (no embedding LayerNorm, a LayerNorm before
each sub-layer, one after the last layer); HF loads it as MegatronBert*.

Attention and the (dropout + residual + LayerNorm) sub-layer exits go through `bertkit.kernels`, whose backend
(--kernels) is our Triton kernels on CUDA and PyTorch's own ops elsewhere by default. Inputs are right-padded
batches: attention_mask is 1 for tokens and 0 for padding, and the kernels use only its per-row length. Hidden
states at padded positions are not meaningful (the attention kernel zeroes padded query rows); nothing reads them.

BertModel and BertForPreTraining also take a packed (unpadded, "varlen") batch: the sequences laid end to end,
input_ids / token_type_ids / position_ids of shape (T,), cu_seqlens (B+1,) int32 offsets and max_seqlen, a Python
int bound on every length (the bucket; never read back from the device). No compute is spent on padding. Tokens
past cu_seqlens[-1] (a fine-tuning batch's tail, which rounds T to a few sizes) belong to no sequence: they attend
to nothing, and no output or loss reads them.
"""
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from bertkit import kernels
from bertkit.formats import IGNORE_INDEX
from bertkit.models.bert_config import BertConfig


# Outputs are NamedTuples: DeepSpeed ZeRO-3 sees their tensors (it hooks the backward through them), no wrapper needed.
class EncoderOutput(NamedTuple):
    last_hidden_state: torch.Tensor  # (B, S, H); packed input: (T, H)
    pooler_output: torch.Tensor | None  # (B, H), tanh(dense(h[CLS]))


class PreTrainingOutput(NamedTuple):
    loss: torch.Tensor | None  # mlm_loss + nsp_loss (whichever were asked for)
    mlm_loss: torch.Tensor | None
    nsp_loss: torch.Tensor | None
    mlm_logits: torch.Tensor  # (B, P, vocab_size) at mlm_positions, or (B, S, vocab_size) without them;
    #                           packed input: (P, vocab_size) at flat mlm_positions, or (T, vocab_size)
    nsp_logits: torch.Tensor  # (B, 2); index 1 = NotNext


class ClassifierOutput(NamedTuple):
    loss: torch.Tensor | None
    logits: torch.Tensor  # (B, num_labels) or (B, S, num_labels)


class QuestionAnsweringOutput(NamedTuple):
    loss: torch.Tensor | None
    start_logits: torch.Tensor  # (B, S); padded positions hold a large negative number
    end_logits: torch.Tensor


class Embeddings(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        # rows past vocab_size are padding for fast matmuls: zero, never an input, never predicted
        width = cfg.embedding_width
        self.word_embeddings = nn.Embedding(cfg.padded_vocab_size, width)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, width)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, width)
        # pre-LN normalises at the first layer's input instead (MegatronBERT has no embedding LayerNorm)
        self.norm = nn.LayerNorm(width, eps=cfg.layer_norm_eps) if cfg.norm == "post" else None

    def forward(self, input_ids, token_type_ids, position_ids=None):
        positions = position_ids if position_ids is not None else torch.arange(input_ids.shape[-1],
                                                                               device=input_ids.device)
        if self.cfg.type_vocab_size == 1:  # one token type (RoBERTa): a pair's second segment is type 0 too
            token_type_ids = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        if self.cfg.position_offset:  # RoBERTa: the first position is row pad_token_id + 1
            positions = positions + self.cfg.position_offset
        x = x + self.position_embeddings(positions)
        if self.norm is not None:
            x = kernels.add_layer_norm(x, None, self.norm.weight, self.norm.bias, self.cfg.layer_norm_eps, 0.0)
        return F.dropout(x, self.cfg.hidden_dropout, self.training)


class Layer(nn.Module):
    """Post-LN transformer layer: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.qkv = nn.Linear(h, 3 * h)  # [query; key; value] rows, split/joined on HF conversion
        self.attn_out = nn.Linear(h, h)
        self.attn_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(h, cfg.intermediate_size)
        self.ffn_out = nn.Linear(cfg.intermediate_size, h)
        self.ffn_norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)

    def forward(self, x, lengths, cu_seqlens=None, max_seqlen=None):
        """x (B, S, H) with lengths (B,), or packed: x (T, H) with cu_seqlens (B+1,) and max_seqlen."""
        cfg = self.cfg
        attn_p = cfg.attention_dropout if self.training else 0.0
        hidden_p = cfg.hidden_dropout if self.training else 0.0
        a = self.attend(x, lengths, cu_seqlens, max_seqlen, attn_p)
        x = kernels.add_layer_norm(self.attn_out(a), x, self.attn_norm.weight, self.attn_norm.bias,
                                   cfg.layer_norm_eps, hidden_p)
        f = self.ffn_out(F.gelu(self.ffn_in(x)))  # GELU with erf, as in BERT
        return kernels.add_layer_norm(f, x, self.ffn_norm.weight, self.ffn_norm.bias, cfg.layer_norm_eps, hidden_p)

    def attend(self, x, lengths, cu_seqlens, max_seqlen, attn_p):
        """Self-attention over x (padded with lengths, or packed), before the output projection."""
        cfg = self.cfg
        # q, k, v stay strided views of one matmul's output; the kernel reads them in place
        q, k, v = self.qkv(x).view(*x.shape[:-1], 3, cfg.num_heads, cfg.head_dim).unbind(-3)
        if cu_seqlens is None:
            a = kernels.attention(q, k, v, lengths, attn_p, None)
        else:
            a = kernels.attention_varlen(q, k, v, cu_seqlens, max_seqlen, attn_p, None)
        return a.reshape(x.shape)


class PreLNLayer(Layer):
    """Pre-LN layer (MegatronBERT): x += Attn(LN(x)); x += FFN(LN(x)), with attn_norm before the attention and
    ffn_norm before the FFN. Each residual add is fused with the LayerNorm that follows it (add_layer_norm's prenorm
    mode), so the layer takes the residual stream x and the previous layer's FFN output not yet added (`branch`;
    None at the first layer) and returns (x, its own FFN output)."""

    def forward(self, x, lengths, cu_seqlens=None, max_seqlen=None, branch=None):
        cfg = self.cfg
        attn_p = cfg.attention_dropout if self.training else 0.0
        hidden_p = cfg.hidden_dropout if self.training else 0.0
        w, b, eps = self.attn_norm.weight, self.attn_norm.bias, cfg.layer_norm_eps
        if branch is None:
            n = kernels.add_layer_norm(x, None, w, b, eps, 0.0)
        else:
            n, x = kernels.add_layer_norm(branch, x, w, b, eps, hidden_p, prenorm=True)
        a = self.attend(n, lengths, cu_seqlens, max_seqlen, attn_p)
        n, x = kernels.add_layer_norm(self.attn_out(a), x, self.ffn_norm.weight, self.ffn_norm.bias, eps, hidden_p,
                                      prenorm=True)
        return x, self.ffn_out(F.gelu(self.ffn_in(n)))


def init_weights(module: nn.Module, cfg: BertConfig) -> None:
    """BERT's initialisation: N(0, initializer_range) weights, zero biases, unit LayerNorm."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=cfg.initializer_range)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    for m in module.modules():
        if isinstance(m, Embeddings):
            with torch.no_grad():
                m.word_embeddings.weight[cfg.vocab_size:].zero_()


def sequence_lengths(input_ids, attention_mask):
    """(B,) int32 valid tokens per row; computed on the device (no host sync)."""
    if attention_mask is None:
        return torch.full((input_ids.shape[0],), input_ids.shape[1], dtype=torch.int32, device=input_ids.device)
    return attention_mask.sum(1, dtype=torch.int32)


def packed_position_ids(cu_seqlens, total_tokens):
    """(T,) position of each packed token within its own sequence."""
    return kernels.packed_rows_and_positions(cu_seqlens, total_tokens)[1]


class BertModel(nn.Module):
    """embeddings=False: no embedding module of its own; forward then takes inputs_embeds (ELECTRA's generator and
    discriminator read shared embeddings). Embeddings narrower or wider than hidden_size (cfg.embedding_size) are
    projected (embeddings_project, as in ELECTRA)."""

    def __init__(self, cfg: BertConfig, add_pooling_layer: bool = True, embeddings: bool = True):
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg) if embeddings else None
        self.embeddings_project = nn.Linear(cfg.embedding_width, cfg.hidden_size) \
            if cfg.embedding_width != cfg.hidden_size else None
        pre = cfg.norm == "pre"
        self.layers = nn.ModuleList((PreLNLayer if pre else Layer)(cfg) for _ in range(cfg.num_layers))
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps) if pre else None
        self.pooler = nn.Linear(cfg.hidden_size, cfg.hidden_size) if add_pooling_layer else None
        self.gradient_checkpointing = False  # recompute each layer in backward: less memory, ~30% more compute
        init_weights(self, cfg)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                position_ids=None, cu_seqlens=None, max_seqlen=None, inputs_embeds=None,
                pool: bool = True) -> EncoderOutput:
        """Padded: input_ids (B, S) + attention_mask. Packed: input_ids (T,) + cu_seqlens (B+1,) + max_seqlen;
        then last_hidden_state is (T, H) and the pooler reads each sequence's first ([CLS]) token.
        pool=False: no pooler_output (a caller that reads only the tokens skips its matmul)."""
        packed = cu_seqlens is not None
        longest = max_seqlen if packed else input_ids.shape[1]
        if packed and (max_seqlen is None or input_ids.dim() != 1 or attention_mask is not None):
            raise ValueError("a packed batch is input_ids (T,) with cu_seqlens and max_seqlen, no attention_mask")
        if longest > self.cfg.max_length:
            raise ValueError(f"sequence of {longest} tokens; the model has {self.cfg.max_length} positions "
                             "(max_position_embeddings" + (f" less RoBERTa's offset {self.cfg.position_offset})"
                                                           if self.cfg.position_offset else ")"))
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if packed and position_ids is None:
            position_ids = packed_position_ids(cu_seqlens, input_ids.shape[0])
        lengths = None if packed else sequence_lengths(input_ids, attention_mask)
        x = self.embeddings(input_ids, token_type_ids, position_ids) if inputs_embeds is None else inputs_embeds
        if self.embeddings_project is not None:
            x = self.embeddings_project(x)
        x = self._pre_ln(x, lengths, cu_seqlens, max_seqlen) if self.final_norm is not None else \
            self._post_ln(x, lengths, cu_seqlens, max_seqlen)
        if self.pooler is None or not pool:
            return EncoderOutput(x, None)
        cls = x[cu_seqlens[:-1]] if packed else x[:, 0]
        return EncoderOutput(x, torch.tanh(self.pooler(cls)))

    def _run(self, layer, *args):
        if self.gradient_checkpointing and self.training:
            return checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)

    def _post_ln(self, x, lengths, cu_seqlens, max_seqlen):
        for layer in self.layers:
            x = self._run(layer, x, lengths, cu_seqlens, max_seqlen)
        return x

    def _pre_ln(self, x, lengths, cu_seqlens, max_seqlen):
        branch = None
        for layer in self.layers:
            x, branch = self._run(layer, x, lengths, cu_seqlens, max_seqlen, branch)
        p = self.cfg.hidden_dropout if self.training else 0.0
        return kernels.add_layer_norm(branch, x, self.final_norm.weight, self.final_norm.bias, self.cfg.layer_norm_eps,
                                      p)


class BertForPreTraining(nn.Module):
    """Masked LM (decoder tied to the word embeddings) + next-sentence prediction."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.bert = BertModel(cfg)
        self.mlm_dense = nn.Linear(cfg.hidden_size, cfg.embedding_width)  # back to the (tied) embeddings' width
        self.mlm_norm = nn.LayerNorm(cfg.embedding_width, eps=cfg.layer_norm_eps)
        self.mlm_bias = nn.Parameter(torch.zeros(cfg.padded_vocab_size))
        self.nsp = nn.Linear(cfg.hidden_size, 2)
        init_weights(self.mlm_dense, cfg)
        init_weights(self.mlm_norm, cfg)
        init_weights(self.nsp, cfg)

    def mlm_head(self, h):
        h = F.gelu(self.mlm_dense(h))
        h = kernels.add_layer_norm(h, None, self.mlm_norm.weight, self.mlm_norm.bias, self.cfg.layer_norm_eps, 0.0)
        logits = F.linear(h, self.bert.embeddings.word_embeddings.weight, self.mlm_bias)
        return logits[..., : self.cfg.vocab_size]  # padded rows are never predicted

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                mlm_positions=None, mlm_labels=None, next_sentence_label=None,
                position_ids=None, cu_seqlens=None, max_seqlen=None) -> PreTrainingOutput:
        """Packed input (see BertModel): mlm_positions / mlm_labels are (P,), positions into the T tokens."""
        out = self.bert(input_ids, token_type_ids, attention_mask, position_ids, cu_seqlens, max_seqlen)
        h = out.last_hidden_state
        # gather first: the vocabulary projection is the costliest part of the head
        if mlm_positions is not None and cu_seqlens is not None:
            h = h.index_select(0, mlm_positions.long())
        elif mlm_positions is not None:
            index = mlm_positions.long().unsqueeze(-1).expand(-1, -1, h.shape[-1])
            h = torch.gather(h, 1, index)
        mlm_logits = self.mlm_head(h)
        nsp_logits = self.nsp(out.pooler_output)

        mlm_loss = nsp_loss = loss = None
        if mlm_labels is not None:
            mlm_loss = F.cross_entropy(mlm_logits.float().flatten(0, -2), mlm_labels.flatten().long(),
                                       ignore_index=IGNORE_INDEX)
            loss = mlm_loss
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label.view(-1).long())
            loss = nsp_loss if loss is None else loss + nsp_loss
        return PreTrainingOutput(loss, mlm_loss, nsp_loss, mlm_logits, nsp_logits)


def mean_over_tokens(h, attention_mask=None, cu_seqlens=None):
    """Each sequence's mean last-layer vector: (B, S, H) over its attention_mask, or packed (T, H) by cu_seqlens."""
    if cu_seqlens is not None:
        lengths = cu_seqlens.long().diff()
        # a tail's tokens: row B, summed then dropped
        owner = kernels.packed_rows_and_positions(cu_seqlens, h.shape[0])[0]
        sums = h.new_zeros(len(lengths) + 1, h.shape[-1]).index_add_(0, owner, h)[:-1]
        return sums / lengths.unsqueeze(-1).to(h.dtype)
    if attention_mask is None:
        return h.mean(1)
    m = attention_mask.unsqueeze(-1).to(h.dtype)
    return (h * m).sum(1) / m.sum(1)


class BertForSequenceClassification(nn.Module):
    """Classifier on the pooled [CLS] output, or on the mean over the tokens (cfg.classifier_pooling "mean": a
    model pretrained without a sentence-level task has an untrained [CLS]); num_labels == 1 is regression (MSE)."""

    def __init__(self, cfg: BertConfig, num_labels: int):
        super().__init__()
        self.cfg, self.num_labels = cfg, num_labels
        self.bert = BertModel(cfg)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        init_weights(self.classifier, cfg)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                position_ids=None, cu_seqlens=None, max_seqlen=None) -> ClassifierOutput:
        """Padded (B, S) or packed (T,) with cu_seqlens / max_seqlen (see BertModel); logits (B, num_labels)."""
        read_cls = self.cfg.classifier_pooling == "cls"
        out = self.bert(input_ids, token_type_ids, attention_mask, position_ids, cu_seqlens, max_seqlen, pool=read_cls)
        pooled = out.pooler_output if read_cls else mean_over_tokens(out.last_hidden_state, attention_mask, cu_seqlens)
        p = self.cfg.classifier_dropout if self.cfg.classifier_dropout is not None else self.cfg.hidden_dropout
        logits = self.classifier(F.dropout(pooled, p, self.training))
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = F.mse_loss(logits.float().view(-1), labels.float().view(-1))
            else:
                loss = F.cross_entropy(logits.float(), labels.view(-1).long())
        return ClassifierOutput(loss, logits)


class BertForTokenClassification(nn.Module):
    """A label per token (NER, POS); labels of -100 (padding, sub-word continuations) are ignored."""

    def __init__(self, cfg: BertConfig, num_labels: int):
        super().__init__()
        self.cfg, self.num_labels = cfg, num_labels
        self.bert = BertModel(cfg, add_pooling_layer=False)
        self.classifier = nn.Linear(cfg.hidden_size, num_labels)
        init_weights(self.classifier, cfg)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                position_ids=None, cu_seqlens=None, max_seqlen=None) -> ClassifierOutput:
        """Padded: logits (B, S, num_labels); packed (T,) input: (T, num_labels), labels (T,)."""
        h = self.bert(input_ids, token_type_ids, attention_mask, position_ids, cu_seqlens,
                      max_seqlen).last_hidden_state
        p = self.cfg.classifier_dropout if self.cfg.classifier_dropout is not None else self.cfg.hidden_dropout
        logits = self.classifier(F.dropout(h, p, self.training))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().flatten(0, -2), labels.flatten().long(), ignore_index=IGNORE_INDEX)
        return ClassifierOutput(loss, logits)


# Large but finite, so a softmax over a fully masked row stays defined; padding is never an answer.
MASKED_LOGIT = -1e4


class BertForQuestionAnswering(nn.Module):
    """Span extraction (SQuAD): start/end logits per token; loss = mean of the two cross-entropies."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        self.bert = BertModel(cfg, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(cfg.hidden_size, 2)
        init_weights(self.qa_outputs, cfg)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, start_positions=None, end_positions=None,
                position_ids=None, cu_seqlens=None, max_seqlen=None) -> QuestionAnsweringOutput:
        """Padded (B, S) or packed (T,) with cu_seqlens / max_seqlen (see BertModel and span_output)."""
        h = self.bert(input_ids, token_type_ids, attention_mask, position_ids, cu_seqlens, max_seqlen).last_hidden_state
        start_logits, end_logits = self.qa_outputs(h).unbind(-1)
        return span_output(start_logits, end_logits, attention_mask, cu_seqlens, max_seqlen, start_positions,
                           end_positions)


def span_output(start, end, attention_mask=None, cu_seqlens=None, max_seqlen=None, start_positions=None,
                end_positions=None) -> QuestionAnsweringOutput:
    """Both families' span head after its linear layer: padding's logits masked, and the loss, the mean of the start
    and end cross-entropies over each sequence's own tokens (a position outside the sequence, an answer cut away, is
    ignored, as in transformers). Packed logits (T,) stay packed; the loss lays them into a (B, max_seqlen) grid
    first, so it equals the padded batch's."""
    if attention_mask is not None:
        start = start.masked_fill(attention_mask == 0, MASKED_LOGIT)
        end = end.masked_fill(attention_mask == 0, MASKED_LOGIT)
    loss = None
    if start_positions is not None and end_positions is not None:
        s, e = start_positions.view(-1).long(), end_positions.view(-1).long()
        grid_start, grid_end = start, end
        if cu_seqlens is not None:
            grid_start, grid_end = (packed_to_grid(x, cu_seqlens, max_seqlen) for x in (start, end))
            past_end = cu_seqlens.long().diff()  # a position past its own sequence: ignored, as past the padded width
            s, e = s.masked_fill(s >= past_end, grid_start.shape[1]), e.masked_fill(e >= past_end, grid_start.shape[1])
        seq = grid_start.shape[1]
        s, e = s.clamp(0, seq), e.clamp(0, seq)
        loss = (F.cross_entropy(grid_start.float(), s, ignore_index=seq)
                + F.cross_entropy(grid_end.float(), e, ignore_index=seq)) / 2
    return QuestionAnsweringOutput(loss, start, end)


def packed_to_grid(x, cu_seqlens, max_seqlen=None, fill: float = MASKED_LOGIT):
    """Packed per-token values (T,) -> (B, max_seqlen), each sequence's in its row from column 0, the rest `fill`
    (a tail past cu_seqlens[-1] goes to a spare row, dropped)."""
    lengths = cu_seqlens.long().diff()
    width = int(max_seqlen) if max_seqlen is not None else int(lengths.max())
    cells = kernels.packed_rows_and_positions(cu_seqlens, x.shape[0])
    grid = x.new_full((len(lengths) + 1, width), fill).index_put(cells, x)
    return grid[:-1]


HEADS = {
    None: BertModel,
    "pretraining": BertForPreTraining,
    "sequence_classification": BertForSequenceClassification,
    "token_classification": BertForTokenClassification,
    "question_answering": BertForQuestionAnswering,
}


def build_model(cfg: BertConfig, head: str | None = None, num_labels: int | None = None) -> nn.Module:
    """The model class for a head name (see HEADS); classification heads need num_labels."""
    if head not in HEADS:
        raise ValueError(f"unknown head {head!r}; choose one of {[h for h in HEADS if h]} or None")
    if head in ("sequence_classification", "token_classification"):
        if not num_labels:
            raise ValueError(f"head {head!r} needs num_labels")
        return HEADS[head](cfg, num_labels)
    return HEADS[head](cfg)


def num_parameters(model: nn.Module, exclude_vocab_padding: bool = True) -> int:
    n = sum(p.numel() for p in model.parameters())
    if exclude_vocab_padding:
        cfg = model.cfg
        pad_rows = cfg.padded_vocab_size - cfg.vocab_size
        n -= pad_rows * cfg.hidden_size + (pad_rows if isinstance(model, BertForPreTraining) else 0)
    return n
