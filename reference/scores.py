"""The Q8KV4 decode scorer contract (docs/DESIGN.md §4), in plain PyTorch."""

from __future__ import annotations

import torch

from indexer_constants import CODE_BYTES, HEAD_DIM, PAGE, SLOTS

from .arguments import check_mma, check_pages, check_tensor
from .e4m3_mma import e4m3_mma_dot
from .nvfp4 import dequantize_nvfp4, dequantize_nvfp4_f64
from .rules import own_page, read_pages

# Pages dequantized at once: bounds the reference's working set (~0.3 MB per page).
PAGE_CHUNK = 256


def scored_pages(lens: torch.Tensor, width: int) -> torch.Tensor:
    """Pages the scorer computes per request: ``min((len - 1) // 128, W)``, at least 0.

    lens: int ``[B]``. Returns int64 ``[B]``.
    """
    return read_pages(lens, width)


def stored_pages(lens: torch.Tensor) -> torch.Tensor:
    """Columns each slot may store: ``own(slot) = (len - SLOTS + slot) // 128``.

    lens: int ``[B]``. Returns int64 ``[B, SLOTS]`` (negative means none).
    """
    return own_page(lens[:, None], torch.arange(SLOTS)[None, :])


class _Workspace:
    """Reusable dequantization buffers for up to ``pages`` pages (see dequantize_nvfp4_f64)."""

    def __init__(self, pages: int):
        self.index = torch.empty(pages * CODE_BYTES, dtype=torch.int32)
        self.values = torch.empty(pages * CODE_BYTES, dtype=torch.complex128)


def page_scores(q_rows: torch.Tensor, pages: torch.Tensor, work: _Workspace, mma: str = "exact") -> torch.Tensor:
    """Score query rows against NVFP4 pages.

    q_rows: float64 ``[R, 128]`` holding E4M3 values; pages: uint8 ``[n, 128, 72]``.
    Returns float32 ``[R, n]``: max over the 128 tokens of the dot product. mma "e4m3":
    each dot product as Hopper's E4M3 MMA sums it (``e4m3_mma.e4m3_mma_dot``).

    mma "exact": each dot product is computed exactly and rounded once to fp32. Exact because every
    product of two E4M3 values is a multiple of 2^-18 below 2^18 in magnitude, so any
    partial sum of 128 of them needs at most 43 bits and float64 holds it in any order.
    That makes a score independent of how pages are batched (CP and full decode agree bit
    for bit), and on exact-arithmetic inputs it equals any fp32 accumulation.
    Adding +0.0 gives an all-zero dot product the sign an fp32 accumulator starting at +0.0
    gives; the exact key tells -0.0 from +0.0.
    """
    n = pages.shape[0]
    k = dequantize_nvfp4_f64(pages, work.index, work.values)  # [n * 128, 128]
    if mma == "e4m3":
        return e4m3_mma_dot(q_rows, k).view(n, PAGE, -1).amax(dim=1).T.contiguous()
    dots = (k @ q_rows.T).view(n, PAGE, -1)
    return dots.amax(dim=1).T.to(torch.float32) + 0.0


def check_score_shapes(q_tile: torch.Tensor, block_table: torch.Tensor, out: torch.Tensor) -> tuple[int, int, int]:
    """The scorer's shapes: q_tile [B, 8, Hs, 128], block_table [B, W], out float32
    [B, 8 * Hs, W]. Returns (B, Hs, W); ValueError naming the argument otherwise."""
    if not isinstance(q_tile, torch.Tensor) or q_tile.dim() != 4:
        got = getattr(q_tile, "shape", q_tile)
        raise ValueError(f"q_tile: expected a tensor [B, {SLOTS}, Hs, {HEAD_DIM}], got {got!r}")
    check_tensor("block_table", block_table, torch.int32, 2)
    check_tensor("out", out, torch.float32, 3)
    batch, slots, hs, dim = q_tile.shape
    if slots != SLOTS or dim != HEAD_DIM:
        raise ValueError(f"q_tile: expected [B, {SLOTS}, Hs, {HEAD_DIM}], got {list(q_tile.shape)}")
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table: expected {batch} rows (one per request of q_tile), got {block_table.shape[0]}")
    width = block_table.shape[1]
    if tuple(out.shape) != (batch, SLOTS * hs, width) or out.dtype != torch.float32:
        raise ValueError(f"out: expected float32 [{batch}, {SLOTS * hs}, {width}], got {out.dtype} {list(out.shape)}")
    return batch, hs, width


def score_pages(
    q_tile: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor,
    lens: torch.Tensor,
    out: torch.Tensor,
    *,
    mma: str = "exact",
) -> torch.Tensor:
    """The scorer contract: write page scores into ``out``, leaving every other column alone.

    q_tile: float8_e4m3fn ``[B, 8, Hs, 128]``; k_cache: uint8 ``[N, 128, 72]``;
    block_table: int32 ``[B, W]``; lens: int32 ``[B]``; out: float32 ``[B, 8 * Hs, W]``,
    row ``slot * Hs + head``. Column j of request b is computed for
    ``j < min((len - 1) // 128, W)`` and stored in row (slot, head) only if also
    ``j < own(slot) = (len - 8 + slot) // 128``. Returns ``out``.
    Only the table entries of computed columns are read; they must lie in ``[0, N)``.
    mma: how a dot product is summed, "exact" (§4) or "e4m3" (Hopper's E4M3 MMA, §4.1).
    """
    batch, hs, width = check_score_shapes(q_tile, block_table, out)
    mma = check_mma(mma)
    check_tensor("q_tile", q_tile, torch.float8_e4m3fn, 4)
    k_cache = check_pages("k_cache", k_cache, at_least=1)
    check_tensor("lens", lens, torch.int32, 1)
    if lens.shape[0] != batch:
        raise ValueError(f"lens: expected {batch} lengths (one per request of q_tile), got {lens.shape[0]}")
    n_scored = scored_pages(lens, width)
    own = stored_pages(lens).repeat_interleave(hs, dim=1)  # [B, 8 * Hs], per row
    num_blocks = k_cache.shape[0]
    q_all = q_tile.to(torch.float64).reshape(batch, SLOTS * hs, HEAD_DIM)
    work = _Workspace(min(PAGE_CHUNK, max(n_scored.tolist(), default=0)))
    for b in range(batch):
        n = int(n_scored[b])
        if n == 0:
            continue
        ids = block_table[b, :n].to(torch.int64)
        bad = (ids < 0) | (ids >= num_blocks)
        if bool(bad.any()):
            j = int(bad.nonzero()[0])
            raise ValueError(
                f"block_table: request {b}, column {j} holds block id {int(ids[j])}, outside [0, {num_blocks})"
            )
        # A row whose query holds NaN (an unused tile slot: 0xFF bytes) scores NaN; skip
        # its dot products rather than pay for them.
        live = ~torch.isnan(q_all[b]).any(dim=1)
        for start in range(0, n, PAGE_CHUNK):
            stop = min(start + PAGE_CHUNK, n)
            s = torch.full((SLOTS * hs, stop - start), torch.nan)
            if bool(live.any()):
                s[live] = page_scores(q_all[b][live], k_cache[ids[start:stop]], work, mma)
            keep = torch.arange(start, stop)[None, :] < own[b][:, None]
            view = out[b, :, start:stop]
            view.copy_(torch.where(keep, s, view))
    return out


def fp32_order_bound(q_tile: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """How far an fp32 accumulation in any order may land from ``score_pages``'s exactly
    rounded score: ``128 * 2^-24 * max_t sum_d |q_d k_td|`` (the classic bound for a 128-term
    fp32 sum; the tolerance a fast scorer is held to on random inputs).

    q_tile: e4m3 ``[B, 8, Hs, 128]``; k_cache: uint8 ``[N, 128, 72]``; block_table: int
    ``[B, W]`` (entries clamped into the cache). Returns float32 ``[B, 8 * Hs, W]``.
    """
    b, _, hs, _ = q_tile.shape
    k = dequantize_nvfp4(k_cache).abs()[block_table.long().clamp(0, k_cache.shape[0] - 1)]
    q = q_tile.float().abs().reshape(b, SLOTS * hs, HEAD_DIM)
    return 128 * 2.0**-24 * torch.einsum("brd,bwtd->brwt", q, k).amax(-1)
