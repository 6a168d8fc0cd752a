"""Per-process CP decode state for BF16 / FP8 keys under the MSA rules (docs/DESIGN.md
§10.4): §6's protocol — layers, buffer sets, q exchange, merge, spins, error record,
``check()`` and ``reset()`` — with this format's plan, scorer, push and output."""

from __future__ import annotations

import torch
import triton

from indexer_constants import HEAD_DIM, SLOTS

from .. import checks
from ..cp import CPLayer, CPPlan, IndexerDecodeCP
from ..select.policy import push_warps
from ..symm import Symmetric
from .kernels.cp import msa_compact_table_kernel, msa_merged_output, msa_push_kernel
from .scorer import KEY_FORMATS, score_blocks


class MsaDecodeCP(IndexerDecodeCP):
    """CP decode of ``heads`` index heads over ``symm.world`` ranks for BF16 or FP8 keys:
    the forced windows ``init_blocks`` (the first) and ``local_blocks`` (the last) plus the
    best ``16 - init - local`` other blocks, ascending with -1 padding (§10.3).

    ``IndexerDecodeCP``'s layout and interface (``new_layer()``, ``plan()`` once per step, no
    host sync; ``forward(layer, plan, ...)``, ``check()``, ``reset()``). Rank r scores blocks
    ``j * CP + r`` of every head at their global token positions (the real lengths: no
    invented page, compact width ``ceil(P / CP)``), pushes the top 16 of its candidates, and
    the owners merge. key_format: "bf16" or "fp8" (the dtype of queries and keys); the other
    keywords are ``IndexerDecodeCP``'s.
    """

    MERGE_OUTPUT = msa_merged_output  # §10.4's output: the windows around the chosen, ascending
    # Its plan: the compact table (-1 past P), real lengths of long requests (0 otherwise),
    # this rank's read columns (n_local) and the id bounds of every rank's read columns.
    COMPACT_KERNEL = msa_compact_table_kernel
    PUSH_KERNEL = msa_push_kernel

    def __init__(
        self,
        *,
        heads: int,
        max_reqs: int,
        symm: Symmetric,
        key_format: str,
        init_blocks: int,
        local_blocks: int,
        **options,
    ):
        if key_format not in KEY_FORMATS:
            raise ValueError(f"key_format: must be one of {tuple(KEY_FORMATS)}, got {key_format!r}")
        checks.forced_windows(init_blocks, local_blocks)
        self.key_format = key_format
        self.query_dtype = self.tile_dtype = KEY_FORMATS[key_format]  # before __init__ sizes the tile
        self.init_blocks, self.local_blocks = init_blocks, local_blocks
        super().__init__(heads=heads, max_reqs=max_reqs, symm=symm, **options)

    def _compact_width(self, pages: int) -> int:
        """W = ceil(P / CP): every block a rank can own (the real lengths invent none)."""
        return triton.cdiv(pages, self.cp)

    def _ranked_width(self) -> int:
        """The push ranks at most every column (the candidates of a row are a range of them)."""
        return self.width

    def _check_forward(self, index_q, k_cache, out, query_len: int, batch: int) -> None:
        """forward's host checks: index_q [B * q, Hr, 128] and k_cache [N, 128, 128], both in
        the key format; out int32 [B * q, Hr, 16]."""
        checks.forward_inputs(
            index_q,
            k_cache,
            out,
            query_len,
            batch,
            self.layout.heads_per_rank,
            self.device,
            q_dtype=self.query_dtype,
            k_dtype=self.query_dtype,
            k_row=HEAD_DIM,
        )

    def _score(
        self, layer: CPLayer, plan: CPPlan, k_cache: torch.Tensor, query_len: int, split_plan: tuple, push_plan: tuple
    ) -> None:
        """The MSA scorer on the exchanged tile (the step's set), column j = global block
        ``j * CP + rank``, the token mask at the real lengths; the step's slots only."""
        score_blocks(
            self._tile(layer, plan.batch),
            k_cache,
            plan.block_table,
            plan.score_lens,
            plan.scores,
            num_pages=plan.pages,
            stride=self.cp,
            offset=self.rank,
            first_slot=SLOTS - query_len,
            q_sel=layer.current,
            q_set_stride=self._tile_words * 4 // self.query_dtype.itemsize,
            q_sets=2,  # the sets by parity (DESIGN §6)
            pdl=self.pdl,
            mma=self.mma,
        )

    def _push_plan(self, rows: int, split_plan: tuple) -> tuple[int, int]:
        """(warps, 0): the MSA push selects with ``levels.row_top16`` alone (no PTX block)."""
        split, columns, s = split_plan
        return push_warps(rows * self.heads * split, columns <= s.chunk, self._sms, False), 0

    def _push_args(self, plan: CPPlan) -> tuple:
        """§10.4's push takes the forced windows (it ranks the columns between them)."""
        return (self.init_blocks, self.local_blocks)
