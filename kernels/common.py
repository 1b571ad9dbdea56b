"""What the kernels and their references share: interpreter or compiled, the dropout seed, and the dropout rule.

Triton-free except for INTERPRET, so the references (kernels/reference.py) work where Triton is missing.
"""
import functools
import os

import torch

try:  # triton >= 3.4 decides interpreter vs compiled when @triton.jit runs, i.e. at import of the kernel modules
    import triton

    INTERPRET = bool(triton.knobs.runtime.interpret)
except ImportError:  # no triton: the references serve every device
    INTERPRET = False
except AttributeError:  # pragma: no cover - older triton
    INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) in plain Python: triton.cdiv is a @jit function whose call from the host costs ~10 µs."""
    return -(-a // b)


def packed_rows_and_positions(cu_seqlens, total_tokens: int):
    """(T,) sequence of each packed token and (T,) its position within it; on the device (no host sync). A tail
    past cu_seqlens[-1] gets row B (one past the last) and position 0."""
    cu = cu_seqlens.long()
    t = torch.arange(total_tokens, device=cu.device)
    # cu[0] is 0, so this equals searchsorted(cu[1:], t); over the sliced cu[1:], Inductor's CUDA lowering (torch
    # 2.11) stopped `--compile` with "NotImplementedError: SliceView" (traced on an H200, 2026-11-28)
    row = torch.searchsorted(cu, t, right=True) - 1
    return row, (t - cu[row]).masked_fill(row == len(cu) - 1, 0)


def next_power_of_2(n: int) -> int:
    """The least power of two >= n (0 for 0, as triton's), in plain Python (triton.next_power_of_2: as cdiv)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


@functools.lru_cache(maxsize=256)
def threshold_and_scale(dropout_p):
    """How the kernels draw dropout (kernels/dropout.py): (16-bit threshold, scale of the kept values).
    p is rounded to a multiple of 1/65536 and kept values are scaled by the inverse of that keep rate, so the
    expectation stays exact; a reference given the kernels' mask applies the same scale."""
    threshold = min(65535, round(dropout_p * 65536))
    return threshold, 65536.0 / (65536 - threshold)


def draw_seed(device):
    """A 62-bit Philox seed from torch's generator for `device` (CUDA RNG on GPU: checkpointing replays it)."""
    return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)
