"""The wgmma scorer's decode of NVFP4 groups (docs/DESIGN.md §3-§4) by byte permutes, ~2
instructions an element, as inline PTX (GPUs only; the interpreter's table scorer gathers
from ``scorer_table.py``'s table of every (scale, code) pair).

For a group of 16 codes sharing scale s, every result is one of 8 magnitudes ``T[m] =
e4m3(s * {0, .5, 1, 1.5, 2, 3, 4, 6}[m])`` with the code's sign applied. Those 8 bytes (the
group's *table*, two registers) come ready-made from a 2 KB table of all 256 scale bytes
(``fast.tables.scale_tables``). Per 32-bit half of the group's code word the asm looks the
3-bit magnitudes up with ``prmt`` (one per 4 codes), spreads the sign bits to byte MSBs
with ``prmt``'s sign-replicate mode, XORs them in (a sign flip: negative scales stay exact),
and widens E4M3 pairs to fp16 pairs with ``cvt`` (exact) — or, for the E4M3-MMA route
(DESIGN §4.1), keeps the E4M3 bytes. ``tests/test_gpu_scorer.py`` holds the decode to the
reference on every (scale byte, code) pair.
"""

from triton.experimental.gluon import language as gl

# One group of 16 codes (code k = nibble k of its 64-bit word: element 2i is byte i's low
# nibble) from its table T (two words, byte i = T[i]), each 32-bit half of the word in
# three steps. Lookup: magnitude selectors are the nibbles with bit 3 cleared (prmt reads a
# selector's low 16 bits: m >> 16 is the upper four). Sign: selectors 0xD9C8 / 0xFBEA pick,
# in sign-replicate mode, the byte of (word << 4) or word whose MSB is nibble k's bit 3
# (lop3 0x78 = a ^ (b & c)). Widen: E4M3 pairs to fp16 pairs. The shifts are multiplies
# (IMAD on the FMA pipe), as the ALU pipe is the one that bounds the scorer.
LOOKUP_STEP = """
and.b32 m, WORD, k7;
prmt.b32 p0, tlo, thi, m;
mul.hi.u32 m2, m, 65536;
prmt.b32 p1, tlo, thi, m2;
"""
SIGN_STEP = """mul.lo.u32 x4, WORD, 16;
prmt.b32 s0, x4, WORD, 0xD9C8;
prmt.b32 s1, x4, WORD, 0xFBEA;
lop3.b32 e0, p0, s0, k80, 0x78;
lop3.b32 e1, p1, s1, k80, 0x78;
"""
WIDEN_STEP = """mov.b32 {e00, e01}, e0;
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
# The E4M3 route's last step: codes 0..3 and 4..7 of the half as two words (an E4M3 MMA's
# A register holds 4 consecutive k).
BYTES_STEP = "mov.b32 $O0, e0;\nmov.b32 $O1, e1;\n"
# The group's table from the 64-bit operand that follows the code word.
TABLE_FROM_ENTRY = "mov.b64 {tlo, thi}, $T;\n"


def group_asm(table: str, half: str, outs: int) -> str:
    """One group's asm: outputs $0 .. $(2 outs - 1) (``outs`` registers a half of the code
    word: 8 fp16 pairs' halves, or 2 E4M3 words), then the 64-bit code word, then the
    operand ``table`` reads ($T; ``TABLE_FROM_ENTRY``: the group's table words). ``half``:
    the steps of one half, WORD its register and $O0.. its outputs."""
    word, operand = f"${2 * outs}", f"${2 * outs + 1}"
    halves = []
    for h, half_word in enumerate(("wlo", "whi")):
        body = half.replace("WORD", half_word)
        for k in range(outs):
            body = body.replace(f"$O{k}", f"${outs * h + k}")
        halves.append(body)
    return (
        "{\n.reg .b32 tlo, thi, wlo, whi, m, m2, x4, p0, p1, s0, s1, e0, e1, f0, f1, f2, f3, k7, k80;\n"
        ".reg .b16 e00, e01, e10, e11;\n"
        + table.replace("$T", operand)
        + f"mov.b64 {{wlo, whi}}, {word};\nmov.b32 k7, 0x77777777;\nmov.b32 k80, 0x80808080;\n"
        + "".join(halves)
        + "}\n"
    )


# The exact decode (16 fp16 outputs) and the E4M3 route's (4 words of E4M3 bytes).
GROUP_ASM = gl.constexpr(group_asm(TABLE_FROM_ENTRY, LOOKUP_STEP + SIGN_STEP + WIDEN_STEP, 8))
GROUP_ASM_E4M3 = gl.constexpr(group_asm(TABLE_FROM_ENTRY, LOOKUP_STEP + SIGN_STEP + BYTES_STEP, 2))
