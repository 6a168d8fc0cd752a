"""``score_pages``: the Q8KV4 decode scorer of docs/DESIGN.md §4 on the tensors' device.

Two kernels honor the one contract: the wgmma kernel on GPUs (``kernels/scorer_wgmma.py``:
codes decoded straight into the MMA's register operand) and the table kernel everywhere
(``kernels/scorer_table.py``: the interpreter's, a gather from the table of every (scale,
code) pair). Both multiply 16-bit operands into fp32 accumulators — Hopper's FP8 MMA does
not accumulate in fp32 — with the page's tokens on M and the query rows scored on N.
The wgmma kernel's launch policy is here too (``mma_rows``, ``pages_per_program``, ...),
as the MSA kernel's is in ``msa/scorer.py``: the kernel modules hold kernels.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

from indexer_constants import PAGE_BYTES, SLOTS

from . import checks
from .backend import pdl_options, sm_count
from .checks import score_shapes
from .kernels import page_ring
from .kernels.guards import ERR_WORDS
from .kernels.page_maxima import dynamic_bytes, folds_by_layout, partial_maxima
from .kernels.scorer_table import score_kernel_table
from .kernels.scorer_wgmma import score_kernel_wgmma
from .route import device_route
from .tables import dequant_lut, scale_tables

KERNELS = ("wgmma", "table")

# The wgmma kernel's launch policy (its shapes, program sizes, register cap, ring and table
# placement; the MSA mma kernel takes its N and program sizes from here too). Each choice
# was measured: bench/PERF.md.

# Most pages per program, and 64-token blocks loaded ahead of the one decoded.
WGMMA_PAGES = 8
WGMMA_DEPTH = 2
# Programs per SM a grid of WGMMA_PAGES-page programs needs (else 4 pages), and below which
# 4 pages per program shrink further (4-5 programs fit at once at Hs <= 4).
_PROGRAMS_PER_SM_FOR_MOST = 16
_PROGRAMS_PER_SM = 4


def long_row_pages(rows: int, mma: str = "exact", msa: bool = False) -> int:
    """Pages per program on long rows at N = ``rows`` (``mma_rows``) on the ``mma`` route:
    WGMMA_PAGES, but 4 at N = 32 on the E4M3-MMA route and in the MSA kernel (``msa``).
    The exact route's 8 at N = 32 keep its programs an SM (with 8 partial maxima) and shed
    half a program's setup a page; the E4M3 route measured behind with 8 there, and the
    MSA kernel's 8 is not measured (bench/PERF.md)."""
    return 4 if rows == 32 and (msa or mma == "e4m3") else WGMMA_PAGES


def pages_per_program(batch: int, width: int, sms: int, rows: int = 8, mma: str = "exact", msa: bool = False) -> int:
    """``long_row_pages(rows, mma, msa)`` where its grid still gives every SM
    _PROGRAMS_PER_SM_FOR_MOST programs (fewer, larger programs leave a longer tail), else 4,
    halved while the grid would fill fewer than _PROGRAMS_PER_SM programs per SM: a short
    row scored by a few programs pays each one's pages in series. rows: the MMA's N
    (``mma_rows`` of the rows scored); mma: the route; msa: for the MSA kernel."""
    most = long_row_pages(rows, mma, msa)
    if most > 4 and batch * triton.cdiv(width, most) >= _PROGRAMS_PER_SM_FOR_MOST * sms:
        return most
    ppp = 4
    while ppp > 1 and batch * triton.cdiv(width, ppp) < _PROGRAMS_PER_SM * sms:
        ppp //= 2
    return ppp


def max_registers(rows: int) -> int | None:
    """The register cap the wgmma kernel is compiled with for ``rows`` live query rows, on
    either route (None: the compiler's choice).

    Registers go out per warp in units of 256, so a cap is programs an SM: at N = 8, 64
    (8 programs; the compiler's own 80 gives 6), at N = 16, 80 (6; its own 96 gives 5).
    Neither spills (``tests/test_sass.py`` checks the spills). From N = 32 the compiler's
    choice stands: a cap of 96 (5 programs an SM) measured no faster (PERF.md)."""
    n = mma_rows(rows)
    return 64 if n == 8 else 80 if n == 16 else None


def ring_pages(rows: int, pages: int, mma: str = "exact") -> int:
    """Pages in flight through the shared-memory ring (``page_ring.py``) at N = ``rows``
    (``mma_rows``) with ``pages`` per program on the ``mma`` route, or 0: the register
    pipeline of DEPTH blocks; never more than fits (``max_ring``).

    2 on long programs at N = 8 (8 pages), N = 16 and N = 32 (4 or more): a program's next
    page then travels in shared memory, where ptxas cannot move its loads to just before
    their use as it does with registers. 0 elsewhere: on shorter programs the ring's first
    page is waited for whole and measured behind (bench/PERF.md). A ring of 1 serialises
    copy and decode; 3 or more cost programs an SM."""
    long = (rows in (16, 32) and pages >= 4) or (rows == 8 and pages >= 8)
    return min(2, max_ring(rows, pages, None, mma)) if long else 0


def shared_tables(rows: int) -> int:
    """1 where the kernel copies the scale table (2 KB) into shared memory once a program
    and gathers each group's entry there (``page_ring.gather_tables``), 0 where it gathers
    from global memory through L1: up to N = 32, fed from registers or the ring. A gather
    is on each block's dependent chain (scale byte, entry, decode); from shared memory it
    is shorter, and the codes' loads do not evict it. N = 64 is not measured."""
    return 1 if rows <= 32 else 0


def shared_bytes(rows: int, pages: int, mma: str = "exact") -> int:
    """The kernel's dynamic shared memory at N = ``rows`` with ``pages`` per program on the
    ``mma`` route (``page_maxima.dynamic_bytes`` at its ``partial_maxima``, folded as
    ``folds_by_layout`` says)."""
    parts = partial_maxima(rows, pages, mma)
    return dynamic_bytes(rows, pages, parts, mma, folds_by_layout(rows, parts))


def max_ring(rows: int, pages: int, tables: int | None = None, mma: str = "exact") -> int:
    """The largest ring the kernel may take at N = ``rows`` with ``pages`` per program on
    the ``mma`` route (``page_ring.max_ring`` beside ``shared_bytes`` and the scale table
    where ``tables``, None: ``shared_tables``, puts it in shared memory); 0 above N = 32,
    where the ring is neither used nor tested."""
    tables = shared_tables(rows) if tables is None else tables
    return page_ring.max_ring(shared_bytes(rows, pages, mma), tables) if rows <= 32 else 0


def mma_rows(rows: int) -> int:
    """This kernel's N (its q tile's rows) for ``rows`` live query rows (live slots x Hs):
    8 up to 8 rows — the per-warp mma.sync, no padding rows — else ``rows_for(rows)``
    (wgmma)."""
    return 8 if rows <= 8 else rows_for(rows)


def rows_for(rows: int) -> int:
    """The MMA's N for the Triton scorers and for wgmma: ``rows`` live query rows rounded
    up to a power of two, at least 16 (tl.dot's minimum; wgmma with N = 8 compiles but
    faulted on the H200, illegal address — up to 8 rows this kernel runs mma.sync instead)."""
    return max(16, triton.next_power_of_2(rows))


def wgmma_options(hs: int, first_slot: int, batch: int, width: int, sms: int, mma: str = "exact") -> dict:
    """The wgmma kernel's policy for a tile of ``hs`` heads scored from slot ``first_slot``
    over ``batch`` rows of ``width`` pages on ``sms`` SMs: its shape constexprs (HS, SLOT0,
    PPP, ROWS, PARTS, DEPTH, RING, TABLES, E4M3_MMA), num_warps and any register cap
    (``maxnreg``); ``plan_scorer`` adds the launch's own (the error record, PDL). No device
    needed: the bench's variants start from it, and its tests hold them to it on a CPU."""
    live = (SLOTS - first_slot) * hs  # the rows scored
    rows = mma_rows(live)
    ppp = pages_per_program(batch, width, sms, rows, mma)
    options = dict(
        HS=hs,
        SLOT0=first_slot,
        PPP=ppp,
        ROWS=rows,
        PARTS=partial_maxima(rows, ppp, mma),
        DEPTH=WGMMA_DEPTH,
        RING=ring_pages(rows, ppp, mma),
        TABLES=shared_tables(rows),
        E4M3_MMA=mma == "e4m3",
        num_warps=4,
    )
    cap = max_registers(live)
    if cap is not None:
        options["maxnreg"] = cap
    return options


@functools.cache
def first_set(device: str) -> torch.Tensor:
    """int64 [1] zero: "read the tile itself" (cached: no allocation inside a graph capture)."""
    return torch.zeros(1, dtype=torch.int64, device=device)


@functools.cache
def no_record(device: str) -> torch.Tensor:
    """An error record no one reads: the kernels' operand where the caller passed none
    (cached: no allocation inside a graph capture)."""
    return torch.zeros(ERR_WORDS, dtype=torch.int32, device=device)


@dataclass
class ScorerLaunch:
    """One scorer launch, spelled out: ``kernel[grid](*args, **options)``. ``score_pages``
    and ``score_blocks`` run it as planned; the benchmark's variants change ``grid`` and
    ``options``, or the kernel for a probe of their own (``bench.variants``)."""

    kernel: object
    grid: tuple[int, int]
    args: tuple
    options: dict

    def __call__(self) -> None:
        """Launch it."""
        self.kernel[self.grid](*self.args, **self.options)


def plan_scorer(
    q_tile: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor,
    lens: torch.Tensor,
    out: torch.Tensor,
    *,
    q_sel: torch.Tensor | None = None,
    q_set_stride: int = 0,
    q_sets: int | None = None,
    first_slot: int = 0,
    pdl: bool = False,
    prefetch: bool = False,
    release: bool = False,
    kernel: str | None = None,
    error: torch.Tensor | None = None,
    mma: str = "exact",
) -> ScorerLaunch | None:
    """``score_pages``' checks and its launch, not run (None: nothing to score). Arguments
    as ``score_pages``', and the launch's own, which the decodes, the tests and the bench
    set (a server calls ``score_pages``):

    prefetch (pdl, wgmma): load the lengths, the table and each program's first blocks
    before the PDL wait — only where the producer releases the scorer after its own wait,
    so that nothing earlier in the stream still writes them.
    release (pdl, wgmma): let the dependent grid launch at once instead of at the end.
    kernel: "wgmma" (sm_90 only) or "table"; by default the device's route's
    (``fast.route``: wgmma on the Hopper route, else table). The "e4m3" mma runs on the
    wgmma kernel alone.
    """
    batch, hs, width = score_shapes(q_tile, block_table, out)
    device = q_tile.device
    checks.scorer_operands(k_cache, lens, batch, device)
    route = device_route(device)
    mma = checks.mma_route(mma, route)
    kernel = kernel or route.nvfp4_scorer
    if mma == "e4m3" and kernel != "wgmma":
        raise ValueError(f"kernel: {kernel!r} has no E4M3 MMA (mma 'e4m3' runs the wgmma kernel)")
    if kernel not in KERNELS:
        raise ValueError(f"kernel: {kernel!r} (one of {KERNELS})")
    if kernel == "wgmma" and not route.sm90:
        raise ValueError(f"kernel: 'wgmma' needs an sm_90 GPU, not {route.device} (the table kernel runs anywhere)")
    if pdl and not route.pdl:
        raise ValueError(f"pdl: {route.device} has no PDL (sm_90 and newer)")
    for name, on in (("prefetch", prefetch), ("release", release)):
        if on and not (pdl and kernel == "wgmma"):
            raise ValueError(f"{name}: needs pdl and the wgmma kernel (pdl={pdl}, kernel={kernel!r})")
    if isinstance(first_slot, bool) or not (isinstance(first_slot, int) and 0 <= first_slot < SLOTS):
        raise ValueError(f"first_slot: {first_slot!r} (0..{SLOTS - 1}: the first of the tile's slots to score)")
    sets = checks.query_sets(q_tile, q_sel, q_set_stride, q_sets, device, "bytes")
    if error is not None:
        checks.error_record(error, device)
    if batch == 0 or width == 0:
        return None
    q_sel = first_set(str(device)) if q_sel is None else q_sel
    record = error is not None
    error = no_record(str(device)) if error is None else error
    live = (SLOTS - first_slot) * hs  # the rows scored
    pages = k_cache.view(-1, PAGE_BYTES)
    operands = (block_table, lens, out)
    tail = (error, k_cache.shape[0], width, block_table.stride(0), out.stride(0), out.stride(1))
    head = (q_tile.view(torch.uint8), q_sel, q_set_stride)
    if kernel == "wgmma":
        options = wgmma_options(hs, first_slot, batch, width, sm_count(str(device)), mma)
        options.update(RECORD=record, SETS=sets, PREFETCH=prefetch, RELEASE=release, **pdl_options(pdl))
        # pages also as int64 (16-byte code loads), and the per-scale magnitude tables with
        # their entry's bytes (a run-time 8: score_kernel_wgmma's _GATHER_TABLE says why)
        tables = scale_tables(device)
        args = (*head, pages, pages.view(torch.int64), tables, tables.element_size(), *operands, *tail)
        return ScorerLaunch(score_kernel_wgmma, (batch, triton.cdiv(width, options["PPP"])), args, options)
    # Under the interpreter each tensor op costs about the same whatever its size: score
    # many pages per op there. On a GPU one page per program keeps the tile in registers.
    v = 1 if device.type == "cuda" else 16
    args = (*head, pages, *operands, dequant_lut(str(device)), *tail)
    options = dict(HS=hs, SLOT0=first_slot, ROWS=rows_for(live), V=v, RECORD=record, SETS=sets, **pdl_options(pdl))
    return ScorerLaunch(score_kernel_table, (batch, triton.cdiv(width, v)), args, options)


def run_scorer(*args, **options) -> None:
    """``plan_scorer``'s launch, run (nothing where there is nothing to score): the decodes'
    call, which passes their route's kernel and PDL choices (``prefetch``, ``release``), and
    the tests' where they pick the kernel."""
    launch = plan_scorer(*args, **options)
    if launch is not None:
        launch()


def score_pages(
    q_tile: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor,
    lens: torch.Tensor,
    out: torch.Tensor,
    *,
    q_sel: torch.Tensor | None = None,
    q_set_stride: int = 0,
    q_sets: int | None = None,
    first_slot: int = 0,
    pdl: bool = False,
    error: torch.Tensor | None = None,
    mma: str = "exact",
) -> torch.Tensor:
    """Score pages by the contract of docs/DESIGN.md §4. Returns ``out``.

    q_tile: float8_e4m3fn or uint8 ``[B, 8, Hs, 128]`` (contiguous); k_cache: uint8
    ``[N, 128, 72]``; block_table: int32 ``[B, W]``; lens: int32 ``[B]``; out: float32
    ``[B, 8 * Hs, W]`` (columns contiguous). Row ``slot * Hs + head``, column j gets the
    best token's fp32 dot product of page ``block_table[b, j]`` for
    ``j < min((len - 1) // 128, W)`` and ``j < (len - 8 + slot) // 128``; nothing else is
    written.

    first_slot: 0..7, score only the slots from it on (a step of query_len q fills slots
    8 - q .. 7) and leave the earlier slots' rows untouched; the MMA's N then follows
    q x Hs. 0 is the reference's contract. q_sel / q_set_stride / q_sets: read the tile at
    ``q_tile + q_sel[0] * q_set_stride`` bytes, one of ``q_sets`` sets in q_tile's storage
    (the CP path's two; q_sel int64 ``[1]`` on the device, the stride a multiple of 16); by
    default the tile itself. An index outside ``[0, q_sets)`` reads set 0 instead: every stored
    column gets NaN and ``error`` records it. pdl: launch as a programmatic dependent
    (GPUs), waiting for the producer before reading the tile.

    Every id read is checked against ``[0, N)`` on the device: a page outside it is never
    loaded and its stored columns get NaN; with ``error`` (int32 [5], an error record as
    the decodes keep: ``fast.errors``), the first such (request, column, id) is recorded
    there for ``fast.errors.raise_recorded``.

    mma: "exact" (16-bit operands, fp32 sums), or "e4m3" on the Hopper route: Hopper's E4M3
    MMA on the keys' E4M3 values (DESIGN §4.1, the reference's scores bit for bit).
    """
    run_scorer(
        q_tile,
        k_cache,
        block_table,
        lens,
        out,
        q_sel=q_sel,
        q_set_stride=q_set_stride,
        q_sets=q_sets,
        first_slot=first_slot,
        pdl=pdl,
        error=error,
        mma=mma,
    )
    return out
