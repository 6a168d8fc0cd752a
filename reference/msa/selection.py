"""MSA selection (docs/DESIGN.md §10.3): forced windows, the exact key, the ascending output."""

from __future__ import annotations

import torch

from indexer_constants import TOPK

from ..selection import exact_keys, keys_to_pages, top_keys

_I64 = torch.int64
_LAST = 1 << 40  # sorts after every block id; becomes -1


def forced(blocks: torch.Tensor, n: torch.Tensor, init_blocks: int, local_blocks: int) -> torch.Tensor:
    """Whether global block ``g`` is in a forced window of a row with causal count ``n``:
    ``g < init_blocks`` or ``g >= n - local_blocks`` (both inside ``[0, n)``).

    blocks, n: int64, broadcastable. Returns bool of the broadcast shape.
    """
    return (blocks < n) & ((blocks < init_blocks) | (blocks >= n - local_blocks))


def candidates(blocks: torch.Tensor, n: torch.Tensor, num_pages: int, init_blocks: int, local_blocks: int):
    """Whether global block ``g`` is ranked by its score: ``g < min(n, P)`` and not forced.

    blocks, n: int64, broadcastable (a row's blocks [1, W] against its counts [R, 1]).
    Returns bool of the broadcast shape.
    """
    return (blocks < torch.clamp(n, max=num_pages)) & ~forced(blocks, n, init_blocks, local_blocks)


def assemble(best_keys: torch.Tensor, n: torch.Tensor, init_blocks: int, local_blocks: int) -> torch.Tensor:
    """The output of each row from its best candidate keys, ascending, -1 padded at the end.

    best_keys: int64 ``[R, >= 16]`` descending (0 = no block); n: int64 ``[R]`` causal
    block counts. A row with ``n <= 16`` selects ``[0 .. n-1]``; a longer one its forced
    blocks (``init_blocks + local_blocks`` of them) and its best
    ``16 - init_blocks - local_blocks`` candidates. Returns int32 ``[R, 16]``.
    """
    rows = n.shape[0]
    ranked = TOPK - init_blocks - local_blocks
    picked = keys_to_pages(best_keys[:, :ranked])
    first = torch.arange(init_blocks, dtype=_I64).expand(rows, init_blocks)
    last = n[:, None] - local_blocks + torch.arange(local_blocks, dtype=_I64)
    chosen = torch.cat([first, last, picked], dim=1)
    chosen = torch.where(chosen < 0, _LAST, chosen).sort(dim=1).values
    k = torch.arange(TOPK, dtype=_I64)
    short = torch.where(k[None, :] < n[:, None], k[None, :], _LAST)
    out = torch.where((n <= TOPK)[:, None], short, chosen)
    return torch.where(out == _LAST, -1, out).to(torch.int32)


def select(scores: torch.Tensor, n: torch.Tensor, num_pages: int, init_blocks: int, local_blocks: int):
    """Each row's 16 outputs from its full-context block scores.

    scores: float32 ``[R, W]`` (column j = block j; only candidates are read); n: int64
    ``[R]``; num_pages: P. Returns int32 ``[R, 16]``.
    """
    width = scores.shape[1]
    j = torch.arange(width, dtype=_I64)
    valid = candidates(j[None, :], n[:, None], num_pages, init_blocks, local_blocks)
    clean = torch.where(valid, scores, torch.zeros((), dtype=scores.dtype))
    return assemble(top_keys(exact_keys(clean, j, valid), TOPK), n, init_blocks, local_blocks)
