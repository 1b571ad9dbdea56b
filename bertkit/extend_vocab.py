"""`bertkit extend-vocab MODEL --tokenizer NEW --out OUT`: a released model's WordPiece vocabulary grown by a new
language's or domain's tokens, for continued pretraining (a decay phase `--init-from OUT` on that text).

The tokens of NEW's vocabulary that MODEL's lacks, in NEW's order, at most --max-new, go first into MODEL's unused
slots ([unused0] ..., which BERT keeps for this), then after its last token; the vocabulary is then filled with
[unused] tokens to a multiple of 64 (the rows a GPU's matrix units like, and slots for the next extension). Every
tensor with a row per token (the word embeddings, an untied decoder, the decoder's bias) keeps its rows for the old
tokens; a new token's row is the mean of the rows of the pieces MODEL's tokenizer spells it with (Gee et al. 2022's
FVT), or, where it spells it only as [UNK] (a script the model never saw), the mean of all rows. What went where is
in manifest.json and said. MODEL is read, never changed; OUT is a model folder transformers loads."""
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

UNUSED = re.compile(r"\[unused\d+\]")
MULTIPLE = 64
NOT_COPIED = {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "README.md", "manifest.json",
              ".bertkit-written.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "config.json"}


class ExtendError(ValueError):
    pass


@dataclass
class Extension:
    old_size: int
    new_size: int
    added: int             # new tokens
    into_unused: int       # of them, in the old vocabulary's unused slots
    appended: int          # of them, after its last token
    padding: int           # [unused] tokens to the multiple of 64
    from_pieces: int       # new rows: the mean of the pieces that spell the token
    from_mean: int         # new rows: the mean of all rows (the old tokenizer gave only [UNK])
    strip_accents: str     # the extended tokenizer's normalisation


def extended_vocabulary(old: list[str], new: list[str], max_new: int | None) -> tuple[list[str], list[int]]:
    """(the vocabulary, the ids whose rows are new): new tokens into unused slots, then appended, then padding."""
    from bertkit.tokenization import SPECIAL_TOKENS

    have = set(old)
    added = [t for t in dict.fromkeys(new) if t not in have and t not in SPECIAL_TOKENS and not UNUSED.fullmatch(t)]
    added = added[:max_new] if max_new is not None else added
    tokens = list(old)
    slots = [i for i, t in enumerate(old) if UNUSED.fullmatch(t)][:len(added)]
    for slot, token in zip(slots, added):
        tokens[slot] = token
    tokens += added[len(slots):]
    tokens += unused_names(set(tokens), -len(tokens) % MULTIPLE)
    return tokens, slots + list(range(len(old), len(tokens)))


def unused_names(taken: set, count: int) -> list[str]:
    """`count` [unusedN] tokens not among `taken`, N counting up."""
    names, k = [], 0
    while len(names) < count:
        if f"[unused{k}]" not in taken:
            names.append(f"[unused{k}]")
        k += 1
    return names


def pieces_of(token: str, tokenizer, unk_id: int) -> list[int]:
    """The old tokenizer's ids for a token's text (a ## continuation's text without its mark), [UNK] left out."""
    text = token[2:] if token.startswith("##") else token
    return [i for i in tokenizer.encode(text, add_special_tokens=False).ids if i != unk_id]


def grow(state: dict, old_size: int, new_size: int, rows: dict) -> dict:
    """Each tensor with old_size rows grown to new_size: old rows kept, row i of `rows` set to the mean of the old
    rows it lists ([] for the mean of every old row)."""
    import torch

    grown = {}
    for name, tensor in state.items():
        if tensor.dim() == 0 or tensor.shape[0] != old_size:
            grown[name] = tensor
            continue
        out = torch.cat([tensor, tensor.new_zeros((new_size - old_size, *tensor.shape[1:]))])
        everything = tensor.mean(0)
        for i, ids in rows.items():
            out[i] = tensor[ids].mean(0) if ids else everything
        grown[name] = out
    return grown


def normalisation(model_dir: Path, tokens: list[str]) -> tuple[bool, str]:
    """(lowercase, strip_accents) the model's tokenizer used (its tokenizer_config.json, else guessed from its
    vocabulary); original BERT's "all" (NFD, every mark dropped: Hangul syllables taken apart into jamo) becomes
    bertkit's "latin", which normalises Latin text alike and keeps Hangul and kana whole, so a new language's tokens
    can match."""
    from bertkit.tokenization import guess_lowercase, guess_strip_accents, hf_normalisation

    said = hf_normalisation(model_dir)
    if said is None:
        lowercase = guess_lowercase(tokens)
        said = lowercase, guess_strip_accents(tokens) if lowercase else "none"
    lowercase, strip = said
    return lowercase, ("latin" if strip == "all" else strip) if lowercase else "none"


def check_wordpiece(tokenizer, folder: Path, what: str) -> None:
    """Both vocabularies are WordPiece: a BPE's tokens (byte-level, as a released ModernBERT's) mean nothing to a
    WordPiece model and its merges nothing to one, so an extension across them would change every id silently."""
    kind = type(tokenizer.model).__name__
    if kind != "WordPiece":
        fix = ("a byte-level BPE (a released ModernBERT's) spells any text without [UNK]: continue pretraining with "
               "its own vocabulary (pretrain --init-from it)" if what == "MODEL" else
               "give a WordPiece tokenizer (bertkit train-tokenizer makes one)")
        raise ExtendError(f"{what} {folder}: its tokenizer is a {kind} model, and extend-vocab grows WordPiece "
                          f"vocabularies only; {fix}")


def extend_vocab(model_dir, tokenizer_dir, out, max_new: int | None = None) -> Extension:
    """Write OUT (a new or empty folder): MODEL with the extended vocabulary; returns what was done."""
    from safetensors.torch import save

    from bertkit.fileio import FolderNotOwnedError, atomic_write_bytes, atomic_write_json, checksum_file, make_folder
    from bertkit.models.bert_hf import read_weights
    from bertkit.tokenization import UNK, build_tokenizer, hf_tokenizer_files, load_tokenizer, vocab_text, vocab_tokens

    model_dir, out = Path(model_dir), Path(out)
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        rows_before = int(config["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ExtendError(f"{model_dir}: no config.json with a vocab_size ({e}); give a model folder") from None
    if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        raise ExtendError(f"{out}: exists and is not empty (or is a link); give a new --out")
    old = vocab_tokens(model_dir)
    if len(old) > rows_before:
        raise ExtendError(f"{model_dir}: {len(old)} tokens but {rows_before} rows (config.json vocab_size)")
    old += unused_names(set(old), rows_before - len(old))   # rows no token uses: free slots
    before = load_tokenizer(model_dir)
    check_wordpiece(before, model_dir, "MODEL")
    check_wordpiece(load_tokenizer(tokenizer_dir), tokenizer_dir, "--tokenizer")
    tokens, fresh = extended_vocabulary(old, vocab_tokens(tokenizer_dir), max_new)
    unk = before.token_to_id(UNK)
    rows = {i: [] if UNUSED.fullmatch(tokens[i]) else pieces_of(tokens[i], before, unk) for i in fresh}
    state = grow(read_weights(model_dir), rows_before, len(tokens), rows)
    lowercase, strip = normalisation(model_dir, old)
    added = sum(not UNUSED.fullmatch(tokens[i]) for i in fresh)
    into_unused = sum(i < rows_before and not UNUSED.fullmatch(tokens[i]) for i in fresh)
    found = Extension(rows_before, len(tokens), added, into_unused, added - into_unused,
                      len(tokens) - len(old) - (added - into_unused), sum(bool(rows[i]) for i in fresh),
                      sum(not rows[i] and not UNUSED.fullmatch(tokens[i]) for i in fresh), strip)
    try:
        make_folder(out)
    except FolderNotOwnedError as e:
        raise ExtendError(str(e)) from None
    for path in sorted(model_dir.iterdir()):   # a folder from someone else: its plain files only, never a link
        if path.is_file() and not path.is_symlink() and path.name not in NOT_COPIED and \
                not path.name.endswith((".safetensors", ".bin")):
            atomic_write_bytes(out / path.name, path.read_bytes())
    atomic_write_bytes(out / "model.safetensors", save({k: v.contiguous() for k, v in state.items()},
                                                         metadata={"format": "pt"}))
    atomic_write_json(out / "config.json", {**config, "vocab_size": len(tokens)})
    atomic_write_bytes(out / "vocab.txt", vocab_text(tokens))
    atomic_write_bytes(out / "tokenizer.json",
                       build_tokenizer({t: i for i, t in enumerate(tokens)}, lowercase, strip).to_str().encode())
    atomic_write_bytes(out / "README.md", card(model_dir.name, found).encode("utf-8"))
    atomic_write_json(out / "tokenizer_config.json", hf_tokenizer_files(lowercase, strip)[0])
    files = {p.name: {"bytes": p.stat().st_size, "checksum": checksum_file(p)} for p in sorted(out.iterdir())}
    atomic_write_json(out / "manifest.json", {"stage": "export", "complete": True, "run": None, "checkpoint": None,
                                              "extended_from": model_dir.name, "extension": asdict(found),
                                              "files": files})
    return found


def card(source: str, found: Extension) -> str:
    return (f"# {source}, its vocabulary extended\n\n`bertkit extend-vocab` grew `{source}`'s vocabulary from "
            f"{found.old_size:,} to {found.new_size:,} tokens: {found.added:,} new ({found.into_unused:,} in "
            f"unused slots, {found.appended:,} appended), {found.padding:,} [unused] to a multiple of {MULTIPLE}. "
            "A new token's rows are the mean of the rows of the pieces the old tokenizer spelled it with "
            f"({found.from_pieces:,}), or of all rows where it gave only [UNK] ({found.from_mean:,}). Not trained "
            "since: continue pretraining on the new text before use.\n")
