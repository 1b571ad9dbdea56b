"""What bertkit wrote into an output folder, so that a rerun or --overwrite replaces bertkit's own files and never
touches another: a user's notes, a thesis, a README beside an export stay, and are named as kept.

Every writer that replaces earlier output keeps FOLDER/.bertkit-written.json, the list of files it wrote there
(found as the files that are new or replaced since the command began: every bertkit write is a new file renamed
into place, so a file it wrote has a new inode; a user's untouched file keeps its own). An export's manifest
already lists every file of an earlier export, so exports from before the record are read from it. A folder with
no record loses nothing: its files are kept and only overwritten by name.

A replacement is written beside the old output (FOLDER/.bertkit-staging/) and swapped in by renames once whole, so
a kill at any moment leaves the old output or the new one, never an empty folder.
"""
import os
import shutil
from pathlib import Path

from bertkit.fileio import FolderNotOwnedError, atomic_write_json, read_json_or_none

WRITTEN = ".bertkit-written.json"
STAGING = ".bertkit-staging"


def _files(folder: Path) -> dict:
    """{relative path: (inode, mtime_ns)} of every file and link under folder's visible entries, no link followed
    (hidden top-level entries are the lock, this record and a scheduler's notes: never bertkit's output)."""
    found = {}
    if not folder.is_dir():
        return found
    for top in folder.iterdir():
        if top.name.startswith("."):
            continue
        if top.is_symlink() or not top.is_dir():
            st = top.lstat()
            found[top.name] = (st.st_ino, st.st_mtime_ns)
            continue
        for root, dirs, names in os.walk(top):  # followlinks=False: a linked folder is listed, not entered
            for name in names + [d for d in dirs if Path(root, d).is_symlink()]:
                p = Path(root, name)
                st = p.lstat()
                found[p.relative_to(folder).as_posix()] = (st.st_ino, st.st_mtime_ns)
    return found


def written_earlier(folder, manifest_files: bool = False) -> set | None:
    """The files an earlier bertkit command recorded writing into folder; None when there is no record (with
    manifest_files, an export's manifest.json 'files' stand in for one)."""
    folder = Path(folder)
    record = read_json_or_none(folder / WRITTEN) if (folder / WRITTEN).is_file() else None
    if isinstance(record, dict) and isinstance(record.get("files"), list):
        return {f for f in record["files"] if isinstance(f, str) and _inside(f)}
    if manifest_files:
        manifest = read_json_or_none(folder / "manifest.json") if (folder / "manifest.json").is_file() else None
        listed = manifest.get("files") if isinstance(manifest, dict) else None
        if isinstance(listed, dict):
            return {f for f in listed if isinstance(f, str) and _inside(f)} | {"manifest.json"}
    return None


def _inside(name: str) -> bool:
    parts = Path(name).parts
    return bool(parts) and not Path(name).is_absolute() and ".." not in parts and not parts[0].startswith(".")


class Output:
    """One command's writing into `folder` (taken under its folder lock): what was there before, what bertkit
    wrote there earlier, and at the end the record of what it wrote."""

    def __init__(self, folder, what: str, manifest_files: bool = False):
        self.folder, self.what = Path(folder), what
        self.before = _files(self.folder)
        self.earlier = written_earlier(self.folder, manifest_files)

    def theirs(self) -> list:
        """The files present that bertkit did not write (all of them when there is no record)."""
        earlier = self.earlier or set()
        return sorted(f for f in self.before if f not in earlier and not _below_any(f, earlier))

    def remove_earlier(self, keep=()) -> list:
        """Remove what bertkit wrote here before (never a file it did not write), but names in `keep`; returns the
        files kept because bertkit did not write them."""
        for name in sorted(self.earlier or (), reverse=True):
            if name not in keep:
                _remove(self.folder, name)
        return self.theirs()

    def record(self) -> None:
        """FOLDER/.bertkit-written.json: the earlier record's files still present, and every file new or replaced
        since this command began."""
        now = _files(self.folder)
        mine = {f for f, stamp in now.items() if self.before.get(f) != stamp}
        mine |= {f for f in (self.earlier or ()) if f in now}
        atomic_write_json(self.folder / WRITTEN, {"what": self.what, "files": sorted(mine)}, fsync=False)

    def kept_note(self) -> str | None:
        """What was kept because bertkit did not write it (files since replaced by name are not counted)."""
        now = _files(self.folder)
        kept = [f for f in self.theirs() if now.get(f) == self.before[f]]
        if not kept:
            return None
        shown = ", ".join(kept[:5]) + (f" and {len(kept) - 5} more" if len(kept) > 5 else "")
        why = "bertkit did not write them" if self.earlier is not None else \
            "this folder has no record of what bertkit wrote (made before that record existed)"
        return f"{self.folder}: kept {shown} ({why})"


def _below_any(name: str, folders: set) -> bool:
    return any(name.startswith(f + "/") for f in folders)


def _remove(folder: Path, name: str) -> None:
    """Remove folder/name (a file, a link, or a folder bertkit wrote whole), then the folders it leaves empty."""
    path = folder / name
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    parent = path.parent
    while parent != folder and parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


def refuse_other_inputs(folder, what: str, mine: dict, theirs: dict | None, overwrite: bool) -> None:
    """An earlier `what` in folder made from other inputs (`theirs`, e.g. another run or task, against `mine`) is
    refused without --overwrite, naming both."""
    differ = {k: (theirs[k], v) for k, v in mine.items() if theirs and k in theirs and theirs[k] != v}
    if differ and not overwrite:
        said = "; ".join(f"{k} {a} (this command: {b})" for k, (a, b) in differ.items())
        raise FolderNotOwnedError(f"{folder} holds an earlier {what} of another {' and '.join(differ)}: {said}. "
                                  "Pass --overwrite to replace it, or choose another folder")


def staging_folder(folder) -> Path:
    """FOLDER/.bertkit-staging, new and empty: a replacement is written here whole, then swapped in."""
    staging = Path(folder) / STAGING
    if staging.is_symlink() or staging.is_file():
        staging.unlink()
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def swap_in(output: Output, staging: Path, last: str | None = None) -> None:
    """Move every file of `staging` into the output folder by renames (the old manifest goes first, `last` comes
    last, so a folder killed in between is never marked finished), then remove what bertkit wrote earlier that
    the new output lacks. A new file whose name a file bertkit did not write holds is refused before anything
    moves, naming it."""
    folder, earlier = output.folder, output.earlier or set()
    new = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
    clash = [f for f in new if f in output.before and f not in earlier and not _below_any(f, earlier)]
    if clash:
        shutil.rmtree(staging, ignore_errors=True)
        raise FolderNotOwnedError(f"{folder / clash[0]}: bertkit did not write this file, and {output.what} would "
                                  "replace it; move it, or choose another folder (nothing was changed)")
    if last:
        (folder / last).unlink(missing_ok=True)
    for name in [f for f in new if f != last] + ([last] if last in new else []):
        target = folder / name
        for parent in reversed(Path(name).parents[:-1]):  # a file bertkit wrote where a folder now goes
            if (folder / parent).is_symlink() or (folder / parent).is_file():
                (folder / parent).unlink()
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(staging / name, target)
    for name in sorted(earlier - set(new), reverse=True):
        if not any(f.startswith(name + "/") for f in new):
            _remove(folder, name)
    shutil.rmtree(staging, ignore_errors=True)

