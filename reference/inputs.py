"""The NVFP4 format's input checks, shared by every entry point (the MSA format's twin:
``reference.msa.inputs``): a clear exception naming the argument."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from indexer_constants import (
    HEAD_DIM,
    MAX_PAGES,
    MAX_QUERY_LEN,
    PAGE,
    ROW_BYTES,
    SUPPORTED_CP,
    SUPPORTED_HEADS,
)

from .arguments import check_int, check_tensor
from .nvfp4 import split_pages

__all__ = ["DecodeInputs", "check_cp", "check_decode_inputs", "check_int", "check_requests", "check_tensor"]


@dataclass(frozen=True)
class DecodeInputs:
    """Checked decode inputs, on the CPU.

    index_q: [rows, H, 128]; k_cache: [N, 128, row]; block_table: int32 [B, P_table];
    seq_lens: int32 [B]; rows = B * query_len. NVFP4 (``check_decode_inputs``): e4m3
    queries and uint8 [N, 128, 72] pages; ``msa.inputs.MsaInputs`` extends it.
    """

    index_q: torch.Tensor
    k_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_len: int

    @property
    def batch(self) -> int:
        """B: requests."""
        return self.seq_lens.shape[0]

    @property
    def heads(self) -> int:
        """H: index heads of the queries."""
        return self.index_q.shape[1]

    @property
    def num_pages(self) -> int:
        """P = min(P_table, MAX_PAGES): the pages the table holds."""
        return min(self.block_table.shape[1], MAX_PAGES)


def _tensor(name: str, x, dtype: torch.dtype, dims: int) -> torch.Tensor:
    check_tensor(name, x, dtype, dims)
    return x.detach().cpu().contiguous()


def check_decode_inputs(index_q, k_cache, block_table, seq_lens, query_len) -> DecodeInputs:
    """Check the decode inputs against docs/DESIGN.md §3 and return them on the CPU.

    Raises TypeError for wrong types/dtypes and ValueError for wrong shapes or values, each
    naming the argument. A length is 0 (a padding request: nothing read, sixteen -1 per
    row) or at least query_len. Page ids are checked where they will be read: the first
    ``min((seq_len - 1) // 128, P)`` entries of each request's row.
    """
    query_len = check_int("query_len", query_len, low=1, high=MAX_QUERY_LEN)
    q = _tensor("index_q", index_q, torch.float8_e4m3fn, 3)
    kc = _tensor("k_cache", k_cache, torch.uint8, 3)
    bt = _tensor("block_table", block_table, torch.int32, 2)
    sl = _tensor("seq_lens", seq_lens, torch.int32, 1)
    rows, heads, dim = q.shape
    if dim != HEAD_DIM:
        raise ValueError(f"index_q: last dimension must be {HEAD_DIM}, got {dim}")
    if heads not in SUPPORTED_HEADS:
        raise ValueError(f"index_q: head count must be one of {SUPPORTED_HEADS}, got {heads}")
    qb = q.view(torch.uint8)
    if bool(((qb & 0x7F) == 0x7F).any()):
        raise ValueError("index_q: holds an E4M3 NaN byte (0x7F/0xFF), which marks an unwritten slot")
    if tuple(kc.shape[1:]) != (PAGE, ROW_BYTES) or kc.shape[0] < 1:
        raise ValueError(f"k_cache: expected shape [N >= 1, {PAGE}, {ROW_BYTES}], got {list(kc.shape)}")
    if bool(((split_pages(kc)[1] & 0x7F) == 0x7F).any()):
        raise ValueError("k_cache: a scale byte is an E4M3 NaN (0x7F/0xFF)")
    read = ((sl.to(torch.int64) - 1) // PAGE).clamp(min=0)  # pages before the own one
    check_requests(rows, bt, sl, query_len, read, kc.shape[0])
    return DecodeInputs(q, kc, bt, sl, query_len)


def check_requests(rows: int, bt: torch.Tensor, sl: torch.Tensor, query_len: int, read, num_blocks: int):
    """The checks both formats share, on CPU tensors: a table row per length and at least one
    column, ``rows = B * query_len`` query rows, the length rule, and every id the decode
    reads (columns ``j < min(read[b], P)``) a block of the cache. read: int64 ``[B]``.
    Returns bool ``[B, P_table]``: the columns read."""
    batch = sl.shape[0]
    if bt.shape[0] != batch:
        raise ValueError(f"block_table: expected {batch} rows (one per request in seq_lens), got {bt.shape[0]}")
    if bt.shape[1] < 1:
        raise ValueError("block_table: must have at least one column")
    if rows != batch * query_len:
        raise ValueError(f"index_q: expected {batch} * {query_len} = {batch * query_len} rows, got {rows}")
    # 0 is a padding request (its rows are sixteen -1); below query_len otherwise, a
    # request would have queries before its first token.
    invalid = (sl < query_len) & (sl != 0)
    if bool(invalid.any()):
        b = int(invalid.nonzero()[0])
        raise ValueError(
            f"seq_lens: request {b} has length {int(sl[b])}; a length is 0 (padding) or >= query_len ({query_len})"
        )
    read = read.clamp(max=min(bt.shape[1], MAX_PAGES))
    touched = torch.arange(bt.shape[1])[None, :] < read[:, None]
    bad = touched & ((bt < 0) | (bt >= num_blocks))
    if bool(bad.any()):
        b, j = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"block_table: entry [{b}, {j}] = {int(bt[b, j])} is not a page of k_cache (N = {num_blocks})")
    return touched


def check_cp(cp) -> int:
    """CP must be one of {1, 2, 4, 8}."""
    return check_int("cp", cp, allowed=SUPPORTED_CP)
