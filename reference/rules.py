"""The contract's per-row rules (docs/DESIGN.md §3, §6), each spelled once for the
reference: the causal cut (a query's own page), which requests are long and which rows are
short, and a short row's output. ``fast.kernels.rules`` spells the same rules for the
kernels.
"""

import torch

from indexer_constants import PAGE, SLOTS, TOPK

_I64 = torch.int64


def own_page(lens: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """The causal cut: the page that holds the query of tile slot ``slot`` (0..7; a step of
    q queries fills the last q slots) of a request of ``lens`` tokens, ``(len - 8 + slot)
    // 128``. Pages below it are ranked; it is the row's own page. lens and slot broadcast
    (int); returns int64 (negative for a slot before a short request's first token)."""
    return (lens.to(_I64) - SLOTS + slot.to(_I64)) // PAGE


def read_pages(lens: torch.Tensor, width: int) -> torch.Tensor:
    """NVFP4 (§3): the table columns a request reads, and its scorer scores:
    ``min((len - 1) // 128, width)``, 0 for ``len < 1``. lens: int ``[B]``; returns int64."""
    return ((lens.to(_I64) - 1) // PAGE).clamp(0, width)


def own_pages(seq_lens: torch.Tensor, query_len: int) -> torch.Tensor:
    """``own_page`` of every row of a step: ``(seq_len - query_len + i) // 128`` for row
    ``b * query_len + i``. seq_lens: int ``[B]``. Returns int64 ``[B * query_len]``."""
    slots = SLOTS - query_len + torch.arange(query_len, dtype=_I64)
    return own_page(seq_lens[:, None], slots[None, :]).reshape(-1)


def long_rows(own: torch.Tensor) -> torch.Tensor:
    """bool: rows whose causal pages ``0 .. own`` do not fit the output (``own + 1 > 16``);
    they are ranked, every other row's output is ``short_rows``'."""
    return own + 1 > TOPK


def long_requests(seq_lens: torch.Tensor) -> torch.Tensor:
    """bool ``[B]``: requests with a long row, i.e. whose last query's own page
    ``(len - 1) // 128`` is >= 16 (seq_lens: int32 ``[B]``).

    Only these are exchanged and scored: every row of any other request is short, its
    output follows from its length alone, so its q and its scores would never be read. A
    step with no long request touches no symmetric buffer at all."""
    return seq_lens.to(_I64) > TOPK * PAGE


def short_rows(own: torch.Tensor) -> torch.Tensor:
    """Output of short rows (``own + 1 <= 16``): ``[0, 1, ..., own, -1, ...]``.

    own: int64 ``[R]``. Returns int32 ``[R, 16]`` (meaningful only where own < 16).
    """
    k = torch.arange(TOPK, dtype=_I64)
    return torch.where(k[None, :] <= own[:, None], k[None, :], -1).to(torch.int32)
