"""The wgmma scorer's decode of NVFP4 groups (docs/DESIGN.md §3-§4) by byte permutes, ~2
instructions an element, as inline PTX (GPUs only): each group's 8 magnitudes from the
``scale_tables`` entry, looked up by ``prmt``, signed, widened to fp16 (or kept as E4M3
for the E4M3-MMA route). The steps: docs/KERNELS.md, "The NVFP4 group decode"."""

from triton.experimental.gluon import language as gl

# A group's 16 codes (nibble k of its word) from its table T, each 32-bit half in three
# steps: lookup, sign, widen (docs/KERNELS.md, "The NVFP4 group decode").
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
