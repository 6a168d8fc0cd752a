"""The full-context decodes: the exact oracle and the stock (16-bit key) selection."""

from __future__ import annotations

import torch

from indexer_constants import HEAD_DIM, SLOTS, TOPK

from .arguments import check_mma
from .inputs import DecodeInputs, check_decode_inputs
from .rules import own_pages
from .scores import score_pages
from .selection import select

UNWRITTEN_Q = 0xFF  # an E4M3 NaN byte: "this tile slot holds no query yet"


def query_tile(index_q: torch.Tensor, batch: int, query_len: int) -> torch.Tensor:
    """Place queries in the scorer's 8-slot tile: query i of request b goes to slot 8 - q + i.

    index_q: float8_e4m3fn ``[B * q, H, 128]``. Returns float8_e4m3fn ``[B, 8, H, 128]``;
    unused slots hold the byte 0xFF (NaN).
    """
    heads = index_q.shape[1]
    tile = torch.full((batch, SLOTS, heads, HEAD_DIM), UNWRITTEN_Q, dtype=torch.uint8)
    tile[:, SLOTS - query_len :] = index_q.view(torch.uint8).view(batch, query_len, heads, HEAD_DIM)
    return tile.view(torch.float8_e4m3fn)


def query_rows(scores: torch.Tensor, query_len: int, heads: int) -> torch.Tensor:
    """The scorer rows of the real queries.

    scores: float32 ``[B, 8 * H, W]`` (row slot * H + head). Returns float32
    ``[B * q, H, W]`` in row order ``b * q + i``.
    """
    batch, _, width = scores.shape
    per_slot = scores.view(batch, SLOTS, heads, width)[:, SLOTS - query_len :]
    return per_slot.reshape(batch * query_len, heads, width)


def full_scores(inputs: DecodeInputs, mma: str = "exact") -> torch.Tensor:
    """Every query's full-context page scores (mma: ``score_pages``').

    Returns float32 ``[rows, H, P]`` (column j = page j of the table); columns the scorer
    does not store for a row (j >= own) hold NaN.
    """
    width = inputs.num_pages
    tile = query_tile(inputs.index_q, inputs.batch, inputs.query_len)
    out = torch.full((inputs.batch, SLOTS * inputs.heads, width), torch.nan)
    score_pages(tile, inputs.k_cache, inputs.block_table[:, :width], inputs.seq_lens, out, mma=mma)
    return query_rows(out, inputs.query_len, inputs.heads)


def _decode(index_q, k_cache, block_table, seq_lens, query_len, key: str, mma: str) -> torch.Tensor:
    mma = check_mma(mma)
    inputs = check_decode_inputs(index_q, k_cache, block_table, seq_lens, query_len)
    scores = full_scores(inputs, mma)
    rows, heads, width = scores.shape
    own = own_pages(inputs.seq_lens, inputs.query_len).repeat_interleave(heads)
    picked = select(scores.reshape(rows * heads, width), own, inputs.num_pages, key)
    return picked.view(rows, heads, TOPK)


def full_decode(index_q, k_cache, block_table, seq_lens, query_len, *, mma: str = "exact") -> torch.Tensor:
    """The oracle: exact full-context selection.

    index_q: float8_e4m3fn ``[rows, H, 128]``, rows = B * query_len; k_cache: uint8
    ``[N, 128, 72]``; block_table: int32 ``[B, P_table]``; seq_lens: int32 ``[B]``;
    query_len: int in 1..8. Returns int32 ``[rows, H, 16]``: 15 pages by (score desc, page
    asc) among ``j < min(own, P)``, -1 where none is left, the own page in slot 15; rows
    with ``own + 1 <= 16`` get ``[0..own, -1, ...]``. mma: the scorer's MMA route, "exact"
    (§4) or "e4m3" (§4.1: the scores Hopper's E4M3 MMA gives, selected exactly as ever).
    """
    return _decode(index_q, k_cache, block_table, seq_lens, query_len, "exact", mma)


def stock_decode(index_q, k_cache, block_table, seq_lens, query_len, *, mma: str = "exact") -> torch.Tensor:
    """The stock (non-CP) selection: as ``full_decode`` but ranked by the 16-bit key.

    Same arguments and output as ``full_decode``. Ties at 16-bit resolution go to the
    lower page, so it may differ from the oracle only where quantization merged scores.
    """
    return _decode(index_q, k_cache, block_table, seq_lens, query_len, "stock", mma)
