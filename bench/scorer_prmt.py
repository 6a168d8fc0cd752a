"""The previous GPU scorer, kept for the benchmark's version comparison and as a second GPU
implementation in the tests: codes decoded by the byte permutes of
``fast.kernels.dequant_prmt`` in plain Triton, each group's table built in the asm from its
scale byte, whose ``tl.dot`` stages the fp16 tile through shared memory. Not in the
decode's dispatch (``fast.scorer``); the tools launch it (``bench.variants``)."""

import triton
import triton.language as tl

from fast.kernels.dequant_prmt import LOOKUP_STEP, SIGN_STEP, WIDEN_STEP, group_asm
from fast.kernels.device import pdl_wait
from fast.kernels.score_rows import pages_scored, query_rows
from indexer_constants import CODE_BYTES, PAGE, PAGE_BYTES

_PAGE = tl.constexpr(PAGE)
_PAGE_BYTES = tl.constexpr(PAGE_BYTES)
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
# One group from its scale byte: the table computed in the asm (s to fp16 with ``cvt``,
# exact; 4 exact fp16x2 products; 4 round-to-nearest-even saturating conversions to E4M3,
# the contract's one rounding), then the runtime's decode steps.
GROUP_ASM_FROM_SCALE = tl.constexpr(
    group_asm(
        _TABLE_BODY.replace("$0", "tlo").replace("$1", "thi").replace("$2", "$T"),
        LOOKUP_STEP + SIGN_STEP + WIDEN_STEP,
        8,
    )
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
        GROUP_ASM_FROM_SCALE,
        "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,l,r",
        [codes, scales],
        dtype=(tl.float16,) * 16,
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


@triton.jit
def score_kernel_prmt(
    q_ptr,
    q_sel_ptr,
    q_set_stride,  # as _score_kernel
    k_ptr,  # uint8 [N, 9216] pages
    k64_ptr,  # the same memory as int64 [N, 1152]
    bt_ptr,
    lens_ptr,
    out_ptr,
    W,
    stride_bt,
    stride_ob,
    stride_or,
    HS: tl.constexpr,
    SLOT0: tl.constexpr,
    ROWS: tl.constexpr,
    PPP: tl.constexpr,  # pages per program, in a loop that prefetches the next block
    TOK: tl.constexpr,  # tokens per dot (128 or 64: a page in one or two blocks)
    PDL: tl.constexpr,
):
    """PPP consecutive pages of one request per program, TOK tokens at a time, dequantized by
    ``dequant_prmt`` (GPUs only). The next block's bytes are loaded before this block's
    arithmetic, so each program keeps a load in flight while it computes."""
    b = tl.program_id(0)
    first = tl.program_id(1) * PPP
    pdl_wait(PDL)
    length, n = pages_scored(lens_ptr, b, W)
    if first < n:
        r, own, q = query_rows(q_ptr, 0, q_set_stride, b, length, HS, SLOT0, ROWS)
        qt = tl.trans(q)  # [128, ROWS]
        bt_row = bt_ptr + b.to(tl.int64) * stride_bt
        out_row = out_ptr + b.to(tl.int64) * stride_ob + r * stride_or
        page = tl.load(bt_row + first).to(tl.int64)
        codes, scales = load_page_prmt(k_ptr + page * _PAGE_BYTES, k64_ptr + page * (_PAGE_BYTES // 8), True, TOK, 0)
        for i in range(PPP):
            j = first + i
            best = tl.full([ROWS], float("-inf"), tl.float32)
            for h in tl.static_range(_PAGE // TOK):
                # prefetch the next block of tokens: this page's next one, or the next page's first
                if h + 1 < _PAGE // TOK:
                    more = j < n
                    nxt, first_token = page, (h + 1) * TOK
                else:
                    more = (i + 1 < PPP) & (j + 1 < n)
                    nxt, first_token = tl.load(bt_row + j + 1, mask=more, other=0).to(tl.int64), 0
                next_codes, next_scales = load_page_prmt(
                    k_ptr + nxt * _PAGE_BYTES, k64_ptr + nxt * (_PAGE_BYTES // 8), more, TOK, first_token
                )
                dots = tl.dot(dequant_prmt(codes, scales), qt, out_dtype=tl.float32)  # [TOK tokens, ROWS]
                best = tl.maximum(best, tl.max(dots, axis=0))
                codes, scales, page = next_codes, next_scales, nxt
            # +0.0: an all-zero sum is +0.0
            tl.store(out_row + j, best + 0.0, mask=(r < 8 * HS) & (j < own) & (j < n))


@triton.jit
def dequant_kernel_prmt(k_ptr, k64_ptr, pages_ptr, out_ptr):
    """out[i] = fp16 [128, 128] of page pages[i], through the prmt path."""
    i = tl.program_id(0)
    page = tl.load(pages_ptr + i).to(tl.int64)
    codes, scales = load_page_prmt(k_ptr + page * _PAGE_BYTES, k64_ptr + page * (_PAGE_BYTES // 8), True)
    k = dequant_prmt(codes, scales)
    t = tl.arange(0, 128)
    tl.store(out_ptr + i * 128 * 128 + t[:, None] * 128 + t[None, :], k)
