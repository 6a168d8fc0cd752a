"""The MSA selection's kernels (docs/DESIGN.md §10.3): each request's id bounds over the
columns the MSA decode reads, and the stock select — forced windows by rule, the best
candidates by the exact key, the output ascending (docs/KERNELS.md, "The MSA stock
kernels")."""

import triton
import triton.language as tl

from indexer_constants import TOPK

from ...kernels.device import pdl_release, pdl_wait
from ...kernels.guards import record_input, request_verdict, row_id_bounds
from ...kernels.rules import is_short_row, own_page, row_query, short_row
from ...select.levels import KEY_EXACT, keys_to_pages, row_top16
from .ascending import best_in_column_order
from .rules import read_blocks

_TOPK = tl.constexpr(TOPK)


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
    n = read_blocks(tl.load(seq_lens_ptr + b), P)
    row_id_bounds(bt_ptr + b.to(tl.int64) * stride_bt, bounds_ptr + b * 4, n, BLOCK)


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
    return tl.where((k >= init) & (k < init + c), picked, msa_windows(k, c, n, init, local))


@triton.jit
def msa_windows(k, c, n, init, local):
    """Output slots ``k`` (int32 [16]) of a long row (n > 16) around its ``c`` chosen blocks,
    which take slots ``init .. init + c - 1``: blocks ``0 .. init - 1`` first, the last
    ``local`` blocks ``n - local .. n - 1`` right after the chosen, then -1 (what the
    chosen slots hold here is not used)."""
    local_at = k - init - c
    return tl.where(k < init, k, tl.where(local_at < local, n - local + local_at, -1))


@triton.jit
def msa_stock_select_kernel(
    score_ptr,  # fp32 [B, 8 * HS, W]: rows stride_sr (>= P rounded up to 16) apart
    seq_lens_ptr,  # int32 [B]
    bounds_ptr,  # int32 [B, 4]: the plan's id bounds
    num_blocks,  # N: the cache's blocks
    err_ptr,  # int32 [5]: the error record
    out_ptr,  # int32 [rows, HS, 16]
    part_ptr,  # int64 [rows * HS * SPLIT, 16]: the slices' top 16 (SPLIT > 1)
    count_ptr,  # int32 [rows * HS]: slices done (0 between calls)
    P,  # blocks the table holds (<= W)
    init,  # the forced windows
    local,
    stride_sb,
    stride_sr,
    HS: tl.constexpr,
    QLEN: tl.constexpr,
    SLICE: tl.constexpr,  # columns per program of a row (a power of two)
    SPLIT: tl.constexpr,  # programs per row (program_id(2))
    SELECT: tl.constexpr,  # the select shape of a slice: a policy.SelectShape
    EMULATE_FMA: tl.constexpr,
    SORT: tl.constexpr,
    PDL: tl.constexpr,
):
    """Per (query, head), programs (t, h, s): a padding request's or a bad one's row is
    sixteen -1 (a bad one recorded, ``guards.request_verdict``); a short row (causal count
    n <= 16) is ``[0 .. n - 1]``; a long one the forced blocks and the best ``16 - init -
    local`` candidates ``init <= g < min(n - local, P)``, ascending.

    The candidates are selected on the row from column ``init`` on, as if it began there.
    A row of one chunk on one program takes ``ascending.best_in_column_order`` (32-bit
    ordered scores, the chosen set stored in block order); a split or longer row takes
    ``levels.row_top16`` (the NVFP4 selects' path over 64-bit exact keys: SPLIT slices of
    SLICE columns, the last slice to finish merging them) and its keys are shifted back by
    ``init``."""
    pdl_wait(PDL)
    pdl_release(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    b, i, slot = row_query(t, QLEN)
    lo = init
    # a one-chunk slice loads with the length (the select is latency-bound), masked later
    start = score_ptr + b.to(tl.int64) * stride_sb + (slot * HS + h) * stride_sr
    row_ptr = start + lo
    cols = s * SLICE + tl.arange(0, SLICE)
    one_chunk: tl.constexpr = SLICE <= SELECT.chunk
    whole: tl.constexpr = one_chunk and SPLIT == 1
    if whole:
        # up to P's next multiple of 16, inside the row (``stock.stock_row_stride``): a mask
        # constant over 16 columns keeps the loads 16 bytes wide at any P
        mine = tl.load(start + cols, mask=cols < tl.cdiv(P, 16) * 16, other=0.0)
    elif one_chunk:
        mine = tl.load(row_ptr + cols, mask=cols < P - lo, other=0.0)
    else:
        mine = tl.zeros([SLICE], tl.float32)  # unused: the slice reads its columns in levels
    seq = tl.load(seq_lens_ptr + b)
    n = own_page(seq, slot) + 1
    k = tl.arange(0, _TOPK)
    out_row = out_ptr + (t * HS + h) * _TOPK
    dst = out_row + k
    verdict, column, value = request_verdict(bounds_ptr, b, seq, num_blocks, QLEN)
    m = _TOPK - init - local
    hi = tl.minimum(n - local, P)
    if (seq < QLEN) | (verdict != 0):
        if s == 0:
            if (i == 0) & (h == 0):
                record_input(err_ptr, verdict, b, column, value)
            tl.store(dst, tl.full([_TOPK], -1, tl.int32))
    elif is_short_row(n - 1):
        if s == 0:
            tl.store(dst, short_row(k, n - 1))
    elif (m > 0) & (hi > lo):
        if whole:
            # the row in one chunk: the chosen set in column (block) order, no 64-bit keys
            chosen, place = best_in_column_order(mine, cols, lo, hi, m, SORT)
            c = tl.sum(chosen.to(tl.int32), axis=0)
            tl.store(dst, msa_windows(k, c, n, init, local), mask=(k < init) | (k >= init + c))
            tl.store(out_row + init + place, cols, mask=chosen)
        else:
            parts = part_ptr + (t * HS + h) * (SPLIT * _TOPK)
            best, done = row_top16(
                row_ptr,
                hi - lo,
                s,
                mine,
                cols,
                parts,
                count_ptr + t * HS + h,
                KEY_EXACT,
                1,
                0,
                0.0,
                0.0,
                EMULATE_FMA,
                SLICE,
                SPLIT,
                SELECT,
                SORT,
            )
            if done:
                tl.store(dst, msa_output(tl.where(best > 0, best - lo, 0), m, n, init, local))
    else:  # no candidate to rank: the two windows alone
        if s == 0:
            tl.store(dst, msa_windows(k, 0, n, init, local))
