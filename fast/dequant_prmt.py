"""GPU dequantization of one NVFP4 page by byte permutes (DESIGN.md §3-§4), ~2 instructions
per element and no table in memory.

For a group of 16 codes sharing scale s, every result is one of 8 magnitudes
``T[m] = e4m3(s * {0, .5, 1, 1.5, 2, 3, 4, 6}[m])`` with the code's sign applied. Per group,
``_ASM_TABLE`` builds those 8 bytes in two registers: s to fp16 (``cvt``, exact), 4 fp16x2
products (exact: at most 6 significant bits, within fp16's normal range) and 4 hardware
round-to-nearest-even, saturating conversions to E4M3 — the contract's one rounding. Per
32-bit word of 8 codes, ``_ASM_DECODE`` looks the 3-bit magnitudes up with ``prmt`` (one per
4 codes), spreads the sign bits to byte MSBs with ``prmt``'s sign-replicate mode, XORs them in
(a sign flip, so negative scales stay exact too), and widens E4M3 pairs to fp16 pairs with
``cvt`` (exact). Inline PTX exists on GPUs only; the interpreter uses the table gather in
``scorer.py``, and ``tests/test_gpu_dequant.py`` checks this path against the reference on every
(scale byte, code) pair.
"""

import triton
import triton.language as tl

from reference.constants import CODE_BYTES

_CODE_BYTES = tl.constexpr(CODE_BYTES)

# $0, $1: table bytes T[0..3], T[4..7] (byte i = T[i]); $2: the scale byte (zero-extended).
# mul.f16x2 constants, high half : low half -> products {lo, hi}: {0, .5s}, {s, 1.5s},
# {2s, 3s}, {4s, 6s}; cvt e4m3x2 puts the low half's byte low, so {ha, hb} = T[0..3].
_ASM_TABLE = tl.constexpr("""
{
.reg .b32 ss, sf, ca, cb, cc, cd, pa, pb, pc, pd;
.reg .b16 slo, shi, ha, hb, hc, hd;
prmt.b32 ss, $2, 0, 0x0000;
mov.b32 {slo, shi}, ss;
cvt.rn.f16x2.e4m3x2 sf, slo;
mov.b32 ca, 0x38000000;
mov.b32 cb, 0x3E003C00;
mov.b32 cc, 0x42004000;
mov.b32 cd, 0x46004400;
mul.rn.f16x2 pa, sf, ca;
mul.rn.f16x2 pb, sf, cb;
mul.rn.f16x2 pc, sf, cc;
mul.rn.f16x2 pd, sf, cd;
cvt.rn.satfinite.e4m3x2.f16x2 ha, pa;
cvt.rn.satfinite.e4m3x2.f16x2 hb, pb;
cvt.rn.satfinite.e4m3x2.f16x2 hc, pc;
cvt.rn.satfinite.e4m3x2.f16x2 hd, pd;
mov.b32 $0, {ha, hb};
mov.b32 $1, {hc, hd};
}
""")

# $0..$7: fp16 of codes 0..7 of the word (code k = nibble k: element 2i is byte i's low
# nibble); $8: the word; $9, $10: the group's table. Magnitude selectors are the nibbles with
# bit 3 cleared; sign selectors 0xD9C8 / 0xFBEA pick, in sign-replicate mode, the byte of
# (word << 4) or word whose MSB is nibble k's bit 3. lop3 0x78 = a ^ (b & c).
_ASM_DECODE = tl.constexpr("""
{
.reg .b32 m, m2, x4, p0, p1, s0, s1, e0, e1, f0, f1, f2, f3, k7, k80;
.reg .b16 e00, e01, e10, e11;
mov.b32 k7, 0x77777777;
mov.b32 k80, 0x80808080;
and.b32 m, $8, k7;
prmt.b32 p0, $9, $10, m;
shr.u32 m2, m, 16;
prmt.b32 p1, $9, $10, m2;
shl.b32 x4, $8, 4;
prmt.b32 s0, x4, $8, 0xD9C8;
prmt.b32 s1, x4, $8, 0xFBEA;
lop3.b32 e0, p0, s0, k80, 0x78;
lop3.b32 e1, p1, s1, k80, 0x78;
mov.b32 {e00, e01}, e0;
mov.b32 {e10, e11}, e1;
cvt.rn.f16x2.e4m3x2 f0, e00;
cvt.rn.f16x2.e4m3x2 f1, e01;
cvt.rn.f16x2.e4m3x2 f2, e10;
cvt.rn.f16x2.e4m3x2 f3, e11;
mov.b32 {$0, $1}, f0;
mov.b32 {$2, $3}, f1;
mov.b32 {$4, $5}, f2;
mov.b32 {$6, $7}, f3;
}
""")


@triton.jit
def load_page_prmt(page_u8, page_i32, live):
    """A page's raw operands for ``dequant_prmt``: int32 ``[128, 16]`` code words and int32
    ``[128, 8]`` scale bytes (zeros where ``live`` is false, nothing read). page_u8 /
    page_i32: the page's first byte as uint8 and int32 pointers (pages are 9216 bytes, so
    words are aligned)."""
    t = tl.arange(0, 128)
    g = tl.arange(0, 8)
    w = tl.arange(0, 16)
    codes = tl.load(page_i32 + t[:, None] * 16 + w[None, :], mask=live, other=0)
    scales = tl.load(page_u8 + _CODE_BYTES + t[:, None] * 8 + g[None, :], mask=live, other=0).to(tl.int32)
    return codes, scales


@triton.jit
def dequant_prmt(codes, scales):
    """fp16 ``[128 tokens, 128]`` from ``load_page_prmt``'s operands."""
    t_lo, t_hi = tl.inline_asm_elementwise(_ASM_TABLE, "=r,=r,r", [scales], dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    t_lo = tl.interleave(t_lo, t_lo)  # [128, 16]: word w uses group w // 2
    t_hi = tl.interleave(t_hi, t_hi)
    o = tl.inline_asm_elementwise(
        _ASM_DECODE,
        "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r",
        [codes, t_lo, t_hi],
        dtype=(tl.float16, tl.float16, tl.float16, tl.float16, tl.float16, tl.float16, tl.float16, tl.float16),
        is_pure=True,
        pack=1,
    )
    # interleave(a, b)[2i + c] = (a, b)[c][i]; three levels give element 8w + k = o[k][w].
    a0 = tl.interleave(o[0], o[4])
    a1 = tl.interleave(o[1], o[5])
    a2 = tl.interleave(o[2], o[6])
    a3 = tl.interleave(o[3], o[7])
    return tl.interleave(tl.interleave(a0, a2), tl.interleave(a1, a3))
