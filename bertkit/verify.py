"""`bertkit verify DIR`: check every file of any bertkit folder against the sizes and checksums its manifest (or a
checkpoint's checkpoint.json) recorded: corpus, tokenizer, instances, export, and a pretraining run's checkpoints.

Opening a folder in a stage only checks sizes and row counts (cheap); this reads every byte.
"""
import json
from dataclasses import dataclass, field
from pathlib import Path

from bertkit.fileio import file_matches, sha256_file
from bertkit.formats import CHECKPOINTS, MANIFEST, FormatError, folder_kind, listed_file


@dataclass
class Verdict:
    folder: str
    kind: str
    checked: int = 0
    damaged: list = field(default_factory=list)     # "file: what is wrong"
    notes: list = field(default_factory=list)       # not damage: e.g. a checkpoint left unfinished by a kill

    @property
    def ok(self) -> bool:
        return not self.damaged


def _check(folder: Path, rel: str, size: int | None, checksum: str | None, verdict: Verdict) -> None:
    verdict.checked += 1
    try:
        path = listed_file(folder, rel, folder / MANIFEST)
    except FormatError as e:
        verdict.damaged.append(str(e))
        return
    if not path.is_file():
        verdict.damaged.append(f"{path}: missing")
    elif size is not None and path.stat().st_size != size:
        verdict.damaged.append(f"{path}: {path.stat().st_size:,} bytes, expected {size:,} (cut short or replaced)")
    elif checksum is not None and not file_matches(path, checksum):
        verdict.damaged.append(f"{path}: contents differ from the recorded checksum (damaged or replaced)")


def _entries(files: dict):
    """(name, size, checksum) of a manifest's `files`; older tokenizer manifests map name -> sha256 hex."""
    for name, entry in files.items():
        if isinstance(entry, str):
            yield name, None, f"sha256:{entry}"
        else:
            yield name, entry.get("bytes"), entry.get("checksum")


def verify_folder(folder) -> Verdict:
    folder = Path(folder)
    if not folder.is_dir():
        raise FormatError(f"{folder}: no such folder")
    kind = folder_kind(folder)
    if kind is None:
        if (folder / MANIFEST).is_file():
            raise FormatError(f"{folder / MANIFEST}: not valid JSON or not a bertkit manifest: the folder's record "
                              "of its files is itself damaged; re-run the stage that wrote it")
        raise FormatError(f"{folder}: not a bertkit folder (no manifest.json, no run config.json with checkpoints)")
    verdict = Verdict(str(folder), kind)
    if kind in ("finetune", "finetune-korean"):
        verdict.notes.append("a fine-tuning output records no checksums; its best/ model is an HF folder")
        return verdict
    if kind == "pretrain":
        from bertkit.pretrain.checkpoints import checkpoint_problems, checkpoint_steps, read_marker

        ckpt = folder / CHECKPOINTS
        for step in checkpoint_steps(ckpt):
            tag = f"global_step{step}"
            marker = read_marker(ckpt / tag)
            if marker is None:
                verdict.notes.append(f"{ckpt / tag}: incomplete (no checkpoint.json): --resume and export skip it")
                continue
            verdict.checked += len(marker.files)
            verdict.damaged += [f"{ckpt / tag}/{p}" for p in checkpoint_problems(ckpt / tag, marker)]
        if not checkpoint_steps(ckpt):
            verdict.notes.append("no checkpoint yet")
        return verdict
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    if not manifest.get("complete"):
        verdict.notes.append(f"{kind} did not finish here: run the same command again to resume it")
    for shard in manifest.get("shards", []):
        checksum = shard.get("checksum") or (f"sha256:{shard['sha256']}" if "sha256" in shard else None)
        _check(folder, shard["file"], shard.get("bytes"), checksum, verdict)
    for name, size, checksum in _entries(manifest.get("files") or {}):
        _check(folder, name, size, checksum, verdict)
    if kind == "train-tokenizer" and manifest.get("vocab_sha256") and (folder / "vocab.txt").is_file():
        if sha256_file(folder / "vocab.txt") != manifest["vocab_sha256"]:
            verdict.damaged.append(f"{folder / 'vocab.txt'}: differs from the vocab_sha256 in {MANIFEST}")
    return verdict
