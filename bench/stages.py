"""The decodes' stages one at a time, for the bench's stage graphs and the tests that check
one stage alone: subclasses of the runtime's decodes that name each stage ``forward`` runs.

A server never calls a stage by itself (``forward`` orders them, and the PDL chain between
them assumes that order); these classes exist so that the runtime's own classes carry no
method or argument that only a benchmark uses.
"""

from __future__ import annotations

import torch

from fast.cp import CPLayer, CPPlan, IndexerDecodeCP
from fast.msa.cp import MsaDecodeCP
from fast.msa.stock import MsaStockDecode
from fast.stock import StockDecode, StockPlan


class CPStages:
    """The CP forward's four stages as methods (mixed into a CP decode class)."""

    def exchange(self, layer: CPLayer, plan: CPPlan, index_q: torch.Tensor, query_len: int) -> None:
        """The q exchange alone: index_q [B * q, Hr, 128] of ``query_dtype`` into every
        rank's tile (the layer's next set), then the wait for every rank's."""
        self._exchange(layer, plan, index_q, query_len)

    def score(self, layer: CPLayer, plan: CPPlan, query_len: int, *, k_cache: torch.Tensor) -> None:
        """The scorer alone: this rank's columns of ``plan`` scored from the layer's tile
        (the set of its last exchange) into ``plan.scores`` (fp32 [B, 8 * H, W])."""
        split_plan = self._split(plan.batch * query_len)
        self._score(layer, plan, k_cache, query_len, split_plan, self._push_plan(plan.batch * query_len, split_plan))

    def push(self, layer: CPLayer, plan: CPPlan, query_len: int, *, num_blocks: int) -> None:
        """The push alone: each long row's local top 16 of ``plan.scores`` into its owners'
        slots of ``layer.recv`` (the set of the layer's last exchange). The keys stay there
        (the merge re-arms them): before ``forward`` uses a layer that ran this without a
        merge, ``layer.recv.local.fill_(-1)`` on every rank. num_blocks: the cache's N."""
        split_plan = self._split(plan.batch * query_len)
        push_plan = self._push_plan(plan.batch * query_len, split_plan)
        self._push(layer, plan, query_len, split_plan, push_plan, num_blocks)

    def merge(
        self, layer: CPLayer, plan: CPPlan, query_len: int, out: torch.Tensor, *, num_blocks: int
    ) -> torch.Tensor:
        """The merge alone, after ``push`` on every rank: out int32 [B * q, Hr, 16]."""
        return self._merge(layer, plan, query_len, out, num_blocks)


class StockStages:
    """The stock forward's top-16 stage as a method (mixed into a stock decode class)."""

    def select(self, plan: StockPlan, out: torch.Tensor, query_len: int, *, num_blocks: int) -> torch.Tensor:
        """The top-16 alone on the scores the plan's last forward (or a caller) left in
        ``plan.scores``: out int32 [B * q, heads, 16]; num_blocks: the cache's N."""
        return self._select(plan, out, query_len, self._split(plan.batch * query_len), num_blocks)


class StagedCP(CPStages, IndexerDecodeCP):
    """``IndexerDecodeCP`` with its stages callable one at a time."""


class StagedMsaCP(CPStages, MsaDecodeCP):
    """``MsaDecodeCP`` with its stages callable one at a time."""


class StagedStock(StockStages, StockDecode):
    """``StockDecode`` with its top-16 callable alone."""


class StagedMsaStock(StockStages, MsaStockDecode):
    """``MsaStockDecode`` with its select callable alone."""
