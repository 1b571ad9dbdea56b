"""Counter-based dropout bits shared by the attention and LayerNorm kernels.

Element (row, col) is kept when its 16-bit draw is >= threshold. The draw is a pure function of (seed, salt, row,
col) through Philox4x32-10 (key = the 64-bit seed, counter = (col // 8, row, salt, 0); column col takes half
col % 2 of output word (col % 8) // 2), so a backward pass regenerates the forward's mask from the seed alone,
whatever its tiling.
One Philox call gives 4 x 32 random bits, which serve 8 consecutive columns (16 bits each): an eighth of the integer
work and registers of one call per element, which on a GPU would cost more than the matmuls of attention and the
memory traffic of LayerNorm. p is rounded to a multiple of 1/65536 and the kept values are scaled by the inverse
of the keep rate actually drawn, so the expectation stays exact.
"""
import triton
import triton.language as tl

from .common import threshold_and_scale  # noqa: F401  (the host side of the same rule)

GROUP = 8  # columns per Philox call; tiles' column starts and widths are multiples of this


@triton.jit
def keep_tile(seed, salt, rows, col0, threshold, BLOCK_COLS: tl.constexpr):
    """Keep bits (rows.shape[0], BLOCK_COLS) for columns col0 .. col0 + BLOCK_COLS - 1 of `rows`; col0 % 8 == 0."""
    groups = col0 // 8 + tl.arange(0, BLOCK_COLS // 8)
    zero = rows[:, None] * 0 + groups[None, :] * 0
    c0 = (groups[None, :] + zero).to(tl.uint32)
    c1 = (rows[:, None] + zero).to(tl.uint32)
    c2 = (zero + salt).to(tl.uint32)
    r0, r1, r2, r3 = tl.philox(seed, c0, c1, c2, zero.to(tl.uint32))
    # column 8g + 2w + h takes half h (low 16 bits first) of Philox word w: join stacks on a new last axis, so
    # joining (r0, r2) with (r1, r3) then flattening puts the words in order r0, r1, r2, r3
    r = tl.join(tl.join(r0, r2), tl.join(r1, r3))  # (rows, groups, 2, 2)
    halves = tl.join(r & 0xFFFF, r >> 16)  # (rows, groups, 2, 2, 2): 8 draws per group
    draws = tl.reshape(halves, (rows.shape[0], BLOCK_COLS))
    return draws.to(tl.int32) >= threshold  # threshold may arrive as a constant (Triton specialises 1)
