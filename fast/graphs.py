"""CUDA-graph replay of the decode layers, one graph per padded batch size.

A server captures the per-layer forward once per batch size it pads to and replays it every
step; the plan (compact table, lengths) runs eagerly before the replay. ``GraphedDecode`` does
exactly that for any decode of the one interface (``IndexerDecodeCP``, ``StockDecode``:
``new_layer()``, ``plan()``, ``forward(layer, plan, ...)``, ``check()``, ``reset()``,
``local_heads``, ``device``): the
graph-replay test, the benchmark and a user's integration all go through it.
"""

from __future__ import annotations

from typing import Protocol

import torch

from indexer_constants import HEAD_DIM, MAX_QUERY_LEN, TOPK

from .checks import check_int, check_tensor


class Decode(Protocol):
    """What ``GraphedDecode`` needs of a decode state (every decode provides it)."""

    device: torch.device
    local_heads: int  # the heads of index_q and out in forward
    query_dtype: torch.dtype  # index_q's dtype in forward

    def new_layer(self):
        """A layer's own buffers (collective where the decode has peers); kept alive as long
        as any graph captured over it."""

    def plan(self, block_table: torch.Tensor, seq_lens: torch.Tensor):
        """The step's plan from block_table int32 [B, P] and seq_lens int32 [B]: eager,
        outside capture, no host sync."""

    def forward(self, layer, plan, index_q, k_cache, out, query_len: int) -> torch.Tensor:
        """One layer's decode: index_q [B * q, local_heads, 128] of ``query_dtype``, k_cache
        in the decode's format, out int32 [B * q, local_heads, 16] (the selected page ids),
        q = query_len. Returns out. Capturable."""

    def check(self) -> None:
        """Raise what the device-side error record holds (a host sync)."""

    def reset(self) -> None:
        """Re-arm every layer and clear the error record after a timeout or a bad input."""


CAPTURE_SIZES = (1, 2, 4, 8, 16, 32, 64)


class _Static:
    """The fixed-address inputs and outputs one padded batch size's graph reads and writes."""

    def __init__(self, batch: int, query_len: int, heads: int, table_width: int, layers: int, q_dtype, device):
        i32 = dict(dtype=torch.int32, device=device)
        self.block_table = torch.zeros(batch, table_width, **i32)
        self.seq_lens = torch.zeros(batch, **i32)  # padding requests: sixteen -1 per row
        self.index_q = torch.zeros(layers, batch * query_len, heads, HEAD_DIM, dtype=q_dtype, device=device)
        self.out = torch.full((layers, batch * query_len, heads, TOPK), -1, **i32)
        self.graph: torch.cuda.CUDAGraph | None = None


class GraphedDecode:
    """``layers`` consecutive decode layers of one rank, replayed from CUDA graphs.

    decode: an ``IndexerDecodeCP``, a ``StockDecode`` or an ``MsaStockDecode`` (this builds
    its layers: for CP a collective, in the same order on every rank); its ``query_dtype``
    is index_q's. k_caches: the decode's caches (uint8 ``[N, 128, 72]``; MSA ``[N, 128,
    128]`` in the key dtype), layer i reads ``k_caches[i % len]``. table_width: the block
    table width every step uses (it fixes P, so it may not change). A step pads its batch to
    the smallest of ``sizes`` that holds it: padding requests get ``seq_len = 0`` (nothing
    read, sixteen -1 per row) and their outputs are dropped.
    """

    def __init__(
        self,
        decode: Decode,
        *,
        query_len: int,
        table_width: int,
        k_caches: list[torch.Tensor],
        layers: int = 1,
        sizes: tuple[int, ...] = CAPTURE_SIZES,
    ):
        for name in ("new_layer", "plan", "forward", "check", "reset", "local_heads", "device", "query_dtype"):
            if not hasattr(decode, name):
                raise TypeError(f"decode: expected an IndexerDecodeCP or a StockDecode, got {type(decode).__name__}")
        if decode.device.type != "cuda":
            raise ValueError(f"decode: GraphedDecode replays CUDA graphs; its decode is on {decode.device}, not a GPU")
        check_int("query_len", query_len, low=1, high=MAX_QUERY_LEN)
        check_int("table_width", table_width, low=1)
        check_int("layers", layers, low=1)
        if not isinstance(k_caches, (list, tuple)) or not k_caches:
            raise ValueError("k_caches: expected a non-empty list of caches, one per layer (or fewer, reused)")
        if not isinstance(sizes, (list, tuple)) or not sizes:
            raise ValueError(f"sizes: expected a non-empty tuple of batch sizes, got {sizes!r}")
        for size in sizes:
            check_int("sizes", size, low=1, high=getattr(decode, "max_reqs", size))
        self.decode, self.heads, self.query_len, self.table_width = decode, decode.local_heads, query_len, table_width
        self.k_caches, self.layers, self.sizes = list(k_caches), layers, tuple(sorted(sizes))
        self.device = decode.device
        self.decode_layers = [decode.new_layer() for _ in range(layers)]
        self._static: dict[int, _Static] = {}
        self._pool = torch.cuda.graph_pool_handle()

    @property
    def captured(self) -> list[int]:
        """The padded batch sizes that have a graph so far."""
        return sorted(size for size, s in self._static.items() if s.graph is not None)

    def padded(self, batch: int) -> int:
        """The capture size a batch of ``batch`` requests runs at."""
        for size in self.sizes:
            if size >= batch:
                return size
        raise ValueError(f"seq_lens: {batch} requests exceed the largest capture size {self.sizes[-1]}")

    def _forward_all(self, s: _Static, plan) -> None:
        for i in range(self.layers):
            k_cache = self.k_caches[i % len(self.k_caches)]
            self.decode.forward(self.decode_layers[i], plan, s.index_q[i], k_cache, s.out[i], self.query_len)

    def prepare(self, block_table: torch.Tensor, seq_lens: torch.Tensor, index_q: torch.Tensor) -> _Static:
        """Copy one step's inputs into the static buffers of its padded size and plan.

        block_table: int32 [b, table_width]; seq_lens: int32 [b]; index_q: the decode's
        query_dtype, [layers, b * q, heads, 128] (or [b * q, heads, 128], used by every layer).
        """
        check_tensor("seq_lens", seq_lens, torch.int32, 1)
        check_tensor("block_table", block_table, torch.int32, 2)
        per_layer = isinstance(index_q, torch.Tensor) and index_q.dim() == 4
        check_tensor("index_q", index_q, self.decode.query_dtype, 4 if per_layer else 3)
        b = seq_lens.shape[0]
        rows = (b * self.query_len, self.heads, HEAD_DIM)
        if tuple(index_q.shape[-3:]) != rows or (per_layer and index_q.shape[0] != self.layers):
            raise ValueError(
                f"index_q: expected [{self.layers}, {rows[0]}, {rows[1]}, {rows[2]}] or {list(rows)},"
                f" got {list(index_q.shape)}"
            )
        if block_table.shape != (b, self.table_width):
            raise ValueError(f"block_table: expected shape ({b}, {self.table_width}), got {tuple(block_table.shape)}")
        size = self.padded(b)
        s = self._static.get(size)
        if s is None:
            s = self._static[size] = _Static(
                size, self.query_len, self.heads, self.table_width, self.layers, self.decode.query_dtype, self.device
            )
        s.block_table[:b].copy_(block_table)
        s.seq_lens[:b].copy_(seq_lens)
        s.seq_lens[b:].zero_()
        s.index_q[:, : rows[0]].copy_(index_q)
        s.plan = self.decode.plan(s.block_table, s.seq_lens)
        return s

    def replay(self, s: _Static) -> None:
        """Run the step's layers: capture the graph of this size first if it is new (one
        eager run compiles the kernels outside the capture; for CP every rank does it at the
        same step, since every rank sees the same batch sizes)."""
        if s.graph is None:
            self._forward_all(s, s.plan)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                self._forward_all(s, s.plan)
            s.graph = graph
        s.graph.replay()

    def check(self) -> None:
        """The decode's ``check()``: raise what its error record holds (a host sync)."""
        self.decode.check()

    def reset(self) -> None:
        """The decode's ``reset()`` (collective for CP): the captured graphs stay valid, since
        it re-arms the same buffers they address."""
        self.decode.reset()

    def step(self, block_table: torch.Tensor, seq_lens: torch.Tensor, index_q: torch.Tensor) -> torch.Tensor:
        """One decode step of every layer; int32 ``[layers, b * q, heads, 16]`` (a view of
        the static output, valid until the next step of the same padded size)."""
        s = self.prepare(block_table, seq_lens, index_q)
        self.replay(s)
        return s.out[:, : seq_lens.shape[0] * self.query_len]
