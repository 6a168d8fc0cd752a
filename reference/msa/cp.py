"""Every CP rank of one MSA decode step, simulated in one process (docs/DESIGN.md §10.4).

The protocol is the NVFP4 one (§6): the same head layout, long requests, q exchange whose
payload is the flag (here the all-ones element), push of each rank's top-16 keys, merge by
the owner. What differs: rank r's scorer is told that compact column j is global block
``j * CP + r`` and masks tokens at their global positions, so no length is invented; the
push ranks only the rank's candidates (not forced, below ``min(n, P)``); the merge keeps
the best ``16 - init - local`` and adds the forced blocks, ascending.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from indexer_constants import HEAD_DIM, PENDING, SLOTS, TOPK

from ..arguments import check_int
from ..cp import HeadLayout, check_rearmed, place_merged
from ..inputs import check_cp
from ..rules import long_requests, long_rows
from ..selection import exact_keys, top_keys, two_level_top16
from .decode import bits_view, query_rows, unwritten, unwritten_tile
from .inputs import check_msa_inputs
from .rules import causal_blocks
from .scores import check_msa_mma, score_blocks
from .selection import assemble, candidates

_I64 = torch.int64


def msa_width(num_pages: int, cp: int) -> int:
    """``W = ceil(P / CP)``: every block a rank can own (no invented block is needed)."""
    return -(-num_pages // cp)


def compact_table(block_table: torch.Tensor, num_pages: int, width: int, cp: int, rank: int) -> torch.Tensor:
    """Rank r's table: ``cbt[b, j] = bt[b, j * CP + r]`` where that block is held (< P),
    -1 elsewhere (never read: the scorer computes only blocks below P).

    block_table: int32 ``[B, P_table]``. Returns int32 ``[B, W]``."""
    g = torch.arange(width, dtype=_I64) * cp + rank
    held = g < num_pages
    cbt = torch.full((block_table.shape[0], width), -1, dtype=torch.int32)
    cbt[:, held] = block_table[:, g[held]]
    return cbt


def local_top16(scores, n, num_pages, windows, query_len, cp, rank):
    """Each (query, head)'s exact top 16 of rank r's candidate blocks.

    scores: float32 ``[B, 8 * H, W]`` compact scores (NaN = not stored); n: int64
    ``[rows]``; windows: (init_blocks, local_blocks). Returns int64 keys ``[rows, H, 16]``
    (0 = no block; short rows get none). Raises if a candidate's column was never stored.
    """
    heads = scores.shape[1] // SLOTS
    s = query_rows(scores, query_len, heads)
    rows, _, width = s.shape
    g = torch.arange(width, dtype=_I64) * cp + rank
    # Only long rows (n > 16) rank anything: a short row's output follows from n alone.
    valid = candidates(g[None, :], n[:, None], num_pages, *windows) & long_rows(n - 1)[:, None]
    valid = valid[:, None, :].expand(rows, heads, width)
    if bool(torch.isnan(s[valid]).any()):
        raise RuntimeError(f"rank {rank}: the local top-16 would read a score column the scorer did not write")
    keys = exact_keys(torch.where(valid, s, 0.0), g, valid)
    return two_level_top16(keys.reshape(rows * heads, width)).view(rows, heads, TOPK)


@dataclass
class MsaRankTrace:
    """One rank's step: compact_table int32 [B, W]; scores float32 [B, 8 * H, W];
    local_keys int64 [rows, H, 16] (-1 where nothing was pushed); received int64
    [CP, rows, Hr, 16]; merged int32 [rows, Hr, 16]."""

    rank: int
    heads: tuple[int, ...]
    compact_table: torch.Tensor
    scores: torch.Tensor
    local_keys: torch.Tensor
    received: torch.Tensor = field(default=None)
    merged: torch.Tensor = field(default=None)


@dataclass
class MsaTrace:
    """The whole step: layout, compact width, causal block counts int64 [rows], ranks."""

    layout: HeadLayout
    width: int
    n: torch.Tensor
    ranks: list[MsaRankTrace]


def cp_decode(
    index_q,
    k_cache,
    block_table,
    seq_lens,
    query_len,
    *,
    init_blocks,
    local_blocks,
    cp,
    width=None,
    trace=False,
    mma="exact",
):
    """MSA decode with CP ranks simulated step by step; must equal ``full_decode`` bit for bit.

    Arguments as ``full_decode``, plus cp: 1, 2, 4 or 8; width: the compact width (default
    ``ceil(P / CP)``; a larger one must not change the output); mma: as ``full_decode``'s.
    Returns int32
    ``[rows, H, 16]``, or ``(out, MsaTrace)`` with ``trace=True``.
    """
    cp = check_cp(cp)
    inputs = check_msa_inputs(index_q, k_cache, block_table, seq_lens, query_len, init_blocks, local_blocks)
    mma = check_msa_mma(mma, inputs.k_cache.dtype)
    batch, q, heads, p = inputs.batch, inputs.query_len, inputs.heads, inputs.num_pages
    need = msa_width(p, cp)
    width = need if width is None else check_int("width", width, low=need)
    layout = HeadLayout(cp, heads)
    rows, hr = batch * q, layout.heads_per_rank
    windows = (inputs.init_blocks, inputs.local_blocks)
    n = causal_blocks(inputs.seq_lens, q)
    ranked = long_rows(n - 1)
    long_reqs = long_requests(inputs.seq_lens)
    slots = slice(SLOTS - q, SLOTS)
    dtype = inputs.index_q.dtype
    flag = unwritten(dtype)

    # Armed buffers: each rank's q tile (all-ones elements) and receive buffer (-1 keys).
    tiles = [unwritten_tile((batch, SLOTS, heads, HEAD_DIM), dtype) for _ in range(cp)]
    recv = [torch.full((cp, rows, hr, TOPK), PENDING, dtype=_I64) for _ in range(cp)]

    # 1. q exchange (long requests): every rank stores its heads' rows into every tile ...
    q_rows = inputs.index_q.view(batch, q, heads, HEAD_DIM)
    for r in range(cp):
        for h in layout.heads_of(r):
            for dst in range(cp):
                tiles[dst][long_reqs, slots, h] = q_rows[long_reqs, :, h]
    # ... and waits until its own tile's rows hold no all-ones element.
    for r in range(cp):
        if bool((bits_view(tiles[r][long_reqs, slots]) == flag).any()):
            raise RuntimeError(f"rank {r}: q tile still holds an unwritten element after the exchange (it would spin)")

    traces = []
    for r in range(cp):
        # 2. score the rank's blocks at their global positions, long requests only.
        cbt = compact_table(inputs.block_table, p, width, cp, r)
        lens = torch.where(long_reqs, inputs.seq_lens, 0).to(torch.int32)
        scores = torch.full((batch, SLOTS * heads, width), torch.nan)
        score_blocks(tiles[r], inputs.k_cache, cbt, lens, scores, num_pages=p, stride=cp, offset=r, mma=mma)
        # 3. local top-16 of long rows, pushed into slot r of every owner's buffer.
        keys = local_top16(scores, n, p, windows, q, cp, r)
        for h in range(heads):
            for o in layout.owners_of(h):
                recv[o][r, ranked, h - layout.heads_of(o).start] = keys[ranked, h]
        pushed = torch.where(ranked[:, None, None], keys, PENDING)
        traces.append(MsaRankTrace(r, tuple(layout.heads_of(r)), cbt, scores, pushed))

    out = torch.full((rows, heads, TOPK), PENDING, dtype=torch.int32)
    for o in range(cp):
        # 4. merge: long rows wait for every candidate; then reset and re-arm.
        traces[o].received = recv[o].clone()
        cands = recv[o].permute(1, 2, 0, 3).reshape(rows, hr, cp * TOPK)
        if bool((cands[ranked] == PENDING).any()):
            raise RuntimeError(f"rank {o}: a long row is missing a peer's candidates (the merge would spin)")
        best = top_keys(torch.where(cands == PENDING, 0, cands).view(rows * hr, cp * TOPK), TOPK)
        merged = assemble(best, n.repeat_interleave(hr), *windows).view(rows, hr, TOPK)
        recv[o].fill_(PENDING)
        # re-armed: the rows it read (a whole tensor of the pattern: a scalar fill could
        # canonicalize the NaN's bits)
        tiles[o][long_reqs, slots] = unwritten_tile(tiles[o][long_reqs, slots].shape, dtype)
        traces[o].merged = merged
        place_merged(out, merged, layout, o)
    check_rearmed([bool((bits_view(t) == flag).all()) for t in tiles], recv)
    return (out, MsaTrace(layout, width, n, traces)) if trace else out
