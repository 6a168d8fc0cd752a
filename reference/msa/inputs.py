"""Input checks of the MSA format (docs/DESIGN.md §10.1): a clear exception naming the argument."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from indexer_constants import HEAD_DIM, MAX_PAGES, MAX_QUERY_LEN, PAGE, SUPPORTED_HEADS, TOPK

from ..arguments import check_int, check_tensor
from ..inputs import DecodeInputs, check_requests
from .rules import causal_blocks  # noqa: F401 (its name here before reference.msa.rules)

# The key dtypes this format takes; the queries come in the cache's dtype.
KEY_DTYPES = (torch.bfloat16, torch.float8_e4m3fn)


@dataclass(frozen=True)
class MsaInputs(DecodeInputs):
    """Checked MSA decode inputs, on the CPU: ``DecodeInputs`` with index_q bf16 or e4m3
    [rows, H, 128], k_cache the same dtype [N, 128, 128], and the forced windows
    init_blocks, local_blocks (init_blocks + local_blocks <= 16)."""

    init_blocks: int
    local_blocks: int


def check_windows(init_blocks, local_blocks) -> tuple[int, int]:
    """Both forced windows are ints >= 0 whose sum fits the 16 outputs."""
    init_blocks = check_int("init_blocks", init_blocks, low=0, high=TOPK)
    local_blocks = check_int("local_blocks", local_blocks, low=0, high=TOPK)
    if init_blocks + local_blocks > TOPK:
        raise ValueError(
            f"local_blocks: init_blocks + local_blocks must be <= {TOPK}, got {init_blocks} + {local_blocks}"
        )
    return init_blocks, local_blocks


def check_keys(name: str, x, dtype: torch.dtype | None = None, *, finite: bool = True) -> torch.Tensor:
    """A bf16 or e4m3 tensor (of ``dtype`` when given); with ``finite``, holding no NaN or
    infinity. Returns it on the CPU."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in KEY_DTYPES:
        raise TypeError(f"{name}: expected dtype bfloat16 or float8_e4m3fn, got {x.dtype}")
    if dtype is not None and x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype} (the k_cache dtype), got {x.dtype}")
    x = x.detach().cpu()
    if finite and not bool(torch.isfinite(x.float()).all()):
        raise ValueError(f"{name}: holds a NaN or an infinity (every value must be finite)")
    return x


def check_msa_inputs(index_q, k_cache, block_table, seq_lens, query_len, init_blocks, local_blocks) -> MsaInputs:
    """Check the MSA decode inputs against docs/DESIGN.md §10.1 and return them on the CPU.

    The length rule is the NVFP4 one (0 pads, else >= query_len). Read columns are the
    whole causal range the table holds, ``j < min(ceil(len / 128), P)``; their ids must
    lie in ``[0, N)`` and their pages must be finite.
    """
    query_len = check_int("query_len", query_len, low=1, high=MAX_QUERY_LEN)
    init_blocks, local_blocks = check_windows(init_blocks, local_blocks)
    kc = check_keys("k_cache", k_cache, finite=False)  # only the read pages must be finite
    if kc.dim() != 3 or tuple(kc.shape[1:]) != (PAGE, HEAD_DIM) or kc.shape[0] < 1:
        raise ValueError(f"k_cache: expected shape [N >= 1, {PAGE}, {HEAD_DIM}], got {list(kc.shape)}")
    q = check_keys("index_q", index_q, kc.dtype)
    check_tensor("block_table", block_table, torch.int32, 2)
    check_tensor("seq_lens", seq_lens, torch.int32, 1)
    bt, sl = block_table.detach().cpu(), seq_lens.detach().cpu()
    if q.dim() != 3 or q.shape[2] != HEAD_DIM:
        raise ValueError(f"index_q: expected [rows, H, {HEAD_DIM}], got {list(q.shape)}")
    if q.shape[1] not in SUPPORTED_HEADS:
        raise ValueError(f"index_q: head count must be one of {SUPPORTED_HEADS}, got {q.shape[1]}")
    read = -(-sl.to(torch.int64) // PAGE)  # the whole causal range, the own block included
    touched = check_requests(q.shape[0], bt, sl, query_len, read, kc.shape[0])
    num_pages = min(bt.shape[1], MAX_PAGES)
    ids = bt[:, :num_pages][touched[:, :num_pages]].to(torch.int64).unique()
    if ids.numel() and not bool(torch.isfinite(kc[ids].float()).all()):
        raise ValueError("k_cache: a page the table reads holds a NaN or an infinity (every read key must be finite)")
    return MsaInputs(
        q.contiguous(), kc.contiguous(), bt.contiguous(), sl.contiguous(), query_len, init_blocks, local_blocks
    )
