"""SQuAD v1.1 / v2.0: read the official JSON, cut windows (features), turn logits back into answers.

Windows follow google-research/bert's run_squad.py: a window holds [CLS] question [SEP] context-piece [SEP],
at most `max_seq_length` tokens, the question cut to `max_query_length` tokens, and window starts are
`window_step` tokens apart (the reference's `doc_stride`). HF tokenizers' `stride` is something else: the
number of tokens two windows *overlap* (overlap = window length - window_step); `window_overlap` cuts windows that
way instead (run_qa.py's, so the step depends on the question's length). A context token that falls in
several windows is answered only from the window where it has the most context on both sides (max-context rule).

Answers map between characters and tokens through the tokenizer's character offsets, so the predicted text is
a slice of the original context (original case, accents and spacing).
"""
import collections
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bertkit.errors import DataError
from bertkit.finetune.classify import read_utf8
from bertkit.tokenization import CLS, SEP


class SquadFormatError(ValueError):
    pass


@dataclass
class SquadExample:
    qid: str
    question: str
    context: str
    answers: list  # [(text, char_start)], all gold answers
    is_impossible: bool = False
    title: str = ""


@dataclass
class SquadFeature:
    example_index: int
    input_ids: list
    token_type_ids: list
    offsets: list        # per input position: (char_start, char_end) into the context, or None outside the context
    max_context: list    # per input position: True where this window is the best one for that context token
    start_position: int = 0
    end_position: int = 0


# ---------------------------------------------------------------- reading

def _line_of(raw: str, qid: str) -> int:
    """1-based line where question `qid` appears in the raw file (the official files are one long line)."""
    pos = raw.find(json.dumps(qid))
    return raw.count("\n", 0, pos) + 1 if pos >= 0 else 0


def _typed(value, kind: type, where, name: str, what: str):
    """value if it is a `kind` (bools are not offsets), else SquadFormatError naming the file, the place and what
    was expected there."""
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise SquadFormatError(f"{where()}: {name} is a {type(value).__name__}, expected {what} "
                           "(the official SQuAD JSON layout)")


def _field(obj: dict, key: str, kind: type, where, what: str, default=None):
    """obj[key] checked by _typed; a missing key gives `default` when one is given, else SquadFormatError."""
    if key not in obj:
        if default is not None:
            return default
        raise SquadFormatError(f"{where()}: '{key}' is missing, expected {what} (the official SQuAD JSON layout)")
    return _typed(obj[key], kind, where, f"'{key}'", what)


def read_squad(path, training: bool, version_2: bool = False, articles: slice | None = None,
               every_nth_question: int = 1, max_questions: int | None = None):
    """-> (examples, dataset) where dataset is the file's `data` list (for the official evaluation), cut to
    `articles`, to every n-th question and to the first `max_questions` when given (a quick, deterministic subset;
    the dataset keeps only those questions so scores stay official)."""
    path = Path(path)
    counter = iter(range(10 ** 9))
    raw, dataset = _squad_json(path)
    indices = list(range(len(dataset)))[articles] if articles is not None else range(len(dataset))
    dataset = [dataset[a] for a in indices]
    examples, seen = [], {}
    for a, article in zip(indices, dataset):
        def at(what, a=a):
            return lambda: f"{path}: data[{a}]{what}"
        article = _typed(article, dict, at(""), "the article", "an object")
        paragraphs = _field(article, "paragraphs", list, at(""), "a list", default=[])
        for p, paragraph in enumerate(paragraphs):
            paragraph = _typed(paragraph, dict, at(f".paragraphs[{p}]"), "the paragraph", "an object")
            context = _field(paragraph, "context", str, at(f".paragraphs[{p}]"), "text")
            qas = _field(paragraph, "qas", list, at(f".paragraphs[{p}]"), "a list of questions")
            if every_nth_question > 1:  # a quick deterministic subset; the dataset keeps only those questions
                qas = paragraph["qas"] = [qa for qa in qas if next(counter) % every_nth_question == 0]
            if max_questions is not None:
                qas = paragraph["qas"] = qas[:max(0, max_questions - len(examples))]
            for q, qa in enumerate(qas):
                qa = _typed(qa, dict, at(f".paragraphs[{p}].qas[{q}]"), "the question", "an object")
                qid = str(qa.get("id", "?"))

                def where(qid=qid, a=a, title=article.get("title", "")):  # the line search is slow: errors only
                    return f"{path}:{_line_of(raw, qid)}: article {a} ({title!r}), question id {qid}"
                if qid in seen and "question" in qa:  # predictions and scores are keyed by id: one would overwrite
                    raise SquadFormatError(f"{where()}: the id {qid} is given to an earlier question too (article "
                                           f"{seen[qid]}); every question needs its own id")
                examples.append(_question(qa, context, where, training, version_2, article.get("title", "")))
                seen[qid] = a
    if not examples:
        other = next((sorted(a) for a in dataset if "paragraphs" not in a), None)  # another layout (KorQuAD 2.0's)
        raise SquadFormatError(f"{path}: no questions found" + (
            f"; its articles hold {other}, not SQuAD's 'paragraphs' (each a 'context' with its 'qas'): bertkit reads "
            "the SQuAD v1.1/v2.0 layout (KorQuAD 1.0's too, not KorQuAD 2.0's whole-page HTML)" if other else ""))
    return examples, dataset


def _squad_json(path: Path) -> tuple[str, list]:
    """(the file's text, its `data` list), or SquadFormatError naming what is wrong where."""
    try:
        raw = read_utf8(path)
    except DataError as e:
        raise SquadFormatError(f"{e} (SQuAD and KorQuAD files are UTF-8 JSON)") from None
    if not raw.strip():
        raise SquadFormatError(f"{path}: the file is empty; expected the official SQuAD JSON ({{'data': [...]}})")
    try:
        top = json.loads(raw)
    except json.JSONDecodeError as e:
        raise SquadFormatError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    top = _typed(top, dict, lambda: f"{path}", "the top level", "an object with 'data'")
    return raw, _field(top, "data", list, lambda: f"{path}: the top level", "a list of articles")


def _question(qa: dict, context: str, where, training: bool, version_2: bool, title: str) -> SquadExample:
    """One question of a paragraph, checked: its id and text, v2's is_impossible, each answer where it says."""
    if "question" not in qa or "id" not in qa:
        raise SquadFormatError(f"{where()}: a question needs 'id' and 'question'")
    question = _field(qa, "question", str, where, "text")
    impossible = bool(qa.get("is_impossible", False))
    if impossible and not version_2:
        raise SquadFormatError(f"{where()}: is_impossible=true in a v1.1 run; pass --version-2")
    answers = []
    for k, ans in enumerate(_field(qa, "answers", list, where, "a list", default=[])):
        ans = _typed(ans, dict, lambda k=k: f"{where()}, answers[{k}]", "the answer", "an object")
        text = _field(ans, "text", str, lambda k=k: f"{where()}, answers[{k}]", "text")
        start = _field(ans, "answer_start", int, lambda k=k: f"{where()}, answers[{k}]", "a character offset")
        if context[start:start + len(text)] != text:
            raise SquadFormatError(f"{where()}: answer_start {start} does not point at the answer text {text!r} "
                                   f"(the context there reads {context[start:start + len(text)]!r}); fix "
                                   "answer_start")
        answers.append((text, start))
    if training and not impossible and not answers:
        raise SquadFormatError(f"{where()}: a training question has no answers "
                               "(mark it is_impossible=true with --version-2, or drop it)")
    return SquadExample(str(qa["id"]), question, context, answers, impossible, title)


# ---------------------------------------------------------------- features

def char_span_to_tokens(offsets, char_start: int, char_end: int):
    """Token span [first, last] covering characters [char_start, char_end), or None if no token overlaps."""
    first = next((i for i, (s, e) in enumerate(offsets) if e > char_start), None)
    last = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < char_end), None)
    if first is None or last is None or last < first:
        return None
    return first, last


WINDOW_STEP = 128  # google-research/bert's doc_stride; against run_qa.py's overlap: bertkit/finetune/README.md


def windows(num_tokens: int, max_tokens: int, window_step: int):
    """[(start, length)] of the sliding windows over a context of `num_tokens` tokens (run_squad.py's doc spans)."""
    spans, start = [], 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, window_step)
    return spans or [(0, 0)]


def _is_max_context(spans, span_index: int, position: int) -> bool:
    best_score, best_index = None, None
    for i, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, i
    return best_index == span_index


def prepare_tokenizer(tokenizer):
    """Fine-tuning cuts windows itself: switch off any truncation/padding saved in tokenizer.json."""
    tokenizer.no_truncation()
    tokenizer.no_padding()
    for token in (CLS, SEP):
        if tokenizer.token_to_id(token) is None:
            raise ValueError(f"the tokenizer has no {token} token; bertkit fine-tuning expects a BERT vocabulary")
    return tokenizer


def make_features(examples, tokenizer, training: bool, max_seq_length: int = 384, window_step: int | None = None,
                  max_query_length: int = 64, stats: dict | None = None, window_overlap: int | None = None):
    """SquadFeature list. In training, a window without the whole answer (or an unanswerable question) points at
    [CLS] (start = end = 0), as the reference does. `stats` (a dict) receives counts of unmappable answers.
    `window_overlap` (instead of `window_step`): consecutive windows share this many context tokens, as HF
    tokenizers' `stride` and run_qa.py's `--doc_stride` cut them. Neither given: windows 128 tokens apart."""
    if window_step is not None and window_overlap is not None:
        raise ValueError("window_step and window_overlap are two ways to place windows: give one")
    window_step = WINDOW_STEP if window_step is None else window_step
    if window_step < 1:
        raise ValueError(f"window_step {window_step}: consecutive windows must start at least 1 token apart "
                         f"(google-research/bert's doc_stride is {WINDOW_STEP})")
    prepare_tokenizer(tokenizer)
    cls_id, sep_id = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)
    contexts = {}  # many questions share a paragraph: tokenize each once
    for ex in examples:
        contexts.setdefault(ex.context, None)
    unique = list(contexts)
    for text, enc in zip(unique, tokenizer.encode_batch(unique, add_special_tokens=False)):
        contexts[text] = (enc.ids, enc.offsets)
    questions = tokenizer.encode_batch([ex.question for ex in examples], add_special_tokens=False)
    max_tokens = max_seq_length - 3
    stats = stats if stats is not None else {}
    stats.setdefault("unmappable_answers", 0)
    features = []
    for ex_index, (ex, q) in enumerate(zip(examples, questions)):
        q_ids = q.ids[:max_query_length]
        doc_ids, doc_offsets = contexts[ex.context]
        max_doc = max_tokens - len(q_ids)
        if max_doc <= 0:
            raise ValueError(f"max_seq_length {max_seq_length} leaves no room for the context")
        step = window_step if window_overlap is None else max_doc - window_overlap
        if step < 1:
            raise ValueError(f"a window overlap of {window_overlap} tokens leaves no step: a question of "
                             f"{len(q_ids)} tokens leaves {max_doc} for the context at max_seq_length "
                             f"{max_seq_length}; give a smaller --window-overlap")
        answer_span = None
        if training and not ex.is_impossible:
            text, start = ex.answers[0]
            answer_span = char_span_to_tokens(doc_offsets, start, start + len(text))
            if answer_span is None:
                stats["unmappable_answers"] += 1
                continue  # an answer made only of characters the tokenizer drops (e.g. whitespace)
        spans = windows(len(doc_ids), max_doc, step)
        for span_index, (start, length) in enumerate(spans):
            input_ids = [cls_id] + q_ids + [sep_id] + doc_ids[start:start + length] + [sep_id]
            type_ids = [0] * (len(q_ids) + 2) + [1] * (length + 1)
            offsets = [None] * (len(q_ids) + 2) + list(doc_offsets[start:start + length]) + [None]
            max_context = [False] * (len(q_ids) + 2) + [_is_max_context(spans, span_index, start + i)
                                                        for i in range(length)] + [False]
            s_pos = e_pos = 0
            if answer_span is not None and start <= answer_span[0] and answer_span[1] < start + length:
                shift = len(q_ids) + 2 - start
                s_pos, e_pos = answer_span[0] + shift, answer_span[1] + shift
            features.append(SquadFeature(ex_index, input_ids, type_ids, offsets, max_context, s_pos, e_pos))
    return features


def feature_dicts(features, training: bool) -> list:
    """Model inputs for the training loop (plus labels when training)."""
    rows = []
    for f in features:
        row = {"input_ids": f.input_ids, "token_type_ids": f.token_type_ids}
        if training:
            row["start_positions"], row["end_positions"] = f.start_position, f.end_position
        rows.append(row)
    return rows


# ---------------------------------------------------------------- post-processing

_NULL_ODDS_NO_SPAN = 1e4  # null odds written when no valid span exists at all: "certainly no answer"


def postprocess(examples, features, start_logits, end_logits, n_best_size: int = 20,
                max_answer_length: int = 30, version_2: bool = False, null_score_diff_threshold: float = 0.0):
    """-> (predictions {qid: text}, nbest {qid: [{text, probability, start_logit, end_logit}]}, null_odds {qid: float}).

    start_logits/end_logits: one 1-D array per feature (padding positions may be included, they are never
    context tokens). For v2, the null score is the smallest [CLS] score over the example's windows, and the
    answer is "" when null score - best span score > threshold; null_odds holds that difference."""
    by_example = collections.defaultdict(list)
    for i, f in enumerate(features):
        by_example[f.example_index].append(i)
    predictions, nbest_json, null_odds = {}, {}, {}
    for ex_index, ex in enumerate(examples):
        candidates, null = _spans(features, by_example.get(ex_index, []), start_logits, end_logits, n_best_size,
                                  max_answer_length)
        entries, seen = [], set()
        for score, sl, el, cs, ce in candidates:
            text = ex.context[cs:ce]
            if text in seen:
                continue
            seen.add(text)
            entries.append({"text": text, "score": score, "start_logit": sl, "end_logit": el})
            if len(entries) == n_best_size:
                break
        best_span = entries[0] if entries else None
        if version_2 and null is not None:
            entries.append({"text": "", "score": null[0], "start_logit": null[1], "end_logit": null[2]})
            entries.sort(key=lambda c: -c["score"])  # up to n_best spans plus the null answer, as the reference
        if not entries:  # no window, or no valid span in v1: keep the official formats well-formed
            entries = [{"text": "", "score": 0.0, "start_logit": 0.0, "end_logit": 0.0}]
        scores = np.array([c["score"] for c in entries])
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        nbest_json[ex.qid] = [{"text": c["text"], "probability": float(p), "start_logit": c["start_logit"],
                               "end_logit": c["end_logit"]} for c, p in zip(entries, probs)]
        if not version_2:
            predictions[ex.qid] = best_span["text"] if best_span else ""
            continue
        if best_span is None:  # every candidate is null (google-research/bert#476): answer "no answer"
            null_odds[ex.qid] = _NULL_ODDS_NO_SPAN
            predictions[ex.qid] = ""
            continue
        diff = null[0] - best_span["score"]
        null_odds[ex.qid] = diff
        predictions[ex.qid] = "" if diff > null_score_diff_threshold else best_span["text"]
    return predictions, nbest_json, null_odds


def _spans(features, indices: list, start_logits, end_logits, n_best_size: int, max_answer_length: int):
    """(candidate spans best first as (score, start_logit, end_logit, char_start, char_end), the null answer's
    (score, start_logit, end_logit): the smallest [CLS] score over the windows, None without one)."""
    candidates, null = [], None
    for fi in indices:
        f, s_logits, e_logits = features[fi], np.asarray(start_logits[fi]), np.asarray(end_logits[fi])
        n = len(f.input_ids)
        s_logits, e_logits = s_logits[:n], e_logits[:n]
        feature_null = float(s_logits[0] + e_logits[0])
        if null is None or feature_null < null[0]:
            null = (feature_null, float(s_logits[0]), float(e_logits[0]))
        top_starts = np.argsort(-s_logits, kind="stable")[:n_best_size]
        top_ends = np.argsort(-e_logits, kind="stable")[:n_best_size]
        for s in top_starts:
            if f.offsets[s] is None or not f.max_context[s]:
                continue
            for e in top_ends:
                if f.offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                    continue
                candidates.append((float(s_logits[s] + e_logits[e]), float(s_logits[s]), float(e_logits[e]),
                                   f.offsets[s][0], f.offsets[e][1]))
    candidates.sort(key=lambda c: -c[0])
    return candidates, null


def tuned_threshold_scores(dataset: list, nbest: dict, null_odds: dict) -> dict:
    """SQuAD v2: the EM and F1 the best --null-score-diff-threshold would give on this dev set, and that threshold.
    evaluate-v2.0.py's best_* sweep the threshold over the predictions as written, so an answer already written as
    "" can never count; here each question's best span is swept instead (an all-null run shows what its spans are
    worth). Tuned on the set it scores: an upper bound, as the official best_* are."""
    from bertkit.finetune.metrics import squad_evaluate

    spans = {qid: next((c["text"] for c in cands if c["text"]), "") for qid, cands in nbest.items()}
    swept = squad_evaluate(dataset, spans, null_odds)
    return {f"tuned_{k}{t}": swept[f"best_{k}{t}"] for k in ("exact", "f1") for t in ("", "_thresh")}


# ---------------------------------------------------------------- the run

def finetune_squad(model_path, train_file, predict_file, cfg, *, version_2: bool = False,
                   max_seq_length: int = 384, window_step: int | None = None, window_overlap: int | None = None,
                   max_query_length: int = 64, n_best_size: int = 20, max_answer_length: int = 30,
                   null_score_diff_threshold: float = 0.0,
                   train_articles: slice | None = None, predict_articles: slice | None = None,
                   every_nth_train_question: int = 1, every_nth_predict_question: int = 1,
                   max_train_questions: int | None = None, max_predict_questions: int | None = None, scorer=None,
                   task: str | None = None) -> dict:
    """`bertkit finetune squad`. Without train_file, only predicts and scores predict_file. `scorer(data,
    predictions, null_odds)` replaces SQuAD's official scores (KorQuAD's own), `task` the name recorded.
    train_articles/predict_articles select articles of each file (e.g. train on one half of dev, score the other)."""
    from bertkit.finetune.metrics import squad_evaluate
    from bertkit.finetune.train import predict, set_seed, train
    from bertkit.models import load_pretrained
    from bertkit.tokenization import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    window = dict(max_seq_length=max_seq_length, window_step=window_step, window_overlap=window_overlap,
                  max_query_length=max_query_length)
    stats = {}
    train_rows = []
    if train_file:
        examples, _ = read_squad(train_file, training=True, version_2=version_2, articles=train_articles,
                                 every_nth_question=every_nth_train_question, max_questions=max_train_questions)
        train_rows = feature_dicts(make_features(examples, tokenizer, True, stats=stats, **window), True)
    dev_examples, dev_data = read_squad(predict_file, training=False, version_2=version_2,
                                        articles=predict_articles, every_nth_question=every_nth_predict_question,
                                        max_questions=max_predict_questions)
    dev_features = make_features(dev_examples, tokenizer, False, **window)
    dev_rows = feature_dicts(dev_features, False)
    set_seed(cfg.seed)  # the new head's initial weights come from the seed too
    model = load_pretrained(model_path, head="question_answering")

    def evaluate(m):
        out = predict(m, dev_rows, cfg.eval_batch_size, outputs=("start_logits", "end_logits"), per_token=True)
        preds, nbest, odds = postprocess(dev_examples, dev_features, out["start_logits"], out["end_logits"],
                                         n_best_size, max_answer_length, version_2, null_score_diff_threshold)
        scores = (scorer or squad_evaluate)(dev_data, preds, odds if version_2 else None)
        if version_2:
            scores.update(tuned_threshold_scores(dev_data, nbest, odds))
        files = {"predictions.json": preds, "nbest_predictions.json": nbest}
        if version_2:
            files["null_odds.json"] = odds
        return scores, files

    settings = {"model": str(model_path), "train_file": str(train_file), "predict_file": str(predict_file),
                "version_2": version_2, **window, "n_best_size": n_best_size,
                "max_answer_length": max_answer_length, "null_score_diff_threshold": null_score_diff_threshold,
                "train_articles": _slice_text(train_articles), "predict_articles": _slice_text(predict_articles),
                "every_nth_train_question": every_nth_train_question,
                "every_nth_predict_question": every_nth_predict_question,
                "train_questions": len(examples) if train_file else 0,
                "train_features": len(train_rows), "predict_questions": len(dev_examples),
                "predict_features": len(dev_rows), **stats}
    task = task or ("squad2" if version_2 else "squad")
    return train(model, train_rows, evaluate, "f1", cfg, task=task, settings=settings, tokenizer_dir=model_path,
                 extra_config={"finetuning_task": task, "bertkit_inputs": {   # what `bertkit predict` reads
                     **window, "version_2": version_2, "n_best_size": n_best_size,
                     "max_answer_length": max_answer_length, "null_score_diff_threshold": null_score_diff_threshold}})


def _slice_text(s: slice | None):
    return None if s is None else f"{s.start or 0}:{'' if s.stop is None else s.stop}"


def parse_articles(text: str | None) -> slice | None:
    """"0:24" -> slice(0, 24): a Python-style range of article indices."""
    if not text:
        return None
    try:
        start, stop = (part.strip() for part in text.split(":"))
        return slice(int(start) if start else None, int(stop) if stop else None)
    except ValueError:
        raise ValueError(f"article range {text!r}: expected START:STOP, e.g. 0:24 or 24:") from None
