"""What each rank runs for the CLI and the demo (``decode_on_rank``), and the parent-side
assembly of the ranks' outputs into ``[rows, H, 16]``."""

from __future__ import annotations

import time

import torch

from ..build import build_cp_decode
from ..cp import IndexerDecodeCP
from ..layout import HeadLayout
from ..msa.cp import MsaDecodeCP
from ..msa.scorer import KEY_FORMATS
from ..msa.stock import MsaStockDecode
from ..select.policy import force_select
from ..stock import StockDecode


def on_device(device, case: dict) -> dict:
    """A case dict with its tensors moved to ``device``."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in case.items()}


def case_format(case: dict) -> tuple[str, dict]:
    """(key format, forced windows) of a case dict: an MSA case (``reference.msa.MsaCase``)
    holds its windows, and its keys' dtype names the format; any other is "nvfp4", no windows."""
    if "init_blocks" not in case:
        return "nvfp4", {}
    formats = {dtype: name for name, dtype in KEY_FORMATS.items()}
    return formats[case["k_cache"].dtype], {"init_blocks": case["init_blocks"], "local_blocks": case["local_blocks"]}


def decode_on_rank(
    ctx,
    case: dict,
    path: str,
    *,
    steps: int = 1,
    spin_timeout_s: float | None = None,
    max_chunk: int | None = None,
    split: int | None = None,
    skip_forward: bool = False,
    poison: bool = False,
    warmup: int = 0,
    pdl: bool = False,
    mma: str = "exact",
) -> dict:
    """Run one decode case on this rank: ``path`` is "cp", "stock", or "auto" (CP where
    ``build_cp_decode`` allows it, else the stock decode with the reason logged), for the
    case's format (``case_format``: an MSA case runs ``MsaDecodeCP`` / ``MsaStockDecode``).

    case: the CLI case dict (CPU tensors). Runs ``steps`` back-to-back forwards of one layer
    (nothing else synchronizes the ranks between them) and returns
    ``{"heads": [...], "out": int32 [rows, len(heads), 16] (last step), "all_equal": bool,
    "seconds": per-step wall time}``. ``skip_forward`` makes this rank plan but never call
    forward (the missing-peer test). ``poison`` fills the plan's score buffer (either path's)
    with 1e30 before every forward, so a read of a column the scorer did not write would rank
    first.
    ``warmup`` untimed steps run first (kernel compilation). ``pdl``: PDL launches (GPUs).
    ``mma``: the scorer's MMA route (the states' ``mma``).
    ``max_chunk`` / ``split``: the top-16 select's shape (``select.policy.force_select``;
    max_chunk applies to the CP path's push); None keeps the policy.
    ``"path"`` in the result says which path ran.
    """
    c = on_device(ctx.device, case)
    q, heads = c["index_q"], c["index_q"].shape[1]
    layout = HeadLayout(ctx.world, heads)
    owned = list(layout.heads_of(ctx.rank))
    rows = q.shape[0]
    batch = c["seq_lens"].shape[0]
    key_format, windows = case_format(c)
    if path not in ("cp", "stock", "auto"):
        raise ValueError(f"path: expected 'cp', 'stock' or 'auto', got {path!r}")
    state = None
    if path == "auto":
        state = build_cp_decode(
            heads=heads,
            max_reqs=max(1, batch),
            max_query_len=c["query_len"],
            symm=ctx.symm,
            world=ctx.world,
            symm_reason=ctx.symm_reason,
            spin_timeout_s=spin_timeout_s,
            pdl=pdl,
            mma=mma,
            key_format=key_format,
            **windows,
        )
        path = "stock" if state is None else "cp"
    if path == "cp" and state is None:
        common = dict(
            heads=heads, max_reqs=max(1, batch), symm=ctx.symm, spin_timeout_s=spin_timeout_s, pdl=pdl, mma=mma
        )
        if windows:
            state = MsaDecodeCP(**common, key_format=key_format, **windows)
        else:
            state = IndexerDecodeCP(**common)
    elif path == "stock":
        common = dict(heads=len(owned), max_reqs=max(1, batch), device=ctx.device, pdl=pdl, mma=mma)
        if windows:
            state = MsaStockDecode(**common, key_format=key_format, **windows)
        else:
            state = StockDecode(**common)
    if split is not None or max_chunk is not None:
        force_select(state, split=split, max_chunk=max_chunk if isinstance(state, IndexerDecodeCP) else None)
    layer = state.new_layer()
    q_mine = q[:, owned].contiguous()
    outs = []
    start = time.perf_counter()
    for step in range(warmup + steps):
        if step == warmup:
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        out = torch.full((rows, len(owned), 16), -7, dtype=torch.int32, device=ctx.device)
        plan = state.plan(c["block_table"], c["seq_lens"])
        if poison:
            plan.scores.fill_(1e30)
        if not skip_forward:
            state.forward(layer, plan, q_mine, c["k_cache"], out, c["query_len"])
        outs.append(out)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / max(1, steps)
    if not skip_forward:
        state.check()
    last = outs[-1].cpu() if outs else None
    return {
        "path": path,
        "heads": owned,
        "out": last,
        "all_equal": all(torch.equal(o.cpu(), last) for o in outs),
        "seconds": seconds,
    }


def assemble(results: list[dict], heads: int) -> torch.Tensor:
    """Per-rank outputs -> int32 [rows, H, 16]; replicas of a head must agree exactly."""
    rows = results[0]["out"].shape[0]
    out = torch.full((rows, heads, 16), -7, dtype=torch.int32)
    seen: dict[int, torch.Tensor] = {}
    for rank, res in enumerate(results):
        for k, h in enumerate(res["heads"]):
            part = res["out"][:, k]
            if h in seen and not torch.equal(seen[h], part):
                raise RuntimeError(f"rank {rank}: head {h} differs from another replica's")
            seen[h] = part
            out[:, h] = part
    return out


def run_case(pool, case, path: str, **kwargs) -> torch.Tensor:
    """Run a ``reference.cases.Case`` or ``reference.msa.MsaCase`` on every rank of ``pool``;
    the assembled output."""
    results = pool.run(decode_on_rank, case.to_dict(), path, **kwargs)
    return assemble(results, case.index_q.shape[1])
