"""E4M3 bytes to fp16: the hardware conversion where the GPU has one (sm_89 on), else in
integer arithmetic (sm_80 / 86; docs/KERNELS.md, "E4M3 without the hardware")."""

import triton
import triton.language as tl


@triton.jit
def e4m3_to_f16(bits):
    """fp16 values of E4M3 bytes (uint8 or int8, any shape); exact."""
    b = bits.to(tl.int32) & 0xFF
    half = ((b & 0x80) << 8) | ((b & 0x7F) << 7)  # sign to bit 15; exponent and mantissa below
    value = half.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    return tl.where((b & 0x7F) == 0x7F, float("nan"), value).to(tl.float16)


@triton.jit
def e4m3_bytes_to_f16(bits, HW: tl.constexpr):
    """fp16 values of E4M3 bytes: with HW the hardware conversion (sm_89 and newer, and the
    interpreter), else ``e4m3_to_f16``'s integer arithmetic; the same values either way."""
    if HW:
        value = bits.to(tl.float8e4nv, bitcast=True).to(tl.float16)
    else:
        value = e4m3_to_f16(bits)
    return value
