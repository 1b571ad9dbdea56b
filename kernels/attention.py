"""FlashAttention-2 style non-causal attention in Triton: forward, deterministic backward, in-kernel dropout.

One kernel family serves both layouts:
  padded  q, k, v (batch, seq, heads, head_dim), per-sequence `lengths`; rows past a length are written as zeros.
  varlen  q, k, v (tokens, heads, head_dim), `cu_seqlens` offsets; only each sequence's own rows are written.
The maximum length is the bucket (the padded seq dim, or the caller's max_seqlen), never read back from the GPU.
q, k, v may be strided views (e.g. slices of a fused QKV projection); only the last dim must be contiguous.

Backward: a small pass computes delta = rowsum(dO * O), one kernel accumulates dK and dV per key block (looping over
queries) and another dQ per query block (looping over keys), so every gradient element is written by exactly one
program: no atomics, bit-for-bit deterministic.

Dropout: a keep bit for score (q, k) of head bh is a pure function of (seed, bh, q, k) through Philox, so the
backward regenerates the forward's mask; the seed is drawn from torch's generator on the tensor's device, so
activation checkpointing (which restores that generator) replays the same mask. dropout_p == 0 compiles the
dropout code away (a constexpr).
"""
import math
import os

import torch
import triton
import triton.language as tl

try:  # triton >= 3.4 decides interpreter vs compiled when @triton.jit runs, i.e. at import of this module
    INTERPRET = bool(triton.knobs.runtime.interpret)
except AttributeError:  # pragma: no cover - older triton
    INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

LOG2E = 1.4426950408889634


@triton.jit
def _dropout_keep(seed, bh, q_idx, k_idx, MAX_SEQLEN, dropout_p):
    """Keep bit for scores (q_idx, k_idx) of batch*head bh; q_idx, k_idx broadcast to the tile's shape."""
    c0 = (q_idx * MAX_SEQLEN + k_idx).to(tl.uint32)
    c1 = c0 * 0 + bh.to(tl.uint32)
    r, _, _, _ = tl.philox(seed, c0, c1, c0 * 0, c0 * 0)
    u = (r >> 8).to(tl.int32).to(tl.float32) * (1.0 / 16777216.0)  # 24 random bits -> [0, 1)
    return u >= dropout_p


@triton.jit
def _sequence_bounds(SEQ, b, MAX_SEQLEN, VARLEN: tl.constexpr):
    """(first row, length, rows this program may write) of sequence b. Varlen: rows past the sequence belong to
    the next one, so never write them; padded: the padded rows are ours, so write zeros there."""
    if VARLEN:
        row0 = tl.load(SEQ + b)
        seqlen = tl.load(SEQ + b + 1) - row0
        rows_out = seqlen
    else:
        row0 = 0
        seqlen = tl.load(SEQ + b)
        rows_out = MAX_SEQLEN
    return row0, seqlen, rows_out


@triton.jit
def _attn_fwd(
    Q, K, V, O, LSE, SEQ, SEED,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh,
    H, MAX_SEQLEN, qk_scale, dropout_p,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    VARLEN: tl.constexpr, DROPOUT: tl.constexpr, DOT_PREC: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    row0, seqlen, rows_out = _sequence_bounds(SEQ, b, MAX_SEQLEN, VARLEN)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    m_mask = offs_m < seqlen
    rows = (row0 + offs_m).to(tl.int64)

    q_ptrs = Q + b.to(tl.int64) * sqb + h * sqh + rows[:, None] * sqs + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    k_base = K + b.to(tl.int64) * skb + h * skh
    v_base = V + b.to(tl.int64) * svb + h * svh
    if DROPOUT:
        seed = tl.load(SEED)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # a block made only of padded queries skips the key loop (no early return: triton 3.6 compatible)
    n_end = tl.where(pid_m * BLOCK_M < seqlen, seqlen, 0)
    for start_n in range(0, n_end, BLOCK_N):
        cols = start_n + offs_n
        n_mask = cols < seqlen
        kv_rows = (row0 + cols).to(tl.int64)
        kt = tl.load(k_base + kv_rows[None, :] * sks + offs_d[:, None],
                     mask=n_mask[None, :] & d_mask[:, None], other=0.0)
        s = tl.dot(q, kt, input_precision=DOT_PREC) * qk_scale  # log2 domain
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if DROPOUT:
            keep = _dropout_keep(seed, bh, offs_m[:, None], cols[None, :], MAX_SEQLEN, dropout_p)
            p = tl.where(keep, p, 0.0)
        v = tl.load(v_base + kv_rows[:, None] * svs + offs_d[None, :],
                    mask=n_mask[:, None] & d_mask[None, :], other=0.0)
        acc += tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        m_i = m_new

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    if DROPOUT:
        out = out * (1.0 / (1.0 - dropout_p))
    out = tl.where(m_mask[:, None], out, 0.0)
    o_ptrs = O + b.to(tl.int64) * sob + h * soh + rows[:, None] * sos + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=(offs_m < rows_out)[:, None] & d_mask[None, :])
    lse = tl.where(m_mask, m_i + tl.log2(l_safe), 0.0)
    tl.store(LSE + bh.to(tl.int64) * MAX_SEQLEN + offs_m, lse, mask=offs_m < MAX_SEQLEN)


@triton.jit
def _attn_bwd_delta(
    O, DO, DELTA, SEQ, sob, sos, soh, sdb, sds, sdh, H, MAX_SEQLEN,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, VARLEN: tl.constexpr,
):
    """delta[b, h, i] = sum_d dO[i, d] * O[i, d] in fp32; zero on padded rows."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    row0, seqlen, rows_out = _sequence_bounds(SEQ, b, MAX_SEQLEN, VARLEN)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m < seqlen)[:, None] & (offs_d < HEAD_DIM)[None, :]
    rows = (row0 + offs_m).to(tl.int64)
    o = tl.load(O + b.to(tl.int64) * sob + h * soh + rows[:, None] * sos + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(DO + b.to(tl.int64) * sdb + h * sdh + rows[:, None] * sds + offs_d[None, :], mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh.to(tl.int64) * MAX_SEQLEN + offs_m, delta, mask=offs_m < MAX_SEQLEN)


@triton.jit
def _attn_bwd_dkdv(
    Q, K, V, DO, LSE, DELTA, DK, DV, SEQ, SEED,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sdb, sds, sdh,
    sgkb, sgks, sgkh, sgvb, sgvs, sgvh,
    H, MAX_SEQLEN, qk_scale, sm_scale, dropout_p,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    VARLEN: tl.constexpr, DROPOUT: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """One program owns a block of keys and loops over all queries; works on transposed (key x query) tiles."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    row0, seqlen, rows_out = _sequence_bounds(SEQ, b, MAX_SEQLEN, VARLEN)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    n_mask = offs_n < seqlen
    kv_rows = (row0 + offs_n).to(tl.int64)
    k = tl.load(K + b.to(tl.int64) * skb + h * skh + kv_rows[:, None] * sks + offs_d[None, :],
                mask=n_mask[:, None] & d_mask[None, :], other=0.0)
    v = tl.load(V + b.to(tl.int64) * svb + h * svh + kv_rows[:, None] * svs + offs_d[None, :],
                mask=n_mask[:, None] & d_mask[None, :], other=0.0)
    q_base = Q + b.to(tl.int64) * sqb + h * sqh
    do_base = DO + b.to(tl.int64) * sdb + h * sdh
    stat_base = bh.to(tl.int64) * MAX_SEQLEN
    if DROPOUT:
        seed = tl.load(SEED)

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    m_end = tl.where(pid_n * BLOCK_N < seqlen, seqlen, 0)
    for start_m in range(0, m_end, BLOCK_M):
        qi = start_m + offs_m
        m_mask = qi < seqlen
        q_rows = (row0 + qi).to(tl.int64)
        qt = tl.load(q_base + q_rows[None, :] * sqs + offs_d[:, None],
                     mask=m_mask[None, :] & d_mask[:, None], other=0.0)
        do = tl.load(do_base + q_rows[:, None] * sds + offs_d[None, :],
                     mask=m_mask[:, None] & d_mask[None, :], other=0.0)
        lse = tl.load(LSE + stat_base + qi, mask=m_mask, other=0.0)
        delta = tl.load(DELTA + stat_base + qi, mask=m_mask, other=0.0)
        st = tl.dot(k, qt, input_precision=DOT_PREC) * qk_scale
        pt = tl.exp2(st - lse[None, :])
        pt = tl.where(n_mask[:, None] & m_mask[None, :], pt, 0.0)
        dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
        if DROPOUT:
            keep = _dropout_keep(seed, bh, qi[None, :], offs_n[:, None], MAX_SEQLEN, dropout_p)
            inv_keep = 1.0 / (1.0 - dropout_p)
            pt_drop = tl.where(keep, pt * inv_keep, 0.0)
            dpt = tl.where(keep, dpt * inv_keep, 0.0)
        else:
            pt_drop = pt
        dv += tl.dot(pt_drop.to(do.dtype), do, input_precision=DOT_PREC)
        dst = pt * (dpt - delta[None, :])
        dk += tl.dot(dst.to(qt.dtype), tl.trans(qt), input_precision=DOT_PREC)

    out_mask = (offs_n < rows_out)[:, None] & d_mask[None, :]
    dk = tl.where(n_mask[:, None], dk * sm_scale, 0.0)
    dv = tl.where(n_mask[:, None], dv, 0.0)
    tl.store(DK + b.to(tl.int64) * sgkb + h * sgkh + kv_rows[:, None] * sgks + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=out_mask)
    tl.store(DV + b.to(tl.int64) * sgvb + h * sgvh + kv_rows[:, None] * sgvs + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=out_mask)


@triton.jit
def _attn_bwd_dq(
    Q, K, V, DO, LSE, DELTA, DQ, SEQ, SEED,
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sdb, sds, sdh, sgqb, sgqs, sgqh,
    H, MAX_SEQLEN, qk_scale, sm_scale, dropout_p,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    VARLEN: tl.constexpr, DROPOUT: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """One program owns a block of queries and loops over all keys."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    row0, seqlen, rows_out = _sequence_bounds(SEQ, b, MAX_SEQLEN, VARLEN)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    m_mask = offs_m < seqlen
    q_rows = (row0 + offs_m).to(tl.int64)
    q = tl.load(Q + b.to(tl.int64) * sqb + h * sqh + q_rows[:, None] * sqs + offs_d[None, :],
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    do = tl.load(DO + b.to(tl.int64) * sdb + h * sdh + q_rows[:, None] * sds + offs_d[None, :],
                 mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    stat_base = bh.to(tl.int64) * MAX_SEQLEN
    lse = tl.load(LSE + stat_base + offs_m, mask=m_mask, other=0.0)
    delta = tl.load(DELTA + stat_base + offs_m, mask=m_mask, other=0.0)
    k_base = K + b.to(tl.int64) * skb + h * skh
    v_base = V + b.to(tl.int64) * svb + h * svh
    if DROPOUT:
        seed = tl.load(SEED)

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    n_end = tl.where(pid_m * BLOCK_M < seqlen, seqlen, 0)
    for start_n in range(0, n_end, BLOCK_N):
        cols = start_n + offs_n
        n_mask = cols < seqlen
        kv_rows = (row0 + cols).to(tl.int64)
        kt = tl.load(k_base + kv_rows[None, :] * sks + offs_d[:, None],
                     mask=n_mask[None, :] & d_mask[:, None], other=0.0)
        vt = tl.load(v_base + kv_rows[None, :] * svs + offs_d[:, None],
                     mask=n_mask[None, :] & d_mask[:, None], other=0.0)
        s = tl.dot(q, kt, input_precision=DOT_PREC) * qk_scale
        p = tl.exp2(s - lse[:, None])
        p = tl.where(m_mask[:, None] & n_mask[None, :], p, 0.0)
        dp = tl.dot(do, vt, input_precision=DOT_PREC)
        if DROPOUT:
            keep = _dropout_keep(seed, bh, offs_m[:, None], cols[None, :], MAX_SEQLEN, dropout_p)
            dp = tl.where(keep, dp * (1.0 / (1.0 - dropout_p)), 0.0)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=DOT_PREC)

    dq = tl.where(m_mask[:, None], dq * sm_scale, 0.0)
    tl.store(DQ + b.to(tl.int64) * sgqb + h * sgqh + q_rows[:, None] * sgqs + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=(offs_m < rows_out)[:, None] & d_mask[None, :])


@triton.jit
def _dropout_mask_kernel(MASK, SEED, H, MAX_SEQLEN, dropout_p, BLOCK: tl.constexpr):
    """Materialises the attention dropout mask (batch*heads, S, S) exactly as the kernels draw it; for tests."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    offs_m = pid_m * BLOCK + tl.arange(0, BLOCK)
    offs_n = tl.arange(0, BLOCK)
    seed = tl.load(SEED)
    for start_n in range(0, MAX_SEQLEN, BLOCK):
        cols = start_n + offs_n
        keep = _dropout_keep(seed, bh, offs_m[:, None], cols[None, :], MAX_SEQLEN, dropout_p)
        mask = (offs_m < MAX_SEQLEN)[:, None] & (cols < MAX_SEQLEN)[None, :]
        ptrs = MASK + bh.to(tl.int64) * MAX_SEQLEN * MAX_SEQLEN + offs_m[:, None] * MAX_SEQLEN + cols[None, :]
        tl.store(ptrs, keep.to(tl.int8), mask=mask)


# ---------------------------------------------------------------------------------------------------------------
# launchers


# (BLOCK_M, BLOCK_N, num_warps, num_stages); the first of each list is the default when autotuning is off.
# BLOCK_M tiles queries, BLOCK_N keys: the forward and dQ kernels own a query block, the dK/dV kernel a key block.
FWD_CONFIGS = [(128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 4)]
DKDV_CONFIGS = [(32, 128, 4, 3), (64, 64, 4, 2), (64, 128, 8, 2), (32, 64, 4, 3)]
DQ_CONFIGS = [(128, 32, 4, 3), (64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 3)]
INTERPRETER_CONFIG = (16, 16, 1, 1)  # small blocks so tiny test shapes still run the multi-block loops
# Autotuning picks per (head_dim, bucket, dtype, dropout, layout) on first use; BERTKIT_AUTOTUNE=0 takes the defaults.
AUTOTUNE = not INTERPRET and os.environ.get("BERTKIT_AUTOTUNE", "1") != "0"
TUNE_KEY = ["HEAD_DIM", "MAX_SEQLEN", "VARLEN", "DROPOUT", "DOT_PREC"]


class _Launcher:
    """kernel[grid](...) with BLOCK_M/BLOCK_N/num_warps/num_stages from the interpreter config, the default config,
    or triton.autotune; `grid(block_m, block_n)` gives the launch grid."""

    def __init__(self, kernel, configs):
        self.kernel, self.configs = kernel, configs
        self.tuned = triton.autotune(
            [triton.Config(dict(BLOCK_M=m, BLOCK_N=n), num_warps=w, num_stages=st) for m, n, w, st in configs],
            key=TUNE_KEY)(kernel) if AUTOTUNE else None

    def __call__(self, grid, *args, **kwargs):
        if self.tuned is not None:
            return self.tuned[lambda meta: grid(meta["BLOCK_M"], meta["BLOCK_N"])](*args, **kwargs)
        m, n, w, st = INTERPRETER_CONFIG if INTERPRET else self.configs[0]
        return self.kernel[grid(m, n)](*args, **kwargs, BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=st)


_fwd_launch = _Launcher(_attn_fwd, FWD_CONFIGS)
_dkdv_launch = _Launcher(_attn_bwd_dkdv, DKDV_CONFIGS)
_dq_launch = _Launcher(_attn_bwd_dq, DQ_CONFIGS)


def _dot_precision(dtype):
    return "ieee" if dtype == torch.float32 else "tf32"  # fp32 inputs get true fp32 products, not TF32


def _strides(t, varlen):
    """(batch, seq, head) strides in elements; the varlen layout has no batch dim (its rows start at cu_seqlens)."""
    if t.stride(-1) != 1:
        raise ValueError("attention: the head_dim axis must be contiguous (stride 1)")
    return (0, t.stride(0), t.stride(1)) if varlen else (t.stride(0), t.stride(1), t.stride(2))


def _check(q, k, v, seqinfo, varlen):
    want = 3 if varlen else 4
    if q.dim() != want or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"attention: q, k, v must share one {want}-d shape, got {q.shape}, {k.shape}, {v.shape}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"attention: q, k, v must be one of fp16/bf16/fp32, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] > 256:
        raise ValueError(f"attention: head_dim {q.shape[-1]} > 256 is not supported")
    if seqinfo.dtype != torch.int32:
        raise ValueError("attention: lengths / cu_seqlens must be int32")


def _batch_heads(q, seqinfo, varlen):
    return (seqinfo.shape[0] - 1 if varlen else q.shape[0]), q.shape[-2]


def flash_attn_forward(q, k, v, seqinfo, seed, max_seqlen, varlen, dropout_p, softmax_scale, out=None, lse=None):
    """Returns (out, lse); lse is (batch, heads, max_seqlen) fp32 log-sum-exp in base 2 of the scaled scores.

    `out`/`lse` may be given (tests pass NaN-filled buffers to prove every element is written)."""
    _check(q, k, v, seqinfo, varlen)
    batch, heads = _batch_heads(q, seqinfo, varlen)
    head_dim = q.shape[-1]
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((batch, heads, max_seqlen), dtype=torch.float32, device=q.device)
    if batch == 0 or max_seqlen == 0 or q.numel() == 0:
        out.zero_()
        return out, lse
    dropout = dropout_p > 0.0
    _fwd_launch(
        lambda block_m, block_n: (triton.cdiv(max_seqlen, block_m), batch * heads),
        q, k, v, out, lse, seqinfo, seed if dropout else seqinfo,
        *_strides(q, varlen), *_strides(k, varlen), *_strides(v, varlen), *_strides(out, varlen),
        heads, max_seqlen, softmax_scale * LOG2E, dropout_p,
        HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        VARLEN=varlen, DROPOUT=dropout, DOT_PREC=_dot_precision(q.dtype),
    )
    return out, lse


def flash_attn_backward(dout, q, k, v, out, lse, seqinfo, seed, max_seqlen, varlen, dropout_p, softmax_scale,
                        dq=None, dk=None, dv=None):
    """Returns (dq, dk, dv) shaped like q; padded rows get exact zeros. Buffers may be given (tests poison them)."""
    batch, heads = _batch_heads(q, seqinfo, varlen)
    head_dim = q.shape[-1]
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device) if dq is None else dq
    dk = torch.empty(q.shape, dtype=q.dtype, device=q.device) if dk is None else dk
    dv = torch.empty(q.shape, dtype=q.dtype, device=q.device) if dv is None else dv
    if batch == 0 or max_seqlen == 0 or q.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    block_m = INTERPRETER_CONFIG[0] if INTERPRET else 64
    block_d = max(16, triton.next_power_of_2(head_dim))
    dropout = dropout_p > 0.0
    seed_arg = seed if dropout else seqinfo
    delta = torch.empty((batch, heads, max_seqlen), dtype=torch.float32, device=q.device)
    _attn_bwd_delta[(triton.cdiv(max_seqlen, block_m), batch * heads)](
        out, dout, delta, seqinfo, *_strides(out, varlen), *_strides(dout, varlen), heads, max_seqlen,
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_D=block_d, VARLEN=varlen,
    )
    common = dict(HEAD_DIM=head_dim, BLOCK_D=block_d, VARLEN=varlen, DROPOUT=dropout,
                  DOT_PREC=_dot_precision(q.dtype))
    qkv_strides = (*_strides(q, varlen), *_strides(k, varlen), *_strides(v, varlen), *_strides(dout, varlen))
    scales = (heads, max_seqlen, softmax_scale * LOG2E, softmax_scale, dropout_p)
    _dkdv_launch(
        lambda block_m, block_n: (triton.cdiv(max_seqlen, block_n), batch * heads),
        q, k, v, dout, lse, delta, dk, dv, seqinfo, seed_arg,
        *qkv_strides, *_strides(dk, varlen), *_strides(dv, varlen), *scales, **common,
    )
    _dq_launch(
        lambda block_m, block_n: (triton.cdiv(max_seqlen, block_m), batch * heads),
        q, k, v, dout, lse, delta, dq, seqinfo, seed_arg,
        *qkv_strides, *_strides(dq, varlen), *scales, **common,
    )
    return dq, dk, dv


def dropout_mask(seed, batch_heads, max_seqlen, dropout_p):
    """The keep mask (batch*heads, max_seqlen, max_seqlen) bool that the kernels apply for this seed (for tests)."""
    mask = torch.empty((batch_heads, max_seqlen, max_seqlen), dtype=torch.int8, device=seed.device)
    block = 16
    _dropout_mask_kernel[(triton.cdiv(max_seqlen, block), batch_heads)](
        mask, seed, 1, max_seqlen, dropout_p, BLOCK=block)
    return mask.bool()


# ---------------------------------------------------------------------------------------------------------------
# torch.library ops: torch.compile and DeepSpeed see ordinary ops with fake (meta) implementations and autograd.


@torch.library.custom_op("bertkit::flash_attn_fwd", mutates_args=())
def flash_attn_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqinfo: torch.Tensor,
                      seed: torch.Tensor, max_seqlen: int, varlen: bool, dropout_p: float,
                      softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return flash_attn_forward(q, k, v, seqinfo, seed, max_seqlen, varlen, dropout_p, softmax_scale)


@flash_attn_fwd_op.register_fake
def _(q, k, v, seqinfo, seed, max_seqlen, varlen, dropout_p, softmax_scale):
    batch, heads = _batch_heads(q, seqinfo, varlen)
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(
        (batch, heads, max_seqlen), dtype=torch.float32)


@torch.library.custom_op("bertkit::flash_attn_bwd", mutates_args=())
def flash_attn_bwd_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                      lse: torch.Tensor, seqinfo: torch.Tensor, seed: torch.Tensor, max_seqlen: int,
                      varlen: bool, dropout_p: float, softmax_scale: float
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return flash_attn_backward(dout, q, k, v, out, lse, seqinfo, seed, max_seqlen, varlen, dropout_p,
                               softmax_scale)


@flash_attn_bwd_op.register_fake
def _(dout, q, k, v, out, lse, seqinfo, seed, max_seqlen, varlen, dropout_p, softmax_scale):
    new = lambda: torch.empty_like(q, memory_format=torch.contiguous_format)  # noqa: E731
    return new(), new(), new()


def _setup_context(ctx, inputs, output):
    q, k, v, seqinfo, seed, max_seqlen, varlen, dropout_p, softmax_scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, seqinfo, seed)
    ctx.args = (max_seqlen, varlen, dropout_p, softmax_scale)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, seqinfo, seed = ctx.saved_tensors
    dq, dk, dv = flash_attn_bwd_op(dout, q, k, v, out, lse, seqinfo, seed, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None


torch.library.register_autograd("bertkit::flash_attn_fwd", _backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------------------------------
# functional entries (the Triton path of kernels.attention / kernels.attention_varlen)


def draw_seed(device):
    """A 62-bit Philox seed from torch's generator for `device` (CUDA RNG on GPU: checkpointing replays it)."""
    return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)


def _run(q, k, v, seqinfo, max_seqlen, varlen, dropout_p, softmax_scale):
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"attention: dropout_p must be in [0, 1), got {dropout_p}")
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    seqinfo = seqinfo.to(device=q.device, dtype=torch.int32)
    seed = draw_seed(q.device) if dropout_p > 0.0 else seqinfo  # any tensor: never read when p == 0
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    out, _ = flash_attn_fwd_op(q, k, v, seqinfo, seed, int(max_seqlen), varlen, float(dropout_p), scale)
    return out


def attention_triton(q, k, v, lengths, dropout_p=0.0, softmax_scale=None):
    """q, k, v (batch, seq, heads, head_dim); lengths (batch,) valid tokens. Rows past a length are zero."""
    return _run(q, k, v, lengths, q.shape[1], False, dropout_p, softmax_scale)


def attention_varlen_triton(q, k, v, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None):
    """q, k, v (tokens, heads, head_dim); cu_seqlens (batch + 1,); max_seqlen: an upper bound (the bucket)."""
    return _run(q, k, v, cu_seqlens, max_seqlen, True, dropout_p, softmax_scale)
