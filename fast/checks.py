"""Host-side checks of the fast path's inputs: metadata only (no device sync), a clear
exception naming the argument, raised before any kernel is launched."""

from __future__ import annotations

import torch

from reference.constants import HEAD_DIM, MAX_QUERY_LEN, PAGE, ROW_BYTES, TOPK
from reference.validate import check_int, check_tensor


def _tensor(name: str, x, dtype: torch.dtype, dims: int, device: torch.device) -> None:
    check_tensor(name, x, dtype, dims)
    if x.device != device:
        raise ValueError(f"{name}: expected device {device}, got {x.device}")
    if not x.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (strides {x.stride()})")


def plan_inputs(block_table, seq_lens, max_reqs: int, device: torch.device) -> int:
    """block_table int32 [B, P_table >= 1], seq_lens int32 [B], B <= max_reqs. Returns B."""
    _tensor("block_table", block_table, torch.int32, 2, device)
    _tensor("seq_lens", seq_lens, torch.int32, 1, device)
    batch = seq_lens.shape[0]
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table: expected {batch} rows (one per request in seq_lens), got {block_table.shape[0]}")
    if block_table.shape[1] < 1:
        raise ValueError("block_table: must have at least one column")
    if batch > max_reqs:
        raise ValueError(f"seq_lens: {batch} requests, more than the {max_reqs} this state was built for")
    return batch


def table_not_wider(width: int, planned: int) -> None:
    if width > planned:
        raise ValueError(f"block_table: {width} pages is wider than the {planned} fixed by the first plan")


def forward_inputs(index_q, k_cache, out, query_len, batch: int, heads: int, device: torch.device) -> None:
    """index_q e4m3 [B * q, heads, 128], k_cache uint8 [N, 128, 72], out int32 [B * q, heads, 16]."""
    check_int("query_len", query_len, low=1, high=MAX_QUERY_LEN)
    rows = batch * query_len
    _tensor("index_q", index_q, torch.float8_e4m3fn, 3, device)
    if tuple(index_q.shape) != (rows, heads, HEAD_DIM):
        raise ValueError(f"index_q: expected [{rows}, {heads}, {HEAD_DIM}] (planned requests x query_len), got {list(index_q.shape)}")
    _tensor("k_cache", k_cache, torch.uint8, 3, device)
    if tuple(k_cache.shape[1:]) != (PAGE, ROW_BYTES):
        raise ValueError(f"k_cache: expected [N, {PAGE}, {ROW_BYTES}], got {list(k_cache.shape)}")
    _tensor("out", out, torch.int32, 3, device)
    if tuple(out.shape) != (rows, heads, TOPK):
        raise ValueError(f"out: expected [{rows}, {heads}, {TOPK}], got {list(out.shape)}")

