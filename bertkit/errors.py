"""The errors a stage raises about a folder or file it reads, below formats and fileio so both can raise them."""
from pathlib import Path


class FormatError(ValueError):
    """A folder is missing, unfinished or not what a stage expects; the message names it and what to run."""


class CorpusError(FormatError):
    pass


class InstancesError(FormatError):
    pass


class RunError(FormatError):
    pass


class DamagedFileError(FormatError):
    """A file of a bertkit folder is missing, cut short, replaced or unreadable."""

    def __init__(self, path, what: str, fix: str = ""):
        self.path = Path(path)
        folder = self.path.parent
        fix = fix or (f"`bertkit verify {folder}` checks every file of the folder; then re-run the stage that "
                      "wrote it")
        super().__init__(f"{self.path}: {what}. {fix}")
