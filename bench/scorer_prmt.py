"""The previous GPU scorer, kept for the benchmark's version comparison and as a second GPU
implementation in the tests: codes decoded by ``dequant_prmt``'s byte permutes in plain
Triton, whose ``tl.dot`` stages the fp16 tile through shared memory. Not in the decode's
dispatch (``fast.scorer``); the tools launch it (``bench.variants``)."""

import triton
import triton.language as tl

from fast.kernels.dequant_prmt import dequant_prmt, load_page_prmt
from fast.kernels.device import pdl_wait
from fast.kernels.score_rows import pages_scored, query_rows
from indexer_constants import PAGE, PAGE_BYTES

_PAGE = tl.constexpr(PAGE)
_PAGE_BYTES = tl.constexpr(PAGE_BYTES)


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
        r, own, q = query_rows(q_ptr, q_sel_ptr, q_set_stride, b, length, HS, SLOT0, ROWS)
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
