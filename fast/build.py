"""Which CP decode state a process runs (docs/DESIGN.md §§8, 10): the format's CP state
where its configuration allows CP, else None with the reason logged (the caller runs the
format's stock decode)."""

from __future__ import annotations

import logging

from indexer_constants import SLOTS, SUPPORTED_CP, SUPPORTED_HEADS

from . import checks
from .cp import IndexerDecodeCP
from .msa.cp import MsaDecodeCP
from .msa.scorer import KEY_FORMATS
from .symm import Symmetric

log = logging.getLogger(__name__)

# "nvfp4": §§3-6's Q8KV4 keys (IndexerDecodeCP); the MSA formats' keys: §10 (MsaDecodeCP).
CP_KEY_FORMATS = ("nvfp4", *KEY_FORMATS)


def cp_unsupported_reason(
    *, world: int, heads: int, max_query_len: int, symm: Symmetric | None, symm_reason: str | None = None
) -> str | None:
    """Why CP decode should not run in this configuration, or None if it can.

    symm_reason: why the ranks have no symmetric memory (``open_cuda_symmetric``'s answer).
    """
    if world not in SUPPORTED_CP:
        return f"{world} ranks (CP needs one of {SUPPORTED_CP})"
    if heads not in SUPPORTED_HEADS:
        return f"{heads} index heads (needs one of {SUPPORTED_HEADS})"
    if max_query_len > SLOTS:
        return f"decode query length {max_query_len} > {SLOTS}"
    if world == 1:
        return "a single rank (one GPU): there are no peers to split the pages with"
    if symm is None:
        return symm_reason or "the ranks have no symmetric memory between them"
    return None


def build_cp_decode(
    *,
    heads: int,
    max_reqs: int,
    max_query_len: int,
    symm: Symmetric | None,
    world: int | None = None,
    symm_reason: str | None = None,
    key_format: str = "nvfp4",
    init_blocks: int | None = None,
    local_blocks: int | None = None,
    **kwargs,
) -> IndexerDecodeCP | None:
    """The process's CP decode state, or None (use the format's stock decode: ``StockDecode``
    for "nvfp4", ``MsaStockDecode`` for "bf16" / "fp8") with the reason logged once. Build
    it once per process. ``world`` is needed only where ``symm`` is None.

    key_format: "nvfp4" (``IndexerDecodeCP``), or "bf16" / "fp8" (``MsaDecodeCP``, which
    also takes the forced windows ``init_blocks`` and ``local_blocks``; "nvfp4" takes
    none). kwargs go to the state (spin_timeout_s, pdl, mma). The format and
    the windows are checked even where CP cannot run: they are the caller's choice either way.
    """
    if key_format not in CP_KEY_FORMATS:
        raise ValueError(f"key_format: must be one of {CP_KEY_FORMATS}, got {key_format!r}")
    msa = key_format != "nvfp4"
    if msa:
        for name, value in (("init_blocks", init_blocks), ("local_blocks", local_blocks)):
            if value is None:
                raise ValueError(f"{name}: key_format {key_format!r} needs both forced windows (the model's values)")
        checks.forced_windows(init_blocks, local_blocks)
    elif init_blocks is not None or local_blocks is not None:
        raise ValueError("init_blocks: the nvfp4 format has no forced windows (init_blocks, local_blocks are MSA's)")
    world = symm.world if symm is not None else (world or 1)
    why = cp_unsupported_reason(
        world=world, heads=heads, max_query_len=max_query_len, symm=symm, symm_reason=symm_reason
    )
    if why is not None:
        log.warning("CP decode disabled: %s; using the stock decode", why)
        return None
    if msa:
        return MsaDecodeCP(
            heads=heads,
            max_reqs=max_reqs,
            symm=symm,
            key_format=key_format,
            init_blocks=init_blocks,
            local_blocks=local_blocks,
            **kwargs,
        )
    return IndexerDecodeCP(heads=heads, max_reqs=max_reqs, symm=symm, **kwargs)
