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


# integer arguments that are multiples of 16 at BERT shapes (strides of the fused QKV output and of (B, S, H, D)
# tensors, the length bucket, hidden sizes); Triton's launcher specialises on that, so offline compiles assume it
ATTENTION_DIVISIBLE = ("sqb", "sqs", "sqh", "skb", "sks", "skh", "svb", "svs", "svh", "sob", "sos", "soh",
                       "sdb", "sds", "sdh", "sgkb", "sgks", "sgkh", "sgvb", "sgvs", "sgvh", "sgqb", "sgqs", "sgqh",
                       "MAX_SEQLEN")
LAYER_NORM_DIVISIBLE = ("N", "stride_x", "stride_r", "stride_y", "stride_h", "stride_dy", "stride_dh", "stride_dx")


def compile_for_gpu(kernel, pointers, floats, constexprs, num_warps=4, num_stages=3, arch=90, divisible=()):
    """Compiles a @triton.jit kernel to a CUDA binary for sm_`arch` without a GPU (Triton ships ptxas): catches
    typing and lowering errors that the interpreter never sees. Arguments not named are i32 scalars.

    As Triton's launcher would on a GPU, pointers are taken as 16-byte aligned, and so are the integers named in
    `divisible` (multiples of 16 at real shapes, e.g. BERT's strides): that is what lets loads vectorise and
    pipeline, so resource figures match a real launch."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("this triton build has no NVIDIA backend")
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        else:
            signature[name] = pointers.get(name) or ("fp32" if name in floats else "i32")
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
             if signature[name].startswith("*") or name in divisible}
    source = ASTSource(kernel, signature, constexprs, attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                              options=dict(num_warps=num_warps, num_stages=num_stages))
    assert compiled.asm.get("cubin"), "no CUDA binary produced"
    return compiled


def ptxas_usage(compiled) -> tuple[int, int]:
    """(registers per thread, spill store bytes) of a compile_for_gpu result: its PTX run again through the ptxas
    and the flags this Triton build compiles sm_90 with, with -v."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    from triton.backends.nvidia import compiler as nvidia

    flags = ["--regAllocOptLevel=2"] if "regAllocOptLevel" in Path(nvidia.__file__).read_text() else []
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(compiled.asm["ptx"])
        log = subprocess.run([nvidia.get_ptxas(90).path, "-v", *flags, "--gpu-name=sm_90a", str(src), "-o",
                              str(Path(tmp) / "kernel.cubin")], capture_output=True, text=True).stderr
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores", log)
    if not regs or not spill:
        raise RuntimeError(f"unexpected ptxas output:\n{log}")
    return int(regs.group(1)), int(spill.group(1))


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


def compile_attention_kernel(kind, config, head_dim=64, dropout=True, varlen=True, rope=False, local=False):
    """One attention kernel ("fwd", "dkdv" or "dq") in `config` (BLOCK_M, BLOCK_N, warps, stages), bf16,
    compiled for sm_90 as a launch at BERT's strides would be (with ModernBERT's rotary embeddings and
    sliding window when asked)."""
    import importlib

    attn = importlib.import_module("bertkit.kernels.attention")
    kernel = {"fwd": attn._attn_fwd, "dkdv": attn._attn_bwd_dkdv, "dq": attn._attn_bwd_dq}[kind]
    block_m, block_n, warps, stages = config
    pointers = {name: "*bf16" for name in ["Q", "K", "V", "O", "DO", "DK", "DV", "DQ"]}
    pointers.update(LSE="*fp32", DELTA="*fp32", SEQ="*i32", SEED="*i64", COS="*fp32", SIN="*fp32")
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=attn.block_d_for(head_dim),
                      VARLEN=varlen, DROPOUT=dropout, DOT_PREC="tf32", ROPE=rope, LOCAL=local)
    return compile_for_gpu(kernel, pointers, ("qk_scale", "sm_scale", "dropout_scale"), constexprs, warps, stages,
                           divisible=ATTENTION_DIVISIBLE)


def compile_layer_norm_kernels(hidden, dropout=True):
    """{"ln_fwd": ..., "ln_bwd": ..., "ln_bwd_prenorm": ...}: the residual-add LayerNorm kernels in their tile for
    `hidden`, bf16, compiled for sm_90 (the pre-LN backward also adds the residual stream's incoming gradient)."""
    import importlib

    ln = importlib.import_module("bertkit.kernels.layer_norm")
    block_m, block_n, warps = ln.tile_shape(hidden)
    pointers = {name: "*bf16" for name in ["X", "R", "W", "B", "Y", "H", "DY", "DH", "DX", "DH_IN"]}
    pointers.update(MEAN="*fp32", RSTD="*fp32", SEED="*i64", DW_PART="*fp32", DB_PART="*fp32")
    tile = dict(BLOCK_M=block_m, BLOCK_N=block_n)
    return {name: compile_for_gpu(kernel, pointers, ("eps", "dropout_scale"), {**tile, **constexprs}, warps,
                                  divisible=LAYER_NORM_DIVISIBLE)
            for name, kernel, constexprs in [
                ("ln_fwd", ln._add_ln_fwd, dict(HAS_RESIDUAL=True, DROPOUT=dropout, STORE_H=True)),
                ("ln_bwd", ln._add_ln_bwd, dict(DROPOUT=dropout, HAS_DH_IN=False)),
                ("ln_bwd_prenorm", ln._add_ln_bwd, dict(DROPOUT=dropout, HAS_DH_IN=True))]}
