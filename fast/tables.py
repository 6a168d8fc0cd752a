"""The dequantization tables the scorers read, derived by ``fast`` from the format itself
(docs/DESIGN.md §3): every E4M3 scale byte times every E2M1 code, rounded once to E4M3
(nearest, ties to even, saturating at 448).

The rounding here is written out over the E4M3 value ladder, not taken from torch's
conversion (which the reference uses), so that a fault in either one shows up as a
difference between them (``tests/test_rules.py`` compares both on every pair).
"""

from __future__ import annotations

import functools

import torch

from indexer_constants import E2M1_MAGNITUDES, E4M3_MAX


def e4m3_value(byte: int) -> float:
    """The value of an E4M3 (fn) byte: 1 sign, 4 exponent (bias 7), 3 mantissa bits;
    exponent 0 is subnormal; 0x7F / 0xFF are NaN (no infinities)."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return float("nan")
    if exponent == 0:
        return sign * mantissa * 2.0**-9
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


@functools.cache
def _ladder() -> tuple[float, ...]:
    """The non-negative finite E4M3 values; value i has byte i (0x00 .. 0x7E)."""
    return tuple(e4m3_value(b) for b in range(0x7F))


def round_e4m3(magnitude: float) -> int:
    """The E4M3 byte nearest to ``magnitude`` (>= 0, an exact float64 product here), ties to
    the even byte; magnitudes past 448 saturate to 448 (the format has no infinity)."""
    mag = min(magnitude, E4M3_MAX)
    ladder = _ladder()
    lo, hi = 0, len(ladder) - 1
    while hi - lo > 1:  # invariant: ladder[lo] <= mag <= ladder[hi]
        mid = (lo + hi) // 2
        if ladder[mid] <= mag:
            lo = mid
        else:
            hi = mid
    below, above = mag - ladder[lo], ladder[hi] - mag
    if below < above or (below == above and lo % 2 == 0):
        return lo
    return hi


@functools.cache
def dequant_bytes() -> torch.Tensor:
    """uint8 ``[256 scale bytes, 16 codes]``: the E4M3 byte of ``e2m1(code) * scale``.
    Codes 0..7 are the magnitudes of E2M1, bit 3 the sign (code 8 is -0)."""
    rows = []
    for s in range(256):
        scale = e4m3_value(s)
        row = []
        for code in range(16):
            sign = 0x80 if (code >> 3) ^ (s >> 7) else 0  # the product's sign, zeros included
            if scale != scale:  # a NaN scale byte (never valid): NaN out
                row.append(0x7F | sign)
            else:
                row.append(round_e4m3(E2M1_MAGNITUDES[code & 7] * abs(scale)) | sign)
        rows.append(row)
    return torch.tensor(rows, dtype=torch.uint8)


@functools.cache
def dequant_lut(device: str) -> torch.Tensor:
    """fp16 ``[256 * 16]``, entry ``scale * 16 + code``: the table scorer's gather (every
    E4M3 value is exact in fp16). Cached per device: no allocation inside a graph capture."""
    values = dequant_bytes().view(torch.float8_e4m3fn).to(torch.float16)
    return values.reshape(-1).contiguous().to(device)


def scale_tables(device) -> torch.Tensor:
    """int64 ``[256]``: entry s packs the 8 bytes ``e4m3(e2m1(m) * scale(s))``, m = 0..7,
    byte m = magnitude m (a negative scale's byte 0 is -0): the wgmma scorer's per-group
    table, one load per 16 codes. Cached per device."""
    return _scale_tables(str(device))


@functools.cache
def _scale_tables(device: str) -> torch.Tensor:
    # 2 KB-aligned: the scorer adds 8 * scale to the low 32 bits of the table's address
    # alone, which is exact only if the table never straddles a 4 GB boundary.
    entries = dequant_bytes()[:, :8].contiguous().view(torch.int64).reshape(256)
    room = torch.empty(2 * 256, dtype=torch.int64, device=device)
    skip = (-room.data_ptr() % 2048) // 8
    table = room[skip : skip + 256]
    table.copy_(entries)
    return table
