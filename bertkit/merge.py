"""`bertkit merge`: several exports of one architecture and vocabulary as one model, as 2025's encoders finish
(mmBERT merges its decay variants; model soups average fine-tunings): the weighted mean, or TIES (Yadav et al.
2023: each model's difference from a base trimmed to its largest `density` share, a sign elected per weight by the
summed differences, the differences that agree with it averaged, added to the base). The folder written is the first
input's (config, vocabulary, tokenizer files) with the merged weights, a manifest and a card naming the inputs."""
import json
from pathlib import Path

METHODS = ("mean", "ties")
NOT_COPIED = {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "README.md", "manifest.json",
              ".bertkit-written.json"}


class MergeError(ValueError):
    pass


RECORDS = ("bertkit", "_name_or_path", "transformers_version", "architectures")
# settings that neither shape the weights nor change what they compute in the encoder: how they were initialised,
# dropped out, stored, or read by a fine-tuning head (a released folder and a bertkit export of it differ here)
NOT_ARCHITECTURE = ("dropout", "classifier_", "initializer_", "dtype", "sparse_pred", "deterministic_",
                    "reference_compile", "repad_", "use_cache")


def _architecture(folder: Path) -> dict:
    """config.json's settings that shape the weights or what they compute (not records, dropout, initialisation,
    storage type or fine-tuning heads' settings)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise MergeError(f"{folder}: no readable config.json ({e}); give export folders") from None
    if not isinstance(config, dict):
        raise MergeError(f"{folder}: config.json is not a JSON object; give export folders")
    return {k: v for k, v in config.items() if k not in RECORDS and not any(n in k for n in NOT_ARCHITECTURE)}


def _vocabulary(folder: Path) -> dict | None:
    """The token -> id map the model was trained with (its tokenizer.json, else its vocab.txt, as bertkit loads
    them), or None where the folder holds neither."""
    from bertkit.tokenization import TokenizerError, load_tokenizer

    if not any((folder / name).is_file() for name in ("tokenizer.json", "vocab.txt")):
        return None
    try:
        return load_tokenizer(folder).get_vocab(with_added_tokens=True)
    except TokenizerError as e:
        raise MergeError(str(e)) from None


def check_mergeable(folders: list[Path]) -> None:
    """One architecture and one vocabulary, or a MergeError naming the folder and what differs."""
    first, vocab = _architecture(folders[0]), _vocabulary(folders[0])
    for folder in folders[1:]:
        other = _architecture(folder)
        # a setting one folder leaves out (or null) is its writer's default, which the other may spell out
        differs = sorted(k for k in set(first) & set(other)
                         if None not in (first[k], other[k]) and first[k] != other[k])
        if differs:
            raise MergeError(f"{folder}: another architecture than {folders[0]} ({differs[0]}: {other.get(differs[0])}"
                             f" against {first.get(differs[0])}); merge models of one shape")
        if _vocabulary(folder) != vocab:
            raise MergeError(f"{folder}: another vocabulary than {folders[0]} (their tokenizer.json or vocab.txt give "
                             "other tokens or ids); merge models trained with one tokenizer")


def mean(states: list[dict], weights: list[float]) -> dict:
    total = sum(weights)
    return {k: sum(w * s[k] for w, s in zip(weights, states)) / total if states[0][k].is_floating_point()
            else states[0][k] for k in states[0]}


def ties(base: dict, states: list[dict], density: float) -> dict:
    """TIES-merging of each floating tensor (the others: the base's)."""
    import torch

    merged = {}
    for key, b in base.items():
        if not b.is_floating_point():
            merged[key] = b
            continue
        deltas = torch.stack([s[key] - b for s in states]).reshape(len(states), -1)
        keep = max(1, int(round(density * deltas.shape[1])))
        threshold = deltas.abs().topk(keep, dim=1).values[:, -1:]
        trimmed = torch.where(deltas.abs() >= threshold, deltas, torch.zeros_like(deltas))
        sign = torch.sign(trimmed.sum(0))
        agree = (torch.sign(trimmed) == sign) & (trimmed != 0)
        merged[key] = b + ((trimmed * agree).sum(0) / agree.sum(0).clamp(min=1)).reshape(b.shape)
    return merged


def merge(folders, out, method: str = "mean", weights: list[float] | None = None, base=None,
          density: float = 0.2) -> Path:
    """Write the merged model to `out` (absent or empty); returns it."""
    from safetensors.torch import save

    from bertkit.fileio import FolderNotOwnedError, atomic_write_bytes, atomic_write_json, checksum_file, make_folder
    from bertkit.models.bert_hf import read_weights

    folders, out = [Path(f) for f in folders], Path(out)
    if method not in METHODS:
        raise MergeError(f"--method {method}: choose {' or '.join(METHODS)}")
    if len(folders) < 2:
        raise MergeError("merge takes at least two model folders")
    if weights is not None and (len(weights) != len(folders) or min(weights) <= 0):
        raise MergeError(f"--weights: one above 0 per model ({len(folders)})")
    if (method == "ties") != (base is not None) or not 0 < density <= 1:
        raise MergeError("--method ties takes --base (the model the others were tuned from) and a --density in "
                         "(0, 1]; mean takes neither base")
    check_mergeable(folders + ([Path(base)] if base is not None else []))
    if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        raise MergeError(f"{out}: exists and is not empty (or is a link); give a new --out")
    states = [read_weights(f) for f in folders]
    if any(set(s) != set(states[0]) or any(s[k].shape != states[0][k].shape for k in s) for s in states[1:]):
        raise MergeError("the models' tensors differ in names or shapes; merge exports of one architecture")
    merged = ties(read_weights(base), states, density) if method == "ties" else \
        mean(states, weights or [1.0] * len(folders))
    try:
        make_folder(out)
    except FolderNotOwnedError as e:
        raise MergeError(str(e)) from None
    for path in sorted(folders[0].iterdir()):   # a folder from someone else: its plain files only, never a link
        if path.is_file() and not path.is_symlink() and path.name not in NOT_COPIED:
            atomic_write_bytes(out / path.name, path.read_bytes())
    atomic_write_bytes(out / "model.safetensors", save({k: v.contiguous() for k, v in merged.items()},
                                                         metadata={"format": "pt"}))
    sources = [{"folder": f.name, "weights_checksum": checksum_file(f / "model.safetensors")
                if (f / "model.safetensors").is_file() else None} for f in folders]
    recipe = {"method": method, "weights": weights, "density": density if method == "ties" else None,
              "base": Path(base).name if base is not None else None}
    atomic_write_bytes(out / "README.md", _card(folders, recipe).encode("utf-8"))
    files = {p.name: {"bytes": p.stat().st_size, "checksum": checksum_file(p)} for p in sorted(out.iterdir())}
    atomic_write_json(out / "manifest.json", {"stage": "export", "complete": True, "run": None, "checkpoint": None,
                                              "merged_from": sources, "merge": recipe, "files": files})
    return out


def _card(folders: list[Path], recipe: dict) -> str:
    names = ", ".join(f"`{f.name}`" for f in folders)
    how = (f"TIES over their differences from `{recipe['base']}` (density {recipe['density']})"
           if recipe["method"] == "ties" else
           f"the mean of their weights{' weighted ' + str(recipe['weights']) if recipe['weights'] else ''}")
    return (f"# Merged model\n\n{len(folders)} models of one architecture and vocabulary ({names}) merged by "
            f"`bertkit merge`: {how}. Its configuration and tokenizer are `{folders[0].name}`'s; `manifest.json` "
            "names each input by its weights' checksum. Score it before use: a merge is not trained.\n")
