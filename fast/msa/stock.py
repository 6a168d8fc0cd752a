"""The stock (non-CP) decode for BF16 / FP8 keys under the MSA rules (docs/DESIGN.md §10):
q into the 8-slot tile, every block of the causal range scored with the token-level mask,
the forced windows and the best candidates by the exact key, output ascending."""

from __future__ import annotations

import torch

from indexer_constants import HEAD_DIM, SLOTS, TOPK

from .. import checks
from ..stock import StockDecode, StockPlan
from .kernels.stock import msa_bounds_kernel, msa_stock_select_kernel
from .scorer import KEY_FORMATS, score_blocks


class MsaStockDecode(StockDecode):
    """One rank's stock decode of its ``heads`` index heads for BF16 or FP8 keys: every
    block of each query's causal range scored, the forced windows ``init_blocks`` (the
    first) and ``local_blocks`` (the last) plus the best ``16 - init - local`` others,
    ascending with -1 padding (docs/DESIGN.md §10.3).

    ``StockDecode``'s state, plan and interface (``new_layer()``, ``plan()`` once per step,
    no host sync; ``forward(layer, plan, ...)``, ``check()``, ``reset()``), with this
    format's tile, id bounds (the whole causal range is read), scorer and select.
    key_format: "bf16" or "fp8" (the dtype of queries and keys); mma: ``StockDecode``'s
    ("e4m3" for "fp8" keys only).
    """

    BOUNDS_KERNEL = msa_bounds_kernel
    SELECT_KERNEL = msa_stock_select_kernel

    def __init__(
        self,
        *,
        heads: int,
        max_reqs: int,
        device: torch.device,
        key_format: str,
        init_blocks: int,
        local_blocks: int,
        pdl: bool = False,
        mma: str = "exact",
    ):
        if key_format not in KEY_FORMATS:
            raise ValueError(f"key_format: must be one of {tuple(KEY_FORMATS)}, got {key_format!r}")
        checks.forced_windows(init_blocks, local_blocks)
        self.key_format = key_format
        self.query_dtype = self.tile_dtype = KEY_FORMATS[key_format]  # before __init__ checks mma
        self.init_blocks, self.local_blocks = init_blocks, local_blocks
        super().__init__(heads=heads, max_reqs=max_reqs, device=device, pdl=pdl, mma=mma)

    def _check_forward(self, index_q, k_cache, out, query_len: int, batch: int) -> None:
        """forward's host checks: index_q [B * q, heads, 128] and k_cache [N, 128, 128], both
        in the key format; out int32 [B * q, heads, 16]."""
        checks.forward_inputs(
            index_q,
            k_cache,
            out,
            query_len,
            batch,
            self.heads,
            self.device,
            q_dtype=self.query_dtype,
            k_dtype=self.query_dtype,
            k_row=HEAD_DIM,
        )

    def _score(self, plan: StockPlan, k_cache: torch.Tensor, query_len: int, split_plan: tuple) -> None:
        """The MSA scorer over the plan's whole table (the token-level mask), the step's slots only."""
        score_blocks(
            plan.tile,
            k_cache,
            plan.block_table[:, : plan.pages],
            plan.seq_lens,
            plan.scores[:, :, : plan.pages],
            num_pages=plan.pages,
            first_slot=SLOTS - query_len,
            pdl=self.pdl,
            mma=self.mma,
        )

    def _select_args(self) -> tuple:
        """§10.3's select takes the forced windows (it ranks the blocks between them)."""
        return (self.init_blocks, self.local_blocks)

    def _select_width(self, columns: int, split: int) -> dict:
        """§10.3's select takes the columns of one program's slice."""
        return {"SLICE": columns}


def msa_stock_decode(
    index_q,
    k_cache,
    block_table,
    seq_lens,
    *,
    query_len: int,
    init_blocks: int,
    local_blocks: int,
    mma: str = "exact",
) -> torch.Tensor:
    """One stock MSA decode step on fresh buffers (a convenience: serving keeps a
    ``MsaStockDecode``). index_q: ``[B * q, H, 128]``, k_cache ``[N, 128, 128]`` (bf16 or
    e4m3, the same); block_table int32 ``[B, P_table]``; seq_lens int32 ``[B]``; mma: the
    scorer's MMA route (``MsaStockDecode``'s). Returns
    int32 ``[B * q, H, 16]``; raises what ``check()`` raises."""
    formats = {v: k for k, v in KEY_FORMATS.items()}
    if not isinstance(k_cache, torch.Tensor) or k_cache.dtype not in formats:
        got = getattr(k_cache, "dtype", type(k_cache).__name__)
        raise TypeError(f"k_cache: expected a bfloat16 or float8_e4m3fn tensor, got {got}")
    if not isinstance(index_q, torch.Tensor) or index_q.dim() != 3:
        raise ValueError(f"index_q: expected [B * q, H, {HEAD_DIM}], got {getattr(index_q, 'shape', index_q)}")
    decode = MsaStockDecode(
        heads=index_q.shape[1],
        max_reqs=max(1, seq_lens.shape[0]),
        device=index_q.device,
        key_format=formats[k_cache.dtype],
        init_blocks=init_blocks,
        local_blocks=local_blocks,
        mma=mma,
    )
    plan = decode.plan(block_table, seq_lens)
    out = torch.empty(index_q.shape[0], index_q.shape[1], TOPK, dtype=torch.int32, device=index_q.device)
    decode.forward(decode.new_layer(), plan, index_q, k_cache, out, query_len)
    decode.check()
    return out
