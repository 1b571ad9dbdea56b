"""Korean benchmarks from their official files as published, each scored with its official metric.

- klue-nli: klue/klue-nli-v1.1/klue-nli-v1.1_{train,dev}.json; accuracy.
- kornli: kornlu/KorNLI/xnli.{dev,test}.ko.tsv (its train set is not here: trains on dev, scores test); accuracy.
- nsmc: nsmc/ratings_test.txt (only the test file is here: its first 40,000 rows train, the last 10,000 score);
  accuracy.
- korsts: kornlu/KorSTS/sts-{train,dev}.tsv; Pearson and Spearman.
- klue-sts: trains on KorSTS train (KLUE-STS train is not here), scores klue/klue-sts-v1.1/klue-sts-v1.1_dev.json;
  Pearson, Spearman and, as KLUE reports it, F1 of the binary label (a prediction of 3.0 or more is "similar").
- klue-ner: klue/klue-ner-v1.1/klue-ner-v1.1_dev.tsv, character-level BIO (KLUE-NER train is not here: its first
  4,000 sentences train, the last 1,000 score); tags go from characters to tokens (a token takes its first
  character's) and predictions back to characters; KLUE's entity-level and character-level macro F1.
- korquad: korquad_v1.0/KorQuAD_v1.0_dev.json (only dev is here: articles 0-99 train, 100-139 score); KorQuAD's
  own EM and character F1.

`--train-file` / `--dev-file` replace a task's files (the official train set where a user has it); the published
file a task cut in two is then read whole. The readers
accept what the files really hold: KLUE-NLI names the source field `genre` in train and `source` in dev; KorSTS
quotes nothing (a sentence may hold a bare `"`) and writes `main-forum` in train, `main-forums` in dev/test;
KLUE-STS's JSON has CRLF line ends.
"""
import json
from dataclasses import dataclass
from pathlib import Path

from bertkit.errors import DataError
from bertkit.finetune import metrics as M
from bertkit.finetune.classify import TextExample, read_table, read_utf8, run_classification

NLI_LABELS = ("contradiction", "entailment", "neutral")  # sorted, as label_list gives them


@dataclass(frozen=True)
class KoreanTask:
    train: str
    dev: str
    labels: tuple | None        # None: regression
    metric: str                 # the one that picks the epoch under --select validation
    train_rows: slice | None = None   # a part of the train file (NSMC: one file split in two)
    dev_rows: slice | None = None


TASKS = {
    "klue-nli": KoreanTask("klue/klue-nli-v1.1/klue-nli-v1.1_train.json", "klue/klue-nli-v1.1/klue-nli-v1.1_dev.json",
                           NLI_LABELS, "accuracy"),
    "kornli": KoreanTask("kornlu/KorNLI/xnli.dev.ko.tsv", "kornlu/KorNLI/xnli.test.ko.tsv", NLI_LABELS, "accuracy"),
    "nsmc": KoreanTask("nsmc/ratings_test.txt", "nsmc/ratings_test.txt", ("0", "1"), "accuracy",
                       slice(0, 40_000), slice(40_000, None)),
    "korsts": KoreanTask("kornlu/KorSTS/sts-train.tsv", "kornlu/KorSTS/sts-dev.tsv", None, "pearson"),
    "klue-sts": KoreanTask("kornlu/KorSTS/sts-train.tsv", "klue/klue-sts-v1.1/klue-sts-v1.1_dev.json", None,
                           "pearson"),
}
KORQUAD = "korquad_v1.0/KorQuAD_v1.0_dev.json"


def read_examples(path) -> list:
    """TextExamples (text_a, text_b, label) from any of the tasks' file layouts, recognised by name and content;
    a KLUE-STS example also carries its binary label (`binary`)."""
    path = Path(path)
    if path.suffix == ".json":
        return _read_klue_json(path)
    head = read_utf8(path).split("\n", 1)[0].rstrip("\r").split("\t") if path.is_file() else []
    for columns in (("premise", "hypothesis", "gold_label"), ("sentence1", "sentence2", "gold_label"),
                    ("sentence1", "sentence2", "score"), ("document", None, "label")):
        if all(c in head for c in columns if c):
            return read_table(path, *columns, header=True, fmt="tsv")
    raise DataError(f"{path}: not a KorNLI, KorSTS or NSMC file (its header is {head}); see `bertkit finetune "
                    "korean --help` for the files each task reads")


def _read_klue_json(path: Path) -> list:
    try:
        rows = json.loads(read_utf8(path))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not a readable KLUE JSON file ({e})") from None
    if not isinstance(rows, list):
        raise DataError(f"{path}: expected a list of examples (the KLUE layout)")
    examples = []
    for i, r in enumerate(rows):
        where = f"{path}: example {i + 1}" + (f" (guid {r['guid']})" if isinstance(r, dict) and "guid" in r else "")
        if not isinstance(r, dict):
            raise DataError(f"{where}: not an object but {type(r).__name__} {r!r:.60}")
        if "premise" in r:  # KLUE-NLI: gold_label; the source field is `genre` in train, `source` in dev
            if not all(isinstance(r.get(k), str) for k in ("premise", "hypothesis", "gold_label")):
                raise DataError(f"{where}: needs premise, hypothesis and gold_label as text")
            examples.append(TextExample(i + 1, r["premise"], r["hypothesis"], r["gold_label"]))
        elif "sentence1" in r:  # KLUE-STS: labels.label (0-5) and labels.binary-label
            if not all(isinstance(r.get(k), str) for k in ("sentence1", "sentence2")):
                raise DataError(f"{where}: needs sentence1 and sentence2 as text")
            labels = r.get("labels") if isinstance(r.get("labels"), dict) else {}
            if not isinstance(labels.get("label"), (int, float)) or labels.get("binary-label") not in (0, 1):
                raise DataError(f"{where}: needs labels.label (a score) and labels.binary-label (0 or 1)")
            examples.append(TextExample(i + 1, r["sentence1"], r["sentence2"], str(labels["label"]),
                                        labels["binary-label"]))
        else:
            raise DataError(f"{where}: neither a KLUE-NLI (premise/hypothesis) nor a KLUE-STS (sentence1/2) example")
    if not examples:
        raise DataError(f"{path}: no examples")
    return examples


def check_pairs(examples: list, task: str, path) -> None:
    """NSMC scores single texts, the others sentence pairs: another task's file stops here, said as such, rather
    than at its first label."""
    pairs = task != "nsmc"
    if examples and (examples[0].text_b is not None) != pairs:
        held = "single texts (NSMC's layout)" if pairs else "sentence pairs"  # the other kind
        raise DataError(f"{path}: holds {held}, but {task} takes {'sentence pairs' if pairs else 'single texts'}; "
                        f"give {task}'s own file")


def check_labels(examples: list, labels: tuple | None, path) -> None:
    """A label outside the task's set (or a score outside 0-5) stops naming the file, line and label."""
    for ex in examples:
        if labels is None:
            try:
                ok = 0.0 <= float(ex.label) <= 5.0
            except ValueError:
                ok = False
        else:
            ok = ex.label in labels
        if not ok:
            expected = "a score from 0 to 5" if labels is None else " or ".join(map(repr, labels))
            raise DataError(f"{path}:{ex.line}: label {ex.label!r} is not the task's ({expected})")


def sts_metrics(preds, golds, binary=None) -> dict:
    out = {"pearson": M.pearson(preds, golds), "spearman": M.spearman(preds, golds)}
    if binary is not None:  # KLUE-STS: the binarised label at threshold 3.0
        out["f1"] = M.binary_f1([int(p >= 3.0) for p in preds], binary, positive=1)
    return out


def task_files(task: str, data_dir=None, train_file=None, dev_file=None) -> tuple[Path, Path]:
    """(train file, dev file) of a task: the user's, else the published ones under `data_dir`. A missing one stops
    here, naming the path and the fix, before any model is loaded (`--task all` checks every task first)."""
    train_rel, dev_rel = ((TASKS[task].train, TASKS[task].dev) if task in TASKS
                          else {"klue-ner": (KLUE_NER, KLUE_NER), "korquad": (KORQUAD, KORQUAD)}[task])
    return _published_file(train_file, data_dir, train_rel), _published_file(dev_file, data_dir, dev_rel)


def _published_file(given, data_dir, relative: str) -> Path:
    """The file the user gave, else the published one under `data_dir`, which must be there."""
    if given:
        return Path(given)
    folder = relative.split("/")[0]
    if data_dir is None:
        raise DataError(f"no data folder for {relative}: pass the folder holding {folder}/ as published as "
                        "--data-dir, or your own files with --train-file and --dev-file")
    path = Path(data_dir) / relative
    if not path.is_file():
        raise DataError(f"{path}: not found; give --data-dir the folder that holds {folder}/ as published (its "
                        f"{relative} inside), or give the files with --train-file / --dev-file")
    return path


def official_examples(task: str, split: str, data_dir) -> list:
    """A task's "train" or "dev" examples from the published file in `data_dir`, cut to the task's split (only
    that split's file is read)."""
    spec = TASKS[task]
    return split_rows(spec, split, read_examples(_published_file(None, data_dir, getattr(spec, split))))


def split_rows(spec: KoreanTask, split: str, examples: list) -> list:
    """The part of a published file that is the task's "train" or "dev" split (NSMC: one file holds both)."""
    return examples[getattr(spec, f"{split}_rows") or slice(None)]


def read_both(read, task: str, data_dir=None, train_file=None, dev_file=None) -> tuple:
    """((train, path), (dev, path)) as `read` gives them; one file for both (NSMC's, KLUE-NER's) is read once."""
    train_path, dev_path = task_files(task, data_dir, train_file, dev_file)
    train = read(train_path)
    return (train, train_path), (train if dev_path == train_path else read(dev_path), dev_path)


def task_examples(task: str, data_dir=None, train_file=None, dev_file=None) -> tuple:
    """((train examples, path), (dev examples, path)): the published files cut to the task's split, or the user's
    file(s); with a file of one's own the published one is read whole (it was cut only to make two splits of one)."""
    spec = TASKS[task]
    (train, train_path), (dev, dev_path) = read_both(read_examples, task, data_dir, train_file, dev_file)
    if train_file or dev_file:
        return (train, train_path), (dev, dev_path)
    return (split_rows(spec, "train", train), train_path), (split_rows(spec, "dev", dev), dev_path)


def finetune_korean(task: str, data_dir, model_path, cfg, max_seq_length: int = 128, train_file=None,
                    dev_file=None, max_train_rows: int | None = None, max_dev_rows: int | None = None) -> dict:
    """`bertkit finetune korean --task TASK` (korquad goes through finetune_korquad); max_*_rows keep the first
    rows only (a quick look, not a score to report)."""
    if task not in TASKS:
        raise DataError(f"unknown Korean task {task!r}; one of {sorted(TASKS) + ['korquad']}")
    spec = TASKS[task]
    (train, train_path), (dev, dev_path) = task_examples(task, data_dir, train_file, dev_file)
    train, dev = train[:max_train_rows], dev[:max_dev_rows]  # a quick look: the first rows only
    for examples, path in ((train, train_path), (dev, dev_path)):
        check_pairs(examples, task, path)
        check_labels(examples, spec.labels, path)
    labels = list(spec.labels) if spec.labels else None
    binary = [ex.binary for ex in dev] if all(ex.binary is not None for ex in dev) else None

    def metric(preds, golds):
        if labels is None:
            return sts_metrics(preds, golds, binary)
        return {"accuracy": M.accuracy(preds, golds)}

    return run_classification(model_path, train, dev, labels, cfg, task=task, metric_fn=metric,
                              best_metric=spec.metric, max_seq_length=max_seq_length, train_file=train_path,
                              dev_file=dev_path, settings={"korean_task": task})


def finetune_korquad(data_dir, model_path, cfg, train_file=None, dev_file=None, max_train_rows: int | None = None,
                     max_dev_rows: int | None = None, **squad) -> dict:
    """KorQuAD 1.0 through the SQuAD path (windows over character offsets) with KorQuAD's own EM/F1. Only dev is
    here: by default articles 0-99 train and 100-139 score. max_*_rows keep the first questions only (a quick
    look, not a score to report)."""
    from bertkit.finetune.metrics import korquad_evaluate
    from bertkit.finetune.squad import finetune_squad

    train_path, dev_path = task_files("korquad", data_dir, train_file, dev_file)
    if not train_file and not dev_file:
        squad.setdefault("train_articles", slice(0, 100))
        squad.setdefault("predict_articles", slice(100, None))
    return finetune_squad(model_path, train_path, dev_path, cfg, scorer=korquad_evaluate, task="korquad",
                          max_train_questions=max_train_rows, max_predict_questions=max_dev_rows, **squad)


# ---------------------------------------------------------------- KLUE-NER: character-level BIO

KLUE_NER = "klue/klue-ner-v1.1/klue-ner-v1.1_dev.tsv"
KLUE_NER_TAGS = tuple(f"{p}-{k}" for k in ("DT", "LC", "OG", "PS", "QT", "TI") for p in "BI") + ("O",)


@dataclass
class CharSentence:
    guid: str
    line: int            # of its first character, 1-based
    chars: list
    tags: list


def read_klue_ner(path) -> list:
    """Sentences of KLUE-NER's TSV: `## guid<TAB>tagged text` heads each one, then one `char<TAB>tag` line per
    character (a space is a character, tagged O); a blank line ends it; other `##` lines are the file's notes."""
    path = Path(path)
    sentences, current = [], None
    for n, raw in enumerate(read_utf8(path).split("\n"), 1):
        line = raw.rstrip("\r")
        if line.startswith("##"):
            head = line[2:].strip().split("\t", 1)
            if len(head) == 2 and head[0].startswith("klue-ner"):
                current = CharSentence(head[0], n + 1, [], [])
            continue
        if not line:
            if current is not None and current.chars:
                sentences.append(current)
            current = None
            continue
        if current is None:
            raise DataError(f"{path}:{n}: a character line outside a sentence (no `## guid` line before it); "
                            "KLUE-NER's TSV heads each sentence with `## klue-ner-v1.1_..._00000<TAB>text`, then one "
                            "`character<TAB>tag` line per character (a word-level CoNLL file is `finetune ner`'s)")
        char, sep, tag = line.rpartition("\t")
        if not sep or len(char) != 1:
            raise DataError(f"{path}:{n}: expected one character, a tab and its tag; got {line!r}")
        if tag not in KLUE_NER_TAGS:
            raise DataError(f"{path}:{n}: tag {tag!r} is not KLUE-NER's ({', '.join(KLUE_NER_TAGS)})")
        current.chars.append(char)
        current.tags.append(tag)
    if current is not None and current.chars:
        sentences.append(current)
    if not sentences:
        raise DataError(f"{path}: no sentences; is this KLUE-NER's character-level TSV?")
    return sentences


def encode_char_tags(sentences: list, tokenizer, max_seq_length: int, with_labels: bool) -> tuple:
    """-> (rows, spans): each token labelled with its first character's tag; spans[i] the (start, end) character
    span of each input position (None for [CLS]/[SEP])."""
    from bertkit.formats import IGNORE_INDEX

    index = {t: i for i, t in enumerate(KLUE_NER_TAGS)}
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_seq_length)
    encodings = tokenizer.encode_batch(["".join(s.chars) for s in sentences], add_special_tokens=True)
    tokenizer.no_truncation()
    rows, spans = [], []
    for s, enc in zip(sentences, encodings):
        span = [o if t is not None else None for o, t in zip(enc.offsets, enc.word_ids)]
        row = {"input_ids": enc.ids, "token_type_ids": enc.type_ids}
        if with_labels:
            row["labels"] = [index[s.tags[o[0]]] if o is not None and o[1] > o[0] else IGNORE_INDEX for o in span]
        rows.append(row)
        spans.append(span)
    return rows, spans


def decode_char_tags(logits: list, spans: list, sentences: list) -> list:
    """Per-character tags: a token's tag on its first character, I- of its type on the rest, O where no token is."""
    out = []
    for token_logits, span, s in zip(logits, spans, sentences):
        tags = ["O"] * len(s.chars)
        best = token_logits.argmax(-1)
        for pos, o in enumerate(span):
            if o is None or o[1] <= o[0]:
                continue
            tag = KLUE_NER_TAGS[int(best[pos])]
            tags[o[0]] = tag
            for c in range(o[0] + 1, min(o[1], len(tags))):
                tags[c] = "O" if tag == "O" else f"I-{tag[2:]}"
        out.append(tags)
    return out


def klue_ner_sentences(data_dir=None, train_file=None, dev_file=None) -> tuple:
    """(train, dev) sentences: the published dev file's first 4,000 and the rest, or the user's file(s); with a file
    of one's own the published one is read whole (it was cut only to make two splits of one)."""
    (train, _), (dev, _) = read_both(read_klue_ner, "klue-ner", data_dir, train_file, dev_file)
    return (train, dev) if train_file or dev_file else (train[:4000], dev[4000:])


def finetune_klue_ner(data_dir, model_path, cfg, max_seq_length: int = 128, train_file=None, dev_file=None,
                      max_train_rows: int | None = None, max_dev_rows: int | None = None) -> dict:
    from bertkit.finetune.train import predict, set_seed, train
    from bertkit.models import load_pretrained
    from bertkit.tokenization import load_tokenizer

    train_s, dev_s = klue_ner_sentences(data_dir, train_file, dev_file)
    train_s, dev_s = train_s[:max_train_rows], dev_s[:max_dev_rows]
    tokenizer = load_tokenizer(model_path)
    train_rows, _ = encode_char_tags(train_s, tokenizer, max_seq_length, True)
    dev_rows, dev_spans = encode_char_tags(dev_s, tokenizer, max_seq_length, False)
    set_seed(cfg.seed)
    model = load_pretrained(model_path, head="token_classification", num_labels=len(KLUE_NER_TAGS))
    gold = [s.tags for s in dev_s]

    def evaluate(m):
        logits = predict(m, dev_rows, cfg.eval_batch_size, per_token=True)["logits"]
        predicted = decode_char_tags(logits, dev_spans, dev_s)
        scores = {"entity_macro_f1": 100 * M.klue_ner_entity_macro_f1(gold, predicted),
                  "char_macro_f1": 100 * M.klue_ner_char_macro_f1(gold, predicted, list(KLUE_NER_TAGS))}
        return scores, {"dev_predictions.json": [{"guid": s.guid, "text": "".join(s.chars), "gold": s.tags,
                                                  "predicted": p} for s, p in zip(dev_s, predicted)]}

    extra = {"finetuning_task": "klue-ner", "id2label": dict(enumerate(KLUE_NER_TAGS)),
             "label2id": {t: i for i, t in enumerate(KLUE_NER_TAGS)}}
    settings = {"model": str(model_path), "max_seq_length": max_seq_length, "korean_task": "klue-ner",
                "train_sentences": len(train_s), "dev_sentences": len(dev_s)}
    return train(model, train_rows, evaluate, "entity_macro_f1", cfg, task="klue-ner", settings=settings,
                 tokenizer_dir=model_path, extra_config=extra)


# settings added after evaluation folders were made, with the value every earlier folder ran with
SINCE_ADDED = {"precision": "fp32", "sweep": False}


class SettingsChanged(DataError):
    """An evaluation folder made with other settings (the message names each change)."""


def evaluate(out, tasks: list, fine_tune, settings: dict, rates=(), seeds=(), overwrite: bool = False,
             say=print) -> dict:
    """Several tasks into OUT/TASK/, or a sweep (`rates` and `seeds` given: every rate x seed of each task) into
    OUT/TASK/lrRATE-seedSEED/, every score in OUT/manifest.json (stage finetune-korean) after each fine-tuning.
    fine_tune(task, folder, rate, seed) runs one (rate None: the configured or default rate) and returns its
    metrics.json summary; a folder holding a finished one is kept, not redone (a sweep grows by its new cells).
    `settings` are what the scores depend on: a folder made with others raises SettingsChanged, unless `overwrite`
    (every task redone). Returns the manifest's tasks."""
    from bertkit.fileio import atomic_write_json, check_folder_owned, disk_errors, folder_lock, read_json_or_none
    from bertkit.finetune.train import finished_fine_tuning

    out, sweep = Path(out), bool(rates or seeds)
    check_folder_owned(out, "finetune-korean")
    settings = {**settings, "sweep": sweep}
    earlier = read_json_or_none(out / "manifest.json") or {}
    before = {**SINCE_ADDED, **earlier.get("settings", {})}
    changed = {k: (before.get(k), v) for k, v in settings.items() if "settings" in earlier and before.get(k) != v}
    if changed and not overwrite:
        raise SettingsChanged(f"{out} holds a Korean evaluation made with other settings ("
                              + "; ".join(f"{k}: {a} -> {b}" for k, (a, b) in changed.items())
                              + "); give another --out, or --overwrite to redo every task")
    summary = {} if overwrite else dict(earlier.get("tasks") or {})  # tasks an earlier call finished stay

    def record(complete=False):  # the folder's kind, from the first moment, and every score
        atomic_write_json(out / "manifest.json", {"stage": "finetune-korean", "settings": settings,
                                                  "tasks": summary, "complete": complete})

    def run(task, folder, rate=None, seed=None):
        done = None if overwrite else finished_fine_tuning(folder, task)
        say(f"{task}: {'kept the finished fine-tuning in' if done else 'fine-tuning into'} {folder}")
        return done or fine_tune(task, folder, rate, seed)

    # one evaluation writes OUT at a time (each task's fine-tuning also locks its own folder); a full disk is
    # one message, and the same command goes on from the finished tasks
    with folder_lock(out, "finetune-korean", say), \
            disk_errors(out, "free space, then run the same command again (finished tasks are kept)"):
        record()
        for task in tasks:
            if sweep:
                cells = dict((summary.get(task) or {}).get("cells") or {})
                for rate in rates or [None]:
                    for seed in seeds:
                        name = f"lr{rate:g}-seed{seed}" if rate else f"seed{seed}"
                        cells[name] = _cell_summary(run(task, out / task / name, rate, seed))
                        summary[task] = {"cells": cells, **sweep_summary(cells)}
                        record()
            else:
                done = run(task, out / task)
                summary[task] = {"best_epoch": done.get("best_epoch"), **done.get("best", {})}
            record(complete=task == tasks[-1])
    return summary


def _cell_summary(done: dict) -> dict:
    """What a sweep's manifest keeps of a fine-tuning's metrics.json (its folder keeps the rest)."""
    return {"settings": {k: done["settings"][k] for k in ("learning_rate", "seed")},
            "best_metric": done["best_metric"], "best_epoch": done.get("best_epoch"), "best": done.get("best", {})}


def sweep_summary(cells: dict) -> dict:
    """A rate sweep's verdict from its cells ({name: metrics.json's summary}): per rate (as run, resolved), the
    mean, min and max of the task's metric over the seeds run (each the chosen epoch's score on the scored set), and
    the best rate: by the mean validation score where every cell has one (--select validation), else by the scored
    mean, which `rate_chosen_on` then says (a maximum over rates of noisy scores flatters the rate it picks). Each
    start is judged at its best rate, with every rate reported: a pretrained start can trail at a rate too low."""
    by_rate, held_out = {}, {}
    for summary in cells.values():  # a (rate, seed) run twice (in a folder named by --lr and one by --lrs) counts once
        rate, seed, best = summary["settings"]["learning_rate"], summary["settings"]["seed"], summary["best"]
        by_rate.setdefault(rate, {}).setdefault(seed, best[summary["best_metric"]])
        if isinstance(best.get("validation"), dict):
            held_out.setdefault(rate, {}).setdefault(seed, best["validation"][summary["best_metric"]])
    metric = next(iter(cells.values()))["best_metric"]
    rates = {f"{rate:g}": {"mean": sum(runs.values()) / len(runs), "min": min(runs.values()),
                           "max": max(runs.values()), "seeds": sorted(runs)}
             for rate, runs in sorted(by_rate.items())}
    validated = all(len(held_out.get(rate, {})) == len(runs) for rate, runs in by_rate.items())
    for rate, runs in held_out.items() if validated else ():
        rates[f"{rate:g}"]["validation_mean"] = sum(runs.values()) / len(runs)
    key = "validation_mean" if validated else "mean"
    return {"metric": metric, "rates": rates, "best_rate": max(rates, key=lambda r: rates[r][key]),
            "rate_chosen_on": "one rate run" if len(rates) == 1 else "validation" if validated else "scored set"}


def compare_sweeps(first: dict, second: dict) -> list[dict]:
    """Two sweeps' summaries (manifest.json's tasks) task by task, each start at its best rate: the difference of
    the means (second - first) and a verdict from the seeds both ran (verdict.paired_verdict: none below 3)."""
    from bertkit.finetune.verdict import paired_verdict

    rows = []
    for task in [t for t in first if t in second]:
        a, b = (s[task]["rates"][s[task]["best_rate"]] | {"rate": s[task]["best_rate"]} for s in (first, second))
        verdict = paired_verdict(*(_seed_scores(s[task], s[task]["best_rate"]) for s in (first, second)))
        rows.append({"task": task, "metric": first[task]["metric"], "first": a, "second": b,
                     "difference": b["mean"] - a["mean"], **{k: verdict[k] for k in ("verdict", "interval", "test")},
                     "paired_seeds": verdict["seeds"],
                     "rate_chosen_on": sorted({s[task].get("rate_chosen_on", "scored set") for s in (first, second)})})
    return rows


def _seed_scores(task_summary: dict, rate: str) -> dict:
    """{seed: score} of a sweep's task at one rate (as sweep_summary names it), from its cells."""
    scores = {}
    for cell in task_summary.get("cells", {}).values():
        if f"{cell['settings']['learning_rate']:g}" == rate:
            scores.setdefault(cell["settings"]["seed"], cell["best"][cell["best_metric"]])
    return scores
