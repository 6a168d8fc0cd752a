"""What every page scorer reads first (docs/DESIGN.md §4): a request's pages to score, and
its query rows with each row's causal bound."""

import triton
import triton.language as tl

from .e4m3 import e4m3_to_f16
from .rules import read_pages, scored_own_page


@triton.jit
def pages_scored(lens_ptr, b, W):
    """(length, n): request b's length and the pages scored (``rules.read_pages``)."""
    length = tl.load(lens_ptr + b)
    return length, read_pages(length, W)


@triton.jit
def query_rows(q_ptr, q_set, q_set_stride, b, length, HS: tl.constexpr, SLOT0: tl.constexpr, ROWS: tl.constexpr):
    """(r, own, q): tile set ``q_set``'s rows (an index the caller bounded:
    ``guards.tile_set``) r = slot * HS + head from slot SLOT0 on (ROWS of them, past 8 * HS
    padding), each row's causal bound own(slot) = (len - 8 + slot) // 128, and q fp16 [ROWS,
    128] (E4M3 -> fp16 is exact, in integers: ``e4m3``; padding rows 0)."""
    r = SLOT0 * HS + tl.arange(0, ROWS)
    own = scored_own_page(length, r // HS)
    d = tl.arange(0, 128)
    tile = q_ptr + q_set * q_set_stride + b.to(tl.int64) * (8 * HS * 128)
    qb = tl.load(tile + r[:, None] * 128 + d[None, :], mask=r[:, None] < 8 * HS, other=0)
    return r, own, e4m3_to_f16(qb)
