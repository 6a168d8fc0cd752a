"""Device-side input guards (docs/DESIGN.md §7): what a host cannot check without a sync —
each request's id bounds, its verdict, and the process's int32 error record
(``ERR_PROTOCOL``: a spin's timeout; ``ERR_INPUT`` ..: the first bad input). How ranks agree:
docs/KERNELS.md, "The device-side guards"."""

import triton
import triton.language as tl

from .rules import read_pages

ERR_WORDS = 5
ERR_PROTOCOL = 0
ERR_INPUT = 1
BAD_BLOCK = 1  # a block id the decode would read lies outside [0, num_blocks)
BAD_LENGTH = 2  # a length that is negative or in 1 .. query_len - 1 (0 is padding)
BAD_QUERY_SET = 3  # a scorer's tile set index outside [0, its sets)
BOUND_WORDS = 4  # per request: smallest id, its column, largest id, its column

_ERR_INPUT = tl.constexpr(ERR_INPUT)
_BAD_BLOCK = tl.constexpr(BAD_BLOCK)
_BAD_LENGTH = tl.constexpr(BAD_LENGTH)
_BAD_QUERY_SET = tl.constexpr(BAD_QUERY_SET)
_BIG = tl.constexpr(2**31 - 1)


@triton.jit
def row_id_bounds(bt_row, bounds_row, n, BLOCK: tl.constexpr):
    """Store (min id, its first column, max id, its first column) over columns ``j < n`` of
    a table row (int32 pointers), or (0, -1, 0, -1) where n is 0: ids the decode never
    reads are never judged."""
    lo = tl.full([], _BIG, tl.int32)
    hi = tl.full([], -_BIG - 1, tl.int32)
    lo_col = tl.full([], -1, tl.int32)
    hi_col = tl.full([], -1, tl.int32)
    start = 0
    while start < n:  # (a while, not a range: the interpreter cannot range over a loaded value)
        j = start + tl.arange(0, BLOCK)
        live = j < n
        v = tl.load(bt_row + j, mask=live, other=0)
        v_lo = tl.min(tl.where(live, v, _BIG), axis=0)
        v_hi = tl.max(tl.where(live, v, -_BIG - 1), axis=0)
        c_lo = tl.min(tl.where(live & (v == v_lo), j, _BIG), axis=0)
        c_hi = tl.min(tl.where(live & (v == v_hi), j, _BIG), axis=0)
        lo_col = tl.where(v_lo < lo, c_lo, lo_col)
        hi_col = tl.where(v_hi > hi, c_hi, hi_col)
        lo = tl.minimum(lo, v_lo)
        hi = tl.maximum(hi, v_hi)
        start += BLOCK
    none = n <= 0
    tl.store(bounds_row, tl.where(none, 0, lo))
    tl.store(bounds_row + 1, tl.where(none, -1, lo_col))
    tl.store(bounds_row + 2, tl.where(none, 0, hi))
    tl.store(bounds_row + 3, tl.where(none, -1, hi_col))


@triton.jit
def table_bounds_kernel(
    bt_ptr,  # int32 [B, P_table]
    seq_lens_ptr,  # int32 [B]
    bounds_ptr,  # int32 [B, 4] out: row_id_bounds of each request
    P,
    stride_bt,
    BLOCK: tl.constexpr,
):
    """The stock plan's bounds: one program per request."""
    b = tl.program_id(0)
    n = read_pages(tl.load(seq_lens_ptr + b), P)
    row_id_bounds(bt_ptr + b.to(tl.int64) * stride_bt, bounds_ptr + b * 4, n, BLOCK)


@triton.jit
def request_verdict(bounds_ptr, b, seq, num_blocks, QLEN: tl.constexpr):
    """(code, column, value) of request b: 0 if its rows may be ranked, BAD_LENGTH (column
    -1, the length) or BAD_BLOCK (the column and id of its smallest or largest id, whichever
    is outside ``[0, num_blocks)``). A padding request (seq 0) is (0, -1, 0); its rows are
    dead all the same (``dead_rows``)."""
    lo = tl.load(bounds_ptr + b * 4)
    hi = tl.load(bounds_ptr + b * 4 + 2)
    bad_len = (seq < 0) | ((seq > 0) & (seq < QLEN))
    low_bad = lo < 0
    bad_block = low_bad | (hi >= num_blocks)
    code = tl.where(bad_len, _BAD_LENGTH, tl.where(bad_block, _BAD_BLOCK, 0))
    column = tl.where(bad_len, -1, tl.where(low_bad, tl.load(bounds_ptr + b * 4 + 1), tl.load(bounds_ptr + b * 4 + 3)))
    value = tl.where(bad_len, seq, tl.where(low_bad, lo, hi))
    return code, column, value


@triton.jit
def record_input(err_ptr, code, request, column, value):
    """Record a bad input in the error record unless one is already there (the first one
    seen wins; later ones leave it)."""
    if code != 0:
        old = tl.atomic_cas(err_ptr + _ERR_INPUT, 0, code)
        if old == 0:
            tl.store(err_ptr + _ERR_INPUT + 1, request)
            tl.store(err_ptr + _ERR_INPUT + 2, column)
            tl.store(err_ptr + _ERR_INPUT + 3, value)


@triton.jit
def tile_set(q_sel_ptr, SETS: tl.constexpr):
    """(set, code, value) of the tile set index ``raw = q_sel[0]`` (int64) among SETS sets:
    the set to read (``raw``, or 0 outside ``[0, SETS)``), the record's code (0 or
    BAD_QUERY_SET) and ``raw`` saturated to int32, which the caller records (a branch here
    would hold later loads behind the index). SETS 0: q_sel unread, (0, 0, 0)."""
    q_set, code, value = 0, 0, 0
    if SETS > 0:
        raw = tl.load(q_sel_ptr)
        ok = (raw >= 0) & (raw < SETS)
        q_set = tl.where(ok, raw, 0)
        code = tl.where(ok, 0, _BAD_QUERY_SET)
        value = tl.minimum(tl.maximum(raw, -_BIG - 1), _BIG).to(tl.int32)
    return q_set, code, value
