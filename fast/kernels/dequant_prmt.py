"""GPU dequantization of one NVFP4 page by byte permutes (docs/DESIGN.md §3-§4), ~2 instructions
per element.

For a group of 16 codes sharing scale s, every result is one of 8 magnitudes
``T[m] = e4m3(s * {0, .5, 1, 1.5, 2, 3, 4, 6}[m])`` with the code's sign applied. Those 8
bytes (the group's *table*, two registers) come either from the scale byte in the asm itself
(``GROUP_ASM``, ``_TABLE_BODY``: s to fp16 with ``cvt``, exact; 4 fp16x2 products, exact: at
most 6 significant bits, within fp16's normal range; 4 hardware round-to-nearest-even,
saturating conversions to E4M3 — the contract's one rounding) or ready-made from a 2 KB
table of all 256 scale bytes in memory (``GROUP_ASM_TABLED``, ``fast.tables.scale_tables``; the wgmma
scorer: 5 of the 13 conversions per group gone). Then, per 32-bit half of the
group's 64-bit code word (``_DECODE_HALF``), the asm looks the 3-bit magnitudes up with
``prmt`` (one per 4 codes), spreads the sign bits to byte MSBs with ``prmt``'s
sign-replicate mode, XORs them in (a sign flip, so negative scales stay exact too), and
widens E4M3 pairs to fp16 pairs with ``cvt`` (exact). Inline PTX exists on GPUs only; the
interpreter uses the table gather of ``scorer_table.py``, and ``tests/test_gpu_scorer.py`` checks
both paths against the reference on every (scale byte, code) pair.

Three timing probes for the bench, never a decode. ``GROUP_ASM_TABLED_SIGNLESS`` is the same
asm without its sign step (the two sign-replicate ``prmt`` and two ``lop3`` of each 8 codes,
a third of the decode's ALU work), so its scores are those of |k|: it prices what a decode 4
ALU instructions cheaper per 8 codes would give the scorer, the pipe that bounds it at N <=
16 (bench/PERF.md). ``GROUP_ASM_MOVES`` decodes nothing: the group's 16 fp16 are the
code word's four 16-bit halves, each four times, the first two XORed with the table's first
four bytes — one ``lop3`` a group, which keeps the scale bytes and their table entries
loaded as the decode has them — so the scorer does all its work but the decode: what a free
decode would reach, the most any decode leaves it. ``GROUP_ASM_TABLED_E4M3`` is the exact
decode stopped before its widening: each 8 codes' E4M3 bytes as two words, for an E4M3 MMA
(Hopper's does not accumulate in fp32, so its scores are not the contract's: issue 65's
E4M3-MMA route, unbuilt; the probe prices the four ``cvt`` per 8 codes and half the MMAs).
"""

import triton
import triton.language as tl

from indexer_constants import CODE_BYTES

_CODE_BYTES = tl.constexpr(CODE_BYTES)

# $0, $1: table bytes T[0..3], T[4..7] (byte i = T[i]); $2: the scale byte (zero-extended;
# times 257 puts it in both low bytes). mul.f16x2 constants, high half : low half -> products
# {lo, hi}: {0, .5s}, {s, 1.5s}, {2s, 3s}, {4s, 6s}; cvt e4m3x2 puts the low half's byte
# low, so {ha, hb} = T[0..3].
# The integer shifts here and below are multiplies (mul.lo by 2^k, mul.hi by 2^16): ptxas
# issues them as IMAD on the FMA pipe instead of SHF / PRMT on the ALU pipe, the busiest one
# (the ALU pipe is what bounds the scorer).
_TABLE_BODY = """
{
.reg .b32 ss, sf, ca, cb, cc, cd, pa, pb, pc, pd;
.reg .b16 slo, shi, ha, hb, hc, hd;
mul.lo.u32 ss, $2, 257;
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
"""

# One group of 16 codes: $0..$15 fp16 of codes 0..15 (code k = nibble k of the 64-bit
# word $16: element 2i is byte i's low nibble); $17 the group's scale byte. The table
# (_TABLE_BODY) is built once, then each 32-bit half is decoded in three steps: magnitude
# selectors are the nibbles with bit 3 cleared (prmt reads a selector's low 16 bits: m >> 16
# is the upper four); sign selectors 0xD9C8 / 0xFBEA pick, in sign-replicate mode, the byte
# of (word << 4) or word whose MSB is nibble k's bit 3 (lop3 0x78 = a ^ (b & c)); E4M3
# pairs widened to fp16 pairs.
_LOOKUP_STEP = """
and.b32 m, WORD, k7;
prmt.b32 p0, tlo, thi, m;
mul.hi.u32 m2, m, 65536;
prmt.b32 p1, tlo, thi, m2;
"""
_SIGN_STEP = """mul.lo.u32 x4, WORD, 16;
prmt.b32 s0, x4, WORD, 0xD9C8;
prmt.b32 s1, x4, WORD, 0xFBEA;
lop3.b32 e0, p0, s0, k80, 0x78;
lop3.b32 e1, p1, s1, k80, 0x78;
"""
_WIDEN_STEP = """mov.b32 {e00, e01}, e0;
mov.b32 {e10, e11}, e1;
cvt.rn.f16x2.e4m3x2 f0, e00;
cvt.rn.f16x2.e4m3x2 f1, e01;
cvt.rn.f16x2.e4m3x2 f2, e10;
cvt.rn.f16x2.e4m3x2 f3, e11;
mov.b32 {$O0, $O1}, f0;
mov.b32 {$O2, $O3}, f1;
mov.b32 {$O4, $O5}, f2;
mov.b32 {$O6, $O7}, f3;
"""
# The bench's E4M3-MMA probe keeps the E4M3 bytes: codes 0..3 and 4..7 of the half as two
# words, byte i of a word = code i's (an E4M3 MMA's A register: 4 consecutive k).
_BYTES_STEP = "mov.b32 $O0, e0;\nmov.b32 $O1, e1;\n"
_DECODE_HALF = _LOOKUP_STEP + _SIGN_STEP + _WIDEN_STEP
# What the bench's probe puts in the sign step's place: the magnitudes as they are (|k|).
_NO_SIGN_STEP = "mov.b32 e0, p0;\nmov.b32 e1, p1;\n"


def _group_asm(table_from_scale: bool, signed: bool = True, widen: bool = True) -> str:
    """One group's asm: $0..$15 fp16 codes (widen; else $0..$3 their E4M3 bytes, four codes
    a word), then the 64-bit code word, then the scale byte (table_from_scale) or the
    group's two table words as one 64-bit operand (byte i = T[i]); signed False: the bench's
    probe, without the sign step (fp16 of |k|)."""
    outs = 8 if widen else 2  # output registers a half-word of codes
    half = _LOOKUP_STEP + (_SIGN_STEP if signed else _NO_SIGN_STEP) + (_WIDEN_STEP if widen else _BYTES_STEP)
    word, scale = f"${2 * outs}", f"${2 * outs + 1}"
    if table_from_scale:
        table = _TABLE_BODY.replace("$0", "tlo").replace("$1", "thi").replace("$2", scale)
    else:
        table = f"mov.b64 {{tlo, thi}}, {scale};\n"
    halves = []
    for h, half_word in enumerate(("wlo", "whi")):
        body = half.replace("WORD", half_word)
        for k in range(outs):
            body = body.replace(f"$O{k}", f"${outs * h + k}")
        halves.append(body)
    return (
        "{\n.reg .b32 tlo, thi, wlo, whi, m, m2, x4, p0, p1, s0, s1, e0, e1, f0, f1, f2, f3, k7, k80;\n"
        ".reg .b16 e00, e01, e10, e11;\n"
        + table
        + f"mov.b64 {{wlo, whi}}, {word};\nmov.b32 k7, 0x77777777;\nmov.b32 k80, 0x80808080;\n"
        + "".join(halves)
        + "}\n"
    )


GROUP_ASM = tl.constexpr(_group_asm(table_from_scale=True))
# scorer_wgmma.py's, which hands each group its table words from ``scale_tables``.
GROUP_ASM_TABLED = tl.constexpr(_group_asm(table_from_scale=False))
# The bench's probe (the module's docstring): the same without the sign step.
GROUP_ASM_TABLED_SIGNLESS = tl.constexpr(_group_asm(table_from_scale=False, signed=False))
# The bench's E4M3-MMA probe (the module's docstring): the exact decode's bytes, not widened.
GROUP_ASM_TABLED_E4M3 = tl.constexpr(_group_asm(table_from_scale=False, widen=False))
# The bench's other probe (the module's docstring): output 4 i + j is the word's 16-bit half
# j, but outputs 0 and 1 are the halves of (low word ^ the table's low word).
GROUP_ASM_MOVES = tl.constexpr(
    "{\n.reg .b32 wlo, whi, tlo, thi, x;\nmov.b64 {wlo, whi}, $16;\nmov.b64 {tlo, thi}, $17;\n"
    "xor.b32 x, wlo, tlo;\nmov.b32 {$0, $1}, x;\nmov.b32 {$2, $3}, whi;\n"
    + "".join(f"mov.b32 {{${k}, ${k + 1}}}, wlo;\nmov.b32 {{${k + 2}, ${k + 3}}}, whi;\n" for k in (4, 8, 12))
    + "}\n"
)


@triton.jit
def load_page_prmt(page_u8, page_i64, live, TOK: tl.constexpr = 128, first_token=0):
    """Raw operands for ``dequant_prmt`` of tokens ``[first_token, first_token + TOK)`` of a
    page: int64 ``[TOK, 8]`` code groups (16 codes each) and int32 ``[TOK, 8]`` their scale
    bytes (zeros where ``live`` is false, nothing read). page_u8 / page_i64: the page's
    first byte as uint8 and int64 pointers (pages are 9216 bytes: groups are 8-byte aligned)."""
    t = first_token + tl.arange(0, TOK)
    g = tl.arange(0, 8)
    codes = tl.load(page_i64 + t[:, None] * 8 + g[None, :], mask=live, other=0)
    scales = tl.load(page_u8 + _CODE_BYTES + t[:, None] * 8 + g[None, :], mask=live, other=0).to(tl.int32)
    return codes, scales


@triton.jit
def dequant_prmt(codes, scales):
    """fp16 ``[TOK tokens, 128]`` from ``load_page_prmt``'s operands: one asm block per
    group (table + 16 codes), then interleaves put element 16g + k = o[k][g]."""
    o = tl.inline_asm_elementwise(
        GROUP_ASM,
        "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,l,r",
        [codes, scales],
        dtype=(
            tl.float16,
            tl.float16,
            tl.float16,
            tl.float16,
            tl.float16,
            tl.float16,
            tl.float16,
            tl.float16,
            tl.float16,
            tl.float16,
            tl.float16,
            tl.float16,
            tl.float16,
            tl.float16,
            tl.float16,
            tl.float16,
        ),
        is_pure=True,
        pack=1,
    )
    # interleave(a, b)[2i + c] = (a, b)[c][i]; four levels over o[k], o[k + 8], ... give
    # element 16g + k = o[k][g] (the bit-reversed pairing makes the order come out natural).
    a = [
        tl.interleave(o[0], o[8]),
        tl.interleave(o[1], o[9]),
        tl.interleave(o[2], o[10]),
        tl.interleave(o[3], o[11]),
        tl.interleave(o[4], o[12]),
        tl.interleave(o[5], o[13]),
        tl.interleave(o[6], o[14]),
        tl.interleave(o[7], o[15]),
    ]
    b0 = tl.interleave(a[0], a[4])
    b1 = tl.interleave(a[1], a[5])
    b2 = tl.interleave(a[2], a[6])
    b3 = tl.interleave(a[3], a[7])
    return tl.interleave(tl.interleave(b0, b2), tl.interleave(b1, b3))
