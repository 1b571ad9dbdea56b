"""Fused (dropout(x) + residual) -> LayerNorm in Triton, forward and backward, for both orders: post-LN (BERT) uses
the normalised rows; pre-LN (prenorm=True) also uses the sum h as the residual stream, whose incoming gradient the
backward adds to LayerNorm's in the same pass.

Forward: each program normalises a tile of BLOCK_M rows x the whole hidden dim in fp32, and saves the per-row mean
and 1/std plus the pre-norm sum h (in the input dtype; it is what PyTorch's add + layer_norm would save too).
Backward: a fixed number of programs each walk a contiguous slab of rows, write dh (the residual's gradient; x's is
dh, or dh * mask * scale with dropout) and keep their dgamma/dbeta partial sums in fp32 registers; the partials
(programs x hidden) are then summed in a fixed order: no atomics, no locks, deterministic.
The row count is a runtime argument that Triton does not specialise on, so changing the token count never
recompiles. Dropout's keep bits are a pure function of (seed, row, col) (kernels/dropout.py), so backward
regenerates them.
"""
import functools

import torch
import triton
import triton.language as tl

from .common import INTERPRET, cdiv, draw_seed, next_power_of_2, threshold_and_scale
from .dropout import GROUP, keep_tile

MAX_HIDDEN = 8192
# empty_like(..., memory_format=CONTIGUOUS) costs a third of torch.empty(shape, dtype=, device=) on the host
CONTIGUOUS = torch.contiguous_format


@triton.jit(do_not_specialize=["n_rows"])
def _add_ln_fwd(
    X, R,           # (n_rows, N): the sub-layer output and the residual (R read only with HAS_RESIDUAL)
    W, B,           # (N,) LayerNorm weight and bias
    Y, H,           # (n_rows, N) out: the normalised rows and the pre-norm sum (H written only with STORE_H)
    MEAN, RSTD,     # (n_rows,) fp32 out
    SEED,           # (1,) int64 Philox seed (read only with DROPOUT)
    n_rows, N, stride_x, stride_r, stride_y, stride_h,  # row strides of X, R, Y, H; columns are contiguous
    eps, threshold, dropout_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, DROPOUT: tl.constexpr, STORE_H: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_mask = rows < n_rows
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if DROPOUT:
        seed = tl.load(SEED)
        x = tl.where(keep_tile(seed, 0, rows, 0, threshold, BLOCK_N), x * dropout_scale, 0.0)
    if HAS_RESIDUAL:
        x += tl.load(R + rows64[:, None] * stride_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if STORE_H:
        h_low = x.to(H.dtype.element_ty)
        tl.store(H + rows64[:, None] * stride_h + cols[None, :], h_low, mask=mask)
        x = h_low.to(tl.float32)  # normalise exactly what backward will read
    mean = tl.sum(x, 1) / N
    xc = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(xc * xc, 1) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = xc * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(Y + rows64[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit(do_not_specialize=["n_rows", "rows_per_program"])
def _add_ln_bwd(
    DY, H,          # (n_rows, N): the output's gradient and the forward's pre-norm sum
    DH_IN,          # (n_rows, N): h's own incoming gradient (pre-LN's residual stream; read only with HAS_DH_IN)
    W, MEAN, RSTD,  # (N,) weight; (n_rows,) fp32 statistics from the forward
    DH, DX,         # (n_rows, N) out: the residual's gradient and x's (x's only with DROPOUT)
    DW_PART, DB_PART,  # (programs, N) fp32 out: per-program partial sums of dW and dB
    SEED,           # (1,) int64
    n_rows, N, rows_per_program, stride_dy, stride_h, stride_dh, stride_dx, stride_dh_in,  # row strides
    threshold, dropout_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DROPOUT: tl.constexpr, HAS_DH_IN: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    if DROPOUT:
        seed = tl.load(SEED)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    for start in range(row_start, row_end, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_mask = rows < row_end
        mask = row_mask[:, None] & col_mask[None, :]
        rows64 = rows.to(tl.int64)
        dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        h = tl.load(H + rows64[:, None] * stride_h + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        xhat = tl.where(mask, (h - mean[:, None]) * rstd[:, None], 0.0)
        wdy = w[None, :] * dy
        c1 = tl.sum(xhat * wdy, 1) / N
        c2 = tl.sum(wdy, 1) / N
        dh = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        if HAS_DH_IN:
            dh += tl.load(DH_IN + rows64[:, None] * stride_dh_in + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dw_acc += tl.sum(dy * xhat, 0)
        db_acc += tl.sum(dy, 0)
        tl.store(DH + rows64[:, None] * stride_dh + cols[None, :], dh.to(DH.dtype.element_ty), mask=mask)
        if DROPOUT:
            dx = tl.where(keep_tile(seed, 0, rows, 0, threshold, BLOCK_N), dh * dropout_scale, 0.0)
            tl.store(DX + rows64[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
    tl.store(DW_PART + pid.to(tl.int64) * N + cols, dw_acc, mask=col_mask)
    tl.store(DB_PART + pid.to(tl.int64) * N + cols, db_acc, mask=col_mask)


@triton.jit(do_not_specialize=["n_rows"])
def _ln_dropout_mask_kernel(MASK, SEED, n_rows, N, threshold,  # MASK: (n_rows, N) int8, contiguous
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Materialises the dropout keep mask (rows, N) exactly as the kernels draw it; for tests."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    seed = tl.load(SEED)
    keep = keep_tile(seed, 0, rows, 0, threshold, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < N)[None, :]
    tl.store(MASK + rows.to(tl.int64)[:, None] * N + cols[None, :], keep.to(tl.int8), mask=mask)


# ---------------------------------------------------------------------------------------------------------------
# launchers


@functools.lru_cache(maxsize=64)
def tile_shape(n):
    """(BLOCK_M, BLOCK_N, num_warps): about 4k elements per tile; fewer warps under the interpreter is irrelevant."""
    block_n = max(GROUP, next_power_of_2(n))
    block_m = max(1, min(16, 4096 // block_n))
    warps = 4 if block_n * block_m <= 4096 else 8
    if block_n >= 4096:
        warps = 8
    return block_m, block_n, warps


@functools.lru_cache(maxsize=None)
def _sm_count(index):
    return torch.cuda.get_device_properties(index).multi_processor_count


def _num_programs(n_rows, block_m, device):
    if INTERPRET or device.type != "cuda":
        cap = 4  # a few slabs, so tests exercise the partial-sum reduction
    else:
        cap = 4 * _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return max(1, min(cap, cdiv(n_rows, block_m)))


def _rows(t, n):
    """(t as rows of n, the row stride). A contiguous t goes as it is (the kernels read flat rows; a reshape or
    view per tensor was a tenth of the launcher's host time); other layouts as a view with evenly strided rows,
    else a copy."""
    if t.is_contiguous():
        return t, n
    if t.stride(-1) != 1:
        t = t.contiguous()
        return t, n
    t = t.reshape(-1, n)
    return t, t.stride(0)


def _out_dtype(x, residual):
    """As PyTorch's add would: a bf16 branch added to an fp32 residual stream (autocast) stays fp32."""
    return x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)


def add_ln_forward(x, residual, weight, bias, seed, eps, dropout_p, y=None, h=None):
    """Returns (y, h, mean, rstd); h is the pre-norm sum, or an empty tensor when it is x itself (no residual, no
    dropout). y/h may be given, contiguous (tests pass NaN-filled buffers)."""
    n = x.shape[-1]
    if n > MAX_HIDDEN:
        raise ValueError(f"add_layer_norm: hidden size {n} > {MAX_HIDDEN} is not supported")
    if weight.shape != (n,) or bias.shape != (n,):
        raise ValueError(f"add_layer_norm: weight/bias must have shape ({n},), got {weight.shape}, {bias.shape}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"add_layer_norm: residual shape {residual.shape} != x shape {x.shape}")
    x2, x_stride = _rows(x, n)
    r2, r_stride = _rows(residual, n) if residual is not None else (x2, x_stride)
    n_rows = x.numel() // n if n else 0
    dropout = dropout_p > 0.0
    store_h = residual is not None or dropout
    dtype = _out_dtype(x, residual)
    y = torch.empty_like(x, dtype=dtype, memory_format=CONTIGUOUS) if y is None else y
    if h is None:
        h = torch.empty_like(y) if store_h else x.new_empty(0, dtype=dtype)
    mean = x.new_empty(n_rows, dtype=torch.float32)
    rstd = x.new_empty(n_rows, dtype=torch.float32)
    if n_rows == 0:
        return y, h, mean, rstd
    h2 = h if store_h else y  # y and h are made (or given) contiguous: row stride n
    block_m, block_n, warps = tile_shape(n)
    _add_ln_fwd[(cdiv(n_rows, block_m),)](
        x2, r2, weight, bias, y, h2, mean, rstd, seed if dropout else mean,
        n_rows, n, x_stride, r_stride, n, n, eps, *threshold_and_scale(dropout_p),
        BLOCK_M=block_m, BLOCK_N=block_n, HAS_RESIDUAL=residual is not None, DROPOUT=dropout, STORE_H=store_h,
        num_warps=warps,
    )
    return y, h, mean, rstd


def add_ln_backward(dy, h, weight, mean, rstd, seed, dropout_p, dh=None, dx=None, dh_in=None):
    """Returns (dh, dx, dweight, dbias): dh is the residual's gradient; dx is x's gradient with dropout, else None
    (x's gradient is dh then). dh_in: h's own incoming gradient (prenorm), added to dh. Given dh/dx/y/h buffers
    (tests poison them) are contiguous."""
    n = h.shape[-1]
    dy2, dy_stride = _rows(dy, n)
    h2, h_stride = _rows(h, n)
    n_rows = h.numel() // n if n else 0
    dropout = dropout_p > 0.0
    dh = torch.empty_like(h, memory_format=CONTIGUOUS) if dh is None else dh
    if dx is None and dropout:
        dx = torch.empty_like(dh)
    block_m, block_n, warps = tile_shape(n)
    programs = _num_programs(n_rows, block_m, h.device)
    rows_per_program = cdiv(cdiv(n_rows, programs), block_m) * block_m
    parts = h.new_empty((2, programs, n), dtype=torch.float32)  # dgamma's and dbeta's partials
    dh_in2, dh_in_stride = _rows(dh_in, n) if dh_in is not None else (dy2, dy_stride)
    _add_ln_bwd[(programs,)](
        dy2, h2, dh_in2, weight, mean, rstd, dh, dx if dropout else dh, parts[0], parts[1], seed if dropout else mean,
        n_rows, n, rows_per_program, dy_stride, h_stride, n, n, dh_in_stride,
        *threshold_and_scale(dropout_p),
        BLOCK_M=block_m, BLOCK_N=block_n, DROPOUT=dropout, HAS_DH_IN=dh_in is not None, num_warps=warps,
    )
    dw, db = parts.sum(1).to(weight.dtype).unbind(0)   # one reduction (and one cast) for both
    return dh, dx, dw, db


def ln_dropout_mask(seed, n_rows, n, dropout_p):
    """The keep mask (n_rows, n) bool that the kernels apply for this seed (for tests)."""
    mask = torch.empty((n_rows, n), dtype=torch.int8, device=seed.device)
    block_m, block_n, _ = tile_shape(n)
    threshold = threshold_and_scale(dropout_p)[0]
    _ln_dropout_mask_kernel[(cdiv(n_rows, block_m),)](mask, seed, n_rows, n, threshold,
                                                             BLOCK_M=block_m, BLOCK_N=block_n)
    return mask.bool()


# ---------------------------------------------------------------------------------------------------------------
# torch.library ops


@torch.library.custom_op("bertkit::add_layer_norm_fwd", mutates_args=())
def add_ln_fwd_op(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor,
                  seed: torch.Tensor, eps: float, dropout_p: float
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return add_ln_forward(x, residual, weight, bias, seed, eps, dropout_p)


@add_ln_fwd_op.register_fake
def _(x, residual, weight, bias, seed, eps, dropout_p):
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    store_h = residual is not None or dropout_p > 0.0
    dtype = _out_dtype(x, residual)
    return (torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format),
            x.new_empty(x.shape if store_h else (0,), dtype=dtype),
            x.new_empty((rows,), dtype=torch.float32), x.new_empty((rows,), dtype=torch.float32))


@torch.library.custom_op("bertkit::add_layer_norm_bwd", mutates_args=())
def add_ln_bwd_op(dy: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
                  rstd: torch.Tensor, seed: torch.Tensor, dropout_p: float, dh_in: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dh, dx, dw, db = add_ln_backward(dy, h, weight, mean, rstd, seed, dropout_p, dh_in=dh_in)
    dx = dx if dx is not None else h.new_empty((0,))  # an op returns a tensor for every output
    return dh, dx, dw, db.clone()  # an op's outputs may not alias: dw and db are rows of one reduction


@add_ln_bwd_op.register_fake
def _(dy, h, weight, mean, rstd, seed, dropout_p, dh_in=None):
    return (torch.empty_like(h, memory_format=torch.contiguous_format),
            h.new_empty(h.shape if dropout_p > 0.0 else (0,)), torch.empty_like(weight), torch.empty_like(weight))


def _setup_context(ctx, inputs, output):
    x, residual, weight, bias, seed, eps, dropout_p = inputs
    y, h, mean, rstd = output
    ctx.has_residual = residual is not None
    ctx.dropout_p = dropout_p
    store_h = residual is not None or dropout_p > 0.0
    ctx.save_for_backward(h if store_h else x, weight, mean, rstd, seed)


def _grads(ctx, dy, dh_in, run_backward):
    """The backward of both paths: run_backward is the op (torch.compile) or the plain function (eager)."""
    h, weight, mean, rstd, seed = ctx.saved_tensors
    if dy is None:  # eager: only h was used (the op path materialises zeros itself)
        dy = torch.zeros_like(h)
    # dh_in: the gradient of the returned sum h, which a pre-LN model uses as its residual stream (None otherwise)
    use_dh_in = dh_in is not None and dh_in.numel() > 0
    dh, dx, dw, db = run_backward(dy, h, weight, mean, rstd, seed, ctx.dropout_p, dh_in=dh_in if use_dh_in else None)
    grad_x = dx if ctx.dropout_p > 0.0 else dh
    return grad_x, (dh if ctx.has_residual else None), dw, db, None, None, None


def _backward(ctx, dy, dh_in, _dmean, _drstd):
    return _grads(ctx, dy, dh_in, add_ln_bwd_op)


torch.library.register_autograd("bertkit::add_layer_norm_fwd", _backward, setup_context=_setup_context)


class _AddLayerNorm(torch.autograd.Function):
    """The same forward and backward as the op, without torch.library's dispatch: eager mode's path, where that
    dispatch was most of the host time of a layer (benchmarks/gates/host_time_cpu.py). torch.compile takes the op."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, seed, eps, dropout_p):
        output = add_ln_forward(x, residual, weight, bias, seed, eps, dropout_p)
        _setup_context(ctx, (x, residual, weight, bias, seed, eps, dropout_p), output)
        ctx.set_materialize_grads(False)  # no zero-filled gradient for an h nobody used
        return output[:2]  # mean and rstd stay in ctx: two outputs fewer for autograd to track

    @staticmethod
    def backward(ctx, dy, dh_in):
        return _grads(ctx, dy, dh_in, add_ln_backward)


def add_layer_norm_triton(x, residual, weight, bias, eps=1e-12, dropout_p=0.0, prenorm=False):
    """LayerNorm(dropout(x) + residual) over the last dim; residual may be None. prenorm: (LayerNorm(h), h) with
    h = dropout(x) + residual (a pre-LN encoder's residual stream; then residual is required)."""
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"add_layer_norm: dropout_p must be in [0, 1), got {dropout_p}")
    if prenorm and residual is None:
        raise ValueError("add_layer_norm: prenorm returns the sum with the residual, so it needs one")
    seed = draw_seed(x.device) if dropout_p > 0.0 else weight  # any tensor: never read when p == 0
    fused = add_ln_fwd_op if torch.compiler.is_compiling() else _AddLayerNorm.apply
    y, h = fused(x, residual, weight, bias, seed, float(eps), float(dropout_p))[:2]
    return (y, h) if prenorm else y
