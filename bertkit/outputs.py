"""What bertkit wrote into an output folder, so that a rerun or --overwrite replaces bertkit's own files and never
touches another: a user's notes, a thesis, a README beside an export stay, and are named as kept.

Every writer that replaces earlier output keeps FOLDER/.bertkit-written.json: each file it wrote there with its
inode, modification time and size (a log bertkit appends to, *.jsonl, may have grown since). The names are those
bertkit's own writers put in place while the command ran (fileio.record_writes), never the folder's difference
before and after, which would take a user's notes saved there during a long run for bertkit's. A file is bertkit's,
and may be removed, only while it is still exactly that file: one the user edited or replaced since, or one a record
from someone else names, stays. An export's manifest (each file's size and checksum) stands in for the record in
exports made before it. A folder with no record loses nothing: its files are only overwritten by name.
Files are removed one by one, never a folder with what it holds.

A replacement is written beside the old output (FOLDER/.bertkit-staging-*/) and swapped in by renames once whole,
so a kill at any moment leaves the old output or the new one, never an empty folder.
"""
import os
import shutil
import tempfile
from pathlib import Path

from bertkit.fileio import (
    FolderNotOwnedError,
    atomic_write_json,
    file_matches,
    note_written,
    read_json_or_none,
    record_writes,
    stop_recording,
)

WRITTEN = ".bertkit-written.json"
STAGING = ".bertkit-staging-"
STAGING_MARK = ".bertkit-staging"   # inside a staging folder: bertkit made it, so a leftover may be removed


def _stamp(path: Path) -> list:
    st = path.lstat()
    return [st.st_ino, st.st_mtime_ns, st.st_size]


def _same_file(path: Path, stamp) -> bool:
    """Whether path is still the file a record's stamp describes: its inode and time (records before the size was
    kept hold only those two); a log bertkit appends to (*.jsonl) may since have grown, never shrunk or been
    rewritten (a user's edit of it rewrites it shorter, or as a new file)."""
    if not isinstance(stamp, list) or len(stamp) < 2:
        return False
    now = _stamp(path)
    if now[:2] == stamp[:2]:
        return True
    return path.suffix == ".jsonl" and len(stamp) == 3 and now[0] == stamp[0] and now[1] >= stamp[1] and \
        isinstance(stamp[2], int) and now[2] > stamp[2]


def _files(folder: Path) -> dict:
    """{relative path: [inode, mtime_ns]} of every file and link under folder's visible entries, no link followed
    (hidden top-level entries are the lock, this record and a scheduler's notes: never bertkit's output)."""
    found = {}
    if not folder.is_dir():
        return found
    for top in folder.iterdir():
        if top.name.startswith("."):
            continue
        if top.is_symlink() or not top.is_dir():
            found[top.name] = _stamp(top)
            continue
        for root, dirs, names in os.walk(top):  # followlinks=False: a linked folder is listed, not entered
            for name in names + [d for d in dirs if Path(root, d).is_symlink()]:
                found[Path(root, name).relative_to(folder).as_posix()] = _stamp(Path(root, name))
    return found


def written_earlier(folder, manifest_files: bool = False) -> set | None:
    """The files an earlier bertkit command wrote into folder that are still exactly what it wrote; None when there
    is no record (with manifest_files, an export's manifest.json 'files' stand in for one)."""
    folder = Path(folder)
    record = read_json_or_none(folder / WRITTEN) if (folder / WRITTEN).is_file() else None
    if isinstance(record, dict) and isinstance(record.get("files"), dict):
        return {f for f, stamp in record["files"].items()
                if _unchanged(folder, f, lambda p, stamp=stamp: _same_file(p, stamp))}
    manifest = read_json_or_none(folder / "manifest.json") if manifest_files else None
    listed = manifest.get("files") if isinstance(manifest, dict) else None
    if isinstance(listed, dict):
        def same(p, entry):
            return isinstance(entry, dict) and entry.get("bytes") == p.stat().st_size and \
                isinstance(entry.get("checksum"), str) and file_matches(p, entry["checksum"])
        return {f for f, e in listed.items() if _unchanged(folder, f, lambda p, e=e: same(p, e))} | \
            ({"manifest.json"} if (folder / "manifest.json").is_file() else set())
    return None


def _unchanged(folder: Path, name, same) -> bool:
    """Whether folder/name is a file inside folder (no `..`, no link on the way) for which same(path) holds."""
    if not isinstance(name, str):
        return False
    parts = Path(name).parts
    if not parts or Path(name).is_absolute() or ".." in parts or parts[0].startswith("."):
        return False
    path = folder / name
    if any((folder / Path(*parts[:i])).is_symlink() for i in range(1, len(parts))):
        return False
    if path.is_symlink() or not path.is_file():
        return False
    try:
        return bool(same(path))
    except (OSError, ValueError):
        return False


class Output:
    """One command's writing into `folder` (taken under its folder lock): what was there before, what bertkit
    wrote there earlier, and at the end the record of what it wrote."""

    def __init__(self, folder, what: str, manifest_files: bool = False):
        self.folder, self.what = Path(folder), what
        self.root = Path(os.path.abspath(folder))
        self.earlier = written_earlier(self.folder, manifest_files)
        # each earlier file's stamp as it was found bertkit's: one replaced since (by the user, during a long run) no
        # longer matches, and is then neither replaced, removed nor recorded as bertkit's
        self.earlier_stamps = {f: _stamp(self.folder / f) for f in self.earlier or ()}
        # the names bertkit's writers put in place from now on; a file not bertkit's is never replaced; the record
        # is kept current after each write, so a killed command's folder says what it wrote
        self.written = record_writes(self.folder, self._may_replace, self.save_record)

    def ours(self) -> set:
        """The earlier files that are still exactly what they were when this command found them bertkit's."""
        return {f for f, stamp in self.earlier_stamps.items()
                if _unchanged(self.folder, f, lambda p, stamp=stamp: _stamp(p) == stamp)}

    def _may_replace(self, path: str) -> bool:
        if self.earlier is None:   # a folder with no record: its files are overwritten by name, as before records
            return True
        return Path(os.path.relpath(path, self.root)).as_posix() in self.ours()

    def remove_earlier(self, under: str = "") -> None:
        """Remove what bertkit wrote here before (the files below `under`, a folder's name and "/", if given), each
        checked again just before it goes: never a file it did not write, or one changed since."""
        for name in sorted(self.ours(), reverse=True):
            if name.startswith(under):
                _remove(self.folder, name)

    def save_record(self) -> set:
        """Write FOLDER/.bertkit-written.json now (after each write, so that a kill leaves it): the earlier files
        still as found and every file bertkit's writers put in place since this command began, each with its inode,
        modification time and size. Returns those names."""
        wrote = {Path(os.path.relpath(p, self.root)).as_posix() for p in self.written}
        files = {f: self.earlier_stamps[f] for f in self.ours() - wrote}
        for f in wrote:
            path = self.folder / f
            if not f.startswith(".") and os.path.lexists(path) and not path.is_dir():
                files[f] = _stamp(path)
        atomic_write_json(self.folder / WRITTEN, {"what": self.what, "files": dict(sorted(files.items()))},
                          fsync=False)
        return set(files)

    def finish(self) -> str | None:
        """The record written a last time, recording stopped; what was kept because it is not bertkit's, as a line to
        say, or None."""
        stop_recording(self.folder)
        mine = self.save_record()
        kept = sorted(f for f in _files(self.folder) if f not in mine)
        if not kept:
            return None
        shown = ", ".join(kept[:5]) + (f" and {len(kept) - 5} more" if len(kept) > 5 else "")
        why = "bertkit did not write them, or they changed since" if self.earlier is not None else \
            "this folder has no record of what bertkit wrote (made before that record existed)"
        return f"{self.folder}: kept {shown} ({why})"


def _remove(folder: Path, name: str) -> None:
    """Remove the file folder/name (checked as bertkit's by written_earlier), then the folders it leaves empty."""
    path = folder / name
    path.unlink(missing_ok=True)
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
    """A new hidden folder FOLDER/.bertkit-staging-XXXX: a replacement is written here whole, then swapped in. Those
    a killed command left (real folders of that name holding STAGING_MARK, which only this function writes) are
    removed first; a folder of that name without the mark is someone else's and stays."""
    folder = Path(folder)
    for old in folder.glob(STAGING + "*"):
        drop_staging(old)
    staging = Path(tempfile.mkdtemp(prefix=STAGING, dir=folder))
    (staging / STAGING_MARK).touch()
    return staging


def drop_staging(staging: Path) -> None:
    """Remove a staging folder with what it holds, only if it is one staging_folder made: a real folder (no link)
    holding STAGING_MARK."""
    staging = Path(staging)
    if staging.is_dir() and not staging.is_symlink() and (staging / STAGING_MARK).is_file():
        shutil.rmtree(staging, ignore_errors=True)


def staged_files(staging: Path) -> list[str]:
    """The files written into a staging folder (relative, sorted), its mark aside."""
    return sorted(n for p in staging.rglob("*")
                  if p.is_file() and (n := p.relative_to(staging).as_posix()) != STAGING_MARK)


def _blocks(folder: Path, p: Path, ours: set, is_file: bool) -> bool:
    """Whether folder/p, not bertkit's, stands where a new file (is_file) or a folder of new files goes. A link
    where a file goes is replaced (its target untouched); a link or file where a folder goes would redirect the
    writes."""
    here = folder / p
    if p.as_posix() in ours:
        return False
    return (here.exists() and not here.is_symlink()) if is_file else (here.is_symlink() or here.is_file())


def swap_in(output: Output, staging: Path, last: str | None = None) -> None:
    """Move every file of `staging` into the output folder by renames (the old manifest goes first, `last` comes
    last, so a folder killed in between is never marked finished), then remove what bertkit wrote earlier that
    the new output lacks. A new file that would replace anything not bertkit's (a user's file, a folder, a file
    where a folder must go) is refused before anything moves, naming it."""
    folder, ours = output.folder, output.ours()
    new = staged_files(staging)
    in_the_way = [folder / p for f in new for p in Path(f).parents[:-1] if _blocks(folder, p, ours, False)] + \
        [folder / f for f in new if _blocks(folder, Path(f), ours, True)]
    if in_the_way:
        drop_staging(staging)
        raise FolderNotOwnedError(f"{in_the_way[0]}: bertkit did not write this, and {output.what} would replace "
                                  "it; move it, or choose another folder (nothing was changed)")
    if last in ours:
        _remove(folder, last)
    for name in [f for f in new if f != last] + ([last] if last in new else []):
        for parent in reversed(Path(name).parents[:-1]):  # a file bertkit wrote where a folder now goes
            if parent.as_posix() in ours and not (folder / parent).is_dir():
                _remove(folder, parent.as_posix())
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / name, folder / name)
        note_written(folder / name)
    for name in sorted(ours - set(new), reverse=True):
        if (folder / name).is_file() or (folder / name).is_symlink():
            _remove(folder, name)
    drop_staging(staging)


def without_local_paths(value):
    """Settings as a published folder may carry them: every string naming a place on this machine (an absolute
    path, or one relative path that exists here) becomes its last part, in dicts and lists at any depth."""
    if isinstance(value, dict):
        return {k: without_local_paths(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [without_local_paths(v) for v in value]
    if isinstance(value, str) and ("/" in value or os.sep in value):
        path = Path(value)
        if path.is_absolute() or value.startswith(".") or path.exists():
            return path.name
    return value
