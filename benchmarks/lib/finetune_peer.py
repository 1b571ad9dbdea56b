"""The transformers side of the fine-tuning head-to-head (benchmarks/studies/finetune_parity.py).

transformers' model classes and fast tokenizer, the preprocessing and post-processing of transformers' own examples
(run_qa.py + utils_qa.py: offset-mapping windows overlapping by `doc_stride` tokens, n-best spans; run_glue.py;
run_ner.py: the first piece of each word labelled), and Trainer's optimisation (AdamW, eps 1e-8, no decay on biases
and LayerNorm weights, linear warmup from 0 then linear decay, clipping), in a plain loop. The data come from
bertkit's readers and the scores from bertkit's official metrics, so only what a user's recipe does differs.
"""
import collections
import io
import math
import os
import random
import time

import numpy as np
import torch

from bertkit.fileio import atomic_write_bytes


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train_loop(model, batches: "ShuffledBatches", total_steps: int, lr: float, weight_decay: float,
               warmup_ratio: float, max_grad_norm: float, state_path=None, every_s: float = 600.0):
    """Trainer's optimisation: AdamW (eps 1e-8; fused, Trainer's default `adamw_torch_fused` since torch 2.8) with
    decay on all but biases and LayerNorm weights, linear warmup over ceil(ratio x steps) from 0, then linear decay
    to 0. With state_path, the loop saves its state there every `every_s` seconds and a later call with the same
    inputs continues from it, ending where an unkilled run ends (a SQuAD cell outlasts a session). Returns the
    seconds a killed earlier run had trained before its last save (0 when it starts afresh)."""
    from transformers import get_linear_schedule_with_warmup

    no_decay = ("bias", "LayerNorm.weight")
    groups = [{"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)],
               "weight_decay": weight_decay},
              {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)],
               "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=lr, eps=1e-8, fused=True)
    scheduler = get_linear_schedule_with_warmup(optimizer, math.ceil(warmup_ratio * total_steps), total_steps)
    step, skip, earlier = 0, 0, 0.0
    if state_path is not None and os.path.isfile(state_path):
        state = torch.load(state_path, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        batches.gen.set_state(state["epoch_gen"])
        torch.set_rng_state(state["rng"])
        step, skip, earlier = state["step"], state["done_in_epoch"], state["elapsed_s"]
        print(f"peer: resuming at step {step} of {total_steps}", flush=True)
    t0, last_save = time.time() - earlier, time.time()
    model.train()
    while step < total_steps:
        epoch_gen = batches.gen.get_state()
        for done_in_epoch, batch in enumerate(batches.epoch(skip), start=skip + 1):
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step >= total_steps:
                break
            if state_path is not None and time.time() - last_save >= every_s:
                state = {"step": step, "done_in_epoch": done_in_epoch, "epoch_gen": epoch_gen,
                         "rng": torch.get_rng_state(), "elapsed_s": time.time() - t0, "model": model.state_dict(),
                         "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
                buffer = io.BytesIO()
                torch.save(state, buffer)
                atomic_write_bytes(state_path, buffer.getvalue())
                last_save = time.time()
                print(f"peer: step {step} of {total_steps}, loss {loss.item():.4f}, saved", flush=True)  # progress
        skip = 0
    model.eval()
    return earlier


class ShuffledBatches:
    """A new shuffled order every epoch (as Trainer's RandomSampler), from the seed; `gen` is the generator, whose
    state at an epoch's start says that epoch's order."""

    def __init__(self, rows: list, batch_size: int, collate, seed: int):
        self.rows, self.batch_size, self.collate = rows, batch_size, collate
        self.gen = torch.Generator().manual_seed(seed)

    def epoch(self, skip: int = 0):
        """This epoch's batches, the first `skip` left out (drawn, not collated)."""
        order = torch.randperm(len(self.rows), generator=self.gen).tolist()
        for i in range(skip * self.batch_size, len(self.rows), self.batch_size):
            yield self.collate([self.rows[j] for j in order[i:i + self.batch_size]])


def pad(rows: list, tokenizer) -> dict:
    """DataCollatorWithPadding: right-pad to the longest row."""
    return tokenizer.pad(rows, return_tensors="pt")


# ---------------------------------------------------------------- SQuAD (run_qa.py, utils_qa.py)

def squad_windows(tok, examples, s: dict):
    """run_qa.py's windows: question then context, the context cut into max_length windows overlapping by
    doc_stride tokens, padded to max_length, with offset mappings."""
    return tok([ex.question.lstrip() for ex in examples], [ex.context for ex in examples],
               truncation="only_second", max_length=s["max_seq_length"], stride=s["doc_stride"],
               return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length")


def squad_train_rows(tok, train_examples, enc) -> list[dict]:
    """run_qa.py's prepare_train_features on the examples' windows (`enc`, from squad_windows): each window labelled
    with the answer's first and last token, or with [CLS] where the answer is not wholly inside it or the question
    has none (v2)."""
    rows = []
    for i, offsets in enumerate(enc["offset_mapping"]):
        ids, seq = enc["input_ids"][i], enc.sequence_ids(i)
        ex = train_examples[enc["overflow_to_sample_mapping"][i]]
        start_pos = end_pos = ids.index(tok.cls_token_id)
        if ex.answers and not ex.is_impossible:
            text, char_start = ex.answers[0]
            char_end = char_start + len(text)
            first = seq.index(1)
            last = len(seq) - 1 - seq[::-1].index(1)
            if offsets[first][0] <= char_start and offsets[last][1] >= char_end:
                while first < len(offsets) and offsets[first][0] <= char_start:
                    first += 1
                while offsets[last][1] >= char_end:
                    last -= 1
                start_pos, end_pos = first - 1, last + 1
        rows.append({"input_ids": ids, "token_type_ids": enc["token_type_ids"][i],
                     "attention_mask": enc["attention_mask"][i], "start_positions": start_pos,
                     "end_positions": end_pos})
    return rows


def squad(model_dir, train_examples, dev_examples, s, version_2: bool, state_path=None):
    """-> (predictions, null odds, best spans, seconds a killed earlier run had trained)."""
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    set_seed(s["seed"])
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir)

    rows = squad_train_rows(tok, train_examples, squad_windows(tok, train_examples, s))
    steps = math.ceil(len(rows) / s["batch_size"]) * s["epochs"]
    collate = lambda b: {k: torch.tensor([r[k] for r in b]) for k in b[0]}  # noqa: E731 (padded to max_length)
    earlier = train_loop(model, ShuffledBatches(rows, s["batch_size"], collate, s["seed"]), int(steps), s["lr"],
                         s["weight_decay"], s["warmup_ratio"], s["max_grad_norm"], state_path)

    enc = squad_windows(tok, dev_examples, s)
    features = []
    for i in range(len(enc["input_ids"])):
        seq = enc.sequence_ids(i)
        offsets = [o if seq[k] == 1 else None for k, o in enumerate(enc["offset_mapping"][i])]
        features.append((enc["overflow_to_sample_mapping"][i], offsets))
    starts, ends = [], []
    with torch.no_grad():
        for i in range(0, len(features), 64):
            batch = {k: torch.tensor(enc[k][i:i + 64]) for k in ("input_ids", "token_type_ids", "attention_mask")}
            out = model(**batch)
            starts += list(out.start_logits.numpy())
            ends += list(out.end_logits.numpy())
    return (*postprocess_qa(dev_examples, features, starts, ends, s["n_best_size"], s["max_answer_length"],
                           version_2), earlier)


def postprocess_qa(examples, features, starts, ends, n_best: int, max_answer_length: int, version_2: bool):
    """utils_qa.postprocess_qa_predictions: the best span over an example's windows by start + end logit; for v2
    the smallest null ([CLS]) score, and "" when it beats the best span (threshold 0).
    -> (predictions, null_odds, {qid: its best span's text, null or not})"""
    by_example = collections.defaultdict(list)
    for i, (ex_index, _) in enumerate(features):
        by_example[ex_index].append(i)
    predictions, null_odds, spans = {}, {}, {}
    for ex_index, ex in enumerate(examples):
        best, null = None, None
        for fi in by_example[ex_index]:
            offsets, s_log, e_log = features[fi][1], starts[fi], ends[fi]
            feature_null = s_log[0] + e_log[0]
            null = feature_null if null is None or feature_null < null else null
            for a in np.argsort(s_log)[-1:-n_best - 1:-1]:
                for b in np.argsort(e_log)[-1:-n_best - 1:-1]:
                    if offsets[a] is None or offsets[b] is None or b < a or b - a + 1 > max_answer_length:
                        continue
                    score = s_log[a] + e_log[b]
                    if best is None or score > best[0]:
                        best = (score, ex.context[offsets[a][0]:offsets[b][1]])
        text = spans[ex.qid] = best[1] if best else ""
        if version_2:
            diff = float(null - best[0]) if best else 1e4
            null_odds[ex.qid] = diff
            text = "" if diff > 0 else text
        predictions[ex.qid] = text
    return predictions, null_odds, spans


# ---------------------------------------------------------------- GLUE (run_glue.py)

def classify(model_dir, train_examples, dev_examples, labels, s):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    set_seed(s["seed"])
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=len(labels))

    def rows(examples, with_labels: bool):
        a = [ex.text_a for ex in examples]
        b = [ex.text_b for ex in examples] if examples[0].text_b is not None else None
        enc = tok(a, b, truncation=True, max_length=s["max_seq_length"])
        out = [{k: enc[k][i] for k in enc} for i in range(len(examples))]
        if with_labels:
            for r, ex in zip(out, examples):
                r["labels"] = labels.index(ex.label)
        return out

    train_rows = rows(train_examples, True)
    steps = math.ceil(len(train_rows) / s["batch_size"]) * s["epochs"]
    train_loop(model, ShuffledBatches(train_rows, s["batch_size"], lambda b: pad(b, tok), s["seed"]), int(steps),
               s["lr"], s["weight_decay"], s["warmup_ratio"], s["max_grad_norm"])
    dev_rows = rows(dev_examples, False)
    preds = []
    with torch.no_grad():
        for i in range(0, len(dev_rows), 64):
            preds += model(**pad(dev_rows[i:i + 64], tok)).logits.argmax(-1).tolist()
    return preds


# ---------------------------------------------------------------- CoNLL-2003 (run_ner.py)

def ner(model_dir, train_sentences, dev_sentences, tags, s):
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    set_seed(s["seed"])
    model = AutoModelForTokenClassification.from_pretrained(model_dir, num_labels=len(tags))

    def rows(sentences, with_labels: bool):
        enc = tok([x.words for x in sentences], truncation=True, max_length=s["max_seq_length"],
                  is_split_into_words=True)
        out, firsts = [], []
        for i, x in enumerate(sentences):
            words, previous, labels, first = enc.word_ids(i), None, [], {}
            for pos, w in enumerate(words):
                labels.append(tags.index(x.tags[w]) if w is not None and w != previous else -100)
                if w is not None and w != previous:
                    first[w] = pos
                previous = w
            r = {k: enc[k][i] for k in enc}
            if with_labels:
                r["labels"] = labels
            out.append(r)
            firsts.append(first)
        return out, firsts

    train_rows, _ = rows(train_sentences, True)

    def collate(batch):
        width = max(len(r["input_ids"]) for r in batch)
        labels = [r.pop("labels") + [-100] * (width - len(r["input_ids"])) for r in batch]
        out = pad(batch, tok)
        for r, lab in zip(batch, labels):
            r["labels"] = lab[:len(r["input_ids"])]
        out["labels"] = torch.tensor(labels)
        return out

    steps = math.ceil(len(train_rows) / s["batch_size"]) * s["epochs"]
    train_loop(model, ShuffledBatches(train_rows, s["batch_size"], collate, s["seed"]), int(steps), s["lr"],
               s["weight_decay"], s["warmup_ratio"], s["max_grad_norm"])
    dev_rows, firsts = rows(dev_sentences, False)
    predicted = []
    with torch.no_grad():
        for i in range(0, len(dev_rows), 64):
            logits = model(**pad(dev_rows[i:i + 64], tok)).logits.argmax(-1)
            for j, first in enumerate(firsts[i:i + 64]):
                predicted.append([tags[int(logits[j, first[w]])] if w in first else "O"
                                  for w in range(len(dev_sentences[i + j].words))])
    return predicted
