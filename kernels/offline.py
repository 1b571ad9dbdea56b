"""The kernels compiled for a GPU architecture with no GPU here (Triton's ahead-of-time path, with the ptxas Triton
ships): typing and lowering errors the interpreter never sees, and each kernel's registers and spills at a real
launch's shapes. The kernel tests and benchmarks/gates/kernel_resources.py both use it."""
import importlib


class NoNvidiaBackend(RuntimeError):
    """This Triton build cannot compile for NVIDIA GPUs."""


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
        raise NoNvidiaBackend("this triton build has no NVIDIA backend")
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


def compile_attention_kernel(kind, config, head_dim=64, dropout=True, varlen=True, rope=False, local=False):
    """One attention kernel ("fwd", "dkdv" or "dq") in `config` (BLOCK_M, BLOCK_N, warps, stages), bf16,
    compiled for sm_90 as a launch at BERT's strides would be (with ModernBERT's rotary embeddings and
    sliding window when asked)."""
    attn = importlib.import_module(f"{__package__}.attention")  # (the package's `attention` is the function)
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
    ln = importlib.import_module(f"{__package__}.layer_norm")  # (the package's `layer_norm` is the function)
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
