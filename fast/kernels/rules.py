"""The contract's per-row rules (docs/DESIGN.md §3, §6), each spelled once for every kernel,
Gluon's included: a row's request and slot, a slot's query position, the causal cut, long
requests and short rows (the reference's twin: ``reference.rules``)."""

import triton
import triton.language as tl

from indexer_constants import PAGE, SLOTS, TOPK

_PAGE = tl.constexpr(PAGE)
_SLOTS = tl.constexpr(SLOTS)
_TOPK = tl.constexpr(TOPK)
# A request is long when its last query's own page is 16 or more: its length exceeds this.
_LONG_LEN = tl.constexpr(TOPK * PAGE)


@triton.jit
def row_query(t, QLEN: tl.constexpr):
    """Row ``t`` of a step of QLEN queries per request: ``(b, i, slot)``, query i = t %
    QLEN of request b = t // QLEN, in tile slot ``8 - QLEN + i`` (a step fills the last
    QLEN of the 8 slots)."""
    i = t % QLEN
    return t // QLEN, i, (_SLOTS - QLEN) + i


@triton.jit
def query_position(length, slot):
    """The position of the query in tile slot ``slot`` (0..7) of a request of ``length``
    tokens: ``length - 8 + slot`` (a step of q queries fills the last q slots, its last
    query at position length - 1). Negative for a slot before a short request's start."""
    return length - _SLOTS + slot


@triton.jit
def read_pages(length, width):
    """NVFP4 (DESIGN §3): the table columns a request of ``length`` tokens reads, and its
    scorer scores: ``min((length - 1) // 128, width)``, 0 for ``length < 1`` (the division
    of a length below 1 is never used: C and numpy round it differently)."""
    return tl.where(length >= 1, tl.minimum((length - 1) // _PAGE, width), 0)


@triton.jit
def own_page(length, slot):
    """The causal cut: the page that holds slot ``slot``'s query, ``(length - 8 + slot) //
    128``. Pages below it are ranked; it is the row's own page. For a position >= 0 (the
    decodes judge a length below query_len bad before using it)."""
    return query_position(length, slot) // _PAGE


@triton.jit
def scored_own_page(length, slot):
    """``own_page`` where the slot's query exists, 0 for a slot before a short request's
    first token (a scorer's bound for a row it never stores)."""
    position = query_position(length, slot)
    return tl.where(position >= 0, position // _PAGE, 0)


@triton.jit
def is_long_request(length):
    """A request whose last query's own page is 16 or more (``length > 16 * 128``): the CP
    path exchanges its queries and scores and merges its rows; no other request touches a
    symmetric buffer."""
    return length > _LONG_LEN


@triton.jit
def is_short_row(own):
    """A row whose causal pages ``0 .. own`` fit the output whole (``own + 1 <= 16``): it
    is written ``[0 .. own, -1, ...]`` (``short_row``) without ranking."""
    return own + 1 <= _TOPK


@triton.jit
def short_row(k, own):
    """The output of a short row (``is_short_row``) at output slots ``k`` (int32 [16]):
    ``[0 .. own, -1, ...]``, its causal pages in order."""
    return tl.where(k <= own, k, -1)
