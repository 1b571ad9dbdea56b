"""Stage 2: a WordPiece vocabulary trained on a prepare-corpus folder (or an existing vocab.txt), saved as a
tokenizer folder that bertkit, HF transformers and HF tokenizers all load.

Output folder:
  vocab.txt                 one token per line, id = line number; [PAD] [UNK] [CLS] [SEP] [MASK] = 0..4 when trained
  tokenizer.json            the whole pipeline (normalizer, pre-tokenizer, WordPiece, [CLS]/[SEP] template)
  tokenizer_config.json, special_tokens_map.json   for transformers' AutoTokenizer
  manifest.json             settings, corpus checksum, vocab_sha256, held-out statistics; written last

The passes over all of the text (the alphabet, character counts, the sample's size) are one task per shard, run by
pipelines/engine.py (here, in --workers processes, or on a Ray cluster); the trainer (tokenizers, Rust) runs here.
"""
import contextlib
import hashlib
import json
import re
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from tokenizers import AddedToken, pre_tokenizers

from bertkit.fileio import (
    atomic_write_bytes,
    atomic_write_json,
    disk_errors,
    file_entry,
    folder_lock,
    read_arrow,
    read_json_or_none,
    sha256_file,
)
from bertkit.formats import (
    MANIFEST,
    TOKENIZER_FILES,
    CorpusColumns as C,
    TokenizerManifest,
    corpus_shards,
    read_corpus_manifest,
    read_tokenizer_manifest,
    write_manifest,
)
from bertkit.pipelines.alphabet import Alphabet
from bertkit.pipelines.engine import Engine, check_available, check_engine, check_shared_path
from bertkit.pipelines.instance_io import single_threaded_tokenizers
from bertkit.pipelines.korean import (
    KOREAN_DEFAULT,
    KOREAN_SHARE,
    PRETOKENIZERS,
    KoreanError,
    analyser,
    korean_word_share,
    training_words,
)
from bertkit.tokenization import (
    CONTINUATION,
    MAX_CHARS_PER_WORD,
    SPECIAL_TOKENS,
    STRIP_ACCENTS,
    UNK,
    TokenizerError,
    build_tokenizer,
    guess_lowercase,
    guess_strip_accents,
    hf_tokenizer_files,
    read_vocab,
    vocab_text,
)

STAGE = "train-tokenizer"
SCANS = ".scans"           # OUT/.scans/: the alphabet pass's result per shard, kept until the tokenizer is written
SCANS_MARK = ".bertkit-scans"  # in each OUT/.scans/KEY/ this pass made: only such folders' scans are removed
MODEL_MAX_LENGTH = 512
SAMPLE_BUCKETS = 1 << 20   # --sample-bytes: documents fall in buckets by a hash of their id; the sample is the
                           # first buckets, as many as fit (so it does not depend on shard or task order)
# --sample-bytes auto: the merges of a corpus larger than this are learnt on a sample of this size; with a morpheme
# analyser (~3 CPU-s per MB of text) a smaller one. On real text a 27 MB Korean and a 10 MB English sample are
# within 1 % of all of 108 / 20 MB in held-out pieces per word (benchmarks/results/scale.md, the sampling default)
AUTO_SAMPLE_BYTES = {"plain": 1 << 30, "analyser": 256 << 20}


@dataclass
class TokenizerConfig:
    vocab_size: int = 30522
    lowercase: bool | None = True      # None: guess from vocab_file (uncased unless it has capitals)
    strip_accents: str = "auto"        # uncased only: "latin" (bertkit), "all" (original BERT), "none"; "auto":
                                       # latin when training, guessed from vocab_file (guess_strip_accents)
    min_frequency: int = 2             # a pair must occur this often to be merged
    limit_alphabet: int | None = None  # None keeps every character of the corpus (tokenizers' BERT default: 1000)
    vocab_file: str | None = None      # use this vocab.txt instead of training one
    pretokenize: str = "auto"          # none | mecab | kiwi: cut Korean words at morpheme boundaries while training
                                       # (pipelines/korean.py); the tokenizer written still reads raw text. auto:
                                       # kiwi for a mostly Korean corpus, else none (resolved, then recorded)
    sample_bytes: int | str | None = "auto"  # learn the merges on at most this much text (documents chosen by a
                                       # hash of their id); the alphabet still comes from all of it. None: all the
                                       # text; auto: AUTO_SAMPLE_BYTES when the training shards are larger (resolved)
    stats_sentences: int = 100_000     # held-out sentences measured for the manifest's statistics
    workers: int = 1                   # processes for the per-shard passes (--engine local); never changes the output
    engine: str = "local"              # local | ray: where the per-shard passes run; never changes the output
    ray_address: str | None = None     # --engine ray: head node host:port; None: a reachable cluster, else a local one
    overwrite: bool = False            # replace a folder made from another corpus or with other settings
    progress: bool = True

    def __post_init__(self):
        if self.lowercase is None and self.vocab_file is None:   # nothing to guess from: BERT's uncased
            self.lowercase = True

    def check(self):
        if self.vocab_file is None and self.vocab_size < len(SPECIAL_TOKENS) + 1:
            raise TokenizerError(f"vocab_size={self.vocab_size} is too small; BERT uses 30522")
        if self.strip_accents not in STRIP_ACCENTS + ("auto",):
            raise TokenizerError(f"strip_accents must be auto or one of {STRIP_ACCENTS}, not {self.strip_accents!r}")
        if self.limit_alphabet is not None and self.limit_alphabet < 1:
            raise TokenizerError("limit_alphabet must be a positive number of characters, or None for all")
        if self.min_frequency < 1:
            raise TokenizerError("min_frequency must be at least 1")
        if self.pretokenize not in PRETOKENIZERS + ("auto",):
            raise TokenizerError(f"pretokenize must be auto or one of {PRETOKENIZERS}, not {self.pretokenize!r}")
        if self.pretokenize not in ("none", "auto") and self.vocab_file is not None:
            raise TokenizerError("--pretokenize shapes a trained vocabulary; it does nothing with --vocab")
        if self.sample_bytes not in (None, "auto") and not (isinstance(self.sample_bytes, int) and
                                                             self.sample_bytes >= 1):
            raise TokenizerError(f"sample_bytes {self.sample_bytes!r}: give a positive number of bytes, None for all "
                                 "the text, or auto")
        if self.workers < 1:
            raise TokenizerError(f"workers must be at least 1, not {self.workers}")
        check_engine(self.engine, TokenizerError)


def _sentence_batches(shards, progress: bool, desc: str, limit: int | None = None, sample: int | None = None):
    """Yield lists of sentences, shard by shard, in file order (deterministic); with `sample`, only the documents
    whose sample bucket is below it."""
    from bertkit.progress import tqdm

    docs = sum(read_arrow(p).num_rows for p in shards)
    left = limit
    with tqdm(total=docs, unit="doc", desc=desc, plain=not progress) as bar:
        for path in shards:
            table = read_arrow(path)
            for batch in table.to_batches(max_chunksize=2000):
                rows = batch if sample is None else batch.filter(pa.array(sample_buckets(batch.column(C.ID)) < sample))
                sentences = rows.column(C.SENTENCES).flatten().to_pylist()
                if left is not None:
                    sentences = sentences[:left]
                    left -= len(sentences)
                bar.update(batch.num_rows)
                if sentences:
                    yield sentences
                if left is not None and left <= 0:
                    return


def _run_trainer(shards, config: TokenizerConfig, vocab_size: int, specials: list[str], desc: str,
                 initial_alphabet: list[str] | None = None, sample: int | None = None) -> list[str]:
    """One tokenizers WordPiece training over the shards (or their sample); the vocabulary in id order."""
    from tokenizers.trainers import WordPieceTrainer

    tok = build_tokenizer(None, lowercase=config.lowercase, strip_accents=config.strip_accents)
    batches = _sentence_batches(shards, config.progress, desc, sample=sample)
    if config.pretokenize != "none":  # words already normalised and split by training_words: split on spaces only
        normalizer, pre_tokenizer = tok.normalizer, tok.pre_tokenizer
        tok.normalizer, tok.pre_tokenizer = None, pre_tokenizers.WhitespaceSplit()
        batches = ([training_words(s, normalizer, pre_tokenizer, config.pretokenize) for s in batch]
                   for batch in batches)
    extra = {}
    if initial_alphabet is not None:  # keep exactly these characters (the binding refuses limit_alphabet=None)
        extra = {"initial_alphabet": initial_alphabet, "limit_alphabet": len(initial_alphabet)}
    trainer = WordPieceTrainer(vocab_size=vocab_size, min_frequency=config.min_frequency, special_tokens=specials,
                               continuing_subword_prefix=CONTINUATION, show_progress=False, **extra)
    tok.train_from_iterator(batches, trainer)
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise AssertionError("tokenizers returned a vocabulary with gaps in its ids")
    return tokens


def _char_counts(shards, config: TokenizerConfig, alphabet_tokens: list[str]) -> dict[str, int]:
    """How often each character occurs in the normalized training words (for --limit-alphabet)."""
    import numpy as np

    tok = build_tokenizer({t: i for i, t in enumerate(alphabet_tokens)}, config.lowercase, config.strip_accents)
    counts = np.zeros(len(alphabet_tokens), dtype=np.int64)
    for batch in _sentence_batches(shards, config.progress, "train-tokenizer: counting characters"):
        ids = [i for e in tok.encode_batch(batch, add_special_tokens=False) for i in e.ids]
        counts += np.bincount(np.asarray(ids, dtype=np.int64), minlength=len(alphabet_tokens))
    chars: dict[str, int] = {}
    for t, n in zip(alphabet_tokens, counts.tolist()):
        if t not in SPECIAL_TOKENS:
            c = t.removeprefix(CONTINUATION) if len(t) > 1 else t
            chars[c] = chars.get(c, 0) + n
    return chars


def sample_buckets(ids) -> np.ndarray:
    """Each document's --sample-bytes bucket: a hash of its id (not the id's own digits, which also decide the
    held-out split), so the sample is the same whatever the shards, the engine or the order of work."""
    return np.array([xxhash.xxh3_64_intdigest(i.encode("utf-8")) % SAMPLE_BUCKETS for i in ids.to_pylist()],
                    dtype=np.int64)


def scan_shard(path: str, options: dict, alphabet_tokens: list[str] | None, sample: bool) -> dict:
    """Task, one per shard. Without alphabet_tokens: the shard's alphabet (what a trainer pass without merges
    finds: pipelines/alphabet.py) and, with `sample`, its text bytes per sample bucket. With alphabet_tokens: how
    often each character occurs (for --limit-alphabet)."""
    config = TokenizerConfig(**{**options, "progress": False})
    table = read_arrow(path)
    if alphabet_tokens is not None:
        return {"counts": _char_counts([path], config, alphabet_tokens), "rows": table.num_rows}
    # the alphabet without the analyser: a morpheme cut only splits a word, so every character keeps its place (first
    # in a word or not) and the cuts add only "#" and "###" (the "##" spelling), which _train adds; the analyser,
    # most of a Korean vocabulary's time, then reads only the text the merges are learnt on (a --sample-bytes sample)
    tok = build_tokenizer(None, lowercase=config.lowercase, strip_accents=config.strip_accents)
    alphabet = Alphabet(tok.normalizer, tok.pre_tokenizer)
    alphabet.add(table.column(C.SENTENCES).combine_chunks().flatten())
    result = {"tokens": sorted(alphabet.tokens()), "rows": table.num_rows, "buckets": None}
    if sample:
        sentences = table.column(C.SENTENCES).combine_chunks()
        sizes = pc.binary_length(sentences.flatten()).to_numpy(zero_copy_only=False).astype(np.int64)
        cum = np.concatenate([[0], np.cumsum(sizes)])
        offsets = sentences.offsets.to_numpy().astype(np.int64)
        doc_bytes = cum[offsets[1:] - offsets[0]] - cum[offsets[:-1] - offsets[0]]   # UTF-8 text bytes per document
        buckets, where = np.unique(sample_buckets(table.column(C.ID)), return_inverse=True)
        result["buckets"] = (buckets, np.bincount(where, weights=doc_bytes, minlength=len(buckets)).astype(np.int64))
    return result


def _per_shard(shards, config: TokenizerConfig, desc: str, alphabet_tokens=None, sample=False, kept=None):
    """Yield scan_shard's result for every shard from the configured engine (the caller folds them as they come, in
    any order, so the main process never holds one result per shard). With `kept` (a folder): each result is kept
    there as it comes, and those a killed run kept are read back instead of scanning their shards again."""
    from bertkit.progress import tqdm

    options = asdict(config)
    pool = config.engine == "local" and config.workers > 1   # one process, one core
    docs = sum(read_arrow(p).num_rows for p in shards)
    earlier = {p: r for p in shards if kept is not None and (r := _read_scan(kept, p)) is not None}
    todo = [p for p in shards if p not in earlier]
    with tqdm(total=docs, unit="doc", desc=desc, plain=not config.progress) as bar, \
            single_threaded_tokenizers() if pool else contextlib.nullcontext(), \
            Engine(config.engine, config.workers, config.ray_address) as engine:
        for result in earlier.values():
            bar.update(result["rows"])
            yield result
        tasks = [(str(p), options, alphabet_tokens, sample) for p in todo]
        for path, result in zip(todo, engine.map(scan_shard, tasks, on_done=lambda i, r: bar.update(r["rows"]))):
            if kept is not None:
                _keep_scan(kept, path, result)
            yield result


def _keep_scan(folder: Path, shard: Path, result: dict) -> None:
    buckets = None if result["buckets"] is None else [a.tolist() for a in result["buckets"]]
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{Path(shard).name}.json"
    written = _scans_written(folder)
    if name not in written:   # the mark lists every scan file this pass wrote here: only those are ever removed
        atomic_write_bytes(folder / SCANS_MARK, json.dumps(sorted({*written, name})).encode(), fsync=False)
    atomic_write_bytes(folder / name, json.dumps({**result, "buckets": buckets}).encode(),
                       fsync=False)


def _read_scan(folder: Path, shard: Path) -> dict | None:
    """A shard's alphabet scan that an earlier run of the same corpus and options kept, or None."""
    result = read_json_or_none(folder / f"{Path(shard).name}.json")
    if result is not None and result["buckets"] is not None:
        result["buckets"] = tuple(np.asarray(a, dtype=np.int64) for a in result["buckets"])
    return result


def scans_folder(out: Path, corpus: dict, config: TokenizerConfig) -> Path:
    """OUT/.scans/KEY: where the alphabet pass keeps each shard's result until the tokenizer is written, KEY naming
    the corpus and the options the scan depends on (a folder of other ones is removed)."""
    what = json.dumps([corpus["manifest_sha256"], config.lowercase, config.strip_accents,
                       config.sample_bytes is not None])
    folder = out / SCANS / hashlib.sha256(what.encode()).hexdigest()[:16]
    _drop_scans(out, keep=folder)  # scans of another corpus or options
    return folder


def drop_scans(out: Path) -> None:
    """The kept scans, once the tokenizer is written."""
    _drop_scans(out)


def _scans_written(folder: Path) -> list[str]:
    """The scan files the mark in `folder` lists (a mark from before it listed them, an empty file: the corpus
    shards' scan names, shard-NNNNN.arrow.json / holdout-NNNNN.arrow.json, found there)."""
    mark = folder / SCANS_MARK
    if not mark.is_file() or mark.is_symlink():
        return []
    listed = read_json_or_none(mark)
    if isinstance(listed, list):
        return [n for n in listed if isinstance(n, str) and "/" not in n and n not in (".", "..")]
    return [p.name for p in folder.glob("*.arrow.json") if re.fullmatch(r"(shard|holdout)-\d{5}\.arrow\.json", p.name)]


def _drop_scans(out: Path, keep: Path | None = None) -> None:
    """Only what the alphabet pass wrote: the scan files its mark lists (a real folder, not a link), then the mark
    and the folders left empty; anything else under OUT/.scans stays."""
    for folder in (out / SCANS).glob("*") if (out / SCANS).is_dir() else ():
        if folder == keep or folder.is_symlink() or not (folder / SCANS_MARK).is_file():
            continue
        for name in _scans_written(folder):
            scan = folder / name
            if scan.is_file() and not scan.is_symlink():
                scan.unlink()
        (folder / SCANS_MARK).unlink()
        if not any(folder.iterdir()):
            folder.rmdir()
    if (out / SCANS).is_dir() and not (out / SCANS).is_symlink() and not any((out / SCANS).iterdir()):
        (out / SCANS).rmdir()


def _sample_threshold(per_bucket: np.ndarray, sample_bytes: int, corpus_dir) -> int:
    """The number of buckets (from bucket 0) whose documents hold at most sample_bytes of text together."""
    cumulative = np.cumsum(per_bucket)
    threshold = int(np.searchsorted(cumulative, sample_bytes, side="right"))
    if threshold == 0 or cumulative[threshold - 1] == 0:
        raise TokenizerError(f"{corpus_dir}: --sample-bytes {sample_bytes} is smaller than the first documents of "
                             f"the sample ({int(per_bucket[per_bucket > 0][0])} bytes); raise it")
    return threshold


def _train(corpus_dir, config: TokenizerConfig, kept: Path | None = None) -> list[str]:
    """Train the vocabulary; deterministic for a given corpus and config.

    tokenizers' trainer gives each `##c` piece an id in hash-map order and breaks ties between equally frequent
    merges by those ids, so two runs can differ. A first pass (a task per shard, whose alphabets are united; the
    trainer's own alphabet, found without it) finds the alphabet and its `##` forms; the second pass gets them,
    sorted, as the first entries of the vocabulary, which fixes every id and so every tie-break. The
    --limit-alphabet cut is made here too, by (count, character), for the same reason. With --sample-bytes the
    second pass reads only the sample, given the whole corpus' alphabet, so a character outside the sample is still
    in the vocabulary. Each shard's first-pass result is kept in `kept` (if given) for a rerun after a kill.
    """
    shards = corpus_shards(corpus_dir, "train")
    if not shards:
        raise TokenizerError(f"{corpus_dir}: the corpus has no training shards; nothing to train on")
    n_special = len(SPECIAL_TOKENS)
    sampling = config.sample_bytes is not None
    found, per_bucket = set(), np.zeros(SAMPLE_BUCKETS if sampling else 0, dtype=np.int64)
    for scan in _per_shard(shards, config, "train-tokenizer: alphabet", sample=sampling, kept=kept):
        found.update(scan["tokens"])
        if sampling:
            buckets, nbytes = scan["buckets"]
            per_bucket[buckets] += nbytes
    if not found:
        raise TokenizerError(f"{corpus_dir}: the training shards hold no text; nothing to train on")
    if config.pretokenize != "none" and any_morpheme_cut(shards, config):
        found |= {"#", CONTINUATION + "#"}  # the "##piece" words the analyser's cuts give the trainer
    chars = sorted(t for t in found if not t.startswith(CONTINUATION) or len(t) == 1)
    continued = {t for t in found if t not in chars}
    sample = _sample_threshold(per_bucket, config.sample_bytes, corpus_dir) if sampling else None
    if config.limit_alphabet is not None and len(chars) > config.limit_alphabet:
        alphabet = list(SPECIAL_TOKENS) + sorted(found)  # any order: ids only index the counts
        counts = {}
        for scan in _per_shard(shards, config, "train-tokenizer: counting characters", alphabet_tokens=alphabet):
            for c, n in scan["counts"].items():
                counts[c] = counts.get(c, 0) + n
        chars = sorted(sorted(chars, key=lambda c: (-counts[c], c))[: config.limit_alphabet])
    # every character a word can hold gets its ## form too, seen after another character or not: "ㅠㅠ", "ㅋㅋ" and
    # emoji runs were one [UNK] each where a corpus held ㅠ only as a word of its own (or Kiwi cut it off)
    in_words = _word_characters(chars, config)
    pieces = [CONTINUATION + c for c in chars if CONTINUATION + c in continued or c in in_words]
    if n_special + len(chars) + len(pieces) > config.vocab_size:
        raise TokenizerError(
            f"{corpus_dir}: the corpus' characters alone (with their ## forms) need {len(chars) + len(pieces)} "
            f"vocabulary entries, more than --vocab-size {config.vocab_size} allows. Raise --vocab-size, or keep "
            f"only the most frequent characters with --limit-alphabet N (the rest become [UNK]).")
    fixed = config.limit_alphabet is not None or sampling
    tokens = _run_trainer(shards, config, config.vocab_size, list(SPECIAL_TOKENS) + pieces,
                          "train-tokenizer: training" + (" (sample)" if sampling else ""),
                          initial_alphabet=chars if fixed else None, sample=sample)
    # trainer order: specials, ## pieces, characters, merges; write the familiar one: characters before ## pieces
    head = n_special + len(pieces)
    if tokens[:head] != list(SPECIAL_TOKENS) + pieces or tokens[head: head + len(chars)] != chars:
        raise AssertionError("tokenizers laid out the vocabulary in an unexpected order")
    return list(SPECIAL_TOKENS) + chars + pieces + tokens[head + len(chars):]


def _word_characters(chars: list[str], config: TokenizerConfig) -> set[str]:
    """The characters BERT's normaliser and pre-tokenizer keep inside a word (not punctuation, CJK ideographs or
    spaces, which they split off alone, so that they never continue a word)."""
    tok = build_tokenizer(None, lowercase=config.lowercase, strip_accents=config.strip_accents)
    return {c for c in chars if len(tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(f"a{c}a"))) == 1}


def any_morpheme_cut(shards, config: TokenizerConfig) -> bool:
    """Whether the analyser cuts any word of the corpus (it does within the first Korean sentences of a real one)."""
    tok = build_tokenizer(None, lowercase=config.lowercase, strip_accents=config.strip_accents)
    for batch in _sentence_batches(shards, False, ""):
        if any("##" in training_words(s, tok.normalizer, tok.pre_tokenizer, config.pretokenize) for s in batch):
            return True
    return False


def tokenizer_stats(tok, sentence_batches) -> dict:
    """[UNK] rate and mean WordPiece pieces per word (words as BERT's pre-tokenizer splits them)."""
    unk_id = tok.token_to_id(UNK)
    sentences = words = pieces = unks = chars = 0
    for batch in sentence_batches:
        for enc, text in zip(tok.encode_batch(batch, add_special_tokens=False), batch):
            ids = enc.ids
            sentences += 1
            chars += len(text)
            pieces += len(ids)
            unks += ids.count(unk_id)
            words += enc.word_ids[-1] + 1 if ids else 0
    return {
        "sentences": sentences,
        "characters": chars,
        "words": words,
        "pieces": pieces,
        "unk_pieces": unks,
        # a word WordPiece cannot spell becomes one [UNK], so these two rates are per word and per piece
        "unk_word_rate": unks / words if words else 0.0,
        "unk_piece_rate": unks / pieces if pieces else 0.0,
        "pieces_per_word": pieces / words if words else 0.0,
    }


def _hf_files(config: TokenizerConfig) -> tuple[dict, dict]:
    return hf_tokenizer_files(bool(config.lowercase), config.strip_accents, MODEL_MAX_LENGTH)


def auto_sample_bytes(corpus_dir, config: TokenizerConfig) -> tuple[int | None, int | None]:
    """--sample-bytes auto: (AUTO_SAMPLE_BYTES for the resolved --pretokenize, the training shards' bytes) when the
    training shards (their Arrow files, a few % over their text) are larger, else (None, None): all of it, so a
    corpus below the size trains exactly as with --sample-bytes all."""
    shards = read_corpus_manifest(corpus_dir).shards
    total = sum(s.bytes for s in shards if s.split == "train")
    cap = AUTO_SAMPLE_BYTES["plain" if config.pretokenize == "none" else "analyser"]
    return (cap, total) if total > cap else (None, None)


def _size(n: int) -> str:
    """Bytes as --sample-bytes reads them (powers of 1024)."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def _say(line: str) -> None:
    from bertkit.progress import tqdm

    tqdm.write(line, file=sys.stderr)


def _korean_default(corpus_dir, per_shard: int = 1000, most_shards: int = 20) -> tuple[str, float]:
    """`--pretokenize auto`: (kiwi when most words are Korean in the first sentences of up to 20 training shards
    spread over the corpus, else none; that share). The same corpus always decides the same."""
    shards = corpus_shards(corpus_dir, "train")
    shards = [shards[i * len(shards) // most_shards] for i in range(most_shards)] if len(shards) > most_shards \
        else shards
    share = korean_word_share(s for path in shards for batch in _sentence_batches([path], False, "", limit=per_shard)
                              for s in batch)
    return (KOREAN_DEFAULT if share >= KOREAN_SHARE else "none"), share


def _say_korean_default(choice: str, share: float) -> None:
    """Before training with what auto chose: say so, and stop at once, naming the fix, if its analyser is missing."""
    try:
        analyser(choice)
    except KoreanError as e:
        raise KoreanError(f"{e} (--pretokenize auto chose {choice} for this Korean corpus; --pretokenize none "
                          "trains plain WordPiece without it)") from None
    _say(f"train-tokenizer: {share:.0%} of the corpus' words are Korean, so the vocabulary follows {choice}'s "
         "morpheme cuts (--pretokenize auto; measured best on Korean tasks: "
         "docs/studies/2026-11-25-korean-transfer.md); "
         "--pretokenize none trains plain WordPiece")


def _settings(config: TokenizerConfig) -> dict:
    s = asdict(config)
    for run_only in ("progress", "stats_sentences", "overwrite", "workers", "engine", "ray_address"):
        s.pop(run_only)
    if s["sample_bytes"] is None:  # all the text: the settings (and so a finished folder) read as before
        s.pop("sample_bytes")
    s.update(special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix=CONTINUATION,
             max_input_chars_per_word=MAX_CHARS_PER_WORD)
    return s


def _corpus_identity(corpus_dir) -> dict | None:
    if corpus_dir is None:
        return None
    read_corpus_manifest(corpus_dir)  # clear error if it is not a finished corpus folder
    return {"path": str(Path(corpus_dir).resolve()),
            "manifest_sha256": sha256_file(Path(corpus_dir) / MANIFEST)}


def train_tokenizer(corpus_dir, out, config: TokenizerConfig | None = None) -> TokenizerManifest:
    """Train (or, with config.vocab_file, adopt) a BERT WordPiece tokenizer; write it to `out`; return the manifest.

    corpus_dir may be None only with a vocab_file (no statistics then). Re-running with the same corpus and
    settings finds the finished folder and returns its manifest; a folder made with other settings is an error.
    """
    config = replace(config) if config else TokenizerConfig()  # resolved below; the caller's copy is untouched
    config.check()
    for path, what in ((corpus_dir, "corpus"), (out, "--out"), (config.vocab_file, "--vocab")):
        if path is not None:
            check_shared_path(path, what)
    check_available(config.engine)
    out = Path(out)
    if corpus_dir is None and config.vocab_file is None:
        raise TokenizerError("train_tokenizer needs a corpus folder to train on, or a vocab_file to use")
    with folder_lock(out, "train-tokenizer"), \
            disk_errors(out, "free space (or fix the disk), then run the same command again"):
        return _train_tokenizer(corpus_dir, out, config)


def _train_tokenizer(corpus_dir, out: Path, config: TokenizerConfig) -> TokenizerManifest:
    tokens, warnings = _settle_normalisation(config)
    korean_share = None  # set when auto decided from the corpus
    if config.pretokenize == "auto":
        config.pretokenize, korean_share = _korean_default(corpus_dir) if config.vocab_file is None else ("none", None)
    corpus = _corpus_identity(corpus_dir)
    auto_sampled = None   # the training shards' bytes, when auto chose a sample
    if config.sample_bytes == "auto":
        config.sample_bytes, auto_sampled = auto_sample_bytes(corpus_dir, config) if config.vocab_file is None \
            else (None, None)
    settings = _settings(config)
    placeholders = _placeholders(corpus_dir) if config.vocab_file is None else []
    if placeholders:
        settings["placeholders"] = placeholders
    if _already_made(out, settings, corpus, config.overwrite):
        return read_tokenizer_manifest(out)  # re-running a finished stage is a no-op

    if config.vocab_file is None:
        if korean_share is not None and config.pretokenize != "none":
            _say_korean_default(config.pretokenize, korean_share)
        if auto_sampled:
            _say(f"train-tokenizer: the training shards hold {_size(auto_sampled)}, so the merges are learnt on a "
                 f"{_size(config.sample_bytes)} sample (--sample-bytes auto; the alphabet comes from all of it); "
                 "--sample-bytes all learns them on every byte")
        tokens = _train(corpus_dir, config, kept=scans_folder(out, corpus, config))
        source = "trained"
    else:
        source = "vocab_file"
    if placeholders:   # in place of the last (rarest) merges: the vocabulary keeps its size
        tokens = tokens[: len(tokens) - len(placeholders)] + [p for p in placeholders if p not in tokens]
    tok = build_tokenizer({t: i for i, t in enumerate(tokens)}, config.lowercase, config.strip_accents)
    if placeholders:   # matched whole in the raw text before any normalising or splitting, as [MASK] is
        tok.add_tokens([AddedToken(p, normalized=False) for p in placeholders])

    stats = _held_out_stats(tok, corpus_dir, config) if corpus_dir is not None else None
    alphabet = [t for t in tokens if len(t) == 1]
    vocab_bytes = vocab_text(tokens)
    hf_config, specials = _hf_files(config)

    atomic_write_bytes(out / "vocab.txt", vocab_bytes)
    atomic_write_bytes(out / "tokenizer.json", tok.to_str(pretty=True).encode("utf-8"))
    atomic_write_json(out / "tokenizer_config.json", hf_config)
    atomic_write_json(out / "special_tokens_map.json", specials)
    manifest = TokenizerManifest(
        stage=STAGE, complete=True, source=source, settings=settings, corpus=corpus, vocab_size=len(tokens),
        alphabet_size=len(alphabet), vocab_sha256=hashlib.sha256(vocab_bytes).hexdigest(),
        files={name: file_entry(out / name) for name in TOKENIZER_FILES}, stats=stats, warnings=warnings)
    write_manifest(out, manifest)
    drop_scans(out)   # the kept scans: a finished tokenizer needs none
    return manifest


def _placeholders(corpus_dir) -> list[str]:
    """The tokens prepare-corpus --pii redact put in place of personal data, for a corpus made with it: each one
    token of the vocabulary, kept whole ([EMAIL] would be [, email, ]), so the model sees one thing where a datum
    was."""
    from bertkit.pipelines.pii import PLACEHOLDER

    if corpus_dir is None or read_corpus_manifest(corpus_dir).options.get("pii") != "redact":
        return []
    return list(PLACEHOLDER.values())


def _settle_normalisation(config: TokenizerConfig) -> tuple[list[str] | None, list[str]]:
    """--uncased/--cased and --strip-accents settled (from the --vocab-file's own tokens where not given): (its
    tokens or None, warnings where the flags contradict them)."""
    if config.vocab_file is None:
        config.lowercase = True if config.lowercase is None else config.lowercase
        config.strip_accents = "latin" if config.strip_accents == "auto" else config.strip_accents
        return None, []
    warnings, tokens = [], read_vocab(config.vocab_file)
    if config.lowercase is None:
        config.lowercase = guess_lowercase(tokens)
    elif config.lowercase != guess_lowercase(tokens):
        warnings.append(f"{config.vocab_file} looks {'uncased' if guess_lowercase(tokens) else 'cased'} "
                        f"but {'--uncased' if config.lowercase else '--cased'} was asked for")
    if config.strip_accents == "auto":
        config.strip_accents = guess_strip_accents(tokens)
    elif config.lowercase and config.strip_accents != guess_strip_accents(tokens) == "all":
        warnings.append(f"{config.vocab_file} was built with original BERT's normalization (Hangul as jamo, kana "
                        f"without voicing marks); --strip-accents {config.strip_accents} tokenizes such text "
                        f"differently from how its model saw it")
    return tokens, warnings


def _already_made(out: Path, settings: dict, corpus: dict | None, overwrite: bool) -> bool:
    """True when OUT holds this very tokenizer; another one is refused without --overwrite, else unmarked."""
    manifest_path = out / MANIFEST
    if not manifest_path.is_file():
        return False
    old = read_json_or_none(manifest_path) or {}
    same_corpus = (old.get("corpus") or {}).get("manifest_sha256") == (corpus or {}).get("manifest_sha256")
    if old.get("complete") and old.get("settings") == settings and same_corpus:  # (the folder may have moved)
        return True
    if not overwrite:
        before = old.get("settings") or {}
        changed = "; ".join(f"{k}: {before.get(k)} -> {v}" for k, v in settings.items() if before.get(k) != v)
        raise TokenizerError(
            f"{out}: already holds a tokenizer made from "
            + (f"other settings ({changed})" if changed else "another corpus")
            + f" (see {manifest_path}); choose a new --out folder, or pass --overwrite to replace it.")
    manifest_path.unlink()  # the folder is not a finished tokenizer until the new manifest is written
    return False


def _held_out_stats(tok, corpus_dir, config: TokenizerConfig) -> dict:
    """Tokens per word and [UNK] on the held-out split (none: on the start of the training text)."""
    holdout = corpus_shards(corpus_dir, "holdout")
    stats = tokenizer_stats(tok, _sentence_batches(holdout or corpus_shards(corpus_dir, "train"), config.progress,
                                                   "train-tokenizer: held-out stats", limit=config.stats_sentences))
    return {"split": "holdout" if holdout else "train", **stats}
