"""The Q8KV4 decode page scorer, honoring DESIGN.md §4 exactly: ``score_pages`` and its
kernels.

Three kernels, one contract: ``"wgmma"`` (the GPU default, ``scorer_wgmma.py``: Gluon,
codes decoded straight into wgmma's register operand — mma.sync's up to 8 rows scored),
``"prmt"`` (GPUs, its predecessor: the same byte-permute decoding, ``dequant_prmt.py``, in plain
Triton, whose tl.dot stages the fp16 tile through shared memory; kept for the bench's
version comparison and as a second GPU implementation in the tests) and ``"table"``
(everywhere, the interpreter's: a gather from a per-scale table of E4M3 values built by
torch — no fp8 conversion in the kernel, which the interpreter gets wrong). All multiply
with 16-bit operands and fp32 accumulators (Hopper's FP8 MMA does not accumulate in fp32):
tokens on M, the query rows scored on N (8 * Hs, or the step's q * Hs with ``first_slot``).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from indexer_constants import CODE_BYTES, PAGE, PAGE_BYTES, SLOTS
from .backend import pdl_options, sm_count
from .checks import score_shapes
from .dequant_prmt import dequant_prmt, load_page_prmt
from .tables import dequant_lut, scale_tables
from .jit_helpers import pdl_wait
from .scorer_wgmma import WGMMA_DEPTH, _score_kernel_wgmma, mma_rows, partial_maxima, rows_for
from .scorer_wgmma import max_registers as wgmma_max_registers
from .scorer_wgmma import pages_per_program as wgmma_pages

_PAGE = tl.constexpr(PAGE)
_PAGE_BYTES = tl.constexpr(PAGE_BYTES)
_CODE_BYTES = tl.constexpr(CODE_BYTES)
# The prmt scorer's pages per program and tokens per MMA block (fast/PERF.md: measured).
PRMT_PAGES = 1
PRMT_TOKENS = 64


@functools.cache
def _first_set(device: str) -> torch.Tensor:
    """int64 [1] zero: "read the tile itself" (cached: no allocation inside a graph capture)."""
    return torch.zeros(1, dtype=torch.int64, device=device)


@triton.jit
def _pages_scored(lens_ptr, b, W):
    """(length, n): request b's length and the pages scored, min((len - 1) // 128, W).
    Written without negative division (C and numpy round it differently)."""
    length = tl.load(lens_ptr + b)
    return length, tl.where(length >= 1, tl.minimum((length - 1) // _PAGE, W), 0)


@triton.jit
def _query_rows(q_ptr, q_sel_ptr, q_set_stride, b, length, HS: tl.constexpr, SLOT0: tl.constexpr, ROWS: tl.constexpr):
    """(r, own, q): the tile's rows r = slot * HS + head from slot SLOT0 on (ROWS of them,
    past 8 * HS padding), each row's causal bound own(slot) = (len - 8 + slot) // 128, and q
    fp16 [ROWS, 128] (E4M3 -> fp16 is exact; padding rows 0)."""
    r = SLOT0 * HS + tl.arange(0, ROWS)
    slot_len = length - 8 + r // HS
    own = tl.where(slot_len >= 0, slot_len // _PAGE, 0)
    d = tl.arange(0, 128)
    tile = q_ptr + tl.load(q_sel_ptr) * q_set_stride + b.to(tl.int64) * (8 * HS * 128)
    qb = tl.load(tile + r[:, None] * 128 + d[None, :], mask=r[:, None] < 8 * HS, other=0)
    return r, own, qb.to(tl.float8e4nv, bitcast=True).to(tl.float16)


@triton.jit
def _score_kernel(
    q_ptr,  # uint8 [.., B, 8, HS, 128] query tile (E4M3 bytes); offset by q_sel below
    q_sel_ptr,  # int64 [1]: which tile set to read (see q_set_stride)
    q_set_stride,  # bytes between tile sets (0 where there is one)
    k_ptr,  # uint8 [N, 9216] pages
    bt_ptr,  # int32 [B, W]
    lens_ptr,  # int32 [B]
    out_ptr,  # fp32 [B, 8 * HS, W]
    lut_ptr,  # fp16 [256 * 16]
    W,
    stride_bt,
    stride_ob,
    stride_or,
    HS: tl.constexpr,
    SLOT0: tl.constexpr,  # the first slot scored
    ROWS: tl.constexpr,  # rows_for((8 - SLOT0) * HS): the rows scored, padded (the MMA's N)
    V: tl.constexpr,  # pages per program, as a leading tensor dimension
    PDL: tl.constexpr,
):
    b = tl.program_id(0)
    first = tl.program_id(1) * V
    pdl_wait(PDL)
    length, n = _pages_scored(lens_ptr, b, W)
    if first < n:
        r, own, q = _query_rows(q_ptr, q_sel_ptr, q_set_stride, b, length, HS, SLOT0, ROWS)
        qt = tl.broadcast_to(tl.trans(q)[None, :, :], [V, 128, ROWS])
        v = tl.arange(0, V)
        j = first + v  # [V] page columns
        live = j < n
        page = tl.load(bt_ptr + b.to(tl.int64) * stride_bt + j, mask=live, other=0).to(tl.int64)
        base = k_ptr + page * _PAGE_BYTES  # [V]
        t = tl.arange(0, 128)
        i = tl.arange(0, 64)
        byte = t[:, None] * 64 + i[None, :]  # [128 tokens, 64 code bytes]
        group = _CODE_BYTES + t[:, None] * 8 + i[None, :] // 8
        codes = tl.load(base[:, None, None] + byte[None, :, :], mask=live[:, None, None], other=0).to(tl.int32)
        scales = tl.load(base[:, None, None] + group[None, :, :], mask=live[:, None, None], other=0).to(tl.int32)
        lo = tl.load(lut_ptr + scales * 16 + (codes & 15))
        hi = tl.load(lut_ptr + scales * 16 + (codes >> 4))
        k = tl.reshape(tl.join(lo, hi), [V, 128, 128])  # element 2i: low nibble, 2i + 1: high
        dots = tl.dot(k, qt, out_dtype=tl.float32)  # [V, 128 tokens, ROWS]
        best = tl.max(dots, axis=1) + 0.0  # [V, ROWS]; +0.0: an all-zero sum is +0.0
        dst = out_ptr + b.to(tl.int64) * stride_ob + r[None, :] * stride_or + j[:, None]
        keep = live[:, None] & (r[None, :] < 8 * HS) & (j[:, None] < own[None, :])
        tl.store(dst, best, mask=keep)


@triton.jit
def _score_kernel_prmt(
    q_ptr, q_sel_ptr, q_set_stride,  # as _score_kernel
    k_ptr,  # uint8 [N, 9216] pages
    k64_ptr,  # the same memory as int64 [N, 1152]
    bt_ptr, lens_ptr, out_ptr, W, stride_bt, stride_ob, stride_or,
    HS: tl.constexpr,
    SLOT0: tl.constexpr,
    ROWS: tl.constexpr,
    PPP: tl.constexpr,  # pages per program, in a loop that prefetches the next block
    TOK: tl.constexpr,  # tokens per dot (128 or 64: a page in one or two blocks)
    PDL: tl.constexpr,
):  # fmt: skip
    """PPP consecutive pages of one request per program, TOK tokens at a time, dequantized by
    ``dequant_prmt`` (GPUs only). The next block's bytes are loaded before this block's
    arithmetic, so each program keeps a load in flight while it computes."""
    b = tl.program_id(0)
    first = tl.program_id(1) * PPP
    pdl_wait(PDL)
    length, n = _pages_scored(lens_ptr, b, W)
    if first < n:
        r, own, q = _query_rows(q_ptr, q_sel_ptr, q_set_stride, b, length, HS, SLOT0, ROWS)
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
                next_codes, next_scales = load_page_prmt(k_ptr + nxt * _PAGE_BYTES, k64_ptr + nxt * (_PAGE_BYTES // 8), more, TOK, first_token)
                dots = tl.dot(dequant_prmt(codes, scales), qt, out_dtype=tl.float32)  # [TOK tokens, ROWS]
                best = tl.maximum(best, tl.max(dots, axis=0))
                codes, scales, page = next_codes, next_scales, nxt
            # +0.0: an all-zero sum is +0.0
            tl.store(out_row + j, best + 0.0, mask=(r < 8 * HS) & (j < own) & (j < n))


@triton.jit
def _dequant_kernel(k_ptr, k64_ptr, pages_ptr, out_ptr):
    """out[i] = fp16 [128, 128] of page pages[i], through the prmt path."""
    i = tl.program_id(0)
    page = tl.load(pages_ptr + i).to(tl.int64)
    codes, scales = load_page_prmt(k_ptr + page * _PAGE_BYTES, k64_ptr + page * (_PAGE_BYTES // 8), True)
    k = dequant_prmt(codes, scales)
    t = tl.arange(0, 128)
    tl.store(out_ptr + i * 128 * 128 + t[:, None] * 128 + t[None, :], k)


def dequant_pages_prmt(k_cache: torch.Tensor, pages: torch.Tensor) -> torch.Tensor:
    """The GPU dequantization on its own (for tests and debugging): fp16 ``[n, 128, 128]``
    of pages ``pages`` (int32 ``[n]``) of ``k_cache`` (uint8 ``[N, 128, 72]``, CUDA)."""
    out = torch.empty(pages.shape[0], 128, 128, dtype=torch.float16, device=k_cache.device)
    if pages.shape[0]:
        pages_u8 = k_cache.view(-1, PAGE_BYTES)
        _dequant_kernel[(pages.shape[0],)](pages_u8, pages_u8.view(torch.int64), pages, out)
    return out


def score_pages(
    q_tile: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor,
    lens: torch.Tensor,
    out: torch.Tensor,
    *,
    q_sel: torch.Tensor | None = None,
    q_set_stride: int = 0,
    pdl: bool = False,
    prefetch: bool = False,
    release: bool = False,
    pages_per_program: int | None = None,
    dequant: str | None = None,
    num_warps: int = 4,
    tokens_per_dot: int | None = None,
    blocks_ahead: int | None = None,
    register_cap: int | None | str = "auto",
    first_slot: int = 0,
    loads_only: bool = False,
) -> torch.Tensor:
    """Launch the scorer: the contract of ``reference.score_pages``, on the tensors' device.

    q_tile: float8_e4m3fn or uint8 ``[B, 8, Hs, 128]`` (contiguous); k_cache: uint8
    ``[N, 128, 72]``; block_table: int32 ``[B, W]``; lens: int32 ``[B]``; out: float32
    ``[B, 8 * Hs, W]`` (rows contiguous). Stores column j of row (slot, head) for
    ``j < min((len - 1) // 128, W)`` and ``j < (len - 8 + slot) // 128``; nothing else.
    q_sel / q_set_stride: read the tile at ``q_tile + q_sel[0] * q_set_stride`` bytes (the
    CP path's double-buffered tiles); by default the tile itself. pdl: launch as a
    programmatic dependent (GPUs), waiting for the producer before reading the q tile;
    prefetch (with pdl, wgmma only): load the lengths, the table and each program's first
    blocks before that wait — only where the producer releases the scorer after its own
    wait, so that nothing earlier in the stream still writes them (the stock and CP
    decodes' q kernels do); release (with pdl, wgmma only): let the dependent grid launch
    at once instead of at the scorer's end — its launch latency hidden, but its programs
    land on the first SMs the scorer frees, several to an SM: a loss where each runs a long
    select (fast/PERF.md, seventh session). dequant: "wgmma" (the GPU
    default), "prmt" (GPUs) or "table" (the interpreter's; on a GPU for comparison);
    pages_per_program: pages per program (defaults: wgmma ``scorer_wgmma.pages_per_program``
    of the grid, PRMT_PAGES; table: 1 on GPUs, 16 in the interpreter); blocks_ahead: 1 or
    2, the wgmma kernel's 64-token blocks in flight while one is decoded (default
    WGMMA_DEPTH); tokens_per_dot: 64 or 128, the prmt kernel's tokens per MMA block (default
    PRMT_TOKENS; wgmma: 64) and num_warps its warps (wgmma: 4, one warpgroup);
    register_cap: the wgmma kernel's registers per thread, "auto" (``scorer_wgmma.
    max_registers``), None (the compiler's choice) or 64..255 (the benchmark compares them).
    first_slot: 0..7, score only the slots from it on and leave the earlier slots' rows
    untouched — a decode step of query_len q fills slots 8 - q .. 7, and the MMA's N then
    follows q x Hs (``scorer_wgmma.mma_rows``): at q = 1 and Hs = 4 the kernel runs N = 8,
    not 32. The default, 0, is the contract of ``reference.score_pages``.
    loads_only: the bench's probe of the wgmma kernel's memory side — the same loads, no
    decode, no MMA, ``out`` untouched.
    """
    batch, hs, width = score_shapes(q_tile, block_table, out)
    if batch == 0 or width == 0:
        return out
    device = q_tile.device
    if q_sel is None:
        q_sel = _first_set(str(device))
    dequant = dequant or ("wgmma" if device.type == "cuda" else "table")
    if dequant not in ("wgmma", "prmt", "table"):
        raise ValueError(f"dequant: {dequant!r} (wgmma, prmt or table)")
    if tokens_per_dot not in (None, 64, 128) or (tokens_per_dot and dequant != "prmt"):
        raise ValueError(f"tokens_per_dot: {tokens_per_dot} (the prmt kernel's: 64 or 128, a page is one or two MMA blocks)")
    if blocks_ahead not in (None, 1, 2) or (blocks_ahead and dequant != "wgmma"):
        raise ValueError(f"blocks_ahead: {blocks_ahead} (the wgmma kernel's: 1 or 2)")
    if register_cap != "auto" and (dequant != "wgmma" or not (register_cap is None or (isinstance(register_cap, int) and 64 <= register_cap <= 255))):
        raise ValueError(f"register_cap: {register_cap!r} (the wgmma kernel's: 'auto', None or 64..255)")
    for name, on in (("prefetch", prefetch), ("release", release)):
        if on and not (pdl and dequant == "wgmma"):
            raise ValueError(f"{name}: needs pdl and the wgmma kernel (pdl={pdl}, dequant={dequant!r})")
    if loads_only and dequant != "wgmma":
        raise ValueError(f"loads_only: the wgmma kernel's probe, not {dequant!r}'s")
    if not (isinstance(first_slot, int) and 0 <= first_slot < SLOTS):
        raise ValueError(f"first_slot: {first_slot!r} (0..{SLOTS - 1}: the first of the tile's slots to score)")
    if dequant != "table" and device.type != "cuda":
        raise ValueError(f"dequant: {dequant!r} is not available on {device.type} (wgmma and prmt need a GPU; table runs anywhere)")
    live = (SLOTS - first_slot) * hs  # the rows scored
    pages_u8 = k_cache.view(-1, PAGE_BYTES)
    if dequant != "table":
        # the two GPU kernels take the same operands (wgmma: and the scale tables); pages
        # also as int64 (16-byte code loads)
        pages = (pages_u8, pages_u8.view(torch.int64))
        rest = (block_table, lens, out, width, block_table.stride(0), out.stride(0), out.stride(1))
        if dequant == "wgmma":
            rows = mma_rows(live)
            ppp = pages_per_program or wgmma_pages(batch, width, sm_count(str(device)), rows)
            tuning = dict(ROWS=rows, PARTS=partial_maxima(rows, ppp), DEPTH=blocks_ahead or WGMMA_DEPTH, PREFETCH=prefetch, RELEASE=release, LOADS_ONLY=bool(loads_only), num_warps=4)
            cap = wgmma_max_registers(live) if register_cap == "auto" else register_cap
            if cap is not None:
                tuning["maxnreg"] = cap
            kernel, pages = _score_kernel_wgmma, (*pages, scale_tables(device))
        else:
            ppp = pages_per_program or PRMT_PAGES
            tuning = dict(ROWS=rows_for(live), TOK=tokens_per_dot or PRMT_TOKENS, num_warps=num_warps)
            kernel = _score_kernel_prmt
        kernel[(batch, triton.cdiv(width, ppp))](
            q_tile.view(torch.uint8), q_sel, q_set_stride, *pages, *rest, HS=hs, SLOT0=first_slot, PPP=ppp, **tuning, **pdl_options(pdl)
        )
        return out
    # Under the interpreter each tensor op costs ~1 ms whatever its size: score many pages
    # per op there. On a GPU one page per program keeps the tile in registers.
    v = pages_per_program or (1 if device.type == "cuda" else 16)
    grid = (batch, triton.cdiv(width, v))
    _score_kernel[grid](
        q_tile.view(torch.uint8),
        q_sel,
        q_set_stride,
        pages_u8,
        block_table,
        lens,
        out,
        dequant_lut(str(device)),
        width,
        block_table.stride(0),
        out.stride(0),
        out.stride(1),
        HS=hs,
        SLOT0=first_slot,
        ROWS=rows_for(live),
        V=v,
        **pdl_options(pdl),
    )
    return out

