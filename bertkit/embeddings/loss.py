"""In-batch negatives (MultipleNegativesRanking / InfoNCE) and gradient caching, which makes a batch of thousands of
pairs cost the memory of one mini-batch (Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory
Limited Setup"; sentence-transformers' CachedMultipleNegativesRankingLoss): embed every mini-batch without a graph,
take the loss and its gradient with respect to the embeddings over the whole batch, then embed each mini-batch again
with a graph, its dropout replayed, and push that gradient through. The weights' gradient equals the whole batch's
at once."""
import torch
import torch.nn.functional as F

from bertkit.finetune.train import pack_features


def info_nce(anchors: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor | None = None,
             scale: float = 20.0, symmetric: bool = False) -> torch.Tensor:
    """Cross-entropy of each anchor against every positive (and hard negative) in the batch, its own positive the
    target, over cosine similarities times `scale` (1 / temperature). symmetric: the mean of that and each positive
    against every anchor (sentence-transformers' directions query_to_doc + doc_to_query, one softmax each)."""
    a = F.normalize(anchors.float(), dim=-1)
    docs = positives if negatives is None else torch.cat([positives, negatives])
    d = F.normalize(docs.float(), dim=-1)
    scores = a @ d.T * scale
    target = torch.arange(len(a), device=a.device)
    loss = F.cross_entropy(scores, target)
    if symmetric:
        loss = (loss + F.cross_entropy(scores[:, :len(a)].T, target)) / 2
    return loss


class ReplayedRandomness:
    """The random state before a mini-batch's first pass, so its second pass draws the same dropout masks."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.cpu_state = torch.get_rng_state()
        self.cuda_state = torch.cuda.get_rng_state(device) if self.cuda else None
        self.device = device

    def __enter__(self):
        self.fork = torch.random.fork_rng(devices=[self.device] if self.cuda else [])
        self.fork.__enter__()
        torch.set_rng_state(self.cpu_state)
        if self.cuda:
            torch.cuda.set_rng_state(self.cuda_state, self.device)

    def __exit__(self, *exc):
        return self.fork.__exit__(*exc)


def cached_step(encoder, columns: list[list[dict]], mini_batch: int, scale: float, symmetric: bool,
                autocast=None) -> float:
    """One batch's loss, its gradient accumulated into `encoder`'s weights. columns: tokenized anchors, positives
    and optionally hard negatives (rows aligned). Each column is packed `mini_batch` rows at a time, once, and
    embedded twice."""
    device = next(encoder.parameters()).device
    autocast = autocast or torch.autocast(device.type, enabled=False)
    chunks = [[pack_features(rows[i:i + mini_batch]) for i in range(0, len(rows), mini_batch)] for rows in columns]
    states, cached = [], []
    with torch.no_grad():
        for column in chunks:
            for batch in column:
                states.append(ReplayedRandomness(device))
                with autocast:
                    cached.append(encoder(batch).float())
    embeddings = [e.requires_grad_() for e in cached]
    per_column, at = [], 0
    for column in chunks:
        per_column.append(torch.cat(embeddings[at:at + len(column)]))
        at += len(column)
    loss = info_nce(*per_column, scale=scale, symmetric=symmetric)
    loss.backward()
    batches = [batch for column in chunks for batch in column]
    for batch, state, e in zip(batches, states, embeddings):
        with state, autocast:
            again = encoder(batch).float()
        again.backward(e.grad)
    return loss.item()
