"""The stock decode's kernels (docs/DESIGN.md §5): the queries into the 8-slot tile, and the
top-16 by MiniMax's 16-bit key over each row's own score range."""

import triton
import triton.language as tl

from indexer_constants import SLOTS, TOPK

from ..select.levels import KEY_STOCK, RANKED, fmaf, keys_to_pages, row_top16
from .device import pdl_release, pdl_wait
from .guards import record_input, request_verdict
from .rules import is_short_row, own_page, row_query, short_row

_SLOTS = tl.constexpr(SLOTS)
_TOPK = tl.constexpr(TOPK)


@triton.jit
def q_to_tile_kernel(
    q_ptr,  # int32 [rows, HS * WORDS]: this rank's heads, the query elements as words
    tile_ptr,  # int32 [B, 8, HS, WORDS]
    HS: tl.constexpr,
    QLEN: tl.constexpr,
    PDL: tl.constexpr,
    WORDS: tl.constexpr = 32,  # int32 words a head: 32 (128 E4M3 bytes), 64 (128 bf16)
):
    """Row t = (b, i) goes to slot 8 - QLEN + i of request b. Releases the scorer once
    its own wait is over (the scorer loads the table, the lengths and its first pages
    before it waits for this kernel: ``score_pages``' prefetch)."""
    pdl_wait(PDL)
    pdl_release(PDL)
    t = tl.program_id(0)
    b, _, slot = row_query(t, QLEN)
    w = tl.arange(0, HS * WORDS)
    tl.store(tile_ptr + (b * _SLOTS + slot) * (HS * WORDS) + w, tl.load(q_ptr + t * (HS * WORDS) + w))


@triton.jit
def _min_max(lo_a, hi_a, lo_b, hi_b):
    """``tl.reduce``'s combine for a row's (min, max) in one pass."""
    return tl.minimum(lo_a, lo_b), tl.maximum(hi_a, hi_b)


@triton.jit
def stock_topk_kernel(
    score_ptr,  # fp32 [B, 8 * HS, W]
    seq_lens_ptr,  # int32 [B]
    bounds_ptr,  # int32 [B, 4]: the plan's id bounds
    num_blocks,  # N: the cache's blocks
    err_ptr,  # int32 [5]: the error record
    out_ptr,  # int32 [rows, HS, 16]
    part_ptr,  # int64 scratch, read as uint32 [rows * HS * SPLIT, 16]: the slices' top 16 (SPLIT > 1)
    count_ptr,  # int32 [rows * HS]: slices done (0 between calls)
    P,  # pages the table holds (<= W)
    stride_sb,
    stride_sr,
    HS: tl.constexpr,
    QLEN: tl.constexpr,
    WIDTH: tl.constexpr,  # the row's columns rounded up to a power of two
    SPLIT: tl.constexpr,  # programs per row (program_id(2)), each WIDTH // SPLIT columns
    SELECT: tl.constexpr,  # the select shape of one slice: a policy.SelectShape
    EMULATE_FMA: tl.constexpr,
    SORT: tl.constexpr,
    PDL: tl.constexpr,
):
    """Per (query, head): 15 pages by the stock key among j < min(own, P), own in slot 15;
    sixteen -1 for a padding request (length 0) and for a request with a bad length or id
    (``guards.request_verdict``), which is recorded in the error record."""
    pdl_wait(PDL)
    pdl_release(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    b, i, slot = row_query(t, QLEN)
    row_ptr = score_ptr + b.to(tl.int64) * stride_sb + (slot * HS + h) * stride_sr
    # The loads that need no length go out with the length's, not one L2 round trip after
    # it (a top-16 at 8192 pages is a chain of dependent steps, latency-bound): the whole
    # (padded) row, for the range every slice keys by — one load, not a loop over chunks —
    # and for a select of one chunk, that chunk. Columns past the length are unwritten
    # (any bits); the masks below drop them.
    j = tl.arange(0, WIDTH)
    row = tl.load(row_ptr + j, mask=j < P, other=0.0)
    first = tl.load(row_ptr)  # column 0: P >= 1 (checks.plan_inputs)
    one_chunk: tl.constexpr = WIDTH // SPLIT <= SELECT.chunk
    cols = s * (WIDTH // SPLIT) + tl.arange(0, WIDTH // SPLIT)
    if one_chunk and SPLIT > 1:
        mine = tl.load(row_ptr + cols, mask=cols < P, other=0.0)
    else:
        mine = row
    seq = tl.load(seq_lens_ptr + b)
    own = own_page(seq, slot)
    k = tl.arange(0, _TOPK)
    dst = out_ptr + (t * HS + h) * _TOPK + k
    verdict, column, value = request_verdict(bounds_ptr, b, seq, num_blocks, QLEN)
    if (seq < QLEN) | (verdict != 0):
        if s == 0:
            if (i == 0) & (h == 0):
                record_input(err_ptr, verdict, b, column, value)
            tl.store(dst, tl.full([_TOPK], -1, tl.int32))
    elif is_short_row(own):
        if s == 0:
            tl.store(dst, short_row(k, own))
    else:
        n = tl.minimum(own, P)
        # Both ends in one reduction, column 0's score (ranked: n >= 1 here) standing in for
        # the columns from n on, which moves neither end: one select a column, not two, and
        # one reduction tree.
        ranked = tl.where(j < n, row, first)
        lo, hi = tl.reduce((ranked, ranked), 0, _min_max)
        span = hi - lo
        scale = tl.where(span == 0, 0.0, tl.math.div_rn(65534.0, tl.where(span == 0, 1.0, span)))
        bias = fmaf(-lo, scale, tl.full([], 1.5, tl.float32), EMULATE_FMA)
        parts = part_ptr.to(tl.pointer_type(tl.uint32)) + (t * HS + h) * (SPLIT * _TOPK)
        best, done = row_top16(
            row_ptr,
            n,
            s,
            mine,
            cols,
            parts,
            count_ptr + t * HS + h,
            KEY_STOCK,
            1,
            0,
            scale,
            bias,
            EMULATE_FMA,
            WIDTH // SPLIT,
            SPLIT,
            SELECT,
            SORT,
        )
        if done:
            tl.store(dst, tl.where(k == RANKED, own, keys_to_pages(best)))
