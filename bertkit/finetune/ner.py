"""Token tagging (NER) from CoNLL-style files: one `word ... tag` line per token (tag in the last column), blank
lines between sentences, -DOCSTART- lines ignored. The first piece of each word carries the word's tag; the other
pieces are ignored by the loss (IGNORE_INDEX) and at prediction time. Scores are entity-level P/R/F1 over IOB2 spans.
"""
from dataclasses import dataclass
from pathlib import Path

from bertkit.errors import DataError
from bertkit.finetune import metrics as M
from bertkit.finetune.classify import read_utf8
from bertkit.formats import IGNORE_INDEX


@dataclass
class TaggedSentence:
    line: int        # line of the sentence's first word
    words: list
    tags: list


def read_conll(path) -> list:
    path = Path(path)
    text = read_utf8(path)
    sentences, words, tags, first, width = [], [], [], 0, None
    for n, raw in enumerate(text.split("\n"), 1):  # "\n" only: CoNLL words may hold other line breaks
        fields = raw.split()
        if not fields or fields[0] == "-DOCSTART-":
            if words:
                sentences.append(TaggedSentence(first, words, tags))
            words, tags = [], []
            continue
        if len(fields) < 2:
            raise DataError(f"{path}:{n}: expected `word ... tag` (at least 2 whitespace-separated fields), "
                            f"got {raw.strip()!r}")
        width = width or (len(fields), n)
        if len(fields) != width[0]:  # the tag is the last column: a line with one more or fewer has another there
            raise DataError(f"{path}:{n}: {len(fields)} whitespace-separated fields, but line {width[1]} has "
                            f"{width[0]}; every word line needs the same columns (the tag last): {raw.strip()!r}")
        if not words:
            first = n
        words.append(fields[0])
        tags.append(fields[-1])
    if words:
        sentences.append(TaggedSentence(first, words, tags))
    if not sentences:
        raise DataError(f"{path}: no sentences (empty file, or not CoNLL format)")
    return sentences


def tag_list(sentences: list) -> list:
    """Training tags, "O" first, then by entity type and prefix."""
    tags = {t for s in sentences for t in s.tags}
    return sorted(tags, key=lambda t: (t != "O", t.split("-", 1)[-1], t))


def check_tags(sentences: list, tags: list, path) -> None:
    known = set(tags)
    for s in sentences:
        for i, t in enumerate(s.tags):
            if t not in known:
                raise DataError(f"{path}:{s.line + i}: tag {t!r} never appears in the training file "
                                f"(training tags: {tags})")


def encode(sentences: list, tokenizer, max_seq_length: int, tags: list | None = None) -> tuple:
    """-> (feature dicts, first_piece) where first_piece[i][w] is the input position of word w's first piece
    (None when the word was cut by max_seq_length or produced no piece)."""
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_seq_length)
    encodings = tokenizer.encode_batch([s.words for s in sentences], is_pretokenized=True, add_special_tokens=True)
    tokenizer.no_truncation()
    index = {t: i for i, t in enumerate(tags)} if tags is not None else None
    rows, first_piece = [], []
    for s, enc in zip(sentences, encodings):
        firsts = [None] * len(s.words)
        labels = [IGNORE_INDEX] * len(enc.ids)
        previous = None
        for pos, word in enumerate(enc.word_ids):
            if word is not None and word != previous:
                firsts[word] = pos
                if index is not None:
                    labels[pos] = index[s.tags[word]]
            previous = word
        row = {"input_ids": enc.ids, "token_type_ids": enc.type_ids}
        if index is not None:
            row["labels"] = labels
        rows.append(row)
        first_piece.append(firsts)
    return rows, first_piece


def decode(logits: list, first_piece: list, tags: list) -> tuple:
    """Per-word predicted tags from per-token logits; words without a piece get "O". -> (tags, words_cut)."""
    predicted, cut = [], 0
    for token_logits, firsts in zip(logits, first_piece):
        best = token_logits.argmax(-1)
        sentence = []
        for pos in firsts:
            if pos is None:
                cut += 1
                sentence.append("O")
            else:
                sentence.append(tags[int(best[pos])])
        predicted.append(sentence)
    return predicted, cut


def finetune_ner(model_path, train_file, dev_file, cfg, max_seq_length: int = 128) -> dict:
    """`bertkit finetune ner`."""
    from bertkit.finetune.train import predict, set_seed, train
    from bertkit.models import load_pretrained
    from bertkit.tokenization import load_tokenizer

    train_sentences = read_conll(train_file) if train_file else []
    dev_sentences = read_conll(dev_file)
    tags = tag_list(train_sentences) if train_sentences else None
    if tags is None:
        raise DataError("ner needs --train-file (the tag set comes from it)")
    check_tags(dev_sentences, tags, dev_file)
    tokenizer = load_tokenizer(model_path)
    train_rows, _ = encode(train_sentences, tokenizer, max_seq_length, tags)
    dev_rows, dev_firsts = encode(dev_sentences, tokenizer, max_seq_length)
    set_seed(cfg.seed)  # the new head's initial weights come from the seed too
    model = load_pretrained(model_path, head="token_classification", num_labels=len(tags))
    gold = [s.tags for s in dev_sentences]

    def evaluate(m):
        logits = predict(m, dev_rows, cfg.eval_batch_size, per_token=True)["logits"]
        predicted, cut = decode(logits, dev_firsts, tags)
        result = M.entity_scores(gold, predicted)
        result["words_cut_by_max_seq_length"] = cut
        return result, {"dev_predictions.json": [{"words": s.words, "gold": s.tags, "predicted": ps}
                                                 for s, ps in zip(dev_sentences, predicted)]}

    extra = {"finetuning_task": "ner", "bertkit_inputs": {"max_seq_length": max_seq_length},
             "id2label": {str(i): t for i, t in enumerate(tags)},
             "label2id": {t: i for i, t in enumerate(tags)}}
    settings = {"model": str(model_path), "max_seq_length": max_seq_length, "tags": tags,
                "train_file": str(train_file), "dev_file": str(dev_file)}
    return train(model, train_rows, evaluate, "f1", cfg, task="ner", settings=settings,
                 tokenizer_dir=model_path, extra_config=extra)
