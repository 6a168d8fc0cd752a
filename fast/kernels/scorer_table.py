"""The table scorer: each code's value gathered from the fp16 table of every (scale byte,
code) pair (``fast.tables.dequant_lut``), then ``tl.dot`` with 16-bit operands and fp32
accumulators. It is the interpreter's scorer — no fp8 conversion in the kernel, which the
interpreter gets wrong — and runs on a GPU too, for comparison."""

import triton
import triton.language as tl

from indexer_constants import CODE_BYTES, PAGE_BYTES

from .device import pdl_wait
from .guards import BAD_BLOCK, record_input, tile_set
from .score_rows import pages_scored, query_rows

_PAGE_BYTES = tl.constexpr(PAGE_BYTES)
_CODE_BYTES = tl.constexpr(CODE_BYTES)
_BAD_BLOCK = tl.constexpr(BAD_BLOCK)


@triton.jit
def score_kernel_table(
    q_ptr,  # uint8 [.., B, 8, HS, 128] query tile (E4M3 bytes); offset by q_sel below
    q_sel_ptr,  # int64 [1]: which tile set to read (SETS > 0; see q_set_stride)
    q_set_stride,  # bytes between tile sets (0 where there is one)
    k_ptr,  # uint8 [N, 9216] pages
    bt_ptr,  # int32 [B, W]
    lens_ptr,  # int32 [B]
    out_ptr,  # fp32 [B, 8 * HS, W]
    lut_ptr,  # fp16 [256 * 16]
    err_ptr,  # int32 [5]: the error record (RECORD)
    num_blocks,  # N: ids outside [0, N) are never loaded
    W,
    stride_bt,
    stride_ob,
    stride_or,
    HS: tl.constexpr,
    SLOT0: tl.constexpr,  # the first slot scored
    ROWS: tl.constexpr,  # scorer.rows_for((8 - SLOT0) * HS): the rows scored, padded (the MMA's N)
    V: tl.constexpr,  # pages per program, as a leading tensor dimension
    RECORD: tl.constexpr,  # record a bad id in err_ptr's record
    PDL: tl.constexpr,
    SETS: tl.constexpr = 0,  # q_sel[0] picks one of SETS tile sets (outside them: NaN); 0: the tile, q_sel unread
):
    """Pages ``first .. first + V - 1`` of request program_id(0); a page whose id lies
    outside ``[0, num_blocks)`` is not loaded and its column gets NaN."""
    b = tl.program_id(0)
    first = tl.program_id(1) * V
    pdl_wait(PDL)
    length, n = pages_scored(lens_ptr, b, W)
    if first < n:
        q_set, set_code, set_value = tile_set(q_sel_ptr, SETS)
        r, own, q = query_rows(q_ptr, q_set, q_set_stride, b, length, HS, SLOT0, ROWS)
        qt = tl.broadcast_to(tl.trans(q)[None, :, :], [V, 128, ROWS])
        v = tl.arange(0, V)
        j = first + v  # [V] page columns
        live = j < n
        page = tl.load(bt_ptr + b.to(tl.int64) * stride_bt + j, mask=live, other=0)
        bad = live & ((page < 0) | (page >= num_blocks))
        live = live & ~bad
        base = k_ptr + tl.where(live, page, 0).to(tl.int64) * _PAGE_BYTES  # [V]
        # the page in two halves of 64 tokens: half the registers live at a time (a whole
        # page's dequantized tile spills on a GPU); the best of each half, then of both
        best_half = tl.zeros([V, ROWS, 2], tl.float32)
        for h in tl.static_range(2):
            t = h * 64 + tl.arange(0, 64)
            i = tl.arange(0, 64)
            byte = t[:, None] * 64 + i[None, :]  # [64 tokens, 64 code bytes]
            group = _CODE_BYTES + t[:, None] * 8 + i[None, :] // 8
            codes = tl.load(base[:, None, None] + byte[None, :, :], mask=live[:, None, None], other=0).to(tl.int32)
            scales = tl.load(base[:, None, None] + group[None, :, :], mask=live[:, None, None], other=0).to(tl.int32)
            lo = tl.load(lut_ptr + scales * 16 + (codes & 15))
            hi = tl.load(lut_ptr + scales * 16 + (codes >> 4))
            k = tl.reshape(tl.join(lo, hi), [V, 64, 128])  # element 2i: low nibble, 2i + 1: high
            dots = tl.dot(k, qt, out_dtype=tl.float32)  # [V, 64 tokens, ROWS]
            half = tl.max(dots, axis=1)  # [V, ROWS]
            best_half = tl.where(tl.arange(0, 2) == h, half[:, :, None], best_half)
        best = tl.max(best_half, axis=2) + 0.0  # [V, ROWS]; +0.0: an all-zero sum is +0.0
        best = tl.where(bad[:, None], float("nan"), best)
        if SETS > 0:  # a tile set outside the sets: every column NaN, the record names it
            best = tl.where(set_code != 0, float("nan"), best)
            if RECORD:
                record_input(err_ptr, set_code, -1, -1, set_value)
        if RECORD:
            column = tl.min(tl.where(bad, j, 2**31 - 1), axis=0)
            value = tl.min(tl.where(bad & (j == column), page, 2**31 - 1), axis=0)
            record_input(err_ptr, tl.where(column < 2**31 - 1, _BAD_BLOCK, 0), b, column, value)
        dst = out_ptr + b.to(tl.int64) * stride_ob + r[None, :] * stride_or + j[:, None]
        keep = (live | bad)[:, None] & (r[None, :] < 8 * HS) & (j[:, None] < own[None, :])
        tl.store(dst, best, mask=keep)
