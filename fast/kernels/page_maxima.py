"""The page maxima of the Gluon scorers (``scorer_wgmma.py``, ``msa/kernels/scorer_mma.py``):
each thread keeps the maximum of its own tokens for every row of every page in shared
memory; one barrier and one reduction per program give the columns. Why: docs/KERNELS.md,
"The page maxima"."""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.runtime.jit import constexpr_function


def partial_maxima(rows: int, pages: int, mma: str = "exact") -> int:
    """The partial maxima per page and row kept at N = ``rows`` with ``pages`` per program
    on the ``mma`` route: 32 (one per thread of a warp's 32 token pairs — no shuffle in the
    page loop) where the epilogue's share is small and the shared memory is not what limits
    the programs an SM — up to 8 rows, or 16 rows with 4 or more pages a program (each warp
    reduces its own page); else 8 (folded a page: ``partials_of``). At N = 32, 32 partials beside
    the page ring would leave shared memory for fewer programs an SM than the registers
    allow; so would they on the E4M3 route at N = 8, where the register cap leaves room
    for 8 programs (its q tile, E4M3, shares no buffer with the maxima)."""
    if rows == 8 and mma == "e4m3":
        return 8
    return 32 if rows <= 8 or (rows == 16 and pages >= 4) else 8


@constexpr_function
def pad_pow2(n):
    """The least power of 2 >= n, at compile time (Gluon's tensor shapes are powers of 2):
    the pages of a program's maxima buffer."""
    return triton.next_power_of_2(n)


@constexpr_function
def maxima_layout(rows, parts):
    """The epilogue's layout of [pages, parts, rows] partial maxima: page i on warp i (fewer
    pages than warps repeat, more wrap), a thread's V rows and its share of the partials
    contiguous (vector loads; the convert from the flat load is then trivial)."""
    v = max(1, rows // 32)  # rows a thread holds: rows / V <= 32 lanes along them
    t = 32 * v // rows  # lanes along the partial maxima
    return gl.BlockedLayout([1, parts // t, v], [1, t, rows // v], [4, 1, 1], [2, 1, 0])


@gluon.jit
def own_tokens_max(acc):
    """[4, 8, N]: the maximum of each thread's two tokens (16 w + g and 16 w + g + 8) of an
    [64, N] accumulator, folded at once so a page's running maximum holds half the registers
    (and ``page_max``'s initial ``best``, from zeros)."""
    return gl.max(gl.reshape(acc, [4, 2, 8, acc.shape[1]]), axis=1)


@constexpr_function
def folds_by_layout(rows, parts):
    """Whether ``partials_of`` may gather its folded lanes into a thread by one layout
    conversion, not shuffles (docs/KERNELS.md; the MSA kernel: ``msa.scorer.mma_folds``)."""
    return rows >= 32 and parts < 32


@constexpr_function
def fold_layout(rows, parts):
    """``partials_of``'s [4, 8 / G, G, N] (G = parts / 4) with every c of g = G c + a in
    one thread, a and N G / 32 adjacent columns on its lanes."""
    g = parts // 4
    return gl.BlockedLayout([1, 8 // g, 1, rows * g // 32], [1, 1, g, 32 // g], [4, 1, 1, 1], [3, 1, 2, 0])


def fold_bytes(rows: int, fold: bool) -> int:
    """The shared memory of ``partials_of``'s conversion (the [4, 8, N] fp32 running
    maximum, reused every page) where it ``fold``s by layout, else 0."""
    return 4 * 8 * rows * 4 if fold else 0


@gluon.jit
def partials_of(best, PARTS: gl.constexpr, FOLD: gl.constexpr):
    """[PARTS, N]: a page's running maximum (``own_tokens_max``'s [4, 8, N]) folded to PARTS
    partial maxima of every row, g = G c + a (G = PARTS / 4) folded over c (below 32, its
    lanes by shuffles or, with FOLD (``folds_by_layout``), gathered into a thread by one
    conversion), as ``page_max`` stores them."""
    G: gl.constexpr = PARTS // 4  # the g kept apart
    N: gl.constexpr = best.shape[2]
    folds = gl.reshape(best, [4, 8 // G, G, N])
    if FOLD:
        folds = gl.convert_layout(folds, fold_layout(N, PARTS))
    return gl.reshape(gl.max(folds, axis=1), [PARTS, N])


@gluon.jit
def page_max(acc, best, H: gl.constexpr, maxima, i, PARTS: gl.constexpr, FOLD: gl.constexpr):
    """Fold 64-token block H (0 or 1) of page i (``acc``: fp32 [64, N] in the MMA's layout)
    into the page's running maximum ``best`` (``own_tokens_max``'s [4, 8, N]: block 0
    overwrites it); after block 1, store PARTS partial maxima of every
    row at ``maxima[i, :PARTS, :]`` (below 32, lanes folded first: ``partials_of``, FOLD).
    Returns the running maximum."""
    own = own_tokens_max(acc)
    if H == 0:
        best = own
    else:
        best = gl.maximum(best, own)
        maxima.index(i).store(partials_of(best, PARTS, FOLD))
    return best


@gluon.jit
def column_maxima(maxima, PAD: gl.constexpr, PARTS: gl.constexpr, ROWS: gl.constexpr):
    """After a barrier: the [PAD, ROWS] maxima of the program's pages (page i's over its
    PARTS partials), +0.0 added (an all-zero sum is +0.0), in
    ``SliceLayout(1, maxima_layout(ROWS, PARTS))``. ``maxima``: the [PAD, PARTS, ROWS]
    buffer ``page_max`` stores into (pages past the program's hold garbage)."""
    across: gl.constexpr = maxima_layout(ROWS, PARTS)
    V: gl.constexpr = max(1, ROWS // 32)
    T: gl.constexpr = 32 * V // ROWS
    # The 3-D buffer's order-[1, 0] layout cannot be loaded as 3-D: as [PAD * PARTS, ROWS].
    flat: gl.constexpr = gl.BlockedLayout([PARTS // T, V], [T, ROWS // V], [4, 1], [1, 0])
    v = maxima._reinterpret(gl.float32, [PAD * PARTS, ROWS], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])).load(flat)
    return gl.max(gl.convert_layout(gl.reshape(v, [PAD, PARTS, ROWS]), across), axis=1) + 0.0


def dynamic_bytes(rows: int, pages: int, parts: int, mma: str, fold: bool) -> int:
    """Either Gluon scorer's dynamic shared memory at N = ``rows`` with ``pages`` a program
    and ``parts`` partial maxima a page: q's tile [rows, 128] (``column_order.store_q_tile``:
    16-bit, or E4M3 on the ``mma`` "e4m3" route), the maxima [pad_pow2(pages), parts,
    rows] fp32 (``alloc_maxima``), sharing one buffer at N 8 on the exact route, and where
    ``partials_of`` ``fold``s by layout its conversion's (``fold_bytes``)."""
    tile = rows * 128 * (1 if mma == "e4m3" else 2)
    maxima = triton.next_power_of_2(pages) * parts * rows * 4
    return (max(tile, maxima) if rows == 8 and mma != "e4m3" else tile + maxima) + fold_bytes(rows, fold)


@gluon.jit
def alloc_maxima(PAD: gl.constexpr, PARTS: gl.constexpr, ROWS: gl.constexpr):
    """The shared [PAD, PARTS, ROWS] fp32 buffer of a program's partial maxima."""
    return gl.allocate_shared_memory(gl.float32, [PAD, PARTS, ROWS], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
