"""Every CP rank of one decode step, simulated in one process (docs/DESIGN.md §6).

The simulation keeps each rank's symmetric buffers (its q tile and its receive buffer) as
separate tensors and moves data between them only the way the protocol does: stores into
peers' buffers whose payload is the flag (0xFF bytes for q, -1 for keys). Where a real rank
would spin forever (a flag that never clears), the simulation raises instead. A request
whose every row is short is neither exchanged nor scored (``long_requests``): a step with
none touches no buffer, which is why the real ranks keep their step parity then.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from indexer_constants import HEAD_DIM, PAGE, PENDING, RANKED, SLOTS, TOPK

from .arguments import check_mma
from .decode import UNWRITTEN_Q, query_rows
from .inputs import DecodeInputs, check_cp, check_decode_inputs, check_int
from .rules import long_requests, long_rows, own_pages, read_pages
from .scores import score_pages
from .selection import assemble_rows, exact_keys, keys_to_pages, keys_to_scores, top_keys, two_level_top16

_I64 = torch.int64


@dataclass(frozen=True)
class HeadLayout:
    """Which heads each rank owns: ``Hr = max(1, H / CP)`` heads per rank, each head on
    ``R = max(1, CP / H)`` replica ranks; rank r owns ``[(r // R) * Hr, (r // R + 1) * Hr)``."""

    cp: int
    heads: int

    @property
    def heads_per_rank(self) -> int:
        """Hr: heads a rank owns."""
        return max(1, self.heads // self.cp)

    @property
    def replicas(self) -> int:
        """R: ranks that own each head."""
        return max(1, self.cp // self.heads)

    def heads_of(self, rank: int) -> range:
        """The Hr consecutive heads rank ``rank`` owns."""
        first = (rank // self.replicas) * self.heads_per_rank
        return range(first, first + self.heads_per_rank)

    def owners_of(self, head: int) -> list[int]:
        """The R ranks that own ``head``, ascending."""
        return [r for r in range(self.cp) if head in self.heads_of(r)]


def compact_width(num_pages: int, cp: int) -> int:
    """``W = ceil(P / CP) + 1``: every page a rank can own, plus the page its length invents."""
    return -(-num_pages // cp) + 1


def plan_rank(block_table: torch.Tensor, seq_lens: torch.Tensor, num_pages: int, width: int, cp: int, rank: int):
    """Step 0, plan: rank r's compact block table and the length its scorer is handed.

    block_table: int32 ``[B, P_table]``; seq_lens: int32 ``[B]``. Returns
    (cbt int32 ``[B, W]`` with ``cbt[b, j] = bt[b, min(j * CP + r, P - 1)]``,
    n_local int64 ``[B]`` = pages of the rank below ``hist = clamp((len - 1) // 128, 0, P)``,
    capped at W - 1, score_lens int32 ``[B]`` = ``n_local * 128 + 8`` for long requests, 0
    (nothing scored) for the others: ``long_requests``).
    The length is a deliberate lie: it puts all 8 slots one page past the chunk, so the
    scorer stores every owned page for every slot; the real causal cut comes back in the
    local top-16.
    """
    j = torch.arange(width, dtype=_I64)
    src = (j * cp + rank).clamp_max(num_pages - 1)
    cbt = block_table[:, src]
    hist = read_pages(seq_lens, num_pages)
    n_local = ((hist + cp - 1 - rank) // cp).clamp_max(width - 1)
    score_lens = torch.where(long_requests(seq_lens), n_local * PAGE + SLOTS, 0)
    return cbt, n_local, score_lens.to(torch.int32)


def rank_cut(own: torch.Tensor, n_local: torch.Tensor, cp: int, rank: int) -> torch.Tensor:
    """Pages of rank r below each query's own page, ``min(ceil((own - r) / CP), n_local)``.

    own, n_local: int64, broadcastable. The bound by n_local (what the scorer stored) keeps
    a length past the page table from reaching an unwritten column.
    """
    return torch.minimum(((own + cp - 1 - rank) // cp).clamp(min=0), n_local)


def local_top16(
    scores: torch.Tensor, own: torch.Tensor, n_local: torch.Tensor, query_len: int, cp: int, rank: int
) -> torch.Tensor:
    """Step 3, local top-16: each (query, head)'s exact top 16 of the rank's pages below own.

    scores: float32 ``[B, 8 * H, W]`` compact scores (NaN = never written); own: int64
    ``[rows]``; n_local: int64 ``[B]``. Returns int64 keys ``[rows, H, 16]`` (0 = no page;
    short rows, which push nothing, get no pages). The cut
    ``n_rank = min(ceil((own - r) / CP), n_local)`` restores causality and never reaches
    past what the scorer stored, also when own lies past the page table.
    """
    batch, _, width = scores.shape
    heads = scores.shape[1] // SLOTS
    s = query_rows(scores, query_len, heads)  # [rows, H, W]
    rows = s.shape[0]
    n_rank = torch.where(long_rows(own), rank_cut(own, n_local.repeat_interleave(query_len), cp, rank), 0)
    j = torch.arange(width, dtype=_I64)
    valid = (j[None, :] < n_rank[:, None])[:, None, :].expand(rows, heads, width)
    if bool(torch.isnan(s[valid]).any()):
        raise RuntimeError(f"rank {rank}: the local top-16 would read a score column the scorer did not write")
    keys = exact_keys(torch.where(valid, s, 0.0), j * cp + rank, valid)
    return two_level_top16(keys.reshape(rows * heads, width)).view(rows, heads, TOPK)


def merge_candidates(received: torch.Tensor, own: torch.Tensor, rank: int) -> torch.Tensor:
    """Step 4, merge: the owner's best 15 of the CP * 16 candidates, own page in slot 15.

    received: int64 ``[CP, rows, Hr, 16]`` (-1 = not yet pushed); own: int64 ``[rows]``.
    Returns int32 ``[rows, Hr, 16]``. Exact: the global top 15 of a union lies in the union
    of the parts' top 16s. Raises where a long row still holds -1 (a real merge would spin).
    """
    cp, rows, hr, _ = received.shape
    cands = received.permute(1, 2, 0, 3).reshape(rows, hr, cp * TOPK)
    ranked = long_rows(own)
    if bool((cands[ranked] == PENDING).any()):
        raise RuntimeError(f"rank {rank}: a long row is missing a peer's candidates (the merge would spin)")
    best = top_keys(torch.where(cands == PENDING, 0, cands).view(rows * hr, cp * TOPK), RANKED)
    return assemble_rows(best, own.repeat_interleave(hr)).view(rows, hr, TOPK)


@dataclass
class RankTrace:
    """What one rank saw and did in one step (B requests, rows = B * q, W compact columns).

    compact_table: int32 [B, W]; n_local: int64 [B]; score_lens: int32 [B] (the lie);
    scores: float32 [B, 8 * H, W], NaN where the scorer wrote nothing; local_keys: int64
    [rows, H, 16], what the rank pushed (-1 for short rows: nothing pushed); received:
    int64 [CP, rows, Hr, 16], the candidates its merge found; merged: int32 [rows, Hr, 16].
    """

    rank: int
    heads: tuple[int, ...]
    compact_table: torch.Tensor
    n_local: torch.Tensor
    score_lens: torch.Tensor
    scores: torch.Tensor
    local_keys: torch.Tensor
    received: torch.Tensor = field(default=None)
    merged: torch.Tensor = field(default=None)

    def candidates(self, row: int, head: int) -> list[tuple[int, float]]:
        """What this rank pushed for ``row`` and ``head`` (an index into all H heads), read:
        (page, fp32 score) pairs, best first; [] for a short row (nothing pushed)."""
        keys = self.local_keys[row, head]
        return [(p, s) for p, s in zip(keys_to_pages(keys).tolist(), keys_to_scores(keys).tolist()) if p >= 0]


@dataclass
class CPTrace:
    """The whole step: the layout, the compact width and every rank's trace."""

    layout: HeadLayout
    width: int
    own: torch.Tensor  # int64 [rows]
    ranks: list[RankTrace]


def _simulate(inputs: DecodeInputs, cp: int, width: int | None, mma: str) -> tuple[torch.Tensor, CPTrace]:
    layout = HeadLayout(cp, inputs.heads)
    batch, q, heads = inputs.batch, inputs.query_len, inputs.heads
    rows, hr = batch * q, layout.heads_per_rank
    num_pages = inputs.num_pages
    need = compact_width(num_pages, cp)
    if width is None:
        width = need
    elif check_int("width", width) < need:
        raise ValueError(f"width: must be at least ceil(P / CP) + 1 = {need} for P = {num_pages}, got {width}")
    own = own_pages(inputs.seq_lens, q)
    ranked = long_rows(own)
    slots = slice(SLOTS - q, SLOTS)

    # Each rank's symmetric buffers, armed: q tile [B, 8, H, 128] bytes, receive [CP, rows, Hr, 16].
    tiles = [torch.full((batch, SLOTS, heads, HEAD_DIM), UNWRITTEN_Q, dtype=torch.uint8) for _ in range(cp)]
    recv = [torch.full((cp, rows, hr, TOPK), PENDING, dtype=_I64) for _ in range(cp)]

    # 1. q exchange, long requests only: every rank stores its heads' rows into every
    # rank's tile ...
    long_reqs = long_requests(inputs.seq_lens)
    q_bytes = inputs.index_q.view(torch.uint8).view(batch, q, heads, HEAD_DIM)
    for r in range(cp):
        for h in layout.heads_of(r):
            for dst in range(cp):
                tiles[dst][long_reqs, slots, h] = q_bytes[long_reqs, :, h]
    # ... then waits until its own tile rows hold no 0xFF byte.
    for r in range(cp):
        if bool((tiles[r][long_reqs, slots] == UNWRITTEN_Q).any()):
            raise RuntimeError(f"rank {r}: q tile still holds 0xFF after the exchange (it would spin)")

    traces = []
    for r in range(cp):
        # 0. plan, 2. score on the compact table with the lying lengths.
        cbt, n_local, score_lens = plan_rank(inputs.block_table, inputs.seq_lens, num_pages, width, cp, r)
        scores = torch.full((batch, SLOTS * heads, width), torch.nan)
        score_pages(tiles[r].view(torch.float8_e4m3fn), inputs.k_cache, cbt, score_lens, scores, mma=mma)
        # 3. local top-16 + push into slot r of every owner's receive buffer.
        keys = local_top16(scores, own, n_local, q, cp, r)
        for h in range(heads):
            for o in layout.owners_of(h):
                recv[o][r, ranked, h - layout.heads_of(o).start] = keys[ranked, h]
        pushed = torch.where(ranked[:, None, None], keys, PENDING)
        traces.append(RankTrace(r, tuple(layout.heads_of(r)), cbt, n_local, score_lens, scores, pushed))

    out = torch.full((rows, heads, TOPK), PENDING, dtype=torch.int32)
    for o in range(cp):
        # 4. merge, then reset the candidates to -1 and re-arm the used tile rows to 0xFF.
        traces[o].received = recv[o].clone()
        merged = merge_candidates(recv[o], own, o)
        recv[o].fill_(PENDING)
        tiles[o][long_reqs, slots] = UNWRITTEN_Q
        traces[o].merged = merged
        place_merged(out, merged, layout, o)
    check_rearmed([bool((t == UNWRITTEN_Q).all()) for t in tiles], recv)
    return out, CPTrace(layout, width, own, traces)


def place_merged(out: torch.Tensor, merged: torch.Tensor, layout: HeadLayout, owner: int) -> None:
    """Write owner rank's merged rows (int32 ``[rows, Hr, 16]``) into ``out`` ``[rows, H,
    16]``; a replica of a head (not its first owner) must agree with what is there."""
    for k, h in enumerate(layout.heads_of(owner)):
        if owner != layout.owners_of(h)[0] and not torch.equal(out[:, h], merged[:, k]):
            raise RuntimeError(f"rank {owner}: its merge of head {h} differs from another replica's")
        out[:, h] = merged[:, k]


def check_rearmed(tiles_armed: list[bool], recv: list[torch.Tensor]) -> None:
    """The step must leave every buffer armed for the next one (a real next step would
    otherwise read stale queries or candidates as if they had arrived): per rank, whether
    its q tile holds only the unwritten pattern, and its receive buffer only -1."""
    for r, armed in enumerate(tiles_armed):
        if not armed or not bool((recv[r] == PENDING).all()):
            raise RuntimeError(f"rank {r}: the step left a buffer un-armed (a stale q or candidate)")


def cp_decode(index_q, k_cache, block_table, seq_lens, query_len, *, cp, width=None, trace=False, mma="exact"):
    """Decode with CP ranks simulated step by step; must equal ``full_decode`` bit for bit.

    index_q: float8_e4m3fn ``[rows, H, 128]``; k_cache: uint8 ``[N, 128, 72]``;
    block_table: int32 ``[B, P_table]``; seq_lens: int32 ``[B]``; query_len: 1..8;
    cp: 1, 2, 4 or 8; width: the compact width W (default ``ceil(P / CP) + 1``; a larger
    one, as a plan fixed by a wider first table, must not change the output); mma: the
    scorer's MMA route, as ``full_decode``'s (CP equals the full decode of the same route).
    Returns int32 ``[rows, H, 16]``, or ``(out, CPTrace)`` with ``trace=True``.
    """
    cp = check_cp(cp)
    mma = check_mma(mma)
    inputs = check_decode_inputs(index_q, k_cache, block_table, seq_lens, query_len)
    out, tr = _simulate(inputs, cp, width, mma)
    return (out, tr) if trace else out
