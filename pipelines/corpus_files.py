"""Reading a prepare-corpus output folder: the one place later stages find its shards."""
import json
from pathlib import Path


class CorpusError(ValueError):
    pass


def read_corpus_manifest(corpus_dir) -> dict:
    corpus_dir = Path(corpus_dir)
    manifest = corpus_dir / "manifest.json"
    if not corpus_dir.is_dir():
        raise CorpusError(f"{corpus_dir}: no such folder. Run `bertkit prepare-corpus INPUT --out {corpus_dir}` first.")
    if not manifest.is_file():
        raise CorpusError(
            f"{corpus_dir}: no manifest.json, so this is not a finished prepare-corpus output. "
            f"Run (or resume) `bertkit prepare-corpus INPUT --out {corpus_dir}`."
        )
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CorpusError(f"{manifest}: not valid JSON ({e}); re-run prepare-corpus into a fresh folder.") from e
    if data.get("stage") != "prepare-corpus" or "shards" not in data:
        raise CorpusError(f"{manifest}: not a prepare-corpus manifest (stage={data.get('stage')!r}).")
    if not data.get("complete", False):
        raise CorpusError(f"{corpus_dir}: prepare-corpus did not finish; re-run the same command to resume it.")
    return data


def corpus_shards(corpus_dir, split: str = "train") -> list[Path]:
    """Shard paths of one split ("train" or "holdout"), in order, checked to exist."""
    corpus_dir = Path(corpus_dir)
    manifest = read_corpus_manifest(corpus_dir)
    paths = [corpus_dir / s["file"] for s in manifest["shards"] if s["split"] == split]
    for p in paths:
        if not p.is_file():
            raise CorpusError(f"{p}: listed in {corpus_dir / 'manifest.json'} but missing; re-run prepare-corpus.")
    return paths
