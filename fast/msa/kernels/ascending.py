"""The exact best ``m`` columns of a row of one chunk as a set, each with its place in column
order: the MSA stock select's output, ascending (docs/DESIGN.md §10.3). Why no key is
built: docs/KERNELS.md, "The ascending select"."""

import triton
import triton.language as tl

from ...select.levels import TOPK, ordered_bits


@triton.jit
def _mth_largest(u, m, SORT: tl.constexpr):
    """The ``m``-th largest (1 <= m <= 16, repeats counted) of uint32 ``u`` (1-D, a power of
    two >= 16 long). SORT (GPUs): ``tl.topk``'s network, which keeps repeats. Else (the
    interpreter, where that network runs ~1 s a call): bit by bit from the top, the largest
    ``t`` with at least ``m`` values >= t."""
    if SORT:
        k = tl.arange(0, TOPK)
        t = tl.max(tl.where(k == m - 1, tl.topk(u, TOPK), 0), axis=0)
    else:
        wide = u.to(tl.int64)
        t = tl.sum(tl.zeros_like(wide), axis=0)
        for b in tl.static_range(32):
            trial = t | (1 << (31 - b))
            t = tl.where(tl.sum((wide >= trial).to(tl.int32), axis=0) >= m, trial, t)
    return t


@triton.jit
def best_in_column_order(score, cols, lo, hi, m, SORT: tl.constexpr):
    """The exact best ``m`` (0 <= m <= 16) of score columns ``lo <= cols < hi`` by (score
    desc, column asc), every column taken if fewer: ``(chosen, place)``, both shaped as
    ``cols`` (1-D, a power of two >= 16 long): ``chosen`` where a column is among them,
    ``place`` its rank among the chosen in column order (0-based; meaningless elsewhere).
    ``score`` holds fp32 scores of ``cols``; what it holds outside ``[lo, hi)`` is ignored.
    Scores order as floats with -0 below +0 (the exact key's order)."""
    valid = (cols >= lo) & (cols < hi)
    bits = tl.where(valid, score, 0.0).to(tl.int32, bitcast=True)
    # the ordered bits with the sign flipped: unsigned order is the floats' order; a column
    # outside is 0, below or equal to every valid one, and the masks below keep it out
    u = tl.where(valid, (ordered_bits(bits) ^ -(2**31)).to(tl.uint32, bitcast=True), 0)
    t = _mth_largest(u, tl.maximum(m, 1), SORT)
    above = (valid & (u > t)).to(tl.int32)
    tied = (valid & (u == t)).to(tl.int32)
    room = m - tl.sum(above, axis=0)  # >= 0: fewer than m lie above the m-th
    # one running count of both kinds (each < 2^16) for the columns before each column
    both = above | (tied << 16)
    before = tl.cumsum(both, axis=0) - both
    tied_before = before >> 16
    chosen = (above > 0) | ((tied > 0) & (tied_before < room))
    # the chosen before a column: every one above, and the tied up to the room
    place = (before & 0xFFFF) + tl.minimum(tied_before, room)
    return chosen, place
