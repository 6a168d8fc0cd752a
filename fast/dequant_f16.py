"""NVFP4 group -> fp16 by byte permutes and a funnel shift: the wgmma scorer's decode, with
no conversion instruction per code (DESIGN.md §3-§4).

Why: Hopper runs conversions (F2FP) at a fraction of the ALU rate. ``dequant_prmt`` widens
every E4M3 pair to fp16 with ``cvt`` (8 per group of 16 codes, 13 with the table): 104 per
page and thread, ~830 cycles of the conversion pipe per page and SM against the ~540 the HBM
rate allows (fast/PERF.md). This decode uses 4 per group (the table's E4M3 rounding).

The trick: E4M3 embeds linearly in fp16. A magnitude byte ``m`` (4 exponent, 3 mantissa
bits) placed at fp16 bits 13..7, bit 14 clear, is the fp16 ``value(m) * 2^-8`` exactly,
subnormals included (E4M3's smallest normal 2^-6 lands on fp16's, 2^-14). So every decoded
element is ``sign << 15 | T[code] << 7`` with T the group's table of 8 E4M3 magnitudes, and
the MMA's sums are 2^-8 times the true ones: the caller multiplies by 256 (exact in fp32).

Per group, the table: ``|s| * 2^-8`` in both fp16 halves (``s << 7``, masked: no
conversion), 4 ``mul.f16x2`` by ``256 * {0, .5, 1, 1.5, 2, 3, 4, 6}`` (exact products of the
true scale), 4 saturating round-to-nearest-even conversions to E4M3 — the contract's one
rounding. Per 8 codes (a 32-bit word): two ``prmt`` look the 3-bit magnitudes up (bytes
``T[c]``); two shifts and masks gather the sign bits as bytes 0x01 / 0x00 (even and odd
codes), XORed with the scale's sign; then per output pair one ``prmt`` builds the word
``[T(hi), sign(lo), T(lo), sign(hi)]`` and ``shf.r.wrap`` by one turns it into the fp16
pair: magnitudes to bits 13..7 / 29..23, the sign bytes' bit 0 to bits 15 and 31. 16
instructions per 8 codes, none of them a conversion.

Each 32-bit register pairs codes (2i, 2i + 2) or (2i + 1, 2i + 3), so output slot ``s``
holds code ``slot_code(s)`` (bits 0 and 1 of s swapped); the scorer permutes q alike. NaN
scale bytes (0x7F / 0xFF) are invalid input (``reference.validate`` rejects them) and decode
to finite values here.
"""

from triton.experimental.gluon import language as gl

# $0..$15: fp16 outputs in slot order; $16: the group's 64-bit code word (code k = nibble
# k); $17: its scale byte, zero-extended. Table bytes T[0..7] in tlo/thi (byte i = T[i]).
_TABLE = """
mul.lo.u32 sf, $17, 0x00800080;
and.b32 sf, sf, 0x3F803F80;
prmt.b32 sfl, $17, 0, 0x8888;
mov.b32 ca, 0x58000000;
mov.b32 cb, 0x5E005C00;
mov.b32 cc, 0x62006000;
mov.b32 cd, 0x66006400;
mul.rn.f16x2 pa, sf, ca;
mul.rn.f16x2 pb, sf, cb;
mul.rn.f16x2 pc, sf, cc;
mul.rn.f16x2 pd, sf, cd;
cvt.rn.satfinite.e4m3x2.f16x2 ha, pa;
cvt.rn.satfinite.e4m3x2.f16x2 hb, pb;
cvt.rn.satfinite.e4m3x2.f16x2 hc, pc;
cvt.rn.satfinite.e4m3x2.f16x2 hd, pd;
mov.b32 tlo, {ha, hb};
mov.b32 thi, {hc, hd};
"""

# One 32-bit word of 8 codes. prmt reads the low 16 bits of its selector. Right shifts are
# mul.hi and the final left shift a mul.lo (IMADs: the FMA pipe, not the busy ALU one). lop3
# 0x28 is (a ^ b) & c: a code's sign bit as byte 0x01 / 0x00, flipped by a negative scale
# (sfl = 0xFFFFFFFF). Each output word is [sign(hi), T(hi), sign(lo), T(lo)] << 7.
_HALF = """
and.b32 m, WORD, 0x77777777;
prmt.b32 p0, tlo, thi, m;
mul.hi.u32 m, m, 0x10000;
prmt.b32 p1, tlo, thi, m;
mul.hi.u32 t, WORD, 0x20000000;
lop3.b32 se, t, sfl, 0x01010101, 0x28;
mul.hi.u32 t, WORD, 0x02000000;
lop3.b32 so, t, sfl, 0x01010101, 0x28;
prmt.b32 v0, p0, se, 0x5240;
mul.lo.u32 r0, v0, 128;
mov.b32 {$O0, $O1}, r0;
prmt.b32 v1, p0, so, 0x5341;
mul.lo.u32 r1, v1, 128;
mov.b32 {$O2, $O3}, r1;
prmt.b32 v2, p1, se, 0x7260;
mul.lo.u32 r2, v2, 128;
mov.b32 {$O4, $O5}, r2;
prmt.b32 v3, p1, so, 0x7361;
mul.lo.u32 r3, v3, 128;
mov.b32 {$O6, $O7}, r3;
"""


def _group_asm() -> str:
    halves = []
    for h, word in enumerate(("wlo", "whi")):
        body = _HALF.replace("WORD", word)
        for k in range(8):
            body = body.replace(f"$O{k}", f"${8 * h + k}")
        halves.append(body)
    return (
        "{\n.reg .b32 sf, sfl, ca, cb, cc, cd, pa, pb, pc, pd, tlo, thi, wlo, whi, m, p0, p1, t, se, so, v0, v1, v2, v3, r0, r1, r2, r3;\n"
        ".reg .b16 ha, hb, hc, hd;\n"
        + _TABLE
        + "mov.b64 {wlo, whi}, $16;\n"
        + "".join(halves)
        + "}\n"
    )


GROUP_ASM_F16 = gl.constexpr(_group_asm())

# The fp16 sums are 2^-8 times the true ones (see above).
UNSCALE = gl.constexpr(256.0)


def slot_code(slot: int) -> int:
    """The code (0..15 within its group) that output ``slot`` of ``GROUP_ASM_F16`` holds."""
    return (slot & ~3) | ((slot & 1) << 1) | ((slot >> 1) & 1)
