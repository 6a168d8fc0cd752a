"""NVFP4 index-K cache: MiniMax's quantizer, the Q8KV4 dequantization and the page layout.

A page is 9216 bytes: 8192 bytes of packed E2M1 codes (64 bytes per token, element 2i in the
low nibble of byte i) followed by 1024 bytes of E4M3 scales (one per 16 elements, at index
token * 8 + group). ``k_cache`` is handed around as the ``[N, 128, 72]`` uint8 view of that.
"""

from __future__ import annotations

import functools

import torch

from indexer_constants import (
    CODE_BYTES,
    E2M1_MAGNITUDES,
    E4M3_MAX,
    E4M3_MIN_SUBNORMAL,
    GROUP,
    HEAD_DIM,
    PAGE,
    PAGE_BYTES,
    ROW_BYTES,
    SCALE_BYTES,
)

from .arguments import check_pages

GROUPS_PER_TOKEN = HEAD_DIM // GROUP  # 8
BYTES_PER_GROUP = GROUP // 2  # 8


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to E4M3 (nearest, ties to even, saturating at ±448).

    x: any shape, float32. Returns float32 of the same shape holding E4M3 values.
    torch's own conversion is correct on CPU; the clamp makes it saturate (a value past
    the rounding edge of 448 would otherwise not be representable).
    """
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def e2m1_values() -> torch.Tensor:
    """The 16 E2M1 code values, float32 ``[16]``: codes 0..7 are the magnitudes, bit 3 the sign."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32)
    return torch.cat([mags, -mags])


def e4m3_byte_values() -> torch.Tensor:
    """The value of every E4M3 byte, float32 ``[256]`` (0x7F and 0xFF are NaN)."""
    return torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)


@functools.cache
def dequant_table() -> torch.Tensor:
    """Every dequantized value, float32 ``[256 scale bytes, 16 codes]``.

    ``table[s, c] = e4m3_round(e2m1(c) * scale(s))``: the Q8KV4 dequantization has only 16
    possible results per scale byte, so the whole format is this 16 KB table.
    """
    return e4m3_round(e4m3_byte_values()[:, None] * e2m1_values()[None, :])


@functools.cache
def _pair_table(dtype: torch.dtype) -> torch.Tensor:
    """Both elements of every code byte under every scale, as one word per (scale, byte).

    Returns ``[256 * 256]`` of int64 (two float32, low nibble first) or complex128 (two
    float64), so that one gather dequantizes a whole code byte.
    """
    t = dequant_table()
    low = torch.arange(256) & 0xF
    high = torch.arange(256) >> 4
    pairs = torch.stack([t[:, low], t[:, high]], dim=-1)  # [256 scales, 256 bytes, 2]
    if dtype == torch.complex128:
        return pairs.to(torch.float64).contiguous().view(torch.complex128).reshape(-1)
    return pairs.contiguous().view(torch.int64).reshape(-1)


def split_pages(k_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """View a cache as its two regions.

    k_cache: uint8 ``[N, 128, 72]`` (or anything holding N * 9216 contiguous bytes).
    Returns (codes uint8 ``[N, 128, 64]``, scales uint8 ``[N, 128, 8]``), both views.
    """
    flat = k_cache.reshape(-1, PAGE_BYTES)
    codes = flat[:, :CODE_BYTES].view(-1, PAGE, HEAD_DIM // 2)
    scales = flat[:, CODE_BYTES:].view(-1, PAGE, GROUPS_PER_TOKEN)
    return codes, scales


def join_pages(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Lay codes ``[N, 128, 64]`` uint8 and scales ``[N, 128, 8]`` uint8 out as pages.

    Returns the uint8 ``[N, 128, 72]`` cache view (codes first, then scales, per page).
    """
    n = codes.shape[0]
    flat = torch.cat([codes.reshape(n, CODE_BYTES), scales.reshape(n, SCALE_BYTES)], dim=1)
    return flat.view(n, PAGE, ROW_BYTES)


def _byte_index(pages: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """int32 ``[n * 8192]``: ``scale_byte * 256 + code_byte`` for every code byte of the pages."""
    codes, scales = split_pages(pages)
    n = codes.shape[0]
    idx = torch.empty(n * CODE_BYTES, dtype=torch.int32) if out is None else out[: n * CODE_BYTES]
    grouped = idx.view(n, PAGE, GROUPS_PER_TOKEN, BYTES_PER_GROUP)
    grouped.copy_(codes.view(n, PAGE, GROUPS_PER_TOKEN, BYTES_PER_GROUP))
    grouped.add_(scales.to(torch.int32).unsqueeze(-1) << 8)
    return idx


def dequantize_nvfp4(pages: torch.Tensor) -> torch.Tensor:
    """Dequantize NVFP4 pages the Q8KV4 way.

    pages: uint8 ``[n, 128, 72]``. Returns float32 ``[n, 128 tokens, 128 dims]`` whose values
    are ``e4m3_round(e2m1(code) * scale)``: one rounding to E4M3 before any dot product.
    """
    pages = check_pages("pages", pages)
    words = _pair_table(torch.int64).index_select(0, _byte_index(pages))
    return words.view(torch.float32).view(-1, PAGE, HEAD_DIM)


def dequantize_nvfp4_f64(pages: torch.Tensor, index_buf: torch.Tensor, out_buf: torch.Tensor) -> torch.Tensor:
    """``dequantize_nvfp4`` in float64, into caller-owned buffers (the reference's hot loop).

    pages: uint8 ``[n, 128, 72]``; index_buf: int32 ``[>= n * 8192]``; out_buf: complex128
    ``[>= n * 8192]``. Returns a float64 ``[n * 128 tokens, 128 dims]`` view of out_buf.
    Reusing the buffers matters: fresh multi-MB allocations cost more than the gather.
    """
    idx = _byte_index(pages, index_buf)
    words = out_buf[: idx.numel()]
    torch.index_select(_pair_table(torch.complex128), 0, idx, out=words)
    return words.view(torch.float64).view(-1, HEAD_DIM)


def quantize_nvfp4(keys: torch.Tensor) -> torch.Tensor:
    """MiniMax's NVFP4 quantizer (used to build test caches from float keys).

    keys: float ``[N, 128 tokens, 128 dims]``, finite. Returns uint8 ``[N, 128, 72]`` pages.
    Per group of 16: ``scale = e4m3(max(amax, 1e-12) / 6)`` clamped to ``[2^-9, 448]``;
    ``code = round_half_even(x / scale)`` on the E2M1 ladder; zero is stored as +0.
    """
    if not isinstance(keys, torch.Tensor):
        raise TypeError(f"keys: expected a torch.Tensor, got {type(keys).__name__}")
    if keys.dim() != 3 or tuple(keys.shape[1:]) != (PAGE, HEAD_DIM):
        raise ValueError(f"keys: expected shape [N, {PAGE}, {HEAD_DIM}], got {list(keys.shape)}")
    if not keys.is_floating_point():
        raise TypeError(f"keys: expected a floating dtype, got {keys.dtype}")
    x = keys.detach().to("cpu", torch.float32)
    if not torch.isfinite(x).all():
        raise ValueError("keys: must be finite")
    n = x.shape[0]
    groups = x.view(n, PAGE, GROUPS_PER_TOKEN, GROUP)
    amax = groups.abs().amax(dim=-1, keepdim=True)
    # Clamping before the rounding equals rounding then clamping (the rounding is monotone
    # and both ends are E4M3 values), and it keeps torch's conversion in range.
    scale = (amax.clamp_min(1e-12) / 6).clamp(E4M3_MIN_SUBNORMAL, E4M3_MAX).to(torch.float8_e4m3fn)
    v = groups / scale.to(torch.float32)
    a = v.abs()
    # The E2M1 ladder as a count of thresholds passed; '>' vs '>=' alternates so that each
    # midpoint goes to the neighbour with an even mantissa (round half to even).
    mag = (a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5) + (a >= 3.5) + (a > 5.0)
    sign = ((v < 0) & (mag > 0)).to(torch.uint8) << 3  # zero is stored as +0
    nib = (mag | sign).view(n, PAGE, HEAD_DIM // 2, 2)
    codes = nib[..., 0] | (nib[..., 1] << 4)
    return join_pages(codes, scale.view(torch.uint8).view(n, PAGE, GROUPS_PER_TOKEN))
