"""Checkpoint files are untrusted input: a run folder may come from a colleague, a shared cluster folder or a
download, and a pickle can carry code. Every torch.load that bertkit makes or causes (its own, DeepSpeed's
load_checkpoint, zero_to_fp32) unpickles with weights_only=True and only the types a bertkit checkpoint really holds.

Two layers, one list: `unsafe_globals(path)` reads a file's pickle opcodes without running them (rank 0 scans a
checkpoint before any rank loads it, so every rank stops with one message), and `refusing_code()` forces
weights_only=True on every torch.load made inside it, in case a file changes between the scan and the load.
"""
import contextlib
import functools
import importlib
import pickle
import re
from pathlib import Path

import torch
from torch.serialization import get_unsafe_globals_in_checkpoint

from bertkit.formats import FormatError

# Beyond what torch.load(weights_only=True) allows anyway (tensors, containers, numbers): what DeepSpeed's ZeRO
# optimizer states (its loss scaler, fragment addresses, stage enum) and bertkit's rng_rank*.pt (numpy's Mersenne
# Twister state) hold. Each only rebuilds data. Both numpy 1 and 2 spellings of the array rebuild function.
ALLOWED = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.dtypes.UInt32DType",
    "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray._reconstruct",
)


class UnsafeCheckpointError(FormatError):
    def __init__(self, path, found: str):
        self.path = Path(path)
        super().__init__(f"{self.path}: holds objects a checkpoint never holds ({found}); this folder may not come "
                         "from bertkit, so nothing in it was loaded. Use a folder you made or trust")


@functools.cache
def _allowed_objects() -> list:
    """(object, its pickled name) for every allowed name that imports here (a missing numpy spelling is skipped)."""
    found = []
    for name in ALLOWED:
        module, _, attr = name.rpartition(".")
        try:
            found.append((getattr(importlib.import_module(module), attr), name))
        except (ImportError, AttributeError):
            pass
    return found


def unsafe_globals(path) -> list[str]:
    """The names a pickled file would import that are neither torch's safe set nor ALLOWED, read from its opcodes
    without unpickling anything. A file that is not torch's zip format cannot be scanned, so it counts as unsafe."""
    try:
        names = get_unsafe_globals_in_checkpoint(str(path))
    except Exception as e:  # a legacy (non-zip) pickle or a damaged archive
        return [f"not a torch zip checkpoint: {type(e).__name__}"]
    return sorted(set(names) - set(ALLOWED))


def first_unsafe_file(folder) -> tuple | None:
    """(file, what it would import) for the first *.pt under folder that holds more than plain data, else None.
    Checksums say a file is unchanged, not that it is safe: a crafted folder recomputes them."""
    for path in sorted(Path(folder).rglob("*.pt")):
        if path.is_file() and (bad := unsafe_globals(path)):
            return str(path), ", ".join(bad[:3])
    return None


def safe_load(path, map_location="cpu", **kwargs):
    """torch.load with weights_only=True and ALLOWED; a file that needs anything else is UnsafeCheckpointError."""
    kwargs.pop("weights_only", None)
    try:
        with torch.serialization.safe_globals(_allowed_objects()):
            return _TORCH_LOAD(path, map_location=map_location, weights_only=True, **kwargs)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))  # torch words it in several ways; the name follows
        raise UnsafeCheckpointError(path, found.group(1) if found else "not plain data") from None


_TORCH_LOAD = torch.load


@contextlib.contextmanager
def refusing_code():
    """Every torch.load made inside (DeepSpeed's included, which ask for full unpickling) goes through safe_load."""
    def load(f, map_location=None, pickle_module=None, **kwargs):
        return safe_load(f, map_location=map_location, **kwargs)

    saved = torch.load, torch.serialization.load
    torch.load = torch.serialization.load = load
    try:
        yield
    finally:
        torch.load, torch.serialization.load = saved
