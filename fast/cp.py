"""Per-process CP decode state (docs/DESIGN.md §6): layers' symmetric buffers, per-batch-size
plans, and the per-layer forward. One object per rank; every call that allocates is
collective (same order on every rank).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import triton

from indexer_constants import HEAD_DIM, MAX_PAGES, SLOTS, SUPPORTED_CP, SUPPORTED_HEADS, TOPK

from . import checks
from .backend import pdl_options, sm_count
from .checks import MAX_REQS, check_int
from .errors import new_record, raise_recorded
from .kernels.cp import MERGE_WARPS, compact_table_kernel, merge_kernel, merged_output, push_kernel, q_exchange_kernel
from .kernels.guards import BOUND_WORDS
from .layout import HeadLayout, compact_width
from .route import device_route, log_route
from .scorer import run_scorer
from .select.policy import (
    MAX_CHUNK,
    PUSH_GROUP,
    SPLIT_PROGRAMS,
    SelectShape,
    plan_split,
    push_group,
    push_warps,
    release_select,
    warp_select_keys,
)
from .select.warp_ptx import warp_asm_options
from .symm import Symmetric, SymmetricTensor

# Seconds a spin waits for a peer before it gives up. On GPUs peers run in lockstep, so two
# seconds is far past any healthy wait; interpreter ranks (CPU) can lag a peer by a whole
# step of Python, hence the longer bound there.
DEFAULT_TIMEOUT_S = {"cuda": 2.0, "cpu": 30.0}


def score_row_stride(width: int) -> int:
    """Floats between rows of the CP scores of ``width`` columns: a multiple of 4, so every
    row is 16-byte aligned for the push's 16-byte loads (``select.levels._quad_max``), and at
    least width + 3: a load of the 4 columns from one below the row's bound (< width) reads
    at most 3 past the row, which stay inside it."""
    return triton.cdiv(width + 3, 4) * 4


@dataclass
class CPLayer:
    """One sparse layer's symmetric buffers (two sets each) and its step parity.

    tile: int32 words, 2 x [max_reqs, 8, H, 32]; recv: int64, 2 x [CP, rows_max, Hr, 16];
    parity: int64 [1], the set this layer's next step with a long request uses (a step
    without one uses none; the merge flips it); current: int64 [1], the running step's set,
    the exchange's copy of the parity (what the scorer, push and merge read).
    """

    tile: SymmetricTensor
    recv: SymmetricTensor
    parity: torch.Tensor
    current: torch.Tensor


@dataclass
class CPPlan:
    """Per padded batch size: the compact table and lengths, and the compact scores."""

    batch: int
    block_table: torch.Tensor  # int32 [B, W]
    score_lens: torch.Tensor  # int32 [B]
    seq_lens: torch.Tensor  # int32 [B], the real lengths
    n_local: torch.Tensor  # int32 [B]
    bounds: torch.Tensor  # int32 [B, 4]: each request's id bounds (kernels.guards.row_id_bounds)
    scores: torch.Tensor  # fp32 [B, 8 * H, W], rows of score_row_stride(W) (16-byte aligned, padded)
    pages: int = 0  # P = min(P_table, MAX_PAGES) of the step's table


class IndexerDecodeCP:
    """CP decode of ``heads`` index heads over ``symm.world`` ranks.

    Rank r scores pages ``j * CP + r`` for all heads and owns heads
    ``[(r // R) * Hr, (r // R + 1) * Hr)`` (Hr = max(1, H / CP), R = max(1, CP / H)).

    The device is ``symm``'s; its route (``fast.route``: which kernels, from the compute
    capability; ValueError below sm_80) is ``self.route`` and logged at INFO on the "fast"
    logger. pdl: launch the kernels as programmatic dependents where the device has PDL
    (sm_90 and newer; elsewhere off). spin_timeout_s: the bound on every wait for a peer.
    mma: the scorer's MMA route, "exact" or "e4m3" (``StockDecode``'s; a CP state and the
    stock or full decode of the same route agree bit for bit, DESIGN §4.1).
    """

    query_dtype = torch.float8_e4m3fn  # index_q's dtype (a subclass may set its own before __init__)
    tile_dtype = torch.uint8  # the q tile's as the scorer reads it (E4M3 bytes)
    # The merge's output of a long row (merge_kernel's OUTPUT, a jit function): §6's, its best
    # 15 and the own page in slot 15; a format sets its own, and its forced windows (§6: none).
    MERGE_OUTPUT = merged_output
    init_blocks = local_blocks = 0
    # The plan's kernel: compact table, scorer lengths, real lengths, n_local and id bounds
    # (§6's; a format with other rules sets its own, of the same parameters).
    COMPACT_KERNEL = compact_table_kernel
    # The push: each long row's local top 16 to its owners (a format's takes its own
    # arguments, ``_push_args``; its select as §6's, ``_push_plan``).
    PUSH_KERNEL = push_kernel
    # The push's select: programs per row (None: select_split's on a GPU, 1 elsewhere) and
    # the columns one select ranks at once; the policy's unless select.policy.force_select
    # fixed them (the tests' and the bench's every-shape runs).
    split: int | None = None
    max_chunk = MAX_CHUNK

    def __init__(
        self,
        *,
        heads: int,
        max_reqs: int,
        symm: Symmetric,
        spin_timeout_s: float | None = None,
        pdl: bool = False,
        mma: str = "exact",
    ):
        if not isinstance(symm, Symmetric):
            raise TypeError(f"symm: expected a fast.symm.Symmetric (the ranks' buffers), got {type(symm).__name__}")
        cp = check_int("cp", symm.world, allowed=SUPPORTED_CP)
        check_int("heads", heads, allowed=SUPPORTED_HEADS)
        check_int("max_reqs", max_reqs, low=1, high=MAX_REQS)
        self.cp, self.rank, self.heads = cp, symm.rank, heads
        self.layout = HeadLayout(cp, heads)
        self.local_heads = self.layout.heads_per_rank  # the heads forward's q and out hold
        self.owned = self.layout.heads_of(self.rank)
        self.symm = symm
        self.device = symm.device
        self.max_reqs = max_reqs
        self.rows_max = max_reqs * SLOTS
        self.timeout_s = checks.spin_timeout(
            DEFAULT_TIMEOUT_S[self.device.type] if spin_timeout_s is None else spin_timeout_s
        )
        self._timeout_ns = int(self.timeout_s * 1e9)
        self._wall = self.device.type != "cuda"  # the interpreter's spins read the host clock
        self.route = device_route(self.device)  # which kernels run here (raises below sm_80)
        self.mma = checks.mma_route(mma, self.route, self.query_dtype)
        log_route(self, self.route)
        self.pdl = pdl and self.route.pdl  # PDL where the device has it (sm_90 and newer)
        self._sms = sm_count(str(self.device)) if self.device.type == "cuda" else 0  # push_warps'
        self.width = 0  # compact width W, fixed by the first plan
        self.shape: SelectShape | None = None
        self.error = new_record(self.device)  # int32 [5]: the protocol word, then the first bad input
        self._layers: list[weakref.ref] = []  # every layer built, for reset()
        self._row_words = HEAD_DIM * self.query_dtype.itemsize // 4  # int32 words of a head's query
        self._tile_words = max_reqs * SLOTS * heads * self._row_words
        self._recv_elems = cp * self.rows_max * self.layout.heads_per_rank * TOPK
        self._plans: dict[int, CPPlan] = {}
        # the push's slices' keys (or, one program a row, the row's group keys:
        # warp_groups_top16) and per-(row, head) counts (zero between calls)
        self._parts = torch.zeros(
            max(SPLIT_PROGRAMS, self.rows_max * heads) * TOPK, dtype=torch.int64, device=self.device
        )
        self._counts = torch.zeros(SPLIT_PROGRAMS // 2, dtype=torch.int32, device=self.device)

    def new_layer(self) -> CPLayer:
        """Collective: every rank builds its layers in the same order. Keep the layer as
        long as any CUDA graph that captured a forward over it: the graph holds its buffers'
        and peer-address arrays' addresses, not the tensors, and memory the allocator hands
        out again would be followed as peer addresses (an illegal-address fault)."""
        tile = self.symm.alloc(2 * self._tile_words, torch.int32, -1)  # 0xFF bytes: no query yet
        recv = self.symm.alloc(2 * self._recv_elems, torch.int64, -1)  # -1: no candidates yet
        layer = CPLayer(
            tile,
            recv,
            torch.zeros(1, dtype=torch.int64, device=self.device),
            torch.zeros(1, dtype=torch.int64, device=self.device),
        )
        self._layers.append(weakref.ref(layer))
        return layer

    def plan(self, block_table: torch.Tensor, seq_lens: torch.Tensor) -> CPPlan:
        """Once per step, outside CUDA-graph capture; no host sync.

        block_table: int32 [B, P_table]; seq_lens: int32 [B] (each >= query_len, or 0 for a
        padding request; ids and lengths are judged on the device: ``check()``).
        The compact width ``W = ceil(P / CP) + 1`` is fixed by the first plan; a later table
        may be narrower, never wider.
        """
        batch = checks.plan_inputs(block_table, seq_lens, self.max_reqs, self.device)
        pages = min(block_table.shape[1], MAX_PAGES)
        width = self._compact_width(pages)
        if self.width == 0:
            self.width = width
            self.shape = SelectShape.for_width(self._ranked_width(), self.max_chunk, PUSH_GROUP)
        checks.table_not_wider(width, self.width)
        p = self._plans.get(batch)
        if p is None:
            i32 = dict(dtype=torch.int32, device=self.device)
            p = self._plans[batch] = CPPlan(
                batch=batch,
                block_table=torch.empty(batch, self.width, **i32),
                score_lens=torch.empty(batch, **i32),
                seq_lens=torch.empty(batch, **i32),
                n_local=torch.empty(batch, **i32),
                bounds=torch.empty(batch, BOUND_WORDS, **i32),
                scores=torch.empty(batch, SLOTS * self.heads, score_row_stride(self.width), device=self.device)[
                    :, :, : self.width
                ],
            )
        p.pages = pages
        if batch:
            self.COMPACT_KERNEL[(p.batch,)](
                block_table,
                seq_lens,
                p.block_table,
                p.score_lens,
                p.seq_lens,
                p.n_local,
                p.bounds,
                pages,
                block_table.stride(0),
                W=self.width,
                CP=self.cp,
                RANK=self.rank,
                BLOCK=min(1024, triton.next_power_of_2(self.width)),
            )
        return p

    def _compact_width(self, pages: int) -> int:
        """The compact width W for a table of ``pages`` pages (§6: one past the most a rank owns)."""
        return compact_width(pages, self.cp)

    def _ranked_width(self) -> int:
        """Columns the push ranks at most: W - 1 (n_local <= W - 1; column W - 1 is the
        lie's page past the chunk), so at P = 2^k its select spans a power of two, where W
        would double every select."""
        return self.width - 1

    def forward(
        self,
        layer: CPLayer,
        plan: CPPlan,
        index_q: torch.Tensor,
        k_cache: torch.Tensor,
        out: torch.Tensor,
        query_len: int,
    ) -> torch.Tensor:
        """One layer's CP decode for this rank's heads.

        index_q: float8_e4m3fn [B * q, Hr, 128] (this rank's heads); k_cache: uint8
        [N, 128, 72] (a subclass's format: its ``_check_forward``); out: int32 [B * q, Hr,
        16]. Returns out. Every rank must call it for
        the same layer and plan; a rank that does not is reported by check() on the others.

        A request of length 0 (padding) gets sixteen -1 per row. A request with a negative
        length, a length in 1 .. query_len - 1, or a block id outside ``[0, N)`` among the
        columns it reads gets sixteen -1 per row on every rank, no rank reads its bad pages,
        and the error record names it (``check()`` raises BadLengthError / BadBlockIdError).
        """
        checks.state_operands(layer, plan, CPLayer, CPPlan, self._plans)
        self._check_forward(index_q, k_cache, out, query_len, plan.batch)
        rows = plan.batch * query_len
        if rows == 0:
            return out
        self._exchange(layer, plan, index_q, query_len)
        split_plan = self._split(rows)
        push_plan = self._push_plan(rows, split_plan)  # one-warp pushes launch early (release_select)
        self._score(layer, plan, k_cache, query_len, split_plan, push_plan)
        self._push(layer, plan, query_len, split_plan, push_plan, k_cache.shape[0])
        self._merge(layer, plan, query_len, out, k_cache.shape[0])
        return out

    def _check_forward(self, index_q, k_cache, out, query_len: int, batch: int) -> None:
        """forward's host checks: e4m3 queries of this rank's heads, NVFP4 pages."""
        checks.forward_inputs(index_q, k_cache, out, query_len, batch, self.layout.heads_per_rank, self.device)

    def _tile(self, layer: CPLayer, batch: int) -> torch.Tensor:
        """The layer's local q tile (set 0; the scorer adds the step's set), ``[B, 8, H,
        128]`` of ``tile_dtype``."""
        tile = layer.tile.local.view(self.tile_dtype)[: batch * SLOTS * self.heads * HEAD_DIM]
        return tile.view(batch, SLOTS, self.heads, HEAD_DIM)

    def _score(
        self, layer: CPLayer, plan: CPPlan, k_cache: torch.Tensor, query_len: int, split_plan: tuple, push_plan: tuple
    ) -> None:
        """forward's scorer: the exchanged tile (the step's set) on the compact table and
        lying lengths (§6), the step's slots only."""
        rows = plan.batch * query_len
        run_scorer(
            self._tile(layer, plan.batch),
            k_cache,
            plan.block_table,
            plan.score_lens,
            plan.scores,
            q_sel=layer.current,
            q_set_stride=self._tile_words * 4,
            q_sets=2,  # the sets by parity (DESIGN §6)
            pdl=self.pdl,
            kernel=self.route.nvfp4_scorer,  # the state's route, taken once at construction
            # the wgmma kernel's PDL options (the Hopper route's scorer)
            prefetch=self.pdl and self.route.hopper,
            release=self.pdl
            and self.route.hopper
            and release_select(rows * self.heads * split_plan[0], push_plan[0], split_plan[1]),
            first_slot=SLOTS - query_len,
            mma=self.mma,
        )

    def _exchange(self, layer: CPLayer, plan: CPPlan, index_q: torch.Tensor, query_len: int) -> None:
        """The q exchange, forward's first stage: each long request's queries of this
        rank's heads (index_q: [B * q, Hr, 128] of ``query_dtype``) into every rank's tile,
        then a wait for every rank's into this one's."""
        q_exchange_kernel[(plan.batch * query_len,)](
            index_q.view(torch.int32),
            plan.seq_lens,
            layer.tile.ptrs,
            layer.parity,
            layer.current,
            self.error,
            self._tile_words,
            self._timeout_ns,
            H=self.heads,
            HR=self.layout.heads_per_rank,
            R=self.layout.replicas,
            HEAD0=self.owned.start,
            CP=self.cp,
            RANK=self.rank,
            QLEN=query_len,
            WALL=self._wall,
            WORDS=self._row_words,
            HALVES=self.query_dtype.itemsize == 2,
            **pdl_options(self.pdl),
        )

    def _split(self, rows: int) -> tuple:
        """``plan_split`` of the push over ``rows`` rows (batch x query_len): its programs per
        row, columns per program and their select shape. The push ranks ``_ranked_width()`` columns."""
        return plan_split(self.split, rows * self.heads, self._ranked_width(), self.device, self.shape)

    def _push(
        self, layer: CPLayer, plan: CPPlan, query_len: int, split_plan: tuple, push_plan: tuple, num_blocks: int
    ) -> None:
        """forward's third stage: each long row's local top 16 of ``plan.scores`` (fp32
        [B, 8 * H, W], as the scorer leaves it) into its owners' slots of ``layer.recv`` (in
        the set of the step, ``layer.current``); ``split_plan`` and ``push_plan`` as forward
        plans them once (the scorer's release needs them too). num_blocks: N of the cache
        the scores came from (the guards' bound)."""
        split, columns, s = split_plan
        rows = plan.batch * query_len
        warps, keys = push_plan
        self.PUSH_KERNEL[(rows, self.heads, split)](
            plan.scores,
            plan.seq_lens,
            plan.n_local,
            plan.bounds,
            num_blocks,
            layer.recv.ptrs,
            layer.current,
            self.error,
            self._parts,
            self._counts,
            self.rows_max,
            self._recv_elems,
            *self._push_args(plan),
            plan.scores.stride(0),
            plan.scores.stride(1),
            H=self.heads,
            HR=self.layout.heads_per_rank,
            R=self.layout.replicas,
            SPLIT=split,
            SLICE=columns,
            **s.constexprs(push_group(columns, keys, s)),
            SORT=self.device.type == "cuda",
            num_warps=warps,
            **(warp_asm_options(keys) if keys else {}),
            CP=self.cp,
            RANK=self.rank,
            QLEN=query_len,
            **pdl_options(self.pdl),
        )

    def _push_args(self, plan: CPPlan) -> tuple:
        """The push kernel's format arguments (between the shared ones and the score
        strides): §6's push takes the compact width it ranks; a format sets its own."""
        return (plan.scores.shape[2],)

    def _merge(self, layer: CPLayer, plan: CPPlan, query_len: int, out: torch.Tensor, num_blocks: int) -> torch.Tensor:
        """The merge, forward's last stage: each row's HR heads' 16 best of the CP x 16
        candidates in ``layer.recv`` into ``out`` (int32 [B * q, Hr, 16]), waiting for every
        rank's push; it re-arms the candidates and the rows' q tile slots (the set of the
        layer's last exchange) and flips ``layer.parity``. num_blocks: N of the step's cache
        (the guards' bound). Returns out."""
        merge_kernel[(plan.batch * query_len,)](
            plan.seq_lens,
            plan.bounds,
            num_blocks,
            layer.recv.ptrs,
            layer.tile.ptrs,
            layer.current,
            layer.parity,
            self.error,
            out,
            self.rows_max,
            self._recv_elems,
            self._tile_words,
            self._timeout_ns,
            self.init_blocks,
            self.local_blocks,
            H=self.heads,
            HR=self.layout.heads_per_rank,
            SORT=self.device.type == "cuda",
            num_warps=MERGE_WARPS,
            CP=self.cp,
            RANK=self.rank,
            QLEN=query_len,
            WALL=self._wall,
            WORDS=self._row_words,
            OUTPUT=self.MERGE_OUTPUT,
            **pdl_options(self.pdl),
        )
        return out

    def _push_plan(self, rows: int, split_plan: tuple) -> tuple[int, int]:
        """(warps, keys) of the push over ``rows`` rows split as ``split_plan``: its warps
        per program (``push_warps``) and the keys per row its programs give ``warp_select``'s
        PTX block where they are one warp (``warp_select_keys``; GPUs only: the interpreter
        runs no inline PTX), else 0 (``tl.topk``)."""
        split, columns, s = split_plan
        programs = rows * self.heads * split
        keys = warp_select_keys(split, columns, s) if self.device.type == "cuda" else 0
        warps = push_warps(programs, columns <= s.chunk, self._sms, keys > 0)
        return warps, keys if warps == 1 else 0

    def check(self) -> None:
        """Raise what this process's error record holds (a host sync: call it where a sync
        is acceptable, e.g. every N steps): PeerTimeoutError if a spin gave up (a peer did
        not arrive within ``timeout_s``), else BadBlockIdError / BadLengthError naming the
        first bad request, column and value (``fast.errors``). The record stays set until
        ``reset()``; while a timeout is recorded every row this process merges is -1."""
        raise_recorded(self.error, rank=self.rank, timeout_s=self.timeout_s)

    def reset(self) -> None:
        """Collective (every rank calls it, none mid-step): after a timeout or a bad input,
        re-arm every layer this state built (both tile and candidate sets, the parity) and
        clear the error record, so the next step is exact without new symmetric memory.

        Waits for this rank's kernels (their spins end within ``timeout_s``), then for every
        rank (no peer still stores into this rank's buffers), re-arms, and waits for every
        rank again (no peer's next exchange lands in a buffer before it is re-armed)."""
        self.symm.barrier()
        for ref in self._layers:
            layer = ref()
            if layer is not None:
                layer.tile.local.fill_(-1)
                layer.recv.local.fill_(-1)
                layer.parity.zero_()
                layer.current.zero_()
        self._counts.zero_()
        self.error.zero_()
        self.symm.barrier()
