"""Shared helpers for the kernel tests.

Triton picks interpreter vs compiler when @triton.jit runs (at import of kernels.*), and the rest of the suite
imports `kernels` without the interpreter. So each kernel test file runs its interpreter cases in a child pytest
process started with TRITON_INTERPRET=1 (test_under_interpreter); in the parent process those cases skip.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

interpreter_only = pytest.mark.skipif(
    not INTERPRETED, reason="runs in the TRITON_INTERPRET=1 child process started by test_under_interpreter")
cuda_only = pytest.mark.skipif(
    INTERPRETED or not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled Triton)")
parent_only = pytest.mark.skipif(INTERPRETED, reason="this is the child process")


def run_file_under_interpreter(test_file, min_passed):
    """Runs `test_file` in a child pytest with TRITON_INTERPRET=1; fails with the child's output if any case fails
    or if fewer than `min_passed` cases actually ran."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", str(test_file)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout[-8000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, f"interpreter run of {Path(test_file).name} failed:\n{log}"
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= min_passed, f"expected >= {min_passed} interpreter cases:\n{log}"


def nvidia_backend_or_skip():
    """The offline compile tests (bertkit.kernels.offline) need a Triton build with the NVIDIA backend."""
    import triton

    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("this triton build has no NVIDIA backend")


def rel_err(actual, expected):
    """max |actual - expected| / max |expected|, in float64."""
    expected = expected.double()
    return ((actual.double() - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()


def poisoned(shape, dtype, device="cpu"):
    """A NaN-filled output buffer: any element a kernel forgets to write fails the comparison."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}


def binomial_ok(keep, p, sigmas=5.0):
    """Keep rate of a bool tensor within `sigmas` standard deviations of 1 - p."""
    n = keep.numel()
    rate = keep.double().mean().item()
    sd = ((p * (1 - p)) / n) ** 0.5
    return abs(rate - (1 - p)) <= sigmas * sd, rate


def philox4x32_10(counter, key):
    """Philox4x32-10 (Salmon et al., SC'11; Random123) in numpy, written from the paper's definition: counter
    (4, ...) uint32, key (2,) uint32 -> (4, ...) uint32. The independent reference for the kernels' dropout bits."""
    import numpy as np

    def mulhilo(a, b):
        product = np.uint64(a) * b.astype(np.uint64)
        return (product >> np.uint64(32)).astype(np.uint32), (product & np.uint64(0xFFFFFFFF)).astype(np.uint32)

    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint32) for c in counter)
    k0, k1 = np.uint32(key[0]), np.uint32(key[1])
    for _ in range(10):
        hi0, lo0 = mulhilo(0xD2511F53, c0)
        hi1, lo1 = mulhilo(0xCD9E8D57, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = np.uint32((int(k0) + 0x9E3779B9) & 0xFFFFFFFF)
        k1 = np.uint32((int(k1) + 0xBB67AE85) & 0xFFFFFFFF)
    return np.stack([c0, c1, c2, c3])


def reference_keep(seed, salt, rows, cols, dropout_p):
    """The keep mask (len(rows), len(cols)) that kernels/dropout.py documents, from philox4x32_10."""
    import numpy as np

    from bertkit.kernels.common import threshold_and_scale

    seed = int(seed) & (2**64 - 1)
    r, c = np.meshgrid(np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64), indexing="ij")
    counter = [(c // 8).astype(np.uint32), r.astype(np.uint32), np.full(r.shape, salt, np.uint32),
               np.zeros(r.shape, np.uint32)]
    words = philox4x32_10(counter, (seed & 0xFFFFFFFF, seed >> 32))
    word = np.take_along_axis(words, ((c % 8) // 2)[None], axis=0)[0]
    draws = np.where(c % 2 == 0, word & 0xFFFF, word >> 16)
    return torch.from_numpy(draws >= threshold_and_scale(dropout_p)[0])
