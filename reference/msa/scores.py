"""The MSA block scorer contract (docs/DESIGN.md §10.2): a token-level causal max, in PyTorch."""

from __future__ import annotations

import torch

from indexer_constants import HEAD_DIM, PAGE, SLOTS

from ..arguments import check_int, check_mma, check_tensor
from ..e4m3_mma import e4m3_mma_dot
from .inputs import check_keys
from .rules import read_blocks

# Blocks scored at once: the float64 products of one chunk are [rows, chunk, 128, 128].
BLOCK_CHUNK = 4


def tree_dot(q_rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Dot products of every query row with every token, summed in one fixed order.

    q_rows: float64 ``[R, 128]``; keys: float64 ``[n, 128, 128]`` (block, token, dim).
    Returns float64 ``[R, n, 128]``. Each product of two 16-bit values is exact in float64;
    the 128 products are summed as a pairwise tree over the dimension index (pairs (0, 1),
    (2, 3), ..., then pairs of those). A fixed order makes a score a function of its row and
    block only, never of how blocks are batched (so CP and the full decode agree bit for
    bit). It is exact whenever the products' exponents span at most 46 bits (E4M3 always:
    products are multiples of 2^-18 below 2^18), and otherwise off by far less than fp32's
    rounding of the result.
    """
    p = q_rows[:, None, None, :] * keys[None]  # [R, n, 128, 128]
    while p.shape[-1] > 1:
        p = p[..., 0::2] + p[..., 1::2]
    return p[..., 0]


def computed_blocks(lens: torch.Tensor, num_pages: int) -> torch.Tensor:
    """Global blocks each request's scorer may compute: ``min(ceil(len / 128), P)``, >= 0.

    lens: int ``[B]``. Returns int64 ``[B]``.
    """
    return read_blocks(lens, num_pages)


def e4m3_dot(q_rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``tree_dot``'s shape for the E4M3-MMA route (DESIGN §4.1): each dot product as
    Hopper's E4M3 MMA sums it. q_rows: float64 ``[R, 128]``, keys: float64 ``[n, 128,
    128]``, both E4M3 values. Returns float64 ``[R, n, 128]`` (float32 values)."""
    n = keys.shape[0]
    dots = e4m3_mma_dot(q_rows, keys.reshape(n * PAGE, HEAD_DIM))  # [n * 128, R]
    return dots.to(torch.float64).view(n, PAGE, -1).permute(2, 0, 1)


def check_msa_mma(mma, dtype: torch.dtype) -> str:
    """The MMA route for keys of ``dtype``: ``check_mma``'s, "e4m3" for E4M3 keys only."""
    if check_mma(mma) == "e4m3" and dtype != torch.float8_e4m3fn:
        raise ValueError(f"mma: 'e4m3' scores E4M3 keys, not {dtype}")
    return mma


def score_blocks(q_tile, k_cache, block_table, lens, out, *, num_pages, stride=1, offset=0, mma="exact"):
    """The MSA scorer contract: write block scores into ``out``, leaving every other column alone.

    q_tile: ``[B, 8, Hs, 128]`` in the cache dtype (bf16 or e4m3; a slot holding NaN is
    unwritten); k_cache: ``[N, 128, 128]``; block_table: int32 ``[B, W]``, column j holding
    global block ``g = j * stride + offset`` of its request; lens: int32 ``[B]``; out:
    float32 ``[B, 8 * Hs, W]``, row ``slot * Hs + head``. num_pages: P, the blocks the full
    table holds. Column j is computed when ``g < min(ceil(len / 128), P)`` (its id must lie
    in ``[0, N)``) and stored in row (slot, head) when also ``128 g <= pos = len - 8 + slot``:
    the largest, over the block's tokens t with ``128 g + t <= pos``, of ``q . k_t``, rounded
    once to fp32 (+0.0 added, as an fp32 accumulator starting at +0.0 gives). mma: "exact",
    or "e4m3" (E4M3 keys only: the dot products Hopper's E4M3 MMA gives, DESIGN §4.1).
    Returns out.
    """
    check_tensor("out", out, torch.float32, 3)
    check_tensor("block_table", block_table, torch.int32, 2)
    check_tensor("lens", lens, torch.int32, 1)
    k_cache = check_keys("k_cache", k_cache, finite=False)
    q_tile = check_keys("q_tile", q_tile, k_cache.dtype, finite=False)
    num_pages = check_int("num_pages", num_pages, low=1)
    stride = check_int("stride", stride, low=1)
    offset = check_int("offset", offset, low=0, high=stride - 1)
    dot = e4m3_dot if check_msa_mma(mma, k_cache.dtype) == "e4m3" else tree_dot
    if q_tile.dim() != 4 or q_tile.shape[1] != SLOTS or q_tile.shape[3] != HEAD_DIM:
        raise ValueError(f"q_tile: expected [B, {SLOTS}, Hs, {HEAD_DIM}], got {list(q_tile.shape)}")
    batch, _, hs, _ = q_tile.shape
    width = block_table.shape[1]
    if tuple(out.shape) != (batch, SLOTS * hs, width):
        raise ValueError(f"out: expected float32 [{batch}, {SLOTS * hs}, {width}], got {list(out.shape)}")
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table: expected {batch} rows (one per request of q_tile), got {block_table.shape[0]}")
    if lens.shape[0] != batch:
        raise ValueError(f"lens: expected {batch} lengths (one per request of q_tile), got {lens.shape[0]}")
    g_all = torch.arange(width, dtype=torch.int64) * stride + offset
    n_blocks = computed_blocks(lens, num_pages)
    slot = torch.arange(SLOTS, dtype=torch.int64).repeat_interleave(hs)
    q_all = q_tile.to(torch.float64).reshape(batch, SLOTS * hs, HEAD_DIM)
    tokens = torch.arange(PAGE, dtype=torch.int64)
    for b in range(batch):
        cols = (g_all < n_blocks[b]).nonzero().flatten()
        if cols.numel() == 0:
            continue
        ids = block_table[b, cols].to(torch.int64)
        bad = (ids < 0) | (ids >= k_cache.shape[0])
        if bool(bad.any()):
            j = int(cols[bad.nonzero()[0]])
            raise ValueError(
                f"block_table: request {b}, column {j} holds block id {int(block_table[b, j])}, "
                f"outside [0, {k_cache.shape[0]})"
            )
        pos = int(lens[b]) - SLOTS + slot  # [8 * Hs]
        live = ~torch.isnan(q_all[b]).any(dim=1)
        for start in range(0, cols.numel(), BLOCK_CHUNK):
            c = cols[start : start + BLOCK_CHUNK]
            g = g_all[c]
            s = torch.full((SLOTS * hs, c.numel()), torch.nan, dtype=torch.float64)
            if bool(live.any()):
                dots = dot(q_all[b][live], k_cache[ids[start : start + BLOCK_CHUNK]].to(torch.float64))
                visible = (g[None, :, None] * PAGE + tokens) <= pos[live][:, None, None]
                s[live] = torch.where(visible, dots, -torch.inf).amax(dim=-1)
            keep = (g[None, :] * PAGE) <= pos[:, None]
            view = out[b, :, c]
            out[b, :, c] = torch.where(keep, s.to(torch.float32) + 0.0, view)
    return out


def fp32_order_bound(q_rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """How far an fp32 accumulation in any order may land from ``score_blocks``'s score:
    ``128 * 2^-24 * max_t sum_d |q_d k_td|`` (a 128-term fp32 sum's classic bound).

    q_rows: ``[R, 128]``; keys: ``[n, 128, 128]``. Returns float32 ``[R, n]``.
    """
    q = q_rows.float().abs()
    k = keys.float().abs()
    return 128 * 2.0**-24 * torch.einsum("rd,ntd->rnt", q, k).amax(-1)
