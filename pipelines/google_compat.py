"""`make-instances --compat google`: google-research/bert's create_pretraining_data.py, call for call.

One `random.Random(seed)` makes exactly the reference's random calls in its order: a shuffle of all documents, then
per pass and per document the draws of rules 1-6, then one shuffle of all instances. With the same documents in the
same order, the same vocab.txt and seed, the instances are the reference's (it holds everything in memory, as the
reference does). None of bertkit's improvements apply here: random replacements draw from the whole vocabulary,
whole-word masking decides per piece (and a `##` piece after [SEP] joins the word before the [SEP]), and NotNext
may come from the document itself when 10 draws all land on it.
"""
import random
from array import array
from pathlib import Path
from typing import NamedTuple

import numpy as np

from bertkit.fileio import atomic_write_arrow, checksum_file, read_arrow
from bertkit.formats import CorpusColumns, instances_file_name
from bertkit.masking import KIND_KEPT, KIND_MASK, KIND_RANDOM
from bertkit.pipelines.instance_io import (
    instances_table,
    load_stage_tokenizer,
    masking_spec,
    pass_stats,
    single_threaded_tokenizers,
    tokenize_documents,
    word_encoder,
)
from bertkit.progress import tqdm


class Instance(NamedTuple):
    ids: array              # [CLS] A [SEP] B [SEP] after masking
    b_start: int            # index of B's first token
    is_random_next: bool    # NotNext
    positions: array        # masked positions, ascending
    labels: array           # the original ids there
    kinds: array            # KIND_MASK / KIND_KEPT / KIND_RANDOM per position


def truncate_pair(a: list, b: list, max_num: int, rng: random.Random) -> None:
    """Rule 4: trim the longer side (B on a tie), its first or last token with probability 0.5 each."""
    while len(a) + len(b) > max_num:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def mask_google(tokens: list, rng: random.Random, vocab_size: int, cls_id: int, sep_id: int, mask_id: int,
                is_continuation, masked_lm_prob: float, max_predictions: int, whole_word_mask: bool):
    """Rule 6 with the reference's draws: shuffle of candidate groups, then per chosen piece random() < 0.8,
    random() < 0.5, randint(0, V - 1). Returns (output ids, positions, labels, kinds)."""
    groups = []
    for i, t in enumerate(tokens):
        if t == cls_id or t == sep_id:
            continue
        if whole_word_mask and groups and is_continuation[t]:
            groups[-1].append(i)
        else:
            groups.append([i])
    rng.shuffle(groups)
    output = list(tokens)
    n_predict = min(max_predictions, max(1, int(round(len(tokens) * masked_lm_prob))))
    chosen, covered = [], set()
    for group in groups:
        if len(chosen) >= n_predict:
            break
        if len(chosen) + len(group) > n_predict:
            continue
        if any(i in covered for i in group):
            continue
        for i in group:
            covered.add(i)
            if rng.random() < 0.8:
                output[i], kind = mask_id, KIND_MASK
            elif rng.random() < 0.5:
                kind = KIND_KEPT
            else:
                output[i], kind = rng.randint(0, vocab_size - 1), KIND_RANDOM
            chosen.append((i, tokens[i], kind))
    chosen.sort()
    return output, [c[0] for c in chosen], [c[1] for c in chosen], [c[2] for c in chosen]


def instances_from_document(documents: list, doc_index: int, rng: random.Random, config, vocab: dict) -> list:
    """Rules 1-6 for one document of one pass, in the reference's order of random calls."""
    document = documents[doc_index]
    max_num = config.max_seq_length - 3
    target = max_num
    if rng.random() < config.short_seq_prob:
        target = rng.randint(2, max_num)
    out = []
    chunk, length, i = [], 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            a_end = 1
            if len(chunk) >= 2:
                a_end = rng.randint(1, len(chunk) - 1)
            a = [t for seg in chunk[:a_end] for t in seg]
            b = []
            if len(chunk) == 1 or rng.random() < 0.5:
                is_random = True
                for _ in range(10):
                    r = rng.randint(0, len(documents) - 1)
                    if r != doc_index:
                        break
                other = documents[r]
                for j in range(rng.randint(0, len(other) - 1), len(other)):
                    b.extend(other[j])
                    if len(b) >= target - len(a):
                        break
                i -= len(chunk) - a_end          # put the unused segments back
            else:
                is_random = False
                b = [t for seg in chunk[a_end:] for t in seg]
            truncate_pair(a, b, max_num, rng)
            tokens = [vocab["cls"], *a, vocab["sep"], *b, vocab["sep"]]
            ids, pos, labels, kinds = mask_google(
                tokens, rng, vocab["size"], vocab["cls"], vocab["sep"], vocab["mask"], vocab["is_continuation"],
                config.masking.masked_lm_prob, config.masking.max_predictions, config.masking.whole_word_mask)
            out.append(Instance(array("i", ids), len(a) + 2, is_random, array("i", pos), array("i", labels),
                                array("b", kinds)))
            chunk, length = [], 0
        i += 1
    return out


def google_instances(documents: list, vocab: dict, config, seed: int, passes: int, progress: bool = False):
    """All instances of the reference for `documents` (lists of segments of ids, empty ones already dropped).

    Returns (instances after the final shuffle, instances per pass)."""
    rng = random.Random(seed)
    documents = list(documents)
    rng.shuffle(documents)
    instances, per_pass = [], []
    for _ in tqdm(range(passes), desc="make-instances --compat google", unit="pass", plain=not progress):
        before = len(instances)
        for d in range(len(documents)):
            instances.extend(instances_from_document(documents, d, rng, config, vocab))
        per_pass.append(len(instances) - before)
    rng.shuffle(instances)
    return instances, per_pass


def read_documents(shards, tokenizer_dir) -> list:
    """Documents of the corpus shards, in order, as lists of non-empty segments (lists of ids)."""
    documents = []
    for path in shards:
        tokens, seg_start, doc_seg = tokenize_documents(word_encoder(tokenizer_dir),
                                                        read_arrow(path).column(CorpusColumns.SENTENCES))
        tokens, seg_start = tokens.tolist(), seg_start.tolist()
        for d in range(len(doc_seg) - 1):
            documents.append([tokens[seg_start[s]:seg_start[s + 1]] for s in range(doc_seg[d], doc_seg[d + 1])])
    return documents


def make_instances_google(train, holdout, tokenizer_dir, out: Path, config, progress: bool) -> list[dict]:
    """The compat stage: one Random(seed) for the train split (the reference's run), another for holdout."""
    with single_threaded_tokenizers():   # single process, single core, like the reference
        _, vocab_tokens = load_stage_tokenizer(tokenizer_dir)
        spec = masking_spec(vocab_tokens, config.masking)   # the config holds the reference's switches
        vocab = {"size": len(vocab_tokens), "cls": spec.cls_id, "sep": spec.sep_id, "mask": spec.mask_id,
                 "is_continuation": spec.is_continuation.tolist()}
        entries = []
        for split, shards, passes in (("train", train, config.passes), ("holdout", holdout, config.holdout_dupe)):
            if not shards:
                continue
            documents = read_documents(shards, tokenizer_dir)
            instances, per_pass = google_instances(documents, vocab, config, config.seed, passes, progress)
            del documents
            for f, start in enumerate(range(0, max(1, len(instances)), config.rows_per_file)):
                part = instances[start:start + config.rows_per_file]
                name = instances_file_name(split, f)
                table, stats = _table_and_stats(part, vocab["size"], config, spec)
                stats["instances_by_pass"] = per_pass if f == 0 else [0] * len(per_pass)
                atomic_write_arrow(out / name, table)
                entries.append({"file": name, "split": split, "rows": table.num_rows,
                                "bytes": (out / name).stat().st_size, "checksum": checksum_file(out / name),
                                "pass": None, "stats": stats})
            del instances
        return entries


def _table_and_stats(part: list[Instance], vocab_size, config, spec):
    def flat(field, dtype):
        arrays = [getattr(p, field) for p in part]
        values = np.frombuffer(b"".join(a.tobytes() for a in arrays), dtype=dtype)
        offsets = np.concatenate([[0], np.cumsum([len(a) for a in arrays])]).astype(np.int64)
        return values, offsets

    ids, offsets = flat("ids", np.int32)
    pos, pred_off = flat("positions", np.int32)
    labels, _ = flat("labels", np.int32)
    kinds, _ = flat("kinds", np.int8)
    b_start = np.array([p.b_start for p in part], dtype=np.int64)
    not_next = np.array([p.is_random_next for p in part], dtype=bool)
    table = instances_table(ids, offsets, b_start, not_next, vocab_size, (pos, labels, pred_off))
    return table, pass_stats(offsets, b_start, not_next, config.max_seq_length, spec, kinds)
