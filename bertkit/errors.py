"""The errors a stage raises about a folder or file it reads, below formats and fileio so both can raise them."""
import os
from pathlib import Path


class FormatError(ValueError):
    """A folder is missing, unfinished or not what a stage expects; the message names it and what to run."""


class CorpusError(FormatError):
    pass


class InstancesError(FormatError):
    pass


class RunError(FormatError):
    pass


class DataError(ValueError):
    """A fine-tuning file or setting a task cannot use (a bad row, a missing file, a length the model lacks); the
    message names the file and line, or the flag, and the fix."""


class DamagedFileError(FormatError):
    """A file of a bertkit folder is missing, cut short, replaced or unreadable."""

    def __init__(self, path, what: str, fix: str = ""):
        self.path = Path(path)
        folder = self.path.parent
        fix = fix or (f"`bertkit verify {folder}` checks every file of the folder; then re-run the stage that "
                      "wrote it")
        super().__init__(f"{self.path}: {what}. {fix}")


class LinkedFileError(FormatError):
    """A file bertkit would read from a folder is a link, or no regular file (a FIFO, a device): a folder from someone
    else may point one at a secret (/proc/self/environ) or at something that never ends."""


def regular_file(path, within=None) -> Path:
    """`path`, checked to be a regular file that no link leads out of its folder (the file, and every folder between
    it and `within`, the folder given on the command line, whose own path is the user's), before anything reads or
    copies it; LinkedFileError naming it and the fix otherwise. A link that stays inside the folder is followed, as
    is one of the Hugging Face hub cache (snapshots/REV/NAME -> ../../blobs/HASH)."""
    import stat

    path = Path(path)
    root = Path(within) if within is not None else path.parent
    steps = [path, *(p for p in path.parents if root in p.parents)]
    inside = [root.resolve()]
    if root.parent.name == "snapshots":  # the hub's cache: every file a link into the repository's blobs/
        inside.append((root.parent.parent / "blobs").resolve())
    for p in steps:
        if p.is_symlink():
            target = p.resolve()
            if not any(folder == target or folder in target.parents for folder in inside):
                raise LinkedFileError(
                    f"{p}: a symbolic link to {os.readlink(p)}, outside {root}; bertkit follows no link out of a "
                    f"folder, which may come from someone else. Put the file itself there (cp --remove-destination "
                    f"\"$(readlink -f {p})\" {p}) if you trust where it points")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return path  # the reader says what is missing, in its own words
    if not stat.S_ISREG(mode):
        kind = "a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or \
            stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "a folder" if stat.S_ISDIR(mode) else \
            "not a regular file"
        raise LinkedFileError(f"{path}: {kind}, not a file; bertkit reads only regular files from a folder (a pipe "
                              "or device would be read without end). Put the file itself there")
    return path


def compile_failure(error: BaseException, fix: str) -> str | None:
    """The one-line message for an error of torch.compile's (TorchDynamo's or Inductor's: a compiler's problem,
    not the user's data or settings), None for any other error, and None under TORCHDYNAMO_VERBOSE=1, so the
    compiler's trace that the message points to is shown. Matched by class name, so this module needs no torch."""
    if os.environ.get("TORCHDYNAMO_VERBOSE", "0") not in ("", "0"):
        return None
    if not any(c.__name__ == "TorchDynamoException" and c.__module__ == "torch._dynamo.exc"
               for c in type(error).__mro__):
        return None
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return (f"torch.compile could not compile this model ({type(error).__name__}: {first[:300]}); the model and "
            f"its training are the same without it: {fix} (TORCHDYNAMO_VERBOSE=1 shows the compiler's own trace)")
