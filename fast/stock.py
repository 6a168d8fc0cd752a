"""The stock (non-CP) decode of one rank's heads: q into the 8-slot tile, score the whole
table, rank by MiniMax's 16-bit key (docs/DESIGN.md §5). It is what CP replaces and falls
back to."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from indexer_constants import HEAD_DIM, MAX_PAGES, SLOTS, SUPPORTED_HEADS, TOPK

from . import checks
from .backend import pdl_options, resolve_device
from .checks import MAX_REQS, check_int
from .errors import new_record, raise_recorded
from .kernels.guards import BOUND_WORDS, table_bounds_kernel
from .kernels.stock import q_to_tile_kernel, stock_topk_kernel
from .route import device_route, log_route
from .scorer import run_scorer
from .select.policy import SPLIT_PROGRAMS, SelectShape, plan_split, release_select


def stock_row_stride(width: int) -> int:
    """Floats between the rows of a stock score buffer of ``width`` columns: ``width``
    rounded up to a multiple of 16. Why: the launcher then passes a stride divisible by 16,
    so every row starts 64-byte aligned, and a select that reads a whole row (the MSA one,
    ``msa.kernels.stock``) loads it 16 bytes at a time up to the next multiple of 16
    columns; at any other stride Triton can prove no alignment and loads a column a thread.
    The columns past ``width`` are never written and no select ranks them."""
    return -(-width // 16) * 16


@dataclass
class StockLayer:
    """A stock layer holds no buffers of its own (it exchanges nothing): the one decode
    interface hands every forward a layer, and this is the stock path's."""


@dataclass
class StockPlan:
    """One step's inputs for a padded batch size: the step's table and lengths (the caller's
    tensors), the q tile and the score buffer (fixed per batch size: graph-safe)."""

    batch: int
    block_table: torch.Tensor  # int32 [B, P_table], the caller's
    seq_lens: torch.Tensor  # int32 [B], the caller's
    pages: int  # P = min(P_table, MAX_PAGES): the columns scored
    tile: torch.Tensor  # [B, 8, Hs, 128] (E4M3 bytes; MSA: the key dtype): the step's queries in their slots
    scores: torch.Tensor  # fp32 [B, 8 * Hs, W], rows ``stock_row_stride(W)`` apart
    bounds: torch.Tensor  # int32 [B, 4]: each request's id bounds (kernels.guards.row_id_bounds)


class StockDecode:
    """One rank's stock decode of its ``heads`` index heads: the whole table scored, the
    top-16 by the 16-bit stock key (docs/DESIGN.md §5).

    The same interface as ``IndexerDecodeCP``: ``new_layer()`` per layer, ``plan()`` once per
    step (no host sync; it fixes the score width at the first call), ``forward(layer, plan,
    ...)`` per layer, ``check()``. Buffers are per batch size, so forward is CUDA-graph safe
    between plans.

    device: where it runs; its route (``fast.route``: which kernels, from the compute
    capability; ValueError below sm_80) is ``self.route`` and logged at INFO on the "fast"
    logger. pdl: launch the kernels as programmatic dependents where the device has PDL
    (sm_90 and newer; elsewhere off). mma: the scorer's MMA route, "exact" (16-bit operands,
    fp32 sums: docs/DESIGN.md §4) or "e4m3" (Hopper's E4M3 MMA, §4.1: the Hopper route only;
    ValueError elsewhere).
    """

    # The top-16's programs per row (None: the policy on a GPU, 1 elsewhere; lowered to
    # what the scratch and the row hold) unless select.policy.force_select fixed it.
    split: int | None = None
    # The top-16 kernel (a format's takes its own arguments: ``_select_args``, ``_select_width``).
    SELECT_KERNEL = stock_topk_kernel

    def __init__(self, *, heads: int, max_reqs: int, device: torch.device, pdl: bool = False, mma: str = "exact"):
        check_int("heads", heads, allowed=SUPPORTED_HEADS)
        check_int("max_reqs", max_reqs, low=1, high=MAX_REQS)
        self.heads = self.local_heads = heads
        self.owned = range(heads)  # the heads of index_q forward takes: every one built for (a TP rank's own)
        self.max_reqs = max_reqs
        self.device = resolve_device(checks.device_arg(device))
        self.route = device_route(self.device)  # which kernels run here (raises below sm_80)
        self.mma = checks.mma_route(mma, self.route, self.query_dtype)
        log_route(self, self.route)
        self.pdl = pdl and self.route.pdl  # PDL where the device has it (sm_90 and newer)
        self.width = 0  # score columns, fixed by the first plan
        self.shape: SelectShape | None = None
        self._plans: dict[int, StockPlan] = {}
        self.error = new_record(self.device)  # int32 [5]: word 0 unused here, then the first bad input
        # the split select's slice keys and per-(row, head) counts (zero between calls)
        self._parts = torch.zeros(SPLIT_PROGRAMS * TOPK, dtype=torch.int64, device=self.device)
        self._counts = torch.zeros(SPLIT_PROGRAMS // 2, dtype=torch.int32, device=self.device)

    # Each request's id bounds over the columns the decode reads (kernels.guards).
    BOUNDS_KERNEL = table_bounds_kernel
    query_dtype = torch.float8_e4m3fn  # index_q's dtype
    tile_dtype = torch.uint8  # the q tile's (the scorer reads E4M3 bytes)

    def _armed_tile(self, batch: int) -> torch.Tensor:
        """A plan's q tile ``[B, 8, Hs, 128]`` of ``tile_dtype``, every byte 0xFF: the
        all-ones element, unwritten, is a NaN in E4M3 and bf16 alike."""
        row = HEAD_DIM * self.query_dtype.itemsize
        tile = torch.full((batch, SLOTS, self.heads, row), 0xFF, dtype=torch.uint8, device=self.device)
        return tile.view(self.tile_dtype)

    def new_layer(self) -> StockLayer:
        """A layer for ``forward`` (nothing to allocate)."""
        return StockLayer()

    def plan(self, block_table: torch.Tensor, seq_lens: torch.Tensor) -> StockPlan:
        """This step's plan. block_table: int32 [B, P_table]; seq_lens: int32 [B]. The
        table may be narrower than the first plan's, never wider. No host sync: each
        request's id bounds are reduced on the device for forward's guards."""
        batch = checks.plan_inputs(block_table, seq_lens, self.max_reqs, self.device)
        pages = min(block_table.shape[1], MAX_PAGES)
        if self.width == 0:
            self.width = pages
            self.shape = SelectShape.for_width(pages)
        checks.table_not_wider(pages, self.width)
        p = self._plans.get(batch)
        if p is None:
            tile = self._armed_tile(batch)
            padded = torch.empty(batch, SLOTS * self.heads, stock_row_stride(self.width), device=self.device)
            scores = padded[:, :, : self.width]
            bounds = torch.empty(batch, BOUND_WORDS, dtype=torch.int32, device=self.device)
            p = self._plans[batch] = StockPlan(batch, block_table, seq_lens, pages, tile, scores, bounds)
        p.block_table, p.seq_lens, p.pages = block_table, seq_lens, pages
        if batch:
            self.BOUNDS_KERNEL[(batch,)](
                block_table,
                seq_lens,
                p.bounds,
                pages,
                block_table.stride(0),
                BLOCK=min(1024, triton.next_power_of_2(pages)),
            )
        return p

    def forward(
        self,
        layer: StockLayer,
        plan: StockPlan,
        index_q: torch.Tensor,
        k_cache: torch.Tensor,
        out: torch.Tensor,
        query_len: int,
    ) -> torch.Tensor:
        """One layer's stock decode. index_q: float8_e4m3fn [B * q, heads, 128]; k_cache:
        uint8 [N, 128, 72] (a subclass's format: its ``_check_forward``); out: int32
        [B * q, heads, 16]. Returns out. Lengths and ids as ``IndexerDecodeCP.forward``:
        padding (0) and bad requests get sixteen -1 per row, and ``check()`` names the
        first bad one."""
        checks.state_operands(layer, plan, StockLayer, StockPlan, self._plans)
        self._check_forward(index_q, k_cache, out, query_len, plan.batch)
        rows = plan.batch * query_len
        if rows == 0:
            return out
        q_to_tile_kernel[(rows,)](
            index_q.view(torch.int32),
            plan.tile.view(torch.int32),
            HS=self.heads,
            QLEN=query_len,
            WORDS=HEAD_DIM * index_q.element_size() // 4,
            **pdl_options(self.pdl),
        )
        split = self._split(rows)
        self._score(plan, k_cache, query_len, split)
        self._select(plan, out, query_len, split, k_cache.shape[0])
        return out

    def _check_forward(self, index_q, k_cache, out, query_len: int, batch: int) -> None:
        """forward's host checks: e4m3 queries, NVFP4 pages (``checks.forward_inputs``)."""
        checks.forward_inputs(index_q, k_cache, out, query_len, batch, self.heads, self.device)

    def _score(self, plan: StockPlan, k_cache: torch.Tensor, query_len: int, split_plan: tuple) -> None:
        """The scorer over the plan's whole table, the step's slots only."""
        run_scorer(
            plan.tile,
            k_cache,
            plan.block_table[:, : plan.pages],
            plan.seq_lens,
            plan.scores[:, :, : plan.pages],
            pdl=self.pdl,
            kernel=self.route.nvfp4_scorer,  # the state's route, taken once at construction
            # the wgmma kernel's PDL options (the Hopper route's scorer)
            prefetch=self.pdl and self.route.hopper,
            release=self.pdl
            and self.route.hopper
            and release_select(plan.batch * query_len * self.heads * split_plan[0]),
            first_slot=SLOTS - query_len,
            mma=self.mma,
        )

    def check(self) -> None:
        """Raise BadBlockIdError / BadLengthError for the first bad input a forward saw
        (``fast.errors``; a host sync). Nothing of the stock path waits on a peer. The record
        stays set until ``reset()``."""
        raise_recorded(self.error)

    def reset(self) -> None:
        """Clear the error record and the split select's counts (zero between calls; the
        stock path holds no other state between steps)."""
        self._counts.zero_()
        self.error.zero_()

    def _split(self, rows: int) -> tuple:
        """``plan_split`` of the top-16 over ``rows`` rows (batch x query_len)."""
        return plan_split(self.split, rows * self.heads, self.width, self.device, self.shape)

    def _select(
        self, plan: StockPlan, out: torch.Tensor, query_len: int, split_plan: tuple, num_blocks: int
    ) -> torch.Tensor:
        """The top-16 stage on the scores the step's scorer left: out int32 [B * q, heads,
        16]; split_plan as ``_split`` gives it; num_blocks: N of the cache scored (the
        guards' bound). Returns out."""
        split, columns, shape = split_plan
        scores = plan.scores
        self.SELECT_KERNEL[(plan.batch * query_len, self.heads, split)](
            scores,
            plan.seq_lens,
            plan.bounds,
            num_blocks,
            self.error,
            out,
            self._parts,
            self._counts,
            plan.pages,
            *self._select_args(),
            scores.stride(0),
            scores.stride(1),
            HS=self.heads,
            QLEN=query_len,
            **self._select_width(columns, split),
            SPLIT=split,
            **shape.constexprs(),
            EMULATE_FMA=self.device.type != "cuda",
            SORT=self.device.type == "cuda",
            **pdl_options(self.pdl),
        )
        return out

    def _select_args(self) -> tuple:
        """The select kernel's format arguments (between the shared ones and the score
        strides): §5's top-16 takes none; a format sets its own."""
        return ()

    def _select_width(self, columns: int, split: int) -> dict:
        """The select kernel's constexpr of the row it ranks: §5's, the whole row's width
        (``split`` programs of ``columns`` columns)."""
        return {"WIDTH": columns * split}
