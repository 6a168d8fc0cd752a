"""The MSA selection's kernels (docs/DESIGN.md §10.3): each request's id bounds over the
columns the MSA decode reads, and the stock select — forced windows by rule, the best
candidates by the exact key, the output ascending.

The candidates of a row are one contiguous range of global blocks, ``init <= g < min(n -
local, P)``; a rank holding every CP-th block sees them as one contiguous range of its
columns. So ``levels.top16`` runs on the row from that range's first column, as if the
range began at block 0, and the keys are shifted back after (the low 16 bits hold 0xFFFF -
block): no key is ever built for a forced or a past-the-range column.
"""

import triton
import triton.language as tl

from indexer_constants import PAGE, SLOTS, TOPK

from ..select.levels import KEY_EXACT, keys_to_pages, short_row, top16
from .device import pdl_release, pdl_wait
from .guards import record_input, request_verdict, row_id_bounds

_PAGE = tl.constexpr(PAGE)
_SLOTS = tl.constexpr(SLOTS)
_TOPK = tl.constexpr(TOPK)


@triton.jit
def msa_read_columns(seq, P):
    """Table columns the MSA decode of a request of length ``seq`` reads: min(ceil(seq /
    128), P), 0 for seq < 1 (no negative division)."""
    return tl.where(seq >= 1, tl.minimum((tl.maximum(seq, 1) + _PAGE - 1) // _PAGE, P), 0)


@triton.jit
def msa_bounds_kernel(
    bt_ptr,  # int32 [B, P_table]
    seq_lens_ptr,  # int32 [B]
    bounds_ptr,  # int32 [B, 4] out: row_id_bounds of each request's read columns
    P,
    stride_bt,
    BLOCK: tl.constexpr,
):
    """One program per request: the id bounds ``guards.request_verdict`` judges."""
    b = tl.program_id(0)
    n = msa_read_columns(tl.load(seq_lens_ptr + b), P)
    row_id_bounds(bt_ptr + b.to(tl.int64) * stride_bt, bounds_ptr + b * 4, n, BLOCK)


@triton.jit
def shifted_top16(
    row_ptr,
    lo,
    hi,
    CP: tl.constexpr,
    RANK: tl.constexpr,
    EMULATE_FMA: tl.constexpr,
    CHUNK: tl.constexpr,
    SUPERS: tl.constexpr,
    PER_SUPER: tl.constexpr,
    GROUP: tl.constexpr,
    SORT: tl.constexpr,
):
    """The best 16 exact keys (descending, 0 = none) of a row's columns ``lo <= j < hi``,
    whose blocks are ``j * CP + RANK``. The keys are the row's own: the range is selected
    from its first column and shifted back (0xFFFF - block drops by lo * CP)."""
    best = tl.zeros([_TOPK], tl.int64)
    if hi > lo:
        best = top16(
            row_ptr + lo, hi - lo, KEY_EXACT, CP, RANK, 0.0, 0.0, EMULATE_FMA, CHUNK, SUPERS, PER_SUPER, GROUP, SORT
        )
        best = tl.where(best > 0, best - lo * CP, 0)
    return best


@triton.jit
def msa_output(best, m, n, init, local):
    """A long row's output (n > 16): blocks ``0 .. init - 1``, then the blocks of the first
    ``m`` keys of ``best`` (descending exact keys, 0 = none; every one in ``[init, n -
    local)``) ascending, then ``n - local .. n - 1``, then -1. int32 [16]."""
    k = tl.arange(0, _TOPK)
    chosen = (k < m) & (best > 0)
    block = tl.where(chosen, keys_to_pages(best), 0)
    c = tl.sum(chosen.to(tl.int32), axis=0)
    # Each chosen block's place among the chosen: how many chosen blocks are lower (distinct).
    lower = chosen[None, :] & chosen[:, None] & (block[None, :] < block[:, None])  # [mine, other]
    place = tl.sum(lower.to(tl.int32), axis=1)
    at = tl.where(chosen, init + place, -1)  # output slot of each chosen block
    picked = tl.sum(tl.where(at[None, :] == k[:, None], block[None, :], 0), axis=1)  # [16]
    local_at = k - init - c
    out = tl.where(local_at < local, n - local + local_at, -1)
    out = tl.where(k < init + c, picked, out)
    return tl.where(k < init, k, out)


@triton.jit
def msa_stock_select_kernel(
    score_ptr,  # fp32 [B, 8 * HS, W]
    seq_lens_ptr,  # int32 [B]
    bounds_ptr,  # int32 [B, 4]: the plan's id bounds
    num_blocks,  # N: the cache's blocks
    err_ptr,  # int32 [5]: the error record
    out_ptr,  # int32 [rows, HS, 16]
    P,  # blocks the table holds (<= W)
    init,  # the forced windows
    local,
    stride_sb,
    stride_sr,
    HS: tl.constexpr,
    QLEN: tl.constexpr,
    CHUNK: tl.constexpr,  # CHUNK .. GROUP: the select shape of a row
    SUPERS: tl.constexpr,
    PER_SUPER: tl.constexpr,
    GROUP: tl.constexpr,
    EMULATE_FMA: tl.constexpr,
    SORT: tl.constexpr,
    PDL: tl.constexpr,
):
    """Per (query, head), program (t, h): a padding request's or a bad one's row is sixteen
    -1 (a bad one recorded, ``guards.request_verdict``); a short row (causal count n <= 16)
    is ``[0 .. n - 1]``; a long one the forced blocks and the best ``16 - init - local``
    candidates ``init <= g < min(n - local, P)``, ascending."""
    pdl_wait(PDL)
    pdl_release(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    b = t // QLEN
    i = t % QLEN
    slot = (_SLOTS - QLEN) + i
    seq = tl.load(seq_lens_ptr + b)
    n = (seq - QLEN + i) // _PAGE + 1
    k = tl.arange(0, _TOPK)
    dst = out_ptr + (t * HS + h) * _TOPK + k
    verdict, column, value = request_verdict(bounds_ptr, b, seq, num_blocks, QLEN)
    if (seq < QLEN) | (verdict != 0):
        if (i == 0) & (h == 0):
            record_input(err_ptr, verdict, b, column, value)
        tl.store(dst, tl.full([_TOPK], -1, tl.int32))
    elif n <= _TOPK:
        tl.store(dst, short_row(k, n - 1))
    else:
        row_ptr = score_ptr + b.to(tl.int64) * stride_sb + (slot * HS + h) * stride_sr
        m = _TOPK - init - local
        hi = tl.minimum(n - local, P)
        best = tl.zeros([_TOPK], tl.int64)
        if m > 0:
            best = shifted_top16(row_ptr, init, hi, 1, 0, EMULATE_FMA, CHUNK, SUPERS, PER_SUPER, GROUP, SORT)
        tl.store(dst, msa_output(best, m, n, init, local))
