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
