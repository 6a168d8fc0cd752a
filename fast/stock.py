"""The stock (non-CP) decode of one rank's heads: q into the 8-slot tile, score the whole
table, rank by MiniMax's 16-bit key (DESIGN.md §5). It is what CP replaces and falls back to.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from indexer_constants import HEAD_DIM, MAX_PAGES, SLOTS, TOPK

from . import checks
from .backend import pdl_options, resolve_device
from .jit_helpers import KEY_STOCK, RANKED, fmaf, keys_to_pages, merged16, pdl_release, pdl_wait, publish_slice, select16, short_row, slice_top16, top16, value_keys
from .scorer import score_pages
from .select_shape import SPLIT_PROGRAMS, SelectShape, check_split, plan_split, release_select

_SLOTS = tl.constexpr(SLOTS)
_TOPK = tl.constexpr(TOPK)


@triton.jit
def _q_to_tile_kernel(
    q_ptr,  # int32 [rows, HS * 32]: this rank's heads, E4M3 bytes as words
    tile_ptr,  # int32 [B, 8, HS, 32]
    HS: tl.constexpr,
    QLEN: tl.constexpr,
    PDL: tl.constexpr,
):
    """Row t = (b, i) goes to slot 8 - QLEN + i of request b. Releases the scorer once
    its own wait is over (the scorer loads the table, the lengths and its first pages
    before it waits for this kernel: ``score_pages``' prefetch)."""
    pdl_wait(PDL)
    pdl_release(PDL)
    t = tl.program_id(0)
    b = t // QLEN
    slot = (_SLOTS - QLEN) + t % QLEN
    w = tl.arange(0, HS * 32)
    tl.store(tile_ptr + (b * _SLOTS + slot) * (HS * 32) + w, tl.load(q_ptr + t * (HS * 32) + w))


@triton.jit
def _min_max(lo_a, hi_a, lo_b, hi_b):
    """``tl.reduce``'s combine for a row's (min, max) in one pass."""
    return tl.minimum(lo_a, lo_b), tl.maximum(hi_a, hi_b)


@triton.jit
def _stock_topk_kernel(
    score_ptr,  # fp32 [B, 8 * HS, W]
    seq_lens_ptr,  # int32 [B]
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
    CHUNK: tl.constexpr,  # CHUNK .. GROUP: the select shape of one slice
    SUPERS: tl.constexpr,
    PER_SUPER: tl.constexpr,
    GROUP: tl.constexpr,
    EMULATE_FMA: tl.constexpr,
    SORT: tl.constexpr,
    PDL: tl.constexpr,
):
    """Per (query, head): 15 pages by the stock key among j < min(own, P), own in slot 15.

    With SPLIT > 1 (few rows: one program per row would leave the GPU idle while it runs
    three dependent selects) slice s of the row, columns [s * W / SPLIT, (s + 1) * W /
    SPLIT), takes its own top 16; the row's last slice to finish selects the 16 best of the
    SPLIT * 16. Exact: keys are unique and the best 16 of a row are among its slices' best.
    It lets the next kernel launch once its own wait is over (a dependent waits for this
    grid's completion before it reads anything)."""
    pdl_wait(PDL)
    pdl_release(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    b = t // QLEN
    i = t % QLEN
    slot = (_SLOTS - QLEN) + i
    row_ptr = score_ptr + b.to(tl.int64) * stride_sb + (slot * HS + h) * stride_sr
    # The loads that need no length go out with the length's, not one L2 round trip after
    # it (a top-16 at 8192 pages is a chain of dependent steps; fast/PERF.md): the whole
    # (padded) row, for the range every slice keys by — one load, not a loop over chunks —
    # and for a select of one chunk, that chunk. Columns past the length are unwritten
    # (any bits); the masks below drop them.
    j = tl.arange(0, WIDTH)
    row = tl.load(row_ptr + j, mask=j < P, other=0.0)
    first = tl.load(row_ptr)  # column 0: P >= 1 (checks.plan_inputs)
    one_chunk: tl.constexpr = WIDTH // SPLIT <= CHUNK
    cols = s * (WIDTH // SPLIT) + tl.arange(0, WIDTH // SPLIT)
    if one_chunk and SPLIT > 1:
        mine = tl.load(row_ptr + cols, mask=cols < P, other=0.0)
    else:
        mine = row
    own = (tl.load(seq_lens_ptr + b) - QLEN + i) // 128
    k = tl.arange(0, _TOPK)
    dst = out_ptr + (t * HS + h) * _TOPK + k
    if own + 1 <= _TOPK:
        if s == 0:
            tl.store(dst, short_row(k, own))
    else:
        n = tl.minimum(own, P)
        # Both ends in one reduction, column 0's score (ranked: n >= 1 here) standing in for
        # the columns from n on, which moves neither end: one select a column, not two, and
        # one reduction tree (0.05-0.15 µs a select, fast/PERF.md).
        ranked = tl.where(j < n, row, first)
        lo, hi = tl.reduce((ranked, ranked), 0, _min_max)
        span = hi - lo
        scale = tl.where(span == 0, 0.0, tl.math.div_rn(65534.0, tl.where(span == 0, 1.0, span)))
        bias = fmaf(-lo, scale, tl.full([], 1.5, tl.float32), EMULATE_FMA)
        if one_chunk:
            best = select16(value_keys(mine, cols, n, KEY_STOCK, 1, 0, scale, bias, EMULATE_FMA), SORT)
        if SPLIT == 1:
            if not one_chunk:
                best = top16(row_ptr, n, KEY_STOCK, 1, 0, scale, bias, EMULATE_FMA, CHUNK, SUPERS, PER_SUPER, GROUP, SORT)
            tl.store(dst, tl.where(k == RANKED, own, keys_to_pages(best)))
        else:
            parts = part_ptr.to(tl.pointer_type(tl.uint32)) + (t * HS + h) * (SPLIT * _TOPK)
            count = count_ptr + t * HS + h
            if one_chunk:
                last = publish_slice(parts, count, s, best, SPLIT)
            else:
                last = slice_top16(row_ptr, n, s, parts, count, KEY_STOCK, 1, 0, scale, bias, EMULATE_FMA, WIDTH // SPLIT, SPLIT, CHUNK, SUPERS, PER_SUPER, GROUP, SORT)
            if last:
                best = merged16(parts, count, SPLIT, SORT)
                tl.store(dst, tl.where(k == RANKED, own, keys_to_pages(best)))


class StockDecode:
    """One rank's stock decode for its ``heads`` index heads (per-process, per-layer-free).

    plan() once per step (fixes the score width at the first call), forward() per layer.
    Buffers are per batch size, so forward is CUDA-graph safe between plans. split: the
    top-16's programs per row (a power of two up to MAX_SPLIT; None: ``select_split`` on a
    GPU, 1 elsewhere; ``select_shape.plan_split`` lowers it to what the scratch and the
    row hold).
    """

    def __init__(self, *, heads: int, max_reqs: int, device: torch.device, pdl: bool = False, split: int | None = None):
        check_split(split)
        self.split = split
        self.heads = heads
        self.max_reqs = max_reqs
        self.device = resolve_device(device)
        self.pdl = pdl and self.device.type == "cuda"  # the interpreter has no PDL
        self.width = 0  # score columns, fixed by the first plan
        self.shape: SelectShape | None = None
        self._tiles: dict[int, torch.Tensor] = {}
        self._scores: dict[int, torch.Tensor] = {}
        # the split select's slice keys and per-(row, head) counts (zero between calls)
        self._parts = torch.zeros(SPLIT_PROGRAMS * TOPK, dtype=torch.int64, device=self.device)
        self._counts = torch.zeros(SPLIT_PROGRAMS // 2, dtype=torch.int32, device=self.device)
        self.block_table: torch.Tensor | None = None
        self.seq_lens: torch.Tensor | None = None

    def plan(self, block_table: torch.Tensor, seq_lens: torch.Tensor) -> None:
        """Record this step's table and lengths. block_table: int32 [B, P_table];
        seq_lens: int32 [B]. No host sync."""
        batch = checks.plan_inputs(block_table, seq_lens, self.max_reqs, self.device)
        width = min(block_table.shape[1], MAX_PAGES)
        if self.width == 0:
            self.width = width
            self.shape = SelectShape.for_width(width)
        checks.table_not_wider(width, self.width)
        if batch not in self._tiles:
            self._tiles[batch] = torch.full((batch, SLOTS, self.heads, HEAD_DIM), 0xFF, dtype=torch.uint8, device=self.device)
            self._scores[batch] = torch.empty(batch, SLOTS * self.heads, self.width, device=self.device)
        self.block_table = block_table
        self.seq_lens = seq_lens

    def forward(self, index_q: torch.Tensor, k_cache: torch.Tensor, out: torch.Tensor, query_len: int) -> torch.Tensor:
        """index_q: float8_e4m3fn [B * q, heads, 128]; k_cache: uint8 [N, 128, 72];
        out: int32 [B * q, heads, 16]. Returns out."""
        batch = self.seq_lens.shape[0]
        checks.forward_inputs(index_q, k_cache, out, query_len, batch, self.heads, self.device)
        rows = batch * query_len
        if rows == 0:
            return out
        tile, scores = self._tiles[batch], self._scores[batch]
        width = min(self.block_table.shape[1], MAX_PAGES)
        _q_to_tile_kernel[(rows,)](index_q.view(torch.int32), tile.view(torch.int32), HS=self.heads, QLEN=query_len, **pdl_options(self.pdl))
        split = self._split(rows)
        score_pages(
            tile, k_cache, self.block_table[:, :width], self.seq_lens, scores[:, :, :width], pdl=self.pdl, prefetch=self.pdl,
            release=self.pdl and release_select(rows * self.heads * split[0]), first_slot=SLOTS - query_len,
        )  # fmt: skip
        return self._select(out, query_len, split)

    def _split(self, rows: int) -> tuple:
        """``plan_split`` of the top-16 over ``rows`` rows (batch x query_len)."""
        return plan_split(self.split, rows * self.heads, self.width, self.device, self.shape)

    def select(self, out: torch.Tensor, query_len: int) -> torch.Tensor:
        """The top-16 stage alone, on the scores the last forward of this batch size left
        (forward runs it; the benchmark times it by itself). out: int32 [B * q, heads, 16]."""
        return self._select(out, query_len, self._split(self.seq_lens.shape[0] * query_len))

    def _select(self, out: torch.Tensor, query_len: int, split_plan: tuple) -> torch.Tensor:
        """``select`` with its ``_split`` already planned (forward plans it once for the
        scorer's release and the select)."""
        batch = self.seq_lens.shape[0]
        scores = self._scores[batch]
        split, columns, shape = split_plan
        _stock_topk_kernel[(batch * query_len, self.heads, split)](
            scores,
            self.seq_lens,
            out,
            self._parts,
            self._counts,
            min(self.block_table.shape[1], MAX_PAGES),
            scores.stride(0),
            scores.stride(1),
            HS=self.heads,
            QLEN=query_len,
            WIDTH=columns * split,
            SPLIT=split,
            CHUNK=shape.chunk,
            SUPERS=shape.supers,
            PER_SUPER=shape.per_super,
            GROUP=shape.group,
            EMULATE_FMA=self.device.type != "cuda",
            SORT=self.device.type == "cuda",
            **pdl_options(self.pdl),
        )
        return out
