"""FlashAttention-2 style non-causal attention in Triton: forward, deterministic backward, in-kernel dropout.

One kernel family serves both layouts:
  padded  q, k, v (batch, seq, heads, head_dim), per-sequence `lengths`; rows past a length are written as zeros.
  varlen  q, k, v (tokens, heads, head_dim), `cu_seqlens` offsets; only each sequence's own rows are written.
The maximum length is the bucket (the padded seq dim, or the caller's max_seqlen), never read back from the GPU.
q, k, v may be strided views (e.g. slices of a fused QKV projection); only the last dim must be contiguous.

Backward: a small pass computes delta = rowsum(dO * O), one kernel accumulates dK and dV per key block (looping over
queries) and another dQ per query block (looping over keys), so every gradient element is written by exactly one
program: no atomics, bit-for-bit deterministic.

Dropout: a keep bit for score (q, k) of head bh is a pure function of (seed, bh, q, k) (kernels/dropout.py), so
the backward regenerates the forward's mask; the seed is drawn from torch's generator on the tensor's device, so
activation checkpointing (which restores that generator) replays the same mask. dropout_p == 0 compiles the
dropout code away (a constexpr).

Registers: rows are addressed by 32-bit offsets from a 64-bit pointer to the sequence's first row, and each loop runs
its whole blocks without masks and the last, partial block separately; `benchmarks/gates/kernel_resources.py` checks
that no configuration spills on sm_90.
"""
import contextlib
import math
import os

import torch
import triton
import triton.language as tl

from .common import INTERPRET, cdiv, draw_seed, next_power_of_2, threshold_and_scale
from .dropout import keep_tile
from .reference import cached_rotary_tables
from .torch_backend import turn_packed, turn_padded

LOG2E = 1.4426950408889634


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
def _loop_bounds(seqlen, block_start, BLOCK: tl.constexpr):
    """(end of the whole blocks, end of the loop) over a sequence: a program whose own block is all padding loops
    over nothing. The last, partial block runs separately with masks, so the main loop carries none."""
    loop_end = seqlen
    if block_start >= seqlen:  # an if rather than tl.where: triton 3.6's interpreter needs a scalar range bound
        loop_end = 0
    return loop_end // BLOCK * BLOCK, loop_end


@triton.jit
def _window_bounds(seqlen, block_start, BLOCK: tl.constexpr, WINDOW, STEP: tl.constexpr):
    """(first, end) of the loop over the other axis's blocks (of STEP) that can see a block of BLOCK rows at
    block_start through a ±WINDOW band: tiles wholly outside it are never visited, so a local layer costs n·w."""
    lo = 0
    hi = 0
    if block_start < seqlen:
        lo = block_start - WINDOW
        if lo < 0:
            lo = 0
        lo = lo // STEP * STEP
        hi = block_start + BLOCK + WINDOW
        if hi > seqlen:
            hi = seqlen
    return lo, hi


@triton.jit
def _load_half(base, idx, idx_mask, stride, offs_h, TRANS: tl.constexpr, MASKED: tl.constexpr):
    """Columns offs_h of rows idx: an (idx, h) tile, or (h, idx) with TRANS."""
    if TRANS:
        ptrs = base + idx[None, :] * stride + offs_h[:, None]
        mask = idx_mask[None, :]
    else:
        ptrs = base + idx[:, None] * stride + offs_h[None, :]
        mask = idx_mask[:, None]
    if MASKED:
        x = tl.load(ptrs, mask=mask, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _join_halves(a, b, TRANS: tl.constexpr):
    """(idx, h) halves side by side as (idx, 2h), or (h, idx) halves stacked as (2h, idx) with TRANS."""
    pair = tl.join(a, b)                                   # (.., .., 2)
    if TRANS:
        joined = tl.reshape(tl.permute(pair, (2, 0, 1)), (2 * a.shape[0], a.shape[1]))
    else:
        joined = tl.reshape(tl.permute(pair, (0, 2, 1)), (a.shape[0], 2 * a.shape[1]))
    return joined


@triton.jit
def _load_tile(base, idx, idx_mask, stride, offs_d, d_mask, COS, SIN, HEAD_DIM: tl.constexpr, ROPE: tl.constexpr,
               TRANS: tl.constexpr, MASKED: tl.constexpr):
    """Rows idx of a (seq, head_dim) slice as an (idx, d) tile, or (d, idx) with TRANS; masked to idx_mask only
    when MASKED (whole blocks load without masks). With ROPE each row is turned by its rotary angles as it loads, in
    fp32 and back to its dtype, from its two halves (x1 c - x2 s, x2 c + x1 s; the tables repeat their first half):
    no pass of its own over q or k. ROPE needs HEAD_DIM == BLOCK_D (the launcher checks)."""
    if ROPE:
        half: tl.constexpr = HEAD_DIM // 2
        offs_h = tl.arange(0, half)
        x1 = _load_half(base, idx, idx_mask, stride, offs_h, TRANS, MASKED).to(tl.float32)
        x2 = _load_half(base, idx, idx_mask, stride, offs_h + half, TRANS, MASKED).to(tl.float32)
        c = _load_half(COS, idx, idx_mask, HEAD_DIM, offs_h, TRANS, MASKED)
        sn = _load_half(SIN, idx, idx_mask, HEAD_DIM, offs_h, TRANS, MASKED)
        x = _join_halves(x1 * c - x2 * sn, x2 * c + x1 * sn, TRANS).to(base.dtype.element_ty)
    else:
        if TRANS:
            ptrs = base + idx[None, :] * stride + offs_d[:, None]
            mask = (d_mask[:, None] & idx_mask[None, :]) if MASKED else d_mask[:, None]
        else:
            ptrs = base + idx[:, None] * stride + offs_d[None, :]
            mask = (idx_mask[:, None] & d_mask[None, :]) if MASKED else d_mask[None, :]
        x = tl.load(ptrs, mask=mask, other=0.0)
    return x


@triton.jit
def _unrotate(g, rows, row_mask, COS, SIN, HEAD_DIM: tl.constexpr):
    """The gradient with respect to the unturned rows, from the one with respect to the turned: each pair of halves
    turned back (g1 c + g2 s, g2 c - g1 s), the rotation's transpose, in registers."""
    half: tl.constexpr = HEAD_DIM // 2
    g1, g2 = tl.split(tl.permute(tl.reshape(g, (g.shape[0], 2, half)), (0, 2, 1)))
    offs_h = tl.arange(0, half)
    c = _load_half(COS, rows, row_mask, HEAD_DIM, offs_h, False, True)
    sn = _load_half(SIN, rows, row_mask, HEAD_DIM, offs_h, False, True)
    return _join_halves(g1 * c + g2 * sn, g2 * c - g1 * sn, False)


@triton.jit
def _fwd_tile(acc, l_i, m_i, q, k_seq, v_seq, sks, svs, start_n, seqlen, offs_m, offs_n, offs_d, d_mask,
              qk_scale, seed, bh, threshold, COS, SIN, WINDOW, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
              MASK_N: tl.constexpr, DROPOUT: tl.constexpr, DOT_PREC: tl.constexpr, ROPE: tl.constexpr,
              LOCAL: tl.constexpr):
    """One key block of the online softmax."""
    cols = start_n + offs_n
    n_mask = cols < seqlen
    kt = _load_tile(k_seq, cols, n_mask, sks, offs_d, d_mask, COS, SIN, HEAD_DIM, ROPE, True, MASK_N)
    s = tl.dot(q, kt, input_precision=DOT_PREC) * qk_scale  # log2 domain
    if LOCAL:
        near = tl.abs(offs_m[:, None] - cols[None, :]) <= WINDOW
        s = tl.where(near & n_mask[None, :], s, float("-inf"))
    elif MASK_N:
        s = tl.where(n_mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if LOCAL:  # a row that has seen no key yet (all -inf): keep its sums at zero, not NaN
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if DROPOUT:
        p = tl.where(keep_tile(seed, bh, offs_m, start_n, threshold, BLOCK_N), p, 0.0)
    v = tl.load(v_seq + cols[:, None] * svs + offs_d[None, :],
                mask=(n_mask[:, None] & d_mask[None, :]) if MASK_N else d_mask[None, :], other=0.0)
    acc += tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return acc, l_i, m_new


@triton.jit
def _attn_fwd(
    Q, K, V, O,     # (B, S, H, D) padded or (T, H, D) varlen; D contiguous, Q/K/V may be views of one QKV output
    LSE,            # (B * H, MAX_SEQLEN) fp32: log2-sum-exp of each query row, for the backward
    SEQ,            # (B,) int32 lengths (padded) or (B + 1,) int32 cu_seqlens (varlen)
    SEED,           # (1,) int64 Philox seed (read only with DROPOUT)
    COS, SIN,       # (MAX_SEQLEN, HEAD_DIM) fp32 rotary tables (read only with ROPE)
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sob, sos, soh,  # (batch, seq, head) strides; batch 0 when varlen
    H, MAX_SEQLEN, qk_scale, threshold, dropout_scale, WINDOW,   # WINDOW: ±keys a query sees (LOCAL)
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    VARLEN: tl.constexpr, DROPOUT: tl.constexpr, DOT_PREC: tl.constexpr, ROPE: tl.constexpr, LOCAL: tl.constexpr,
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
    # 64-bit pointers to each sequence's first row; 32-bit offsets inside it (the launcher checks they fit)
    b64 = b.to(tl.int64)
    row64 = row0.to(tl.int64)
    q = _load_tile(Q + b64 * sqb + h * sqh + row64 * sqs, offs_m, m_mask, sqs, offs_d, d_mask, COS, SIN, HEAD_DIM,
                   ROPE, False, True)
    k_seq = K + b64 * skb + h * skh + row64 * sks
    v_seq = V + b64 * svb + h * svh + row64 * svs
    seed = tl.load(SEED) if DROPOUT else 0

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if LOCAL:  # only the key blocks the window reaches, each masked to the band
        n_lo, n_hi = _window_bounds(seqlen, pid_m * BLOCK_M, BLOCK_M, WINDOW, BLOCK_N)
        for start_n in range(n_lo, n_hi, BLOCK_N):
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k_seq, v_seq, sks, svs, start_n, seqlen, offs_m, offs_n,
                                      offs_d, d_mask, qk_scale, seed, bh, threshold, COS, SIN, WINDOW, HEAD_DIM,
                                      BLOCK_N, True, DROPOUT, DOT_PREC, ROPE, True)
    else:
        n_full, n_end = _loop_bounds(seqlen, pid_m * BLOCK_M, BLOCK_N)
        for start_n in range(0, n_full, BLOCK_N):
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k_seq, v_seq, sks, svs, start_n, seqlen, offs_m, offs_n,
                                      offs_d, d_mask, qk_scale, seed, bh, threshold, COS, SIN, WINDOW, HEAD_DIM,
                                      BLOCK_N, False, DROPOUT, DOT_PREC, ROPE, False)
        if n_full < n_end:
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k_seq, v_seq, sks, svs, n_full, seqlen, offs_m, offs_n,
                                      offs_d, d_mask, qk_scale, seed, bh, threshold, COS, SIN, WINDOW, HEAD_DIM,
                                      BLOCK_N, True, DROPOUT, DOT_PREC, ROPE, False)

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    out = acc / l_safe[:, None]
    if DROPOUT:
        out = out * dropout_scale
    out = tl.where(m_mask[:, None], out, 0.0)
    o_ptrs = O + b64 * sob + h * soh + row64 * sos + offs_m[:, None] * sos + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=(offs_m < rows_out)[:, None] & d_mask[None, :])
    lse = tl.where(m_mask, m_i + tl.log2(l_safe), 0.0)
    tl.store(LSE + bh.to(tl.int64) * MAX_SEQLEN + offs_m, lse, mask=offs_m < MAX_SEQLEN)


@triton.jit
def _attn_bwd_delta(
    O, DO,          # like Q in _attn_fwd
    DELTA,          # (B * H, MAX_SEQLEN) fp32 out
    SEQ,            # lengths or cu_seqlens, as in _attn_fwd
    sob, sos, soh, sdb, sds, sdh,  # (batch, seq, head) strides of O and DO
    H, MAX_SEQLEN,
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
    b64 = b.to(tl.int64)
    row64 = row0.to(tl.int64)
    o = tl.load(O + b64 * sob + h * soh + row64 * sos + offs_m[:, None] * sos + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(DO + b64 * sdb + h * sdh + row64 * sds + offs_m[:, None] * sds + offs_d[None, :], mask=mask,
                 other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + bh.to(tl.int64) * MAX_SEQLEN + offs_m, delta, mask=offs_m < MAX_SEQLEN)


@triton.jit
def _dkdv_tile(dk, dv, k, v, q_seq, do_seq, lse_bh, delta_bh, sqs, sds, start_m, key0, seqlen, offs_m, offs_n,
               offs_d, d_mask, qk_scale, seed, bh, threshold, dropout_scale, COS, SIN, WINDOW,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK_M: tl.constexpr, DROPOUT: tl.constexpr,
               DOT_PREC: tl.constexpr, ROPE: tl.constexpr, LOCAL: tl.constexpr):
    """One query block's contribution to a key block's dK and dV, on transposed (key x query) tiles. Padded
    queries load as zeros (dO = 0, delta = 0), so they add nothing."""
    qi = start_m + offs_m
    m_mask = qi < seqlen
    qt = _load_tile(q_seq, qi, m_mask, sqs, offs_d, d_mask, COS, SIN, HEAD_DIM, ROPE, True, MASK_M)
    do = tl.load(do_seq + qi[:, None] * sds + offs_d[None, :],
                 mask=(m_mask[:, None] & d_mask[None, :]) if MASK_M else d_mask[None, :], other=0.0)
    if MASK_M:
        lse = tl.load(lse_bh + qi, mask=m_mask, other=0.0)
        delta = tl.load(delta_bh + qi, mask=m_mask, other=0.0)
    else:
        lse = tl.load(lse_bh + qi)
        delta = tl.load(delta_bh + qi)
    pt = tl.exp2(tl.dot(k, qt, input_precision=DOT_PREC) * qk_scale - lse[None, :])
    if LOCAL:
        pt = tl.where((tl.abs(offs_n[:, None] - qi[None, :]) <= WINDOW) & m_mask[None, :], pt, 0.0)
    elif MASK_M:
        pt = tl.where(m_mask[None, :], pt, 0.0)
    dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
    if DROPOUT:
        keep = tl.trans(keep_tile(seed, bh, qi, key0, threshold, BLOCK_N))
        pt_drop = tl.where(keep, pt * dropout_scale, 0.0)
        dpt = tl.where(keep, dpt * dropout_scale, 0.0)
    else:
        pt_drop = pt
    dv += tl.dot(pt_drop.to(do.dtype), do, input_precision=DOT_PREC)
    dst = pt * (dpt - delta[None, :])
    dk += tl.dot(dst.to(qt.dtype), tl.trans(qt), input_precision=DOT_PREC)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(
    Q, K, V, DO,    # (B, S, H, D) padded or (T, H, D) varlen
    LSE, DELTA,     # (B * H, MAX_SEQLEN) fp32, from the forward and _attn_bwd_delta
    DK, DV,         # like K and V: out
    SEQ, SEED, COS, SIN,   # as in _attn_fwd
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sdb, sds, sdh,  # (batch, seq, head) strides of Q, K, V, DO
    sgkb, sgks, sgkh, sgvb, sgvs, sgvh,                          # ... and of DK, DV
    H, MAX_SEQLEN, qk_scale, sm_scale, threshold, dropout_scale, WINDOW,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    VARLEN: tl.constexpr, DROPOUT: tl.constexpr, DOT_PREC: tl.constexpr, ROPE: tl.constexpr, LOCAL: tl.constexpr,
):
    """One program owns a block of keys and loops over the queries that see them (all, or the window's)."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    row0, seqlen, rows_out = _sequence_bounds(SEQ, b, MAX_SEQLEN, VARLEN)
    key0 = pid_n * BLOCK_N
    offs_n = key0 + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    n_mask = offs_n < seqlen
    b64 = b.to(tl.int64)
    row64 = row0.to(tl.int64)
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = _load_tile(K + b64 * skb + h * skh + row64 * sks, offs_n, n_mask, sks, offs_d, d_mask, COS, SIN, HEAD_DIM,
                   ROPE, False, True)
    v = tl.load(V + b64 * svb + h * svh + row64 * svs + offs_n[:, None] * svs + offs_d[None, :], mask=kv_mask,
                other=0.0)
    q_seq = Q + b64 * sqb + h * sqh + row64 * sqs
    do_seq = DO + b64 * sdb + h * sdh + row64 * sds
    lse_bh = LSE + bh.to(tl.int64) * MAX_SEQLEN
    delta_bh = DELTA + bh.to(tl.int64) * MAX_SEQLEN
    seed = tl.load(SEED) if DROPOUT else 0

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    if LOCAL:
        m_lo, m_hi = _window_bounds(seqlen, key0, BLOCK_N, WINDOW, BLOCK_M)
        for start_m in range(m_lo, m_hi, BLOCK_M):
            dk, dv = _dkdv_tile(dk, dv, k, v, q_seq, do_seq, lse_bh, delta_bh, sqs, sds, start_m, key0, seqlen,
                                offs_m, offs_n, offs_d, d_mask, qk_scale, seed, bh, threshold, dropout_scale, COS,
                                SIN, WINDOW, HEAD_DIM, BLOCK_N, True, DROPOUT, DOT_PREC, ROPE, True)
    else:
        m_full, m_end = _loop_bounds(seqlen, key0, BLOCK_M)
        for start_m in range(0, m_full, BLOCK_M):
            dk, dv = _dkdv_tile(dk, dv, k, v, q_seq, do_seq, lse_bh, delta_bh, sqs, sds, start_m, key0, seqlen,
                                offs_m, offs_n, offs_d, d_mask, qk_scale, seed, bh, threshold, dropout_scale, COS,
                                SIN, WINDOW, HEAD_DIM, BLOCK_N, False, DROPOUT, DOT_PREC, ROPE, False)
        if m_full < m_end:
            dk, dv = _dkdv_tile(dk, dv, k, v, q_seq, do_seq, lse_bh, delta_bh, sqs, sds, m_full, key0, seqlen,
                                offs_m, offs_n, offs_d, d_mask, qk_scale, seed, bh, threshold, dropout_scale, COS,
                                SIN, WINDOW, HEAD_DIM, BLOCK_N, True, DROPOUT, DOT_PREC, ROPE, False)

    _store_dkdv(dk, dv, DK + b64 * sgkb + h * sgkh + row64 * sgks, DV + b64 * sgvb + h * sgvh + row64 * sgvs, sgks,
                sgvs, offs_n, n_mask, offs_d, d_mask, rows_out, sm_scale, COS, SIN, HEAD_DIM, ROPE)


@triton.jit
def _store_dkdv(dk, dv, dk_seq, dv_seq, sgks, sgvs, offs_n, n_mask, offs_d, d_mask, rows_out, sm_scale, COS, SIN,
                HEAD_DIM: tl.constexpr, ROPE: tl.constexpr):
    """One key block's dK and dV: rows past the sequence zero, rows past the output (varlen) not written."""
    out_mask = (offs_n < rows_out)[:, None] & d_mask[None, :]
    if ROPE:  # dK so far is with respect to the turned keys
        dk = _unrotate(dk, offs_n, n_mask, COS, SIN, HEAD_DIM)
    dk = tl.where(n_mask[:, None], dk * sm_scale, 0.0)
    dv = tl.where(n_mask[:, None], dv, 0.0)
    tl.store(dk_seq + offs_n[:, None] * sgks + offs_d[None, :], dk.to(dk_seq.dtype.element_ty), mask=out_mask)
    tl.store(dv_seq + offs_n[:, None] * sgvs + offs_d[None, :], dv.to(dv_seq.dtype.element_ty), mask=out_mask)


@triton.jit
def _dq_tile(dq, q, do, lse, delta, k_seq, v_seq, sks, svs, start_n, seqlen, offs_m, offs_n, offs_d, d_mask,
             qk_scale, seed, bh, threshold, dropout_scale, COS, SIN, WINDOW, HEAD_DIM: tl.constexpr,
             BLOCK_N: tl.constexpr, MASK_N: tl.constexpr, DROPOUT: tl.constexpr, DOT_PREC: tl.constexpr,
             ROPE: tl.constexpr, LOCAL: tl.constexpr):
    """One key block's contribution to a query block's dQ."""
    cols = start_n + offs_n
    n_mask = cols < seqlen
    kt_mask = (d_mask[:, None] & n_mask[None, :]) if MASK_N else d_mask[:, None]
    kt = _load_tile(k_seq, cols, n_mask, sks, offs_d, d_mask, COS, SIN, HEAD_DIM, ROPE, True, MASK_N)
    vt = tl.load(v_seq + cols[None, :] * svs + offs_d[:, None], mask=kt_mask, other=0.0)
    p = tl.exp2(tl.dot(q, kt, input_precision=DOT_PREC) * qk_scale - lse[:, None])
    if LOCAL:
        p = tl.where((tl.abs(offs_m[:, None] - cols[None, :]) <= WINDOW) & n_mask[None, :], p, 0.0)
    elif MASK_N:
        p = tl.where(n_mask[None, :], p, 0.0)
    dp = tl.dot(do, vt, input_precision=DOT_PREC)
    if DROPOUT:
        dp = tl.where(keep_tile(seed, bh, offs_m, start_n, threshold, BLOCK_N), dp * dropout_scale, 0.0)
    ds = p * (dp - delta[:, None])
    dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=DOT_PREC)
    return dq


@triton.jit
def _attn_bwd_dq(
    Q, K, V, DO,    # (B, S, H, D) padded or (T, H, D) varlen
    LSE, DELTA,     # (B * H, MAX_SEQLEN) fp32
    DQ,             # like Q: out
    SEQ, SEED, COS, SIN,   # as in _attn_fwd
    sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sdb, sds, sdh,  # (batch, seq, head) strides of Q, K, V, DO
    sgqb, sgqs, sgqh,                                            # ... and of DQ
    H, MAX_SEQLEN, qk_scale, sm_scale, threshold, dropout_scale, WINDOW,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    VARLEN: tl.constexpr, DROPOUT: tl.constexpr, DOT_PREC: tl.constexpr, ROPE: tl.constexpr, LOCAL: tl.constexpr,
):
    """One program owns a block of queries and loops over all keys. Padded queries load as zeros (dO = 0,
    delta = 0), so their rows of dS are zero."""
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
    b64 = b.to(tl.int64)
    row64 = row0.to(tl.int64)
    q_mask = m_mask[:, None] & d_mask[None, :]
    q = _load_tile(Q + b64 * sqb + h * sqh + row64 * sqs, offs_m, m_mask, sqs, offs_d, d_mask, COS, SIN, HEAD_DIM,
                   ROPE, False, True)
    do = tl.load(DO + b64 * sdb + h * sdh + row64 * sds + offs_m[:, None] * sds + offs_d[None, :], mask=q_mask,
                 other=0.0)
    stat_base = bh.to(tl.int64) * MAX_SEQLEN
    lse = tl.load(LSE + stat_base + offs_m, mask=m_mask, other=0.0)
    delta = tl.load(DELTA + stat_base + offs_m, mask=m_mask, other=0.0)
    k_seq = K + b64 * skb + h * skh + row64 * sks
    v_seq = V + b64 * svb + h * svh + row64 * svs
    seed = tl.load(SEED) if DROPOUT else 0

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if LOCAL:
        n_lo, n_hi = _window_bounds(seqlen, pid_m * BLOCK_M, BLOCK_M, WINDOW, BLOCK_N)
        for start_n in range(n_lo, n_hi, BLOCK_N):
            dq = _dq_tile(dq, q, do, lse, delta, k_seq, v_seq, sks, svs, start_n, seqlen, offs_m, offs_n, offs_d,
                          d_mask, qk_scale, seed, bh, threshold, dropout_scale, COS, SIN, WINDOW, HEAD_DIM, BLOCK_N,
                          True, DROPOUT, DOT_PREC, ROPE, True)
    else:
        n_full, n_end = _loop_bounds(seqlen, pid_m * BLOCK_M, BLOCK_N)
        for start_n in range(0, n_full, BLOCK_N):
            dq = _dq_tile(dq, q, do, lse, delta, k_seq, v_seq, sks, svs, start_n, seqlen, offs_m, offs_n, offs_d,
                          d_mask, qk_scale, seed, bh, threshold, dropout_scale, COS, SIN, WINDOW, HEAD_DIM, BLOCK_N,
                          False, DROPOUT, DOT_PREC, ROPE, False)
        if n_full < n_end:
            dq = _dq_tile(dq, q, do, lse, delta, k_seq, v_seq, sks, svs, n_full, seqlen, offs_m, offs_n, offs_d,
                          d_mask, qk_scale, seed, bh, threshold, dropout_scale, COS, SIN, WINDOW, HEAD_DIM, BLOCK_N,
                          True, DROPOUT, DOT_PREC, ROPE, False)

    if ROPE:  # dQ so far is with respect to the turned queries
        dq = _unrotate(dq, offs_m, m_mask, COS, SIN, HEAD_DIM)
    dq = tl.where(m_mask[:, None], dq * sm_scale, 0.0)
    tl.store(DQ + b64 * sgqb + h * sgqh + row64 * sgqs + offs_m[:, None] * sgqs + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=(offs_m < rows_out)[:, None] & d_mask[None, :])


@triton.jit
def _dropout_mask_kernel(MASK, SEED, MAX_SEQLEN, threshold, BLOCK: tl.constexpr):  # MASK: (B * H, S, S) int8
    """Materialises the attention dropout mask (batch*heads, S, S) exactly as the kernels draw it; for tests."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    offs_m = pid_m * BLOCK + tl.arange(0, BLOCK)
    offs_n = tl.arange(0, BLOCK)
    seed = tl.load(SEED)
    for start_n in range(0, MAX_SEQLEN, BLOCK):
        cols = start_n + offs_n
        keep = keep_tile(seed, bh, offs_m, start_n, threshold, BLOCK)
        mask = (offs_m < MAX_SEQLEN)[:, None] & (cols < MAX_SEQLEN)[None, :]
        ptrs = MASK + bh.to(tl.int64) * MAX_SEQLEN * MAX_SEQLEN + offs_m[:, None] * MAX_SEQLEN + cols[None, :]
        tl.store(ptrs, keep.to(tl.int8), mask=mask)


# ---------------------------------------------------------------------------------------------------------------
# launchers


# (BLOCK_M, BLOCK_N, num_warps, num_stages) per padded head dim (BLOCK_D: 16-64, 128, 256); the first of each list is
# the default when autotuning is off. BLOCK_M tiles queries, BLOCK_N keys: the forward and dQ kernels own a query
# block, the dK/dV kernel a key block. Every entry compiles for sm_90 to wgmma without register spills, with and
# without dropout, padded and varlen, and fits the 227 KiB of shared memory a block may use
# (benchmarks/gates/kernel_resources.py; results/kernel_resources*.json). Head dim 256 (beyond BERT's sizes) is the
# exception: the forward spills up to 32 bytes with varlen + dropout, and dK/dV spills 140-450 bytes in every tile
# tried (its two fp32 accumulators alone are 2 x 256 columns). One more exception, measured: dK/dV (32, 128, 4, 3)
# spills 16 bytes (188 with dropout) yet was the fastest tile of 24 for ModernBERT's global layer at 8,192 tokens on
# an H100 (2026-11-26: fwd + bwd 12.15 ms against 13.35 autotuned over the rest; results/h100-2026-11-26/), so the
# autotuner may pick it; (32, 128, 8, 3), the same tile with 8 warps, passed check-gpu there.
FWD_CONFIGS = {
    64: [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3)],
    128: [(128, 64, 8, 3), (64, 128, 8, 3), (128, 32, 8, 3), (64, 32, 4, 3)],
    256: [(64, 32, 4, 2), (64, 64, 8, 2), (128, 32, 8, 2)],
}
DKDV_CONFIGS = {
    64: [(32, 128, 8, 3), (64, 64, 8, 3), (64, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 2), (32, 128, 4, 3)],
    128: [(32, 64, 8, 3), (16, 128, 8, 3)],
    256: [(32, 64, 8, 2), (32, 64, 8, 1)],
}
DQ_CONFIGS = {
    64: [(128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3), (64, 128, 8, 3), (64, 32, 4, 3)],
    128: [(128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 3), (128, 32, 8, 3)],
    256: [(128, 32, 8, 2), (64, 16, 4, 2), (128, 16, 8, 2)],
}
INTERPRETER_CONFIG = (16, 16, 1, 1)  # small blocks so tiny test shapes still run the multi-block loops
# Autotuning picks per (head_dim, bucket, dtype, dropout, layout) on first use; BERTKIT_AUTOTUNE=0 takes the defaults.
AUTOTUNE = not INTERPRET and os.environ.get("BERTKIT_AUTOTUNE", "1") != "0"
TUNE_KEY = ["HEAD_DIM", "MAX_SEQLEN", "VARLEN", "DROPOUT", "DOT_PREC", "ROPE", "LOCAL"]


def block_d_for(head_dim):
    """The head dimension's tile width (a power of two, at least 16); check_gpu and the benchmarks read it too."""
    return max(16, next_power_of_2(head_dim))


def dim_class(block_d):
    """Which config list (FWD_CONFIGS, DQ_CONFIGS, DKDV_CONFIGS) a tile width takes: 64 for 64 and below."""
    return 64 if block_d <= 64 else block_d


class _Launcher:
    """kernel[grid](...) with BLOCK_M/BLOCK_N/num_warps/num_stages from the interpreter config, the default config of
    the head dim's list, or triton.autotune over that list; `grid(block_m, block_n)` gives the launch grid."""

    def __init__(self, kernel, configs_by_dim):
        self.kernel, self.configs = kernel, configs_by_dim
        self.forced = None  # a (BLOCK_M, BLOCK_N, warps, stages) that overrides the rest (forced_configs)
        self.tuned = {dim: triton.autotune(
            [triton.Config(dict(BLOCK_M=m, BLOCK_N=n), num_warps=w, num_stages=st) for m, n, w, st in configs],
            key=TUNE_KEY)(kernel) for dim, configs in configs_by_dim.items()} if AUTOTUNE else None

    def __call__(self, grid, *args, BLOCK_D, **kwargs):
        dim = dim_class(BLOCK_D)
        if self.forced is not None:
            m, n, w, st = self.forced
            return self.kernel[grid(m, n)](*args, BLOCK_D=BLOCK_D, **kwargs, BLOCK_M=m, BLOCK_N=n, num_warps=w,
                                           num_stages=st)
        if self.tuned is not None:
            return self.tuned[dim][lambda meta: grid(meta["BLOCK_M"], meta["BLOCK_N"])](*args, BLOCK_D=BLOCK_D,
                                                                                        **kwargs)
        m, n, w, st = INTERPRETER_CONFIG if INTERPRET else self.configs[dim][0]
        return self.kernel[grid(m, n)](*args, BLOCK_D=BLOCK_D, **kwargs, BLOCK_M=m, BLOCK_N=n, num_warps=w,
                                       num_stages=st)


_fwd_launch = _Launcher(_attn_fwd, FWD_CONFIGS)
_dkdv_launch = _Launcher(_attn_bwd_dkdv, DKDV_CONFIGS)
_dq_launch = _Launcher(_attn_bwd_dq, DQ_CONFIGS)


@contextlib.contextmanager
def forced_configs(fwd=None, dkdv=None, dq=None):
    """Launch with these (BLOCK_M, BLOCK_N, warps, stages) instead of the default or the autotuned one (None: as
    usual), so `bertkit check-gpu` can run every shipped configuration."""
    launchers = ((_fwd_launch, fwd), (_dkdv_launch, dkdv), (_dq_launch, dq))
    for launcher, config in launchers:
        launcher.forced = config
    try:
        yield
    finally:
        for launcher, _ in launchers:
            launcher.forced = None


def _dot_precision(dtype):
    return "ieee" if dtype == torch.float32 else "tf32"  # fp32 inputs get true fp32 products, not TF32


def _strides(t, varlen):
    """(batch, seq, head) strides in elements; the varlen layout has no batch dim (its rows start at cu_seqlens)."""
    st = t.stride()   # one call: each .stride(i) costs as much as the whole tuple
    if st[-1] != 1:
        raise ValueError("attention: the head_dim axis must be contiguous (stride 1)")
    return (0, st[0], st[1]) if varlen else st[:3]


def _check(q, k, v, seqinfo, varlen):
    want, shape = 3 if varlen else 4, tuple(q.shape)   # tuples: torch.Size's == goes through symbolic shapes
    if len(shape) != want or shape != tuple(k.shape) or shape != tuple(v.shape):
        raise ValueError(f"attention: q, k, v must share one {want}-d shape, got {q.shape}, {k.shape}, {v.shape}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"attention: q, k, v must be one of fp16/bf16/fp32, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] > 256:
        raise ValueError(f"attention: head_dim {q.shape[-1]} > 256 is not supported")
    if seqinfo.dtype != torch.int32:
        raise ValueError("attention: lengths / cu_seqlens must be int32")


def _check_offsets(max_seqlen, *strides):
    """The kernels address rows inside a sequence with 32-bit offsets (fewer registers than 64-bit ones).
    strides: _strides' (batch, seq, head) tuples, whose middle one is the row stride in both layouts."""
    row_stride = max([st[1] for st in strides])
    if (max_seqlen + 128) * row_stride >= 2**31:
        raise ValueError(f"attention: max_seqlen {max_seqlen} x row stride {row_stride} does not fit 32-bit "
                         "offsets; make the tensors contiguous or split the batch")


def _batch_heads(q, seqinfo, varlen):
    return (seqinfo.shape[0] - 1 if varlen else q.shape[0]), q.shape[-2]


def _rotary_args(rope_theta, max_seqlen, head_dim, device, dummy):
    """(COS, SIN, ROPE) for a launch: the reference's fp32 tables, made once per (length, dim, base, device);
    rope_theta <= 0 means no rotary (the tables are then never read)."""
    if rope_theta is None or rope_theta <= 0:
        return dummy, dummy, False
    if head_dim != block_d_for(head_dim):
        raise ValueError(f"attention: the kernels' rotary embeddings need a head_dim that is a power of two (16 to "
                         f"256), got {head_dim}; use --kernels torch for this model")
    return (*cached_rotary_tables(max_seqlen, head_dim, rope_theta, device), True)


def _window_args(window):
    """(WINDOW, LOCAL): window < 0 (or None) means every key."""
    return (0, False) if window is None or window < 0 else (int(window), True)


def flash_attn_forward(q, k, v, seqinfo, seed, max_seqlen, varlen, dropout_p, softmax_scale, out=None, lse=None,
                       window=None, rope_theta=None):
    """Returns (out, lse); lse is (batch, heads, max_seqlen) fp32 log-sum-exp in base 2 of the scaled scores.

    window: each query sees the keys within ±window positions (None or < 0: all); rope_theta: q and k are turned
    by rotary embeddings of this base as they load (None or <= 0: not), positions restarting at each sequence.
    `out`/`lse` may be given (tests pass NaN-filled buffers to prove every element is written)."""
    _check(q, k, v, seqinfo, varlen)
    batch, heads = _batch_heads(q, seqinfo, varlen)
    head_dim = q.shape[-1]
    if out is None:  # varlen: rows past cu_seqlens[-1] belong to no sequence, and no program writes them
        out = (torch.zeros_like if varlen else torch.empty_like)(q, memory_format=torch.contiguous_format)
    if lse is None:
        lse = q.new_empty((batch, heads, max_seqlen), dtype=torch.float32)
    if batch == 0 or max_seqlen == 0 or q.numel() == 0:
        out.zero_()
        return out, lse
    q_st, k_st, v_st, out_st = _strides(q, varlen), _strides(k, varlen), _strides(v, varlen), _strides(out, varlen)
    _check_offsets(max_seqlen, q_st, k_st, v_st, out_st)
    dropout = dropout_p > 0.0
    threshold, dropout_scale = threshold_and_scale(dropout_p)
    cos, sin, rope = _rotary_args(rope_theta, max_seqlen, head_dim, q.device, seqinfo)
    window, local = _window_args(window)
    _fwd_launch(
        lambda block_m, block_n: (cdiv(max_seqlen, block_m), batch * heads),
        q, k, v, out, lse, seqinfo, seed if dropout else seqinfo, cos, sin, *q_st, *k_st, *v_st, *out_st,
        heads, max_seqlen, softmax_scale * LOG2E, threshold, dropout_scale, window,
        HEAD_DIM=head_dim, BLOCK_D=block_d_for(head_dim),
        VARLEN=varlen, DROPOUT=dropout, DOT_PREC=_dot_precision(q.dtype), ROPE=rope, LOCAL=local,
    )
    return out, lse


def flash_attn_backward(dout, q, k, v, out, lse, seqinfo, seed, max_seqlen, varlen, dropout_p, softmax_scale,
                        dq=None, dk=None, dv=None, window=None, rope_theta=None):
    """Returns (dq, dk, dv) shaped like q; padded rows, and varlen rows past cu_seqlens[-1] (in buffers it
    allocates), get exact zeros. Buffers may be given (tests poison them): three of one layout."""
    batch, heads = _batch_heads(q, seqinfo, varlen)
    head_dim = q.shape[-1]
    given = dq is not None or dk is not None or dv is not None
    new = torch.zeros_like if varlen else torch.empty_like  # varlen: rows past cu_seqlens[-1] are never written
    dq = new(q, memory_format=torch.contiguous_format) if dq is None else dq
    dk = new(q, memory_format=torch.contiguous_format) if dk is None else dk
    dv = new(q, memory_format=torch.contiguous_format) if dv is None else dv
    if batch == 0 or max_seqlen == 0 or q.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    block_m = INTERPRETER_CONFIG[0] if INTERPRET else 64
    block_d = block_d_for(head_dim)
    q_st, k_st, v_st, out_st, dout_st, grad_st = [_strides(t, varlen) for t in (q, k, v, out, dout, dq)]
    if given and (dk.stride() != dq.stride() or dv.stride() != dq.stride()):
        raise ValueError("attention: given dq, dk, dv buffers must share one layout")
    _check_offsets(max_seqlen, q_st, k_st, v_st, out_st, dout_st, grad_st)
    dropout = dropout_p > 0.0
    threshold, dropout_scale = threshold_and_scale(dropout_p)
    seed_arg = seed if dropout else seqinfo
    delta = q.new_empty((batch, heads, max_seqlen), dtype=torch.float32)
    _attn_bwd_delta[(cdiv(max_seqlen, block_m), batch * heads)](
        out, dout, delta, seqinfo, *out_st, *dout_st, heads, max_seqlen,
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_D=block_d, VARLEN=varlen,
    )
    cos, sin, rope = _rotary_args(rope_theta, max_seqlen, head_dim, q.device, seqinfo)
    window, local = _window_args(window)
    common = dict(HEAD_DIM=head_dim, BLOCK_D=block_d, VARLEN=varlen, DROPOUT=dropout,
                  DOT_PREC=_dot_precision(q.dtype), ROPE=rope, LOCAL=local)
    qkv_strides = (*q_st, *k_st, *v_st, *dout_st)
    scales = (heads, max_seqlen, softmax_scale * LOG2E, softmax_scale, threshold, dropout_scale, window)
    _dkdv_launch(
        lambda block_m, block_n: (cdiv(max_seqlen, block_n), batch * heads),
        q, k, v, dout, lse, delta, dk, dv, seqinfo, seed_arg, cos, sin,
        *qkv_strides, *grad_st, *grad_st, *scales, **common,
    )
    _dq_launch(
        lambda block_m, block_n: (cdiv(max_seqlen, block_m), batch * heads),
        q, k, v, dout, lse, delta, dq, seqinfo, seed_arg, cos, sin,
        *qkv_strides, *grad_st, *scales, **common,
    )
    return dq, dk, dv


def dropout_mask(seed, batch_heads, max_seqlen, dropout_p, block=16):
    """The keep mask (batch*heads, max_seqlen, max_seqlen) bool that the kernels apply for this seed, drawn in
    block x block tiles (any multiple of 8 gives the same mask; for tests)."""
    mask = torch.empty((batch_heads, max_seqlen, max_seqlen), dtype=torch.int8, device=seed.device)
    _dropout_mask_kernel[(cdiv(max_seqlen, block), batch_heads)](
        mask, seed, max_seqlen, threshold_and_scale(dropout_p)[0], BLOCK=block)
    return mask.bool()


# ---------------------------------------------------------------------------------------------------------------
# torch.library ops: torch.compile and DeepSpeed see ordinary ops with fake (meta) implementations and autograd.


@torch.library.custom_op("bertkit::flash_attn_fwd", mutates_args=())
def flash_attn_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqinfo: torch.Tensor,
                      seed: torch.Tensor, max_seqlen: int, varlen: bool, dropout_p: float,
                      softmax_scale: float, window: int = -1, rope_theta: float = 0.0
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    return flash_attn_forward(q, k, v, seqinfo, seed, max_seqlen, varlen, dropout_p, softmax_scale, window=window,
                              rope_theta=rope_theta)


@flash_attn_fwd_op.register_fake
def _(q, k, v, seqinfo, seed, max_seqlen, varlen, dropout_p, softmax_scale, window=-1, rope_theta=0.0):
    batch, heads = _batch_heads(q, seqinfo, varlen)
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(
        (batch, heads, max_seqlen), dtype=torch.float32)


@torch.library.custom_op("bertkit::flash_attn_bwd", mutates_args=())
def flash_attn_bwd_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                      lse: torch.Tensor, seqinfo: torch.Tensor, seed: torch.Tensor, max_seqlen: int,
                      varlen: bool, dropout_p: float, softmax_scale: float, window: int = -1,
                      rope_theta: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return flash_attn_backward(dout, q, k, v, out, lse, seqinfo, seed, max_seqlen, varlen, dropout_p,
                               softmax_scale, window=window, rope_theta=rope_theta)


@flash_attn_bwd_op.register_fake
def _(dout, q, k, v, out, lse, seqinfo, seed, max_seqlen, varlen, dropout_p, softmax_scale, window=-1,
      rope_theta=0.0):
    new = lambda: torch.empty_like(q, memory_format=torch.contiguous_format)  # noqa: E731
    return new(), new(), new()


def _setup_context(ctx, inputs, output):
    q, k, v, seqinfo, seed, max_seqlen, varlen, dropout_p, softmax_scale, window, rope_theta = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, seqinfo, seed)
    ctx.args = (max_seqlen, varlen, dropout_p, softmax_scale, window, rope_theta)


def _grads(ctx, dout, run_backward):
    """The backward of both paths: run_backward is the op (torch.compile) or the plain function (eager)."""
    q, k, v, out, lse, seqinfo, seed = ctx.saved_tensors
    max_seqlen, varlen, dropout_p, softmax_scale, window, rope_theta = ctx.args
    dq, dk, dv = run_backward(dout, q, k, v, out, lse, seqinfo, seed, max_seqlen, varlen, dropout_p, softmax_scale,
                              window=window, rope_theta=rope_theta)
    return dq, dk, dv, None, None, None, None, None, None, None, None


def _backward(ctx, dout, _dlse):
    return _grads(ctx, dout, flash_attn_bwd_op)


torch.library.register_autograd("bertkit::flash_attn_fwd", _backward, setup_context=_setup_context)


class _FlashAttention(torch.autograd.Function):
    """The same forward and backward as the op, without torch.library's dispatch: eager mode's path, where that
    dispatch was most of the host time of a layer (benchmarks/gates/host_time_cpu.py). torch.compile takes the op."""

    @staticmethod
    def forward(ctx, q, k, v, seqinfo, seed, max_seqlen, varlen, dropout_p, softmax_scale, window, rope_theta):
        inputs = (q, k, v, seqinfo, seed, max_seqlen, varlen, dropout_p, softmax_scale, window, rope_theta)
        out, lse = flash_attn_forward(*inputs[:9], window=window, rope_theta=rope_theta)
        _setup_context(ctx, inputs, (out, lse))
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        return _grads(ctx, dout, flash_attn_backward)


# ---------------------------------------------------------------------------------------------------------------
# functional entries (the Triton path of kernels.attention / kernels.attention_varlen)


def _run(q, k, v, seqinfo, max_seqlen, varlen, dropout_p, softmax_scale, window=None, rope_theta=None):
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
    fused = flash_attn_fwd_op if torch.compiler.is_compiling() else _FlashAttention.apply
    out, _ = fused(q, k, v, seqinfo, seed, int(max_seqlen), varlen, float(dropout_p), scale,
                   -1 if window is None else int(window), float(rope_theta or 0.0))
    return out


# A global layer's q and k are turned by RoPE in one pass before the kernels (torch_backend.turn_padded /
# turn_packed). Turning them inside re-reads the cos/sin tables for every tile the loops visit, which a global
# layer's loops visit all of: on an H200 at 8,192 tokens that made its forward + backward 12.36 ms against 9.09
# turning once (FlexAttention 11.20; benchmarks/results/gates.md). A local layer's band visits few tiles, so it keeps
# RoPE inside (0.80 ms against 2.71).


def attention_triton(q, k, v, lengths, dropout_p=0.0, softmax_scale=None, window=None, rope_theta=None):
    """q, k, v (batch, seq, heads, head_dim); lengths (batch,) valid tokens. Rows past a length are zero."""
    if rope_theta is not None and window is None:  # a global layer: turned once (above)
        (q, k), rope_theta = turn_padded(q, k, rope_theta), None
    return _run(q, k, v, lengths, q.shape[1], False, dropout_p, softmax_scale, window, rope_theta)


def attention_varlen_triton(q, k, v, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, window=None,
                            rope_theta=None):
    """q, k, v (tokens, heads, head_dim); cu_seqlens (batch + 1,); max_seqlen: an upper bound (the bucket)."""
    if rope_theta is not None and window is None:  # a global layer: turned once (above)
        (q, k), rope_theta = turn_packed(q, k, cu_seqlens, max_seqlen, rope_theta), None
    return _run(q, k, v, cu_seqlens, max_seqlen, True, dropout_p, softmax_scale, window, rope_theta)
