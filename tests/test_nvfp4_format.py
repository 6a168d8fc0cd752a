"""NVFP4: the quantizer, the Q8KV4 dequantization and the page layout (docs/DESIGN.md §3)."""

from fractions import Fraction

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from indexer_constants import CODE_BYTES, PAGE_BYTES
from reference import dequantize_nvfp4, quantize_nvfp4
from reference.nvfp4 import dequant_table, e2m1_values, e4m3_byte_values, split_pages


def e4m3_round_exact(x: Fraction) -> Fraction:
    """Independent E4M3 rounding (nearest, ties to even, saturating) in exact arithmetic."""
    sign = -1 if x < 0 else 1
    a = abs(x)
    if a >= 448:
        return sign * Fraction(448)
    e = -6  # below 2^-6 the quantum stays 2^-9 (subnormals)
    while a >= Fraction(2) ** (e + 1):
        e += 1
    quantum = Fraction(2) ** (e - 3)
    m = a / quantum
    floor = m.numerator // m.denominator
    rest = m - floor
    r = floor + (1 if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and floor % 2) else 0)
    return sign * r * quantum


def test_dequant_table_matches_exact_rounding():
    """All 256 scales x 16 codes against an independent exact-arithmetic E4M3 rounding."""
    table = dequant_table()
    scales = e4m3_byte_values()
    codes = e2m1_values()
    for s in range(256):
        if s & 0x7F == 0x7F:
            assert torch.isnan(table[s]).all()
            continue
        for c in range(16):
            want = e4m3_round_exact(Fraction(float(codes[c])) * Fraction(float(scales[s])))
            got = float(table[s, c])
            assert Fraction(got) == want, (hex(s), c, got, want)
            if c == 8:  # code -0 keeps its sign; it adds nothing to a dot product
                assert got == 0.0


def test_known_values():
    table, scales = dequant_table(), e4m3_byte_values()
    b448 = int((scales == 448).nonzero()[0])
    assert table[b448, 7] == 448  # 6 * 448 saturates
    assert table[b448, 5] == 448  # 3 * 448 = 1344 saturates
    assert table[b448 | 0x80, 7] == -448
    b1125 = int((scales == 1.125).nonzero()[0])
    assert table[b1125, 3] == 1.75  # 1.5 * 1.125 = 1.6875: a tie, to the even mantissa (1.110b)
    assert table[b1125, 5] == 3.5  # 3 * 1.125 = 3.375: a tie between 3.25 and 3.5 -> 3.5 (even)


def _group_keys(values):
    """One page whose token 0, group 0 holds `values` (16 floats), everything else zero."""
    keys = torch.zeros(1, 128, 128)
    keys[0, 0, :16] = torch.tensor(values)
    return keys


def _codes_of_group0(page):
    codes, scales = split_pages(page)
    b = codes[0, 0, :8]
    nib = torch.stack([b & 15, b >> 4], dim=-1).reshape(-1)
    return nib.tolist(), float(e4m3_byte_values()[int(scales[0, 0, 0])])


def test_quantizer_half_even_ladder_and_plus_zero():
    # amax 6 -> scale e4m3(1) = 1, so x / scale is x itself.
    x = [6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.0, 0.26, 0.74, 5.01, 4.99, 3, -1e-3]
    codes, scale = _codes_of_group0(quantize_nvfp4(_group_keys(x)))
    assert scale == 1.0
    mags = [7, 0, 2, 2, 4, 4, 6, 6, 0, 0, 1, 1, 7, 6, 5, 0]
    assert codes == mags  # negatives that round to zero are stored as +0 (code 0, not 8)
    codes, _ = _codes_of_group0(quantize_nvfp4(_group_keys([-v for v in x])))
    assert codes == [m | 8 if m else 0 for m in mags]


def test_quantizer_scale_clamps():
    codes, scale = _codes_of_group0(quantize_nvfp4(_group_keys([1e-30] + [0.0] * 15)))
    assert scale == 2.0**-9 and codes == [0] * 16  # amax floor 1e-12, scale floor 2^-9
    codes, scale = _codes_of_group0(quantize_nvfp4(_group_keys([1e6] + [0.0] * 15)))
    assert scale == 448 and codes[0] == 7  # scale ceiling 448, code saturates at 6
    codes, scale = _codes_of_group0(quantize_nvfp4(_group_keys([0.0] * 16)))
    assert scale == 2.0**-9 and codes == [0] * 16


def test_page_layout_byte_positions():
    """Element (t, d): nibble (d % 2) of byte t * 64 + d // 2; its scale at 8192 + t * 8 + d // 16."""
    for t, d in [(0, 0), (0, 1), (5, 17), (127, 126), (127, 127), (64, 64)]:
        keys = torch.zeros(1, 128, 128)
        keys[0, t, d] = -6.0
        page = quantize_nvfp4(keys)
        assert page.shape == (1, 128, 72) and page.dtype == torch.uint8
        flat = page.reshape(PAGE_BYTES)
        nz = flat[:CODE_BYTES].nonzero().flatten().tolist()
        assert nz == [t * 64 + d // 2]
        assert int(flat[nz[0]]) == (0xF << 4 * (d % 2))  # code 15: sign | 6
        scale_at = CODE_BYTES + t * 8 + d // 16
        assert float(e4m3_byte_values()[int(flat[scale_at])]) == 1.0
        # The 72-wide view is only a view: byte k of the page sits at [k // 72, k % 72].
        assert int(page[0, scale_at // 72, scale_at % 72]) == int(flat[scale_at])
        assert dequantize_nvfp4(page)[0, t, d] == -6.0
        assert dequantize_nvfp4(page).abs().sum() == 6.0


@given(seed=st.integers(0, 2**31 - 1), pages=st.integers(1, 3))
def test_dequantize_matches_elementwise_definition(seed, pages):
    gen = torch.Generator().manual_seed(seed)
    cache = torch.randint(0, 256, (pages, 128, 72), dtype=torch.uint8, generator=gen)
    codes, scales = split_pages(cache)
    scales.copy_(torch.randint(0, 0x7F, scales.shape, dtype=torch.uint8, generator=gen))  # finite
    nib = torch.stack([codes & 15, codes >> 4], dim=-1).reshape(pages, 128, 128).long()
    scale = e4m3_byte_values()[scales.long()].repeat_interleave(16, dim=-1)
    want = (e2m1_values()[nib] * scale).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    assert torch.equal(dequantize_nvfp4(cache), want)


@given(seed=st.integers(0, 2**31 - 1), spread=st.integers(-3, 6))
def test_round_trip_error_bound(seed, spread):
    """|dequant(quant(x)) - x| <= 1.375 * scale + 2^-10 per group: the E2M1 ladder's worst
    gap (4 to 6: error 1 * scale) plus one E4M3 rounding of a value up to 6 * scale (2^-4
    relative, or half the 2^-9 subnormal quantum for tiny values). The spread keeps
    amax / 6 in E4M3's normal range: a subnormal scale can be 1.5x too small and a group
    beyond 6 * 448 saturates, where no such bound holds."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 128, 128, generator=gen) * 2.0**spread
    page = quantize_nvfp4(x)
    scale = e4m3_byte_values()[split_pages(page)[1].long()].repeat_interleave(16, dim=-1)
    err = (dequantize_nvfp4(page) - x).abs()
    assert bool((err <= 1.375 * scale + 2.0**-10).all())


def test_quantizer_rejects_bad_keys():
    with pytest.raises(ValueError, match="keys"):
        quantize_nvfp4(torch.zeros(1, 128, 64))
    with pytest.raises(ValueError, match="keys"):
        quantize_nvfp4(torch.full((1, 128, 128), float("inf")))
    with pytest.raises(TypeError, match="keys"):
        quantize_nvfp4(torch.zeros(1, 128, 128, dtype=torch.int32))
