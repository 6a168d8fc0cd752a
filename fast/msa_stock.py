"""The stock (non-CP) decode for BF16 / FP8 keys under the MSA rules (docs/DESIGN.md §10):
q into the 8-slot tile, every block of the causal range scored with the token-level mask,
the forced windows and the best candidates by the exact key, output ascending."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from indexer_constants import HEAD_DIM, MAX_PAGES, SLOTS, SUPPORTED_HEADS, TOPK

from . import checks
from .backend import pdl_options, resolve_device
from .checks import MAX_REQS, check_int
from .errors import new_record, raise_recorded
from .kernels.guards import BOUND_WORDS
from .kernels.msa_select import msa_bounds_kernel, msa_stock_select_kernel
from .kernels.stock import q_to_tile_kernel
from .msa_scorer import score_blocks
from .select.policy import SPLIT_PROGRAMS, SelectShape, check_split, plan_split
from .stage_clock import StageClock

# The key formats of this decode, and their element type (queries and keys alike).
KEY_FORMATS = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


@dataclass
class MsaStockLayer:
    """A stock layer holds no buffers of its own (it exchanges nothing)."""


@dataclass
class MsaStockPlan:
    """One step's inputs for a padded batch size: the caller's table and lengths, the q tile
    and the score buffer (fixed per batch size: graph-safe), each request's id bounds."""

    batch: int
    block_table: torch.Tensor  # int32 [B, P_table], the caller's
    seq_lens: torch.Tensor  # int32 [B], the caller's
    pages: int  # P = min(P_table, MAX_PAGES): the columns scored
    tile: torch.Tensor  # [B, 8, Hs, 128] in the key format: the step's queries in their slots
    scores: torch.Tensor  # fp32 [B, 8 * Hs, W]
    bounds: torch.Tensor  # int32 [B, 4]: id bounds over the read columns (guards.row_id_bounds)


class MsaStockDecode:
    """One rank's stock decode of its ``heads`` index heads for BF16 or FP8 keys: every
    block of each query's causal range scored, the forced windows ``init_blocks`` (the
    first) and ``local_blocks`` (the last) plus the best ``16 - init - local`` others,
    ascending with -1 padding (docs/DESIGN.md §10.3).

    The interface of ``StockDecode``: ``new_layer()``, ``plan()`` once per step (no host
    sync), ``forward(layer, plan, ...)`` per layer, ``check()``, ``reset()``.
    key_format: "bf16" or "fp8" (the dtype of queries and keys). split: the select's
    programs per row, as ``StockDecode``'s (None: the policy on a GPU, 1 elsewhere).
    """

    def __init__(
        self,
        *,
        heads: int,
        max_reqs: int,
        device: torch.device,
        key_format: str,
        init_blocks: int,
        local_blocks: int,
        pdl: bool = False,
        split: int | None = None,
    ):
        check_int("heads", heads, allowed=SUPPORTED_HEADS)
        check_int("max_reqs", max_reqs, low=1, high=MAX_REQS)
        if key_format not in KEY_FORMATS:
            raise ValueError(f"key_format: must be one of {tuple(KEY_FORMATS)}, got {key_format!r}")
        checks.forced_windows(init_blocks, local_blocks)
        check_split(split)
        self.split = split
        self.heads = self.local_heads = heads
        self.max_reqs = max_reqs
        self.key_format = key_format
        self.dtype = KEY_FORMATS[key_format]
        self.init_blocks, self.local_blocks = init_blocks, local_blocks
        self.device = resolve_device(checks.device_arg(device))
        self.pdl = pdl and self.device.type == "cuda"  # the interpreter has no PDL
        self.width = 0  # score columns, fixed by the first plan
        self.shape: SelectShape | None = None
        self._plans: dict[int, MsaStockPlan] = {}
        self.error = new_record(self.device)  # int32 [5]: word 0 unused here, then the first bad input
        # the split select's slice keys and per-(row, head) counts (zero between calls)
        self._parts = torch.zeros(SPLIT_PROGRAMS * TOPK, dtype=torch.int64, device=self.device)
        self._counts = torch.zeros(SPLIT_PROGRAMS // 2, dtype=torch.int32, device=self.device)

    def new_layer(self) -> MsaStockLayer:
        """A layer for ``forward`` (nothing to allocate)."""
        return MsaStockLayer()

    def plan(self, block_table: torch.Tensor, seq_lens: torch.Tensor) -> MsaStockPlan:
        """This step's plan. block_table: int32 [B, P_table]; seq_lens: int32 [B]. The
        table may be narrower than the first plan's, never wider. No host sync: each
        request's id bounds over the columns it reads are reduced on the device."""
        batch = checks.plan_inputs(block_table, seq_lens, self.max_reqs, self.device)
        pages = min(block_table.shape[1], MAX_PAGES)
        if self.width == 0:
            self.width = pages
            self.shape = SelectShape.for_width(pages)
        checks.table_not_wider(pages, self.width)
        p = self._plans.get(batch)
        if p is None:
            # the all-ones element in the unused slots: the NaN an unwritten query holds
            raw = torch.uint8 if self.dtype == torch.float8_e4m3fn else torch.int16
            ones = torch.full((batch, SLOTS, self.heads, HEAD_DIM), -1, dtype=torch.int32).to(raw)
            tile = ones.to(self.device).view(self.dtype)
            scores = torch.empty(batch, SLOTS * self.heads, self.width, device=self.device)
            bounds = torch.empty(batch, BOUND_WORDS, dtype=torch.int32, device=self.device)
            p = self._plans[batch] = MsaStockPlan(batch, block_table, seq_lens, pages, tile, scores, bounds)
        p.block_table, p.seq_lens, p.pages = block_table, seq_lens, pages
        if batch:
            msa_bounds_kernel[(batch,)](
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
        layer: MsaStockLayer,
        plan: MsaStockPlan,
        index_q: torch.Tensor,
        k_cache: torch.Tensor,
        out: torch.Tensor,
        query_len: int,
        stage_times: dict | None = None,
    ) -> torch.Tensor:
        """One layer's stock decode. index_q: [B * q, heads, 128] and k_cache: [N, 128, 128],
        both in the key format; out: int32 [B * q, heads, 16]. Returns out. stage_times: as
        ``StockDecode.forward``'s ("score", the q copy included, and "select"). Padding (0)
        and bad requests get sixteen -1 per row, and ``check()`` names the first bad one."""
        checks.state_operands(layer, plan, MsaStockLayer, MsaStockPlan, self._plans)
        checks.forward_inputs(
            index_q,
            k_cache,
            out,
            query_len,
            plan.batch,
            self.heads,
            self.device,
            q_dtype=self.dtype,
            k_dtype=self.dtype,
            k_row=HEAD_DIM,
        )
        rows = plan.batch * query_len
        if rows == 0:
            return out
        clock = StageClock(stage_times, self.device)
        words = HEAD_DIM * index_q.element_size() // 4
        q_to_tile_kernel[(rows,)](
            index_q.view(torch.int32),
            plan.tile.view(torch.int32),
            HS=self.heads,
            QLEN=query_len,
            WORDS=words,
            **pdl_options(self.pdl),
        )
        score_blocks(
            plan.tile,
            k_cache,
            plan.block_table[:, : plan.pages],
            plan.seq_lens,
            plan.scores[:, :, : plan.pages],
            num_pages=plan.pages,
            first_slot=SLOTS - query_len,
            pdl=self.pdl,
        )
        clock.lap("score")
        self._select(plan, out, query_len, k_cache.shape[0])
        clock.lap("select")
        clock.done()
        return out

    def check(self) -> None:
        """Raise BadBlockIdError / BadLengthError for the first bad input a forward saw
        (``fast.errors``; a host sync). The record stays set until ``reset()``."""
        raise_recorded(self.error)

    def reset(self) -> None:
        """Clear the error record (the stock path holds no other state between steps)."""
        self.error.zero_()

    def select(self, plan: MsaStockPlan, out: torch.Tensor, query_len: int, *, num_blocks: int) -> torch.Tensor:
        """The select stage alone, on the scores the plan's last forward left (the benchmark
        times it by itself). out: int32 [B * q, heads, 16]; num_blocks: N of the cache."""
        return self._select(plan, out, query_len, num_blocks)

    def _select(self, plan: MsaStockPlan, out: torch.Tensor, query_len: int, num_blocks: int) -> torch.Tensor:
        scores = plan.scores
        rows = plan.batch * query_len
        split, columns, shape = plan_split(self.split, rows * self.heads, self.width, self.device, self.shape)
        msa_stock_select_kernel[(rows, self.heads, split)](
            scores,
            plan.seq_lens,
            plan.bounds,
            num_blocks,
            self.error,
            out,
            self._parts,
            self._counts,
            plan.pages,
            self.init_blocks,
            self.local_blocks,
            scores.stride(0),
            scores.stride(1),
            HS=self.heads,
            QLEN=query_len,
            SLICE=columns,
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


def msa_stock_decode(
    index_q, k_cache, block_table, seq_lens, *, query_len: int, init_blocks: int, local_blocks: int
) -> torch.Tensor:
    """One stock MSA decode step on fresh buffers (a convenience: serving keeps a
    ``MsaStockDecode``). index_q: ``[B * q, H, 128]``, k_cache ``[N, 128, 128]`` (bf16 or
    e4m3, the same); block_table int32 ``[B, P_table]``; seq_lens int32 ``[B]``. Returns
    int32 ``[B * q, H, 16]``; raises what ``check()`` raises."""
    formats = {v: k for k, v in KEY_FORMATS.items()}
    if not isinstance(k_cache, torch.Tensor) or k_cache.dtype not in formats:
        got = getattr(k_cache, "dtype", type(k_cache).__name__)
        raise TypeError(f"k_cache: expected a bfloat16 or float8_e4m3fn tensor, got {got}")
    if not isinstance(index_q, torch.Tensor) or index_q.dim() != 3:
        raise ValueError(f"index_q: expected [B * q, H, {HEAD_DIM}], got {getattr(index_q, 'shape', index_q)}")
    decode = MsaStockDecode(
        heads=index_q.shape[1],
        max_reqs=max(1, seq_lens.shape[0]),
        device=index_q.device,
        key_format=formats[k_cache.dtype],
        init_blocks=init_blocks,
        local_blocks=local_blocks,
    )
    plan = decode.plan(block_table, seq_lens)
    out = torch.empty(index_q.shape[0], index_q.shape[1], TOPK, dtype=torch.int32, device=index_q.device)
    decode.forward(decode.new_layer(), plan, index_q, k_cache, out, query_len)
    decode.check()
    return out
