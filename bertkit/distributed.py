"""The process group's lifetime, and how a process that made one ends.

A gloo (or NCCL) group left to interpreter finalization is torn down by C++ destructors while its threads may still
hold work objects; that can abort a run that finished well ("terminate called without an active exception": exit
code 134, or 250 from DeepSpeed's launcher; seen about once in a full test run). So:
- the `bertkit` command (console script and cli.py) ends a process that made a group with `exit_now`: its files
  are all closed by then (checkpoints, logs, loader workers), so it flushes its output and leaves with os._exit,
  skipping the C++ teardown where the abort happens, with the command's own exit code;
- from Python (pretrain() in a script or a notebook), an atexit hook destroys the group while the interpreter is
  whole. It is not destroyed when pretrain() returns: DeepSpeed caches its groups per process, and a script may
  call pretrain() again. A group the caller made is the caller's to destroy.
"""
import atexit
import logging
import os
import sys

import torch.distributed as dist

_hooked = False


def destroy_at_exit() -> None:
    """Call right after making the default process group: it is destroyed when the process exits."""
    global _hooked
    if not _hooked:
        atexit.register(_destroy)
        _hooked = True


def _destroy() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def made_group_here() -> bool:
    return _hooked


def exit_now(code: int):
    """Flush what this process has to say, then leave without interpreter finalization (see above)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
