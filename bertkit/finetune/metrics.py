"""Evaluation metrics, each written from its official definition.

- SQuAD EM/F1: the official evaluate-v1.1.py / evaluate-v2.0.py rules (normalise: lower case, drop punctuation,
  drop the articles a/an/the, collapse whitespace; max over the gold answers; v2 adds HasAns/NoAns splits and the
  best threshold over null odds).
- Matthews correlation (CoLA), F1 of the positive class + accuracy (MRPC, QQP), Pearson + Spearman (STS-B).
- Entity-level precision/recall/F1 over IOB2 spans, as seqeval's default (conlleval-compatible) mode computes them.
- KLUE-NER: entity-level macro F1 (strict IOB2 over the characters of all sentences as one sequence, the mean of
  each entity type's F1) and character-level macro F1 (over every tag but O), as KLUE's baseline scores them.
- KorQuAD 1.0 EM/F1: its own evaluate-v1.0.py rules, which differ from SQuAD's (quotes and brackets become spaces,
  no article removal, and F1 counts characters, not words: Korean words carry particles).
"""
import collections
import math
import re
import string

# ---------------------------------------------------------------- SQuAD

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def span_f1(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:  # v2: an empty answer is right only against an empty gold
        return float(pred_tokens == gold_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


# KorQuAD 1.0: quote marks and brackets (Korean and Western) turn into spaces before SQuAD's punctuation removal
_KORQUAD_SPACED = re.compile("['\"《》<>〈〉()‘’]")


def korquad_normalize(s: str) -> str:
    s = _KORQUAD_SPACED.sub(" ", s).lower()
    return " ".join("".join(ch for ch in s if ch not in _PUNCT).split())


def korquad_exact_match(prediction: str, gold: str) -> float:
    return float(korquad_normalize(prediction) == korquad_normalize(gold))


def korquad_f1(prediction: str, gold: str) -> float:
    """F1 over the characters of the normalised words (spaces not counted)."""
    pred = [ch for word in korquad_normalize(prediction).split() for ch in word]
    ref = [ch for word in korquad_normalize(gold).split() for ch in word]
    same = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def korquad_evaluate(dataset: list, predictions: dict, null_odds: dict | None = None) -> dict:
    """KorQuAD 1.0 scores in percent ({"exact_match", "f1"}), max over each question's gold answers; a missing
    prediction scores 0."""
    gold = squad_gold_answers(dataset)
    em = f1 = 0.0
    for qid, answers in gold.items():
        if qid in predictions:
            em += max(korquad_exact_match(predictions[qid], g) for g in answers)
            f1 += max(korquad_f1(predictions[qid], g) for g in answers)
    return {"exact_match": 100.0 * em / len(gold), "f1": 100.0 * f1 / len(gold)}


def squad_gold_answers(dataset: list) -> dict:
    """{qid: [gold texts]} from the official JSON's `data` list; unanswerable (v2) questions get [""]."""
    gold = {}
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                texts = [a["text"] for a in qa.get("answers", []) if normalize_answer(a["text"])]
                gold[qa["id"]] = texts or [""]
    return gold


def squad_evaluate(dataset: list, predictions: dict, null_odds: dict | None = None) -> dict:
    """Official SQuAD scores in percent. `dataset` is the JSON's `data`; `predictions` {qid: text}.

    v1.1 (no unanswerable questions): {"exact_match", "f1"} as evaluate-v1.1.py (a missing prediction scores 0).
    When the data has unanswerable questions (v2.0), the evaluate-v2.0.py keys: exact, f1, total, HasAns_*,
    NoAns_*, and with `null_odds` {qid: score} also best_exact/best_f1 and the null-odds threshold that gives them
    (the predictions are scored as given: "" means "no answer").
    """
    gold = squad_gold_answers(dataset)
    is_v2 = any(answers == [""] for answers in gold.values())
    em, f1 = {}, {}
    for qid, answers in gold.items():
        pred = predictions.get(qid)
        if pred is None:
            em[qid] = f1[qid] = 0.0
            continue
        em[qid] = max(exact_match(pred, g) for g in answers)
        f1[qid] = max(span_f1(pred, g) for g in answers)
    n = len(gold)
    if not is_v2:
        return {"exact_match": 100.0 * sum(em.values()) / n, "f1": 100.0 * sum(f1.values()) / n}
    out = {"exact": 100.0 * sum(em.values()) / n, "f1": 100.0 * sum(f1.values()) / n, "total": n}
    has = [q for q, a in gold.items() if a != [""]]
    no = [q for q, a in gold.items() if a == [""]]
    for name, qids in (("HasAns", has), ("NoAns", no)):
        if qids:
            out[f"{name}_exact"] = 100.0 * sum(em[q] for q in qids) / len(qids)
            out[f"{name}_f1"] = 100.0 * sum(f1[q] for q in qids) / len(qids)
            out[f"{name}_total"] = len(qids)
    if null_odds is not None:
        for key, scores in (("exact", em), ("f1", f1)):
            best, thresh = _best_threshold(scores, null_odds, gold, predictions)
            out[f"best_{key}"], out[f"best_{key}_thresh"] = best, thresh
    return out


def _best_threshold(scores: dict, null_odds: dict, gold: dict, predictions: dict):
    """evaluate-v2.0.py's find_best_thresh: sweep the threshold over the sorted null odds."""
    num_no_ans = sum(1 for a in gold.values() if a == [""])
    cur = best = float(num_no_ans)
    best_thresh = 0.0
    for qid in sorted(null_odds, key=lambda q: null_odds[q]):
        if qid not in scores:
            continue
        if gold[qid] != [""]:
            diff = scores[qid]
        elif predictions.get(qid):
            diff = -1
        else:
            diff = 0
        cur += diff
        if cur > best:
            best, best_thresh = cur, null_odds[qid]
    return 100.0 * best / len(scores), best_thresh


# ---------------------------------------------------------------- classification and regression

def accuracy(preds, labels) -> float:
    preds, labels = list(preds), list(labels)
    return sum(int(p == y) for p, y in zip(preds, labels)) / len(labels)


def binary_f1(preds, labels, positive=1) -> float:
    tp = sum(1 for p, y in zip(preds, labels) if p == positive and y == positive)
    fp = sum(1 for p, y in zip(preds, labels) if p == positive and y != positive)
    fn = sum(1 for p, y in zip(preds, labels) if p != positive and y == positive)
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def class_report(preds, golds, labels: list) -> dict:
    """Per-class precision, recall, F1 and support, and the confusion matrix (rows: gold class, columns: predicted),
    for class indices into `labels`."""
    n = len(labels)
    confusion = [[0] * n for _ in range(n)]
    for p, y in zip(preds, golds):
        confusion[y][p] += 1
    per_class = {}
    for c, name in enumerate(labels):
        tp, predicted, support = confusion[c][c], sum(row[c] for row in confusion), sum(confusion[c])
        precision, recall = tp / predicted if predicted else 0.0, tp / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if tp else 0.0
        per_class[name] = {"precision": precision, "recall": recall, "f1": f1, "support": support}
    return {"labels": list(labels), "per_class": per_class, "confusion": confusion}


def matthews_corrcoef(preds, labels) -> float:
    """Binary MCC = (tp*tn - fp*fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)); 0 when a margin is empty (sklearn)."""
    tp = tn = fp = fn = 0
    for p, y in zip(preds, labels):
        if p == 1 and y == 1:
            tp += 1
        elif p == 1:
            fp += 1
        elif y == 1:
            fn += 1
        else:
            tn += 1
    denom = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return 0.0 if denom == 0 else (tp * tn - fp * fn) / denom


def pearson(x, y) -> float:
    x, y = [float(v) for v in x], [float(v) for v in y]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return 0.0 if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


def _average_ranks(values) -> list:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):  # ties share the mean of their 1-based ranks
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x, y) -> float:
    return pearson(_average_ranks([float(v) for v in x]), _average_ranks([float(v) for v in y]))


# ---------------------------------------------------------------- entity spans (seqeval default mode)

def _split_tag(tag: str):
    if tag in ("O", ""):
        return "O", ""
    if "-" in tag:
        prefix, kind = tag.split("-", 1)
        return prefix, kind
    return tag, ""


def _chunk_ends(prev_tag, tag, prev_type, type_) -> bool:
    if prev_tag in ("E", "S"):
        return True
    if prev_tag in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev_tag not in ("O", ".") and prev_type != type_


def _chunk_starts(prev_tag, tag, prev_type, type_) -> bool:
    if tag in ("B", "S"):
        return True
    if prev_tag in ("E", "S", "O") and tag in ("E", "I"):
        return True
    return tag not in ("O", ".") and prev_type != type_


def get_entities(tags: list) -> list:
    """[(type, start, end_inclusive)] for one sentence; an I- after O or after another type starts a chunk."""
    chunks = []
    prev_tag, prev_type, begin = "O", "", 0
    for i, tag in enumerate(list(tags) + ["O"]):
        cur_tag, cur_type = _split_tag(tag)
        if _chunk_ends(prev_tag, cur_tag, prev_type, cur_type):
            chunks.append((prev_type, begin, i - 1))
        if _chunk_starts(prev_tag, cur_tag, prev_type, cur_type):
            begin = i
        prev_tag, prev_type = cur_tag, cur_type
    return chunks


def entity_scores(gold_sentences: list, pred_sentences: list) -> dict:
    """Micro precision/recall/F1 over exact (type, start, end) entity matches, plus per-type F1 and token accuracy."""
    gold, pred = set(), set()
    correct_tokens = total_tokens = 0
    for s, (g_tags, p_tags) in enumerate(zip(gold_sentences, pred_sentences)):
        if len(g_tags) != len(p_tags):
            raise ValueError(f"sentence {s}: {len(g_tags)} gold tags but {len(p_tags)} predicted tags")
        gold.update((s,) + e for e in get_entities(g_tags))
        pred.update((s,) + e for e in get_entities(p_tags))
        correct_tokens += sum(int(a == b) for a, b in zip(g_tags, p_tags))
        total_tokens += len(g_tags)
    out = _prf(len(gold & pred), len(pred), len(gold))
    out["accuracy"] = correct_tokens / max(total_tokens, 1)
    for kind in sorted({e[1] for e in gold | pred}):
        g = {e for e in gold if e[1] == kind}
        p = {e for e in pred if e[1] == kind}
        out[f"{kind}_f1"] = _prf(len(g & p), len(p), len(g))["f1"]
    return out


def _prf(n_correct, n_pred, n_gold) -> dict:
    precision = n_correct / n_pred if n_pred else 0.0
    recall = n_correct / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


# ---------------------------------------------------------------- KLUE-NER

def strict_entities(tags: list) -> set:
    """{(type, start, end)} in strict IOB2: an entity is B-X then I-X...; an I- that does not continue one is none."""
    spans, kind, start = set(), None, None
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, type_ = _split_tag(tag)
        if kind is not None and not (prefix == "I" and type_ == kind):
            spans.add((kind, start, i))
            kind = None
        if prefix == "B":
            kind, start = type_, i
    return spans


def klue_ner_entity_macro_f1(gold_sentences: list, pred_sentences: list) -> float:
    gold = strict_entities([t for s in gold_sentences for t in s])  # one sequence, as KLUE's baseline
    pred = strict_entities([t for s in pred_sentences for t in s])
    kinds = sorted({k for k, _, _ in gold | pred})
    scores = []
    for k in kinds:
        g, p = {e for e in gold if e[0] == k}, {e for e in pred if e[0] == k}
        tp = len(g & p)
        scores.append(2 * tp / (len(g) + len(p)) if g or p else 0.0)
    return sum(scores) / len(scores) if scores else 0.0


def klue_ner_char_macro_f1(gold_sentences: list, pred_sentences: list, tags: list) -> float:
    """The mean F1 of every tag but O over all characters (a tag never seen in gold or prediction scores 0)."""
    gold = [t for s in gold_sentences for t in s]
    pred = [t for s in pred_sentences for t in s]
    scores = []
    for tag in (t for t in tags if t != "O"):
        tp = sum(g == tag and p == tag for g, p in zip(gold, pred))
        n = sum(g == tag for g in gold) + sum(p == tag for p in pred)
        scores.append(2 * tp / n if n else 0.0)
    return sum(scores) / len(scores) if scores else 0.0
