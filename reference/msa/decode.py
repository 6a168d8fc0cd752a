"""The MSA full-context decode: the oracle every MSA path must equal bit for bit."""

from __future__ import annotations

import torch

from indexer_constants import HEAD_DIM, SLOTS, TOPK

from .inputs import MsaInputs, check_msa_inputs
from .rules import causal_blocks
from .scores import check_msa_mma, score_blocks
from .selection import select


def unwritten(dtype: torch.dtype) -> int:
    """The all-ones bit pattern of one element (a NaN in both key dtypes): "no query yet"."""
    return 0xFFFF if dtype == torch.bfloat16 else 0xFF


def bits_view(x: torch.Tensor) -> torch.Tensor:
    """The raw bits of a bf16 (as int32 0..65535) or e4m3 (0..255) tensor, same shape."""
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).to(torch.int32) & 0xFFFF
    return x.view(torch.uint8).to(torch.int32)


def unwritten_tile(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``shape`` whose every element is the all-ones pattern of ``dtype`` (bf16 or
    e4m3): an armed exchange tile, or the slots a step leaves empty."""
    if dtype == torch.bfloat16:
        return torch.full(shape, -1, dtype=torch.int16).view(dtype)
    return torch.full(shape, 0xFF, dtype=torch.uint8).view(dtype)


def query_tile(index_q: torch.Tensor, batch: int, query_len: int) -> torch.Tensor:
    """Query i of request b in slot 8 - q + i of a ``[B, 8, H, 128]`` tile; other slots
    hold the all-ones element (NaN). index_q: ``[B * q, H, 128]``, same dtype out."""
    heads = index_q.shape[1]
    tile = unwritten_tile((batch, SLOTS, heads, HEAD_DIM), index_q.dtype)
    tile[:, SLOTS - query_len :] = index_q.view(batch, query_len, heads, HEAD_DIM)
    return tile


def query_rows(scores: torch.Tensor, query_len: int, heads: int) -> torch.Tensor:
    """Scorer rows ``[B, 8 * H, W]`` of the real queries, as ``[B * q, H, W]``."""
    batch, _, width = scores.shape
    per_slot = scores.view(batch, SLOTS, heads, width)[:, SLOTS - query_len :]
    return per_slot.reshape(batch * query_len, heads, width)


def full_scores(inputs: MsaInputs, mma: str = "exact") -> torch.Tensor:
    """Every query's full-context block scores: float32 ``[rows, H, P]``, NaN where the
    scorer stores nothing (blocks past the query's position); mma: ``score_blocks``'."""
    width = inputs.num_pages
    tile = query_tile(inputs.index_q, inputs.batch, inputs.query_len)
    out = torch.full((inputs.batch, SLOTS * inputs.heads, width), torch.nan)
    score_blocks(tile, inputs.k_cache, inputs.block_table[:, :width], inputs.seq_lens, out, num_pages=width, mma=mma)
    return query_rows(out, inputs.query_len, inputs.heads)


def full_decode(index_q, k_cache, block_table, seq_lens, query_len, *, init_blocks, local_blocks, mma="exact"):
    """The MSA oracle: exact full-context selection with forced windows, ascending output.

    index_q: bf16 or e4m3 ``[rows, H, 128]`` (rows = B * query_len); k_cache: the same
    dtype ``[N, 128, 128]``; block_table: int32 ``[B, P_table]``; seq_lens: int32 ``[B]``;
    query_len: 1..8; init_blocks, local_blocks: forced windows (sum <= 16). Returns int32
    ``[rows, H, 16]``: block ids ascending, -1 padded at the end (docs/DESIGN.md §10.3).
    mma: the scorer's MMA route, "exact" or, for E4M3 keys, "e4m3" (§4.1).
    """
    inputs = check_msa_inputs(index_q, k_cache, block_table, seq_lens, query_len, init_blocks, local_blocks)
    scores = full_scores(inputs, check_msa_mma(mma, inputs.k_cache.dtype))
    rows, heads, width = scores.shape
    n = causal_blocks(inputs.seq_lens, inputs.query_len).repeat_interleave(heads)
    picked = select(scores.reshape(rows * heads, width), n, inputs.num_pages, inputs.init_blocks, inputs.local_blocks)
    return picked.view(rows, heads, TOPK)
