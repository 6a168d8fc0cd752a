"""Selection (docs/DESIGN.md §5): the exact key, the stock 16-bit key, and the output format.

Every function here works on whole batches of rows at once; a "row" is one (query, head).
"""

from __future__ import annotations

import torch

from indexer_constants import KEY_VALID_BIT, NO_KEY, PAGE_MASK, RANKED, TOPK

from .rules import long_rows, short_rows

# Long rows of the local top-16 use a two-level select over groups of this many columns:
# the top 16 groups by group maximum, then the top 16 of those groups' members. Small, so
# that rows past 128 columns (already at a few hundred pages) take the two-level path.
TOPK_GROUP = 8

_I64 = torch.int64


def ordered_bits(scores: torch.Tensor) -> torch.Tensor:
    """fp32 bits mapped to an unsigned total order: ``bits ^ (sign ? 0xFFFFFFFF : 0x80000000)``.

    scores: float32, any shape. Returns int64 of the same shape, values in ``[0, 2^32)``;
    -0.0 orders below +0.0.
    """
    bits = scores.contiguous().view(torch.int32).to(_I64) & 0xFFFFFFFF
    negative = (bits >> 31) != 0
    return torch.where(negative, bits ^ 0xFFFFFFFF, bits ^ 0x80000000)


def exact_keys(scores: torch.Tensor, pages: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The exact key ``1 << 48 | ordered(score) << 16 | (0xFFFF - page)``, 0 where invalid.

    scores: float32 ``[..., n]``; pages: int ``[..., n]`` (broadcastable, < 65536);
    valid: bool ``[..., n]``. Returns int64 ``[..., n]``: unique among valid entries, and
    larger means better (score descending, then page ascending).
    """
    key = KEY_VALID_BIT | (ordered_bits(scores) << 16) | (PAGE_MASK - pages.to(_I64))
    return torch.where(valid, key, NO_KEY)


def fmaf(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 fused multiply-add ``a * b + c`` with one rounding, as CUDA's ``fmaf``.

    a, b, c: float32, broadcastable. Returns float32. The product is exact in float64; the
    sum's error comes from TwoSum, and rounding the float64 sum to odd before rounding to
    float32 makes the double rounding exact (53 >= 2 * 24 + 2 bits).
    """
    p = a.to(torch.float64) * b.to(torch.float64)
    c64 = c.to(torch.float64)
    s = p + c64
    bv = s - p
    err = (p - (s - bv)) + (c64 - bv)
    even = (s.view(_I64) & 1) == 0
    to_odd = (err != 0) & even & torch.isfinite(s)
    toward = torch.where(err > 0, torch.inf, -torch.inf).to(torch.float64)
    return torch.where(to_odd, torch.nextafter(s, toward), s).to(torch.float32)


def f32_to_u32(x: torch.Tensor) -> torch.Tensor:
    """CUDA's ``(unsigned)x`` (``cvt.rzi.u32.f32``): truncate, saturate to ``[0, 2^32 - 1]``, NaN -> 0.

    x: float32. Returns int64.
    """
    x64 = torch.nan_to_num(x.to(torch.float64), nan=0.0)
    return x64.clamp(0.0, 4294967295.0).trunc().to(_I64)


def stock_keys(scores: torch.Tensor, pages: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """MiniMax's stock 16-bit key ``q16 << 16 | (~page & 0xFFFF)``, 0 where invalid.

    scores: float32 ``[R, n]``; pages: int ``[R, n]`` or ``[n]``; valid: bool ``[R, n]``.
    Per row over its valid scores: ``scale = 65534 / (max - min)`` (0 if equal),
    ``bias = fmaf(-min, scale, 1.5)``, ``q16 = min(uint(fmaf(v, scale, bias)), 65535)``.
    Returns int64 ``[R, n]`` (uint32 values); stock ties at 16-bit resolution, broken by
    the lower page.
    """
    hi = torch.where(valid, scores, -torch.inf).amax(dim=-1, keepdim=True)
    lo = torch.where(valid, scores, torch.inf).amin(dim=-1, keepdim=True)
    span = hi - lo  # fp32, as the kernel computes it
    scale = torch.where(span == 0, torch.zeros_like(span), torch.tensor(65534.0) / span)
    bias = fmaf(-lo, scale, torch.tensor(1.5))
    q16 = f32_to_u32(fmaf(scores, scale, bias)).clamp_max(0xFFFF)
    key = (q16 << 16) | (~pages.to(_I64) & PAGE_MASK)
    return torch.where(valid, key, NO_KEY)


def top_keys(keys: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest keys per row, descending, padded with 0 (no page) if a row is short.

    keys: int64 ``[R, n]``. Returns int64 ``[R, k]``.
    """
    if keys.shape[-1] < k:
        keys = torch.nn.functional.pad(keys, (0, k - keys.shape[-1]), value=NO_KEY)
    return keys.topk(k, dim=-1, sorted=True).values


def two_level_top16(keys: torch.Tensor, group: int = TOPK_GROUP) -> torch.Tensor:
    """The 16 largest keys per row by a two-level select, descending.

    keys: int64 ``[R, n]``, valid keys unique and positive, 0 for no page. Returns int64
    ``[R, 16]``. Level one keeps the 16 groups (of ``group`` columns) with the largest
    maxima; level two takes the top 16 of their members. Exact: if a top-16 key t lay in a
    group outside the kept 16, each kept group's maximum would be a distinct key above t,
    so 16 keys would beat t — contradiction. Hence the top 16 lie in the kept groups.
    """
    rows, n = keys.shape
    groups = -(-n // group)
    if groups <= TOPK:
        return top_keys(keys, TOPK)
    padded = torch.nn.functional.pad(keys, (0, groups * group - n), value=NO_KEY)
    members = padded.view(rows, groups, group)
    kept = members.amax(dim=-1).topk(TOPK, dim=-1).indices  # [R, 16]
    chosen = members.gather(1, kept[:, :, None].expand(rows, TOPK, group))
    return top_keys(chosen.reshape(rows, TOPK * group), TOPK)


def keys_to_pages(keys: torch.Tensor) -> torch.Tensor:
    """Page id of each key (both keys keep ``0xFFFF - page`` in the low 16 bits); -1 for 0.

    keys: int64, any shape. Returns int64 of the same shape.
    """
    return torch.where(keys > 0, PAGE_MASK - (keys & PAGE_MASK), -1)


def keys_to_scores(keys: torch.Tensor) -> torch.Tensor:
    """The fp32 score inside each exact key (the inverse of ``ordered_bits``); NaN for keys <= 0.

    keys: int64, any shape. Returns float32 of the same shape.
    """
    ordered = (keys >> 16) & 0xFFFFFFFF
    bits = torch.where(ordered >= 0x80000000, ordered ^ 0x80000000, ordered ^ 0xFFFFFFFF)
    scores = bits.to(torch.int32).view(torch.float32)  # int64 -> int32 keeps the low 32 bits
    return torch.where(keys > 0, scores, torch.nan)


def assemble_rows(ranked_keys: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """The output format from the best keys: 15 ranked pages, the own page in slot 15.

    ranked_keys: int64 ``[R, >=15]`` descending; own: int64 ``[R]``. Returns int32
    ``[R, 16]``; short rows (own + 1 <= 16) get ``[0..own, -1, ...]`` instead.
    """
    out = torch.cat([keys_to_pages(ranked_keys[:, :RANKED]), own[:, None]], dim=1)
    return torch.where(~long_rows(own)[:, None], short_rows(own).to(_I64), out).to(torch.int32)


def select(scores: torch.Tensor, own: torch.Tensor, num_pages: int, key: str = "exact") -> torch.Tensor:
    """Select each row's 16 output pages from its full-context scores.

    scores: float32 ``[R, W]`` (column j = page j; only ``j < min(own, P)`` is read);
    own: int64 ``[R]``; num_pages: P, the pages the table holds (at most W);
    key: ``"exact"`` or ``"stock"``. Returns int32 ``[R, 16]``.
    """
    rows, width = scores.shape
    j = torch.arange(width, dtype=_I64)
    valid = (j[None, :] < own[:, None]) & (j[None, :] < num_pages)
    # Never let an unread column (poisoned or stale) reach a key, not even masked arithmetic.
    clean = torch.where(valid, scores, torch.zeros((), dtype=scores.dtype))
    if key == "exact":
        keys = exact_keys(clean, j, valid)
    elif key == "stock":
        keys = stock_keys(clean, j, valid)
    else:
        raise ValueError(f"key: expected 'exact' or 'stock', got {key!r}")
    return assemble_rows(top_keys(keys, RANKED), own)


def describe_keys(keys: torch.Tensor) -> str:
    """Exact keys (int64 ``[n]``) as ``page(score) ...`` for the explains; "(none)" if none is valid."""
    pages, scores = keys_to_pages(keys).tolist(), keys_to_scores(keys).tolist()
    cells = [f"{p}({s:.6g})" for p, s in zip(pages, scores) if p >= 0]
    return " ".join(cells) if cells else "(none)"
