"""The WordPiece tokenizer every stage shares: how it is built, saved and loaded.

One place builds the normalizer and pre-tokenizer so that training (pipelines/train_tokenizer.py) and
loading can never disagree. BERT conventions: [PAD] [UNK] [CLS] [SEP] [MASK], `##` continuation pieces,
[CLS] A [SEP] B [SEP] with token type ids 0 for A and 1 for B.

Uncased normalization differs from google-research/bert in one deliberate way. BERT lower-cases, applies NFD
and drops every combining mark (Unicode category Mn). That turns é into e, but it also splits every Hangul
syllable into jamo (google-research/bert#135) and deletes the voicing marks of Japanese kana, so が becomes か
(#130). bertkit drops only the script-neutral combining diacritics (the Combining Diacritical Marks blocks) and
recomposes with NFC: é -> e, 한국어 stays 한국어, が stays が. pipelines/README.md (train-tokenizer) lists what else
differs.
"""
import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from bertkit.errors import regular_file
from bertkit.fileio import sha256_file
from bertkit.formats import TOKENIZER_FILES

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK]  # their order in a trained vocab: [PAD]=0 ... [MASK]=4
CONTINUATION = "##"
# HF tokenizers and transformers turn a word longer than this into [UNK]; google-research/bert uses 200.
MAX_CHARS_PER_WORD = 100

# Combining marks that are accents on Latin, Greek and Cyrillic letters, not letters' parts in other scripts:
# Combining Diacritical Marks, ... Extended, ... Supplement, ... for Symbols, Combining Half Marks.
LATIN_TYPE_MARKS = "[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]"

STRIP_ACCENTS = ("latin", "all", "none")  # uncased only; "all" is google-research/bert's (and HF's) behaviour
VOICED_KANA = set("がぎぐげござじずぜぞだぢづでどばびぶべぼぱぴぷぺぽ"
                  "ガギグゲゴザジズゼゾダヂヅデドバビブベボパピプペポ")


class TokenizerError(ValueError):
    pass


def build_normalizer(lowercase: bool = True, strip_accents: str = "latin"):
    """The normalizer for `lowercase` (uncased) or cased text.

    strip_accents (uncased only): "latin" drops Latin-type combining marks and keeps Hangul syllables and kana
    voicing marks; "all" is original BERT (NFD, drop every Mn mark); "none" lower-cases only.
    Cased text is never accent-stripped, as in BERT. Control characters are removed, whitespace becomes a
    space and every CJK ideograph becomes its own word, as in BERT.
    """
    if strip_accents not in STRIP_ACCENTS:
        raise TokenizerError(f"strip_accents must be one of {STRIP_ACCENTS}, not {strip_accents!r}")
    if lowercase and strip_accents == "all":
        return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=True,
                                          lowercase=True)
    bert = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False,
                                      lowercase=lowercase)
    if not lowercase or strip_accents == "none":
        return bert
    return normalizers.Sequence([bert, normalizers.NFD(), normalizers.Replace(Regex(LATIN_TYPE_MARKS), ""),
                                 normalizers.NFC()])


def build_tokenizer(vocab: dict[str, int] | None = None, lowercase: bool = True,
                    strip_accents: str = "latin") -> Tokenizer:
    """A BERT WordPiece tokenizer over `vocab` (token -> id); with vocab=None, an empty one to train."""
    if vocab is None:
        model = WordPiece(unk_token=UNK, continuing_subword_prefix=CONTINUATION,
                          max_input_chars_per_word=MAX_CHARS_PER_WORD)
    else:
        model = WordPiece(vocab, unk_token=UNK, continuing_subword_prefix=CONTINUATION,
                          max_input_chars_per_word=MAX_CHARS_PER_WORD)
    tok = Tokenizer(model)
    tok.normalizer = build_normalizer(lowercase, strip_accents)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix=CONTINUATION)
    if vocab is not None:
        finish_tokenizer(tok)
    return tok


def finish_tokenizer(tok: Tokenizer) -> Tokenizer:
    """Add the special tokens (matched verbatim in text, like HF's BertTokenizer) and the BERT post-processor."""
    vocab = tok.get_vocab()
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise TokenizerError(f"the vocabulary lacks the special tokens {missing}; a BERT vocabulary needs all of "
                             f"{SPECIAL_TOKENS}")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS}:0 $A:0 {SEP}:0",
        pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
        special_tokens=[(CLS, vocab[CLS]), (SEP, vocab[SEP])],
    )
    return tok


def hf_tokenizer_files(lowercase: bool, strip_accents: str, model_max_length: int = 512) -> tuple[dict, dict]:
    """(tokenizer_config.json, special_tokens_map.json) for transformers' AutoTokenizer over a bertkit tokenizer."""
    specials = {"unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS, "mask_token": MASK}
    # HF's BertTokenizer rebuilds its normalizer from do_lower_case/strip_accents and has no "Latin accents only"
    # setting, so a bertkit-normalized tokenizer names the generic class, which uses tokenizer.json as written.
    hf_equivalent = not lowercase or strip_accents in ("all", "none")
    cfg = {
        "tokenizer_class": "BertTokenizer" if hf_equivalent else "PreTrainedTokenizerFast",
        "do_lower_case": lowercase,
        "strip_accents": False if lowercase and strip_accents != "all" else None,
        "bertkit_strip_accents": strip_accents if lowercase else "none",
        "tokenize_chinese_chars": True,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": True,
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
        **specials,
    }
    return cfg, specials


def read_vocab(path) -> list[str]:
    """vocab.txt -> tokens in id order (id = line number). Clear errors for what would silently shift ids."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise TokenizerError(f"{path}: no such vocabulary file") from None
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise TokenizerError(f"{path}:{line}: not UTF-8 ({e.reason}); a vocab.txt must be UTF-8") from None
    if text.startswith("\ufeff"):
        text = text[1:]  # a byte-order mark is not part of the first token
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    tokens, seen = [], {}
    for i, line in enumerate(lines):
        token = line.rstrip("\r")
        if not token.strip():
            raise TokenizerError(f"{path}:{i + 1}: empty token; every line of a vocab.txt is one token "
                                 f"(id = line number - 1), so blank lines would shift the ids")
        if token in seen:
            raise TokenizerError(f"{path}:{i + 1}: token {token!r} repeats line {seen[token] + 1}; "
                                 f"each token must appear once")
        seen[token] = i
        tokens.append(token)
    if not tokens:
        raise TokenizerError(f"{path}: empty vocabulary")
    missing = [t for t in SPECIAL_TOKENS if t not in seen]
    if missing:
        raise TokenizerError(f"{path}: lacks the special tokens {missing}; add them as lines (BERT needs all of "
                             f"{SPECIAL_TOKENS})")
    return tokens


def vocab_text(tokens: list[str]) -> bytes:
    """The bytes of a vocab.txt for `tokens` (the format bertkit writes)."""
    return "".join(t + "\n" for t in tokens).encode("utf-8")


def guess_lowercase(tokens: list[str]) -> bool:
    """For a bare vocab.txt: uncased unless a noticeable share of its word tokens have capitals."""
    words = [t for t in tokens if not (t.startswith("[") and t.endswith("]"))]
    capitalised = sum(1 for t in words if any(c.isupper() for c in t))
    return capitalised < max(1, len(words) // 200)


def guess_strip_accents(tokens: list[str]) -> str:
    """For an existing uncased vocab.txt: "all" when it was built from NFD-stripped text, else "latin".

    A vocabulary made with original BERT's normalization (bert-base-uncased, multilingual-uncased) spells Hangul
    as conjoining jamo and has kana without voicing marks; its model only ever saw text normalized that way, so
    that is how it must be tokenized. Any other vocabulary gets bertkit's Latin-only accent stripping.
    """
    chars = {c for t in tokens for c in t}
    jamo = sum(1 for c in chars if 0x1100 <= ord(c) <= 0x11FF)
    syllables = sum(1 for c in chars if 0xAC00 <= ord(c) <= 0xD7A3)
    kana = sum(1 for c in chars if 0x3041 <= ord(c) <= 0x30FA)
    if (jamo >= 10 and syllables < jamo) or (kana >= 20 and not chars & VOICED_KANA):
        return "all"
    return "latin"


def tokenizer_from_vocab(path, lowercase: bool | None = None, strip_accents: str = "auto") -> Tokenizer:
    """A tokenizer over an existing vocab.txt; lowercase=None and strip_accents="auto" are guessed from it."""
    tokens = read_vocab(path)
    if lowercase is None:
        lowercase = guess_lowercase(tokens)
    if strip_accents == "auto":
        strip_accents = guess_strip_accents(tokens)
    return build_tokenizer({t: i for i, t in enumerate(tokens)}, lowercase, strip_accents)


def _hf_config(folder: Path) -> dict:
    cfg = folder / "tokenizer_config.json"
    if not cfg.is_file():
        return {}
    try:
        return json.loads(cfg.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{cfg}: not valid JSON ({e})") from None


def hf_normalisation(folder: Path) -> tuple[bool, str] | None:
    """(lowercase, strip_accents) of an HF or bertkit folder's tokenizer_config.json, with HF's meaning (strip_accents
    unset: every accent stripped when lower-casing, as original BERT was trained; bertkit's own setting where it
    wrote one; accents are only ever stripped when lower-casing); None where the folder does not say."""
    cfg = _hf_config(folder)
    if not cfg.keys() & {"do_lower_case", "strip_accents", "bertkit_strip_accents"}:
        return None
    lowercase = bool(cfg.get("do_lower_case", True))   # HF's BertTokenizer default
    return lowercase, cfg.get("bertkit_strip_accents") or ("none" if cfg.get("strip_accents") is False else "all")


def load_tokenizer(path, *, lowercase: bool | None = None, strip_accents: str | None = None) -> Tokenizer:
    """Load a BERT tokenizer from a bertkit tokenizer folder, an HF model folder or a vocab.txt.

    - folder with tokenizer.json (bertkit or HF): used as written, so ids are exactly the model's;
    - folder with vocab.txt only (HF): do_lower_case / strip_accents from tokenizer_config.json, with HF's
      meaning (strip_accents unset = strip every accent when lower-casing, as the model was trained);
    - a vocab.txt path: uncased unless the vocabulary has capitals; bertkit's Latin-only accent stripping
      unless the vocabulary was built with original BERT's (see guess_strip_accents). Override with
      lowercase= / strip_accents=.
    The result adds [CLS]/[SEP] and type ids for pairs with add_special_tokens=True and gives offsets; it
    never pads or truncates (settings in an HF tokenizer.json are dropped): callers decide.
    """
    path = Path(path)
    if path.is_dir():
        check_tokenizer_files(path)
        check_recorded_sizes(path)
        if (path / "tokenizer.json").is_file():
            return _from_tokenizer_json(path / "tokenizer.json")
        if (path / "vocab.txt").is_file():
            said_lower, said_strip = hf_normalisation(path) or (True, "all")   # unsaid: original BERT's
            lower = said_lower if lowercase is None else lowercase
            return tokenizer_from_vocab(path / "vocab.txt", lower, strip_accents or said_strip)
        raise TokenizerError(f"{path}: no tokenizer.json or vocab.txt here; pass a `bertkit train-tokenizer` "
                             f"output folder, an HF model folder or a vocab.txt file")
    if not path.exists():
        raise TokenizerError(f"{path}: no such tokenizer folder or vocab file; train one with "
                             f"`bertkit train-tokenizer CORPUS_DIR --out {path}`, or point to an existing "
                             f"tokenizer folder, HF model folder or vocab.txt")
    if path.name.endswith(".json"):
        return _from_tokenizer_json(path)
    return tokenizer_from_vocab(path, lowercase, strip_accents or "auto")


def check_tokenizer_files(folder: Path) -> None:
    """A tokenizer folder may come from someone else: none of its files a link out of it or a pipe (a vocab.txt
    given by its own path is the user's, and read as it is)."""
    for name in TOKENIZER_FILES:
        if (folder / name).exists() or (folder / name).is_symlink():
            regular_file(folder / name)


def check_recorded_sizes(folder: Path) -> None:
    """The tokenizer files of a bertkit folder (tokenizer, instances, export) have the sizes its manifest.json
    records: a replaced vocab.txt would give ids that no longer mean what the model learnt."""
    try:
        files = json.loads((folder / "manifest.json").read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return  # no manifest (an HF folder) or not bertkit's: nothing recorded to compare with
    for name in TOKENIZER_FILES:
        entry = files.get(name) if isinstance(files, dict) else None
        if isinstance(entry, dict) and isinstance(entry.get("bytes"), int) and (folder / name).is_file():
            size = (folder / name).stat().st_size
            if size != entry["bytes"]:
                raise TokenizerError(f"{folder / name}: {size:,} bytes, but {folder / 'manifest.json'} records "
                                     f"{entry['bytes']:,}: replaced or cut short since the folder was written. "
                                     f"`bertkit verify {folder}` checks every file; restore it or re-run the stage")


def check_ids_fit(tokenizer: Tokenizer, vocab_size: int, tokenizer_where, model_where,
                  what: str = "word embeddings", fix: str = "use the tokenizer the model was trained with") -> None:
    """Every id the tokenizer can give is below vocab_size (a row of the model's embedding, a token of vocab.txt),
    checked before anything is written or trained."""
    n = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1  # the highest id, not the count
    if n > vocab_size:
        raise TokenizerError(f"{tokenizer_where}: gives token ids up to {n - 1:,}, but {model_where} has only "
                             f"{vocab_size:,} {what}: the two do not belong together; {fix}")


def check_dense_ids(vocab: dict, path) -> None:
    """Ids run from 0 to the vocabulary's size less one: bertkit sizes embeddings and the stored id type by the
    count, so an id past it would index out of the model or wrap in storage (70,000 kept as 4,464 in uint16)."""
    if not vocab:
        return
    token, top = max(vocab.items(), key=lambda kv: kv[1])
    if top >= len(vocab) or min(vocab.values()) < 0:
        raise TokenizerError(f"{path}: the token {token!r} has id {top:,}, but the vocabulary holds {len(vocab):,} "
                             f"tokens; ids must run from 0 to {len(vocab) - 1:,} without gaps. Use the tokenizer "
                             "as `bertkit train-tokenizer` or transformers wrote it")


def _from_tokenizer_json(path: Path) -> Tokenizer:
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises plain Exception subclasses with terse messages
        raise TokenizerError(f"{path}: not a loadable tokenizers file ({e})") from None
    vocab = tok.get_vocab()
    check_dense_ids(tok.get_vocab(with_added_tokens=True), path)
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise TokenizerError(f"{path}: the vocabulary lacks the special tokens {missing}; bertkit needs a BERT "
                             f"WordPiece tokenizer with all of {SPECIAL_TOKENS}")
    if tok.post_processor is None:  # a bare tokenizer.json: give it BERT's [CLS]/[SEP] template
        finish_tokenizer(tok)
    # HF folders often ship padding/truncation settings (e.g. pad to 128); every bertkit stage sets its own.
    tok.no_padding()
    tok.no_truncation()
    return tok


def vocab_tokens(path) -> list[str]:
    """The vocabulary, in id order, of anything load_tokenizer accepts."""
    path = Path(path)
    if path.is_dir():
        check_tokenizer_files(path)
    if path.is_dir() and (path / "vocab.txt").is_file():
        return read_vocab(path / "vocab.txt")
    if path.is_file() and not path.name.endswith(".json"):
        return read_vocab(path)
    vocab = load_tokenizer(path).get_vocab()
    return sorted(vocab, key=vocab.__getitem__)


def vocab_sha256(path) -> str:
    """sha256 of the vocab.txt of a tokenizer folder (or of a vocab.txt path).

    A folder with only tokenizer.json hashes the vocab.txt bertkit would write for it, so the same vocabulary
    gives the same checksum whichever files carry it.
    """
    path = Path(path)
    if path.is_dir():
        check_tokenizer_files(path)
    if path.is_dir() and (path / "vocab.txt").is_file():
        return sha256_file(path / "vocab.txt")
    if path.is_file() and not path.name.endswith(".json"):
        return sha256_file(path)
    import hashlib

    return hashlib.sha256(vocab_text(vocab_tokens(path))).hexdigest()


def _byte_of_char() -> dict[str, int]:
    """A byte-level BPE writes each byte as one printable character (GPT-2's table: printable Latin-1 bytes as
    themselves, the others shifted past 255, so a space is 'Ġ'); this is the way back."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(shifted)}}


BYTE_OF_CHAR = _byte_of_char()


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """How a token reads to a person: a byte-level BPE's as its text ('Ġ' a space; the bytes of a character cut
    between tokens as \\xNN), any other as it is (WordPiece's ##s, special tokens)."""
    token = tokenizer.id_to_token(token_id)
    if type(tokenizer.decoder).__name__ != "ByteLevel" or token is None or not all(c in BYTE_OF_CHAR for c in token):
        return token
    return bytes(BYTE_OF_CHAR[c] for c in token).decode("utf-8", errors="backslashreplace")
