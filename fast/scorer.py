"""``score_pages``: the Q8KV4 decode scorer of docs/DESIGN.md §4 on the tensors' device.

Two kernels honor the one contract: the wgmma kernel on GPUs (``kernels/scorer_wgmma.py``:
codes decoded straight into the MMA's register operand) and the table kernel everywhere
(``kernels/scorer_table.py``: the interpreter's, a gather from the table of every (scale,
code) pair). Both multiply 16-bit operands into fp32 accumulators — Hopper's FP8 MMA does
not accumulate in fp32 — with the page's tokens on M and the query rows scored on N.
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
from .kernels.guards import ERR_WORDS
from .kernels.page_maxima import partial_maxima
from .kernels.scorer_table import score_kernel_table
from .kernels.scorer_wgmma import WGMMA_DEPTH, mma_rows, ring_pages, rows_for, score_kernel_wgmma, shared_tables
from .kernels.scorer_wgmma import max_registers as wgmma_max_registers
from .kernels.scorer_wgmma import pages_per_program as wgmma_pages
from .tables import dequant_lut, scale_tables

KERNELS = ("wgmma", "table")


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
    runs it as planned; the benchmark's variants change ``grid`` and ``options``."""

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
    first_slot: int = 0,
    pdl: bool = False,
    prefetch: bool = False,
    release: bool = False,
    kernel: str | None = None,
    error: torch.Tensor | None = None,
) -> ScorerLaunch | None:
    """``score_pages``' checks and its launch, not run (None: nothing to score). Arguments
    as ``score_pages``'."""
    batch, hs, width = score_shapes(q_tile, block_table, out)
    device = q_tile.device
    checks.scorer_operands(k_cache, lens, batch, device)
    kernel = kernel or ("wgmma" if device.type == "cuda" else "table")
    if kernel not in KERNELS:
        raise ValueError(f"kernel: {kernel!r} (one of {KERNELS})")
    if kernel == "wgmma" and device.type != "cuda":
        raise ValueError(f"kernel: 'wgmma' needs a GPU, not {device.type} (the table kernel runs anywhere)")
    for name, on in (("prefetch", prefetch), ("release", release)):
        if on and not (pdl and kernel == "wgmma"):
            raise ValueError(f"{name}: needs pdl and the wgmma kernel (pdl={pdl}, kernel={kernel!r})")
    if isinstance(first_slot, bool) or not (isinstance(first_slot, int) and 0 <= first_slot < SLOTS):
        raise ValueError(f"first_slot: {first_slot!r} (0..{SLOTS - 1}: the first of the tile's slots to score)")
    checks.query_sets(q_sel, q_set_stride, device, "bytes")
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
        rows = mma_rows(live)
        ppp = wgmma_pages(batch, width, sm_count(str(device)), rows)
        options = dict(
            HS=hs,
            SLOT0=first_slot,
            PPP=ppp,
            ROWS=rows,
            PARTS=partial_maxima(rows, ppp),
            RECORD=record,
            DEPTH=WGMMA_DEPTH,
            RING=ring_pages(rows, ppp),
            TABLES=shared_tables(rows),
            PREFETCH=prefetch,
            RELEASE=release,
            num_warps=4,
            **pdl_options(pdl),
        )
        cap = wgmma_max_registers(live)
        if cap is not None:
            options["maxnreg"] = cap
        # pages also as int64 (16-byte code loads), and the per-scale magnitude tables with
        # their entry's bytes (a run-time 8: score_kernel_wgmma's _GATHER_TABLE says why)
        tables = scale_tables(device)
        args = (*head, pages, pages.view(torch.int64), tables, tables.element_size(), *operands, *tail)
        return ScorerLaunch(score_kernel_wgmma, (batch, triton.cdiv(width, ppp)), args, options)
    # Under the interpreter each tensor op costs about the same whatever its size: score
    # many pages per op there. On a GPU one page per program keeps the tile in registers.
    v = 1 if device.type == "cuda" else 16
    args = (*head, pages, *operands, dequant_lut(str(device)), *tail)
    options = dict(HS=hs, SLOT0=first_slot, ROWS=rows_for(live), V=v, RECORD=record, **pdl_options(pdl))
    return ScorerLaunch(score_kernel_table, (batch, triton.cdiv(width, v)), args, options)


def score_pages(
    q_tile: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor,
    lens: torch.Tensor,
    out: torch.Tensor,
    *,
    q_sel: torch.Tensor | None = None,
    q_set_stride: int = 0,
    first_slot: int = 0,
    pdl: bool = False,
    prefetch: bool = False,
    release: bool = False,
    kernel: str | None = None,
    error: torch.Tensor | None = None,
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
    q x Hs. 0 is the reference's contract. q_sel / q_set_stride: read the tile at
    ``q_tile + q_sel[0] * q_set_stride`` bytes (the CP path's two tile sets; q_sel int64
    ``[1]``, the stride a multiple of 16); by default the tile itself. pdl: launch as a
    programmatic dependent (GPUs), waiting for the producer before reading the tile.
    prefetch (pdl, wgmma): load the lengths, the table and each program's first blocks
    before that wait — only where the producer releases the scorer after its own wait, so
    that nothing earlier in the stream still writes them.
    release (pdl, wgmma): let the dependent grid launch at once instead of at the end.
    kernel: "wgmma" (the GPU default) or "table" (the interpreter's; on a GPU to compare).

    Every id read is checked against ``[0, N)`` on the device: a page outside it is never
    loaded and its stored columns get NaN; with ``error`` (int32 [5], an error record as
    the decodes keep: ``fast.errors``), the first such (request, column, id) is recorded
    there for ``fast.errors.raise_recorded``.
    """
    launch = plan_scorer(
        q_tile,
        k_cache,
        block_table,
        lens,
        out,
        q_sel=q_sel,
        q_set_stride=q_set_stride,
        first_slot=first_slot,
        pdl=pdl,
        prefetch=prefetch,
        release=release,
        kernel=kernel,
        error=error,
    )
    if launch is not None:
        launch()
    return out
