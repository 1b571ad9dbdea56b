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
import os
import pickle
import re
from pathlib import Path

import torch
from torch.serialization import get_unsafe_globals_in_checkpoint

from bertkit.errors import regular_file
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


class OversizedCheckpointError(UnsafeCheckpointError):
    def __init__(self, path, what: str):
        self.path = Path(path)
        FormatError.__init__(self, f"{self.path}: {what}, more than a file of {self.path.stat().st_size:,} bytes "
                                   "holds; this folder may not come from bertkit, so nothing in it was loaded. Use a "
                                   "folder you made or trust")


def budget(path) -> int:
    """The bytes a checkpoint file may make in memory: what it holds, with room for its zip's own records."""
    return 2 * Path(path).stat().st_size + (1 << 20)


# pickled calls whose arguments size an allocation: bytearray(n), numpy's _reconstruct(ndarray, shape, dtype)
SIZED_CALLS = {"bytearray", "_reconstruct"}


def check_budget(path) -> None:
    """Before unpickling: the zip records inflate to at most budget(path) bytes, and no integer that sizes an
    allocation (bytearray's length, an array's shape, a storage's element count) exceeds it. A pickle that passes
    the opcode scan can still ask for gigabytes from a kilobyte; this refuses it unread."""
    import pickletools
    import zipfile

    limit = budget(path)
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
            inflated = sum(r.file_size for r in records)
            if inflated > limit:
                raise OversizedCheckpointError(path, f"its records inflate to {inflated:,} bytes")
            pickled = next((r for r in records if r.filename.endswith("data.pkl")), None)
            data = archive.read(pickled) if pickled else b""
    except (zipfile.BadZipFile, OSError):
        return  # not torch's zip format: torch.load says so in its own words
    try:
        ops = list(pickletools.genops(data))
    except (ValueError, EOFError):
        return  # a damaged pickle: torch.load says where
    strings, sizing, last_int = [], False, 0
    for op, arg, _ in ops:
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings = [*strings[-1:], arg]
        elif op.name in ("GLOBAL", "STACK_GLOBAL"):
            name = arg.split(" ")[-1] if op.name == "GLOBAL" else (strings or [""])[-1]
            sizing = sizing or name in SIZED_CALLS
        elif op.name == "REDUCE":
            sizing = False
        elif op.name == "BINPERSID" and last_int > limit:  # ('storage', type, key, location, numel)
            raise OversizedCheckpointError(path, f"asks for a tensor storage of {last_int:,} elements")
        if isinstance(arg, int) and op.name.startswith(("BININT", "INT", "LONG")):
            last_int = arg
            if sizing and arg > limit:
                raise OversizedCheckpointError(path, f"asks for an object of {arg:,} bytes")


def safe_load(path, map_location="cpu", **kwargs):
    """torch.load with weights_only=True and ALLOWED; a file that needs anything else is UnsafeCheckpointError."""
    kwargs.pop("weights_only", None)
    if isinstance(path, (str, os.PathLike)):
        regular_file(path)  # a FIFO would hang the read, a link could lead anywhere
        check_budget(path)
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
