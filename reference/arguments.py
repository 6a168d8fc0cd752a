"""Argument checks every reference entry point shares: a TypeError or ValueError whose
message starts with the argument's name. Imports nothing else of the reference, so the
format module can use it too."""

from __future__ import annotations

import torch

from indexer_constants import MMA_ROUTES, PAGE, ROW_BYTES


def check_tensor(name: str, x, dtype: torch.dtype, dims: int) -> None:
    """A torch.Tensor of this dtype and rank, or TypeError/ValueError naming the argument."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {x.dtype}")
    if x.dim() != dims:
        raise ValueError(f"{name}: expected {dims} dimensions, got shape {list(x.shape)}")


def check_int(name: str, value, allowed=None, low=None, high=None) -> int:
    """Check a Python int argument (bools rejected); raise TypeError/ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if allowed is not None and value not in allowed:
        raise ValueError(f"{name}: must be one of {tuple(allowed)}, got {value}")
    if low is not None and value < low or high is not None and value > high:
        bound = f"in {low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"{name}: must be {bound}, got {value}")
    return value


def check_mma(mma) -> str:
    """The scorer's MMA route: one of ``MMA_ROUTES`` (DESIGN §4.1), or ValueError naming
    ``mma``."""
    if not isinstance(mma, str) or mma not in MMA_ROUTES:
        raise ValueError(f"mma: must be one of {MMA_ROUTES}, got {mma!r}")
    return mma


def check_pages(name: str, pages, *, at_least: int = 0) -> torch.Tensor:
    """NVFP4 pages: uint8 ``[n >= at_least, 128, 72]``, contiguous (a strided view would be
    read as other bytes). Returns them on the CPU."""
    check_tensor(name, pages, torch.uint8, 3)
    if tuple(pages.shape[1:]) != (PAGE, ROW_BYTES) or pages.shape[0] < at_least:
        n = "N" if at_least == 0 else f"N >= {at_least}"
        raise ValueError(f"{name}: expected shape [{n}, {PAGE}, {ROW_BYTES}], got {list(pages.shape)}")
    if not pages.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (strides {pages.stride()})")
    return pages.detach().cpu()


def check_row_head(index_q: torch.Tensor, row, head) -> None:
    """``row`` and ``head`` name one (query row, head) of ``index_q`` ``[rows, H, 128]``."""
    rows, heads = index_q.shape[:2]
    if not 0 <= row < rows:
        raise ValueError(f"row: the case has {rows} rows (0..{rows - 1}), got {row}")
    if not 0 <= head < heads:
        raise ValueError(f"head: the case has {heads} heads (0..{heads - 1}), got {head}")
