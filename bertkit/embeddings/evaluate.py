"""Scores of a sentence encoder with the field's metrics, and the floors no model must fall under:
- STS: cosine similarity of each pair's vectors against the gold score (Spearman, Pearson), as sentence-transformers'
  EmbeddingSimilarityEvaluator; floor: character overlap (the pair's character sets, spaces left out, Jaccard);
- retrieval: every question of a SQuAD-format file against every distinct paragraph of the file, exact search (one
  matrix product per block of questions): Recall@1/5/10, MRR@10, nDCG@10 as sentence-transformers'
  InformationRetrievalEvaluator; floor: BM25 (bm25s) over words and over character bigrams; and the two fused, by
  reciprocal rank and by a weighted sum (its weight tuned on half the questions, scored on the other half)."""
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bertkit.errors import DataError

KS = (1, 5, 10)
FULL_SCORES_LIMIT = 50_000_000   # queries x documents up to which the weighted hybrid is scored (200 MB a matrix)


@dataclass
class StsPair:
    a: str
    b: str
    score: float


def read_sts(path) -> list[StsPair]:
    """KorSTS / STS-B .tsv (sentence1, sentence2, score columns) or KLUE-STS .json (labels.label)."""
    from bertkit.finetune.korean import read_examples

    path = Path(path)
    if path.suffix == ".json":
        examples = read_examples(path)
    else:
        from bertkit.finetune.classify import read_table

        examples = read_table(path, "sentence1", "sentence2", "score", header=True, fmt="tsv")
    pairs = []
    for e in examples:
        try:
            score = float(e.label)
        except (TypeError, ValueError):
            raise DataError(f"{path}:{e.line}: score {e.label!r} is not a number") from None
        if not math.isfinite(score):
            raise DataError(f"{path}:{e.line}: score {e.label!r} is not a finite number; fix or remove this pair")
        pairs.append(StsPair(e.text_a, e.text_b, score))
    if len(pairs) < 2 or len({p.score for p in pairs}) < 2:
        raise DataError(f"{path}: {len(pairs)} pair(s) of {len({p.score for p in pairs})} distinct score(s); a "
                        "correlation needs two pairs and two scores at least")
    return pairs


@dataclass
class Retrieval:
    queries: list[str]
    corpus: list[str]
    relevant: list[int]     # each query's paragraph, an index into corpus


def read_retrieval(path) -> Retrieval:
    """A SQuAD-format file (SQuAD v1.1, KorQuAD 1.0) as retrieval: each question's paragraph is its one relevant
    document among the file's distinct paragraphs."""
    from bertkit.finetune.squad import read_squad

    examples, _ = read_squad(path, training=False)
    index: dict[str, int] = {}
    relevant = [index.setdefault(e.context, len(index)) for e in examples]
    if not examples:
        raise DataError(f"{path}: no questions")
    return Retrieval([e.question for e in examples], list(index), relevant)


def sts_scores(similarities, pairs: list[StsPair]) -> dict:
    from scipy.stats import pearsonr, spearmanr

    gold = [p.score for p in pairs]
    if np.ptp(np.asarray(similarities, dtype=np.float64)) == 0:
        raise DataError(f"every one of the {len(pairs)} pairs has the same similarity "
                        f"({float(similarities[0]):g}), so no correlation is defined: a model whose vectors are all "
                        "alike (collapsed, or untrained with this pooling)")
    return {"spearman": float(spearmanr(similarities, gold)[0]), "pearson": float(pearsonr(similarities, gold)[0])}


def evaluate_sts(encoder, pairs: list[StsPair], batch_size: int = 64) -> dict:
    a = encoder.encode([p.a for p in pairs], batch_size, normalize=True)
    b = encoder.encode([p.b for p in pairs], batch_size, normalize=True)
    return sts_scores((a * b).sum(-1), pairs)


def character_overlap_sts(pairs: list[StsPair]) -> dict:
    def overlap(a: str, b: str) -> float:
        a, b = set(a.replace(" ", "")), set(b.replace(" ", ""))
        return len(a & b) / max(1, len(a | b))

    return sts_scores([overlap(p.a, p.b) for p in pairs], pairs)


def ranking_metrics(top: np.ndarray, relevant: list[int]) -> dict:
    """top: (Q, 10+) each query's documents best first. One relevant document a query: Recall@k is whether it is in
    the first k, MRR@10 1 / its rank (0 past 10), nDCG@10 1 / log2(rank + 1) (the ideal ranking's DCG is 1)."""
    rank = np.full(len(relevant), np.inf)
    hit_row, hit_col = np.nonzero(top[:, :max(KS)] == np.asarray(relevant)[:, None])
    rank[hit_row] = hit_col + 1
    out = {f"recall@{k}": float(np.mean(rank <= k)) for k in KS}
    out["mrr@10"] = float(np.mean(np.where(rank <= 10, 1 / rank, 0.0)))
    out["ndcg@10"] = float(np.mean(np.where(rank <= 10, 1 / np.log2(rank + 1), 0.0)))
    return out


def exact_top(queries: np.ndarray, corpus: np.ndarray, k: int = max(KS), block: int = 1024) -> np.ndarray:
    """Each query's k best documents by dot product (cosine for unit vectors), exact, a block of queries at a time
    (memory: block x corpus scores); ties go to the lower index."""
    c = torch.from_numpy(corpus)
    k = min(k, len(corpus))
    tops = [torch.topk(torch.from_numpy(queries[i:i + block]) @ c.T, k, dim=1, sorted=True).indices.numpy()
            for i in range(0, len(queries), block)]
    return np.concatenate(tops)


def dense_top(encoder, data: Retrieval, batch_size: int = 64, k: int = max(KS)) -> np.ndarray:
    q = encoder.encode(data.queries, batch_size, normalize=True)
    c = encoder.encode(data.corpus, batch_size, normalize=True)
    return exact_top(q, c, k)


def evaluate_retrieval(encoder, data: Retrieval, batch_size: int = 64) -> dict:
    return ranking_metrics(dense_top(encoder, data, batch_size), data.relevant)


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def character_bigrams(text: str) -> list[str]:
    """Each word's character bigrams (a one-letter word: itself): Korean's particles and endings, glued to the word,
    then stop hiding the stem (바다를 / 바다에서 share 바다)."""
    return [w[i:i + 2] for w in words(text) for i in range(max(1, len(w) - 1))]


def bm25_retrieval(data: Retrieval, split=words) -> dict:
    """The BM25 floor (bm25s, its default k1 1.5, b 0.75, Lucene's scoring) over `split`'s terms."""
    return ranking_metrics(bm25_top(data, split, max(KS)), data.relevant)


def bm25_index(data: Retrieval, split=words):
    """bm25s' index of the corpus' `split` terms."""
    import bm25s

    retriever = bm25s.BM25()
    retriever.index([split(d) for d in data.corpus], show_progress=False)
    return retriever


def bm25_top(data: Retrieval, split=words, k: int = 100, index=None) -> np.ndarray:
    """Each query's k best documents; `index`: bm25_index(data, split) when made already."""
    retriever = index if index is not None else bm25_index(data, split)
    top, _ = retriever.retrieve([split(q) or ["\0"] for q in data.queries], k=min(k, len(data.corpus)),
                                show_progress=False)
    return np.asarray(top)


def reciprocal_rank_fusion(*tops: np.ndarray, k: int = 60, keep: int = max(KS)) -> np.ndarray:
    """Each query's documents by the sum over rankings of 1 / (k + rank) (Cormack et al. 2009; k = 60 as there), a
    document absent from a ranking adding nothing; ties to the lower index."""
    fused = []
    for rows in zip(*tops):
        score: dict[int, float] = {}
        for ranking in rows:
            for rank, doc in enumerate(ranking.tolist(), 1):
                score[doc] = score.get(doc, 0.0) + 1.0 / (k + rank)
        fused.append(sorted(score, key=lambda d: (-score[d], d))[:keep])
    width = min(len(f) for f in fused)
    return np.array([f[:width] for f in fused])


def bm25_scores(data: Retrieval, split=character_bigrams, index=None) -> np.ndarray:
    """(Q, N) BM25 scores of every query against every document (bm25s)."""
    retriever = index if index is not None else bm25_index(data, split)
    known = set(retriever.vocab_dict)   # a term no document has scores nothing
    return np.stack([retriever.get_scores([t for t in split(q) if t in known]) if any(t in known for t in split(q))
                     else np.zeros(len(data.corpus)) for q in data.queries]).astype(np.float32)


def weighted_fusion(dense: np.ndarray, bm25: np.ndarray, weight: float, k: int = max(KS)) -> np.ndarray:
    """Each query's k best documents by weight x dense + (1 - weight) x BM25, each min-max scaled per query."""
    def scaled(x):
        low, high = x.min(1, keepdims=True), x.max(1, keepdims=True)
        return (x - low) / np.maximum(high - low, 1e-12)

    fused = weight * scaled(dense) + (1 - weight) * scaled(bm25)
    return np.argsort(-fused, axis=1, kind="stable")[:, :k]


def tuned_hybrid(dense: np.ndarray, bm25: np.ndarray, relevant: list[int]) -> dict:
    """The dense weight (0, 0.1, ..., 1) with the best MRR@10 on the even-numbered queries, then dense, BM25 and
    their fusion at that weight scored on the odd-numbered ones: a weight never chosen on the queries it is scored
    on."""
    rel = np.asarray(relevant)
    tune, test = slice(0, None, 2), slice(1, None, 2)
    weight = max((round(w, 1) for w in np.linspace(0, 1, 11)),
                 key=lambda w: ranking_metrics(weighted_fusion(dense[tune], bm25[tune], w), rel[tune])["mrr@10"])
    return {"weight": weight, "queries": len(rel[test]),
            "model": ranking_metrics(weighted_fusion(dense[test], bm25[test], 1.0), rel[test]),
            "bm25": ranking_metrics(weighted_fusion(dense[test], bm25[test], 0.0), rel[test]),
            "fused": ranking_metrics(weighted_fusion(dense[test], bm25[test], weight), rel[test])}


# the published evaluation sets by name, under a data folder laid out as their publishers ship them (each file's
# own licence)
STS_SETS = {"korsts-dev": "kornlu/KorSTS/sts-dev.tsv", "korsts-test": "kornlu/KorSTS/sts-test.tsv",
            "klue-sts-dev": "klue/klue-sts-v1.1/klue-sts-v1.1_dev.json", "stsb-dev": "glue/STS-B/dev.tsv"}
RETRIEVAL_SETS = {"korquad-dev": "korquad_v1.0/KorQuAD_v1.0_dev.json", "squad-dev": "squad_v1.1/dev-v1.1.json"}


def resolve_set(spec: str, names: dict, data_dir) -> Path:
    """A file given by path, or a published set by name inside `data_dir`."""
    if spec in names:
        if data_dir is None:
            raise DataError(f"{spec}: a published set's name needs --data-dir (the folder holding {names[spec]})")
        path = Path(data_dir) / names[spec]
    else:
        path = Path(spec)
    if not path.is_file():
        raise DataError(f"{path}: no such file (give a file, or one of {', '.join(names)} with --data-dir)")
    return path


def score(encoder, sts=(), retrieval=(), data_dir=None, floors: bool = True, batch_size: int = 64) -> dict:
    """{"sts": {set: scores}, "retrieval": {set: scores}}, each set's floors beside it (encoder None: floors only)."""
    out = {"sts": {}, "retrieval": {}}
    for spec in sts:
        pairs = read_sts(resolve_set(spec, STS_SETS, data_dir))
        row = {"pairs": len(pairs)}
        if encoder is not None:
            row["model"] = evaluate_sts(encoder, pairs, batch_size)
        if floors:
            row["character_overlap"] = character_overlap_sts(pairs)
        out["sts"][spec] = row
    for spec in retrieval:
        data = read_retrieval(resolve_set(spec, RETRIEVAL_SETS, data_dir))
        row = {"queries": len(data.queries), "documents": len(data.corpus)}
        if encoder is not None:
            q = encoder.encode(data.queries, batch_size, normalize=True)
            c = encoder.encode(data.corpus, batch_size, normalize=True)
            dense = exact_top(q, c, k=100)
            row["model"] = ranking_metrics(dense, data.relevant)
        if floors:
            row["bm25_words"] = bm25_retrieval(data, words)
            index = bm25_index(data, character_bigrams)
            bigrams = bm25_top(data, character_bigrams, k=100, index=index)
            row["bm25_character_bigrams"] = ranking_metrics(bigrams, data.relevant)
        if floors and encoder is not None:   # dense + BM25 fused: results of their own beside both
            row["hybrid_rrf"] = ranking_metrics(reciprocal_rank_fusion(dense, bigrams), data.relevant)
            if len(q) * len(c) <= FULL_SCORES_LIMIT:   # it needs every query's score of every document
                row["hybrid_weighted"] = tuned_hybrid(q @ c.T, bm25_scores(data, index=index), data.relevant)
        out["retrieval"][spec] = row
    return out
