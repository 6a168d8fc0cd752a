"""The GPU page scorer: NVFP4 codes dequantized straight into Hopper wgmma register
fragments (Gluon), so the fp16 tile never goes through shared memory.

Why: a Triton scorer (``scorer_prmt.py``) writes each page's 32 KB fp16 tile to shared memory
for wgmma and reads it back, several times the bytes it reads from HBM: that shared traffic,
not HBM, bounds it. wgmma takes its A operand from registers
when they hold the A fragment: in each warp, lane (gid, tig) holds rows 16w + gid and
16w + gid + 8 and, per 16-wide k block kb, columns 2 tig + {0, 1} and 2 tig + 8 + {0, 1}.

The trick: the dot product's dimension may be permuted freely if q is permuted alike. We
give logical column k = 16 kb + 8 h + 2 tig + e the physical dimension
``d(k) = 32 tig + 4 kb + 2 h + e``. Then lane tig's 32 columns of a row are the physical
dimensions [32 tig, 32 tig + 32): two whole NVFP4 groups (2 tig, 2 tig + 1), 16 contiguous
code bytes and 2 scale bytes. Each lane loads exactly those, decodes each group with the
``prmt`` asm block of ``dequant_prmt.py`` (16 fp16 values), and joins / permutes them into
the fragment order; ``convert_layout(..., assert_trivial=True)`` proves at compile time that
no data moves between threads. q is loaded once per program in the same order
(``column_order.py``). Each group's 8 E4M3 magnitudes come from a 2 KB table of all scale
bytes (``fast.tables.scale_tables``) instead of being computed per group, which saves 5 of
the group's 13 conversions. Up to N = 32 the table is copied into shared memory once a
program and each group's entry gathered there (``page_ring.gather_tables``): a gather is
on every block's dependent chain, shorter from shared memory than through L1, where the
codes' loads also evict it; at N = 64 the gather goes through L1
(``fast.scorer.shared_tables``). The scale bytes and the table entries are loaded by a few
lines of PTX (``_load_scales``, ``_gather_tables``) that keep their addressing off the ALU
pipe, the one the decode fills.

The MMA's N is the rows scored: a decode step fills only the tile's last query_len slots,
and the kernel scores the rows from slot ``SLOT0`` on (``score_pages``' ``first_slot``), so
N follows query_len x Hs rather than 8 x Hs. Up to 8 rows the MMA is Ampere's per-warp
``mma.sync`` m16n8k16 instead (same A fragment, q in registers): N = 8 needs no padding rows
(wgmma's N is at least 16) and each warp runs on without waiting for its warpgroup at every
block; at N >= 16 its q operand and accumulators in registers would cost programs per SM,
so wgmma takes over there (``fast.scorer.mma_rows``, beside the rest of the kernel's
launch policy: program sizes, register cap, ring and table placement). Scores equal the
reference's within its fp32-order bound (the sum's order differs); exact-arithmetic inputs
give the same bits as every other path.

Gluon (Triton's explicit-layout dialect) runs on GPUs only; the interpreter keeps the table
scorer of ``scorer.py``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.runtime.jit import constexpr_function

from indexer_constants import CODE_BYTES, PAGE, PAGE_BYTES

from . import page_ring
from .column_order import load_q_rows, logical_columns, store_q_tile
from .dequant_prmt import GROUP_ASM_MOVES, GROUP_ASM_TABLED, GROUP_ASM_TABLED_E4M3, GROUP_ASM_TABLED_SIGNLESS
from .guards import BAD_BLOCK, ERR_INPUT
from .page_maxima import (
    alloc_maxima,
    column_maxima,
    maxima_layout,
    own_tokens_max,
    pad_pow2,
    page_max,
)
from .rules import read_pages, scored_own_page

_PAGE = gl.constexpr(PAGE)
_PAGE_BYTES = gl.constexpr(PAGE_BYTES)
_CODE_BYTES = gl.constexpr(CODE_BYTES)
_ERR_INPUT = gl.constexpr(ERR_INPUT)
_BAD_BLOCK = gl.constexpr(BAD_BLOCK)
# Where a block's int64 [64, 8] code words (and their scale bytes) live: lane (gid, tig) of
# warp w holds groups 2 tig, 2 tig + 1 of tokens 16 w + gid and 16 w + gid + 8, exactly the
# groups of its A fragment.
_GROUP_LAYOUT = gl.constexpr(
    gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [8, 0]],
        lane_bases=[[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]],
        block_bases=[],
        shape=[64, 8],
    )
)


@gluon.jit
def _fragment(o0, o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11, o12, o13, o14, o15):
    """fp16 [T, 128] in logical column order from o[c][t, g] = element 16 g + c of token t.

    Physical (g, c) = (2 tig + gh, 4 kl + 2 h + e) is logical k = 16 (4 gh + kl) + 8 h + 2 tig
    + e: join the 16 codes into trailing axes (e, h, kl0, kl1), split g into (tig, gh), and
    order the axes as k's digits, most significant first."""
    c0 = gl.join(gl.join(o0, o1), gl.join(o2, o3))
    c1 = gl.join(gl.join(o4, o5), gl.join(o6, o7))
    c2 = gl.join(gl.join(o8, o9), gl.join(o10, o11))
    c3 = gl.join(gl.join(o12, o13), gl.join(o14, o15))
    x = gl.join(gl.join(c0, c1), gl.join(c2, c3))  # [T, g, e, h, kl0, kl1]
    T: gl.constexpr = x.shape[0]
    x = gl.reshape(x, [T, 4, 2, 2, 2, 2, 2])  # [T, tig, gh, e, h, kl0, kl1]
    x = gl.permute(x, (0, 2, 6, 5, 4, 1, 3))  # [T, gh, kl1, kl0, h, tig, e]
    return gl.reshape(x, [T, 128])


@constexpr_function
def _mma_sync(rows, decode):
    """Whether the kernel multiplies by ``mma.sync`` m16n8k16 (each warp on its own) rather
    than wgmma: up to 8 rows, fp16 operands. Not the bench's E4M3 probe (``decode``
    "e4m3"): sm_90 has no E4M3 ``mma.sync`` of its own — ptxas widens m16n8k32's operands
    to fp16 and adds two m16n8k16 halves (``F2FP``, ``HMMA.16816``, ``FADD``) — so the probe
    runs wgmma m64n8k32 there."""
    return rows == 8 and decode != "e4m3"


@gluon.jit
def _byte(w, i: gl.constexpr):
    """Byte i of int32 ``w`` (any shape) as an E4M3 value."""
    return (w >> (8 * i)).to(gl.int8).to(gl.float8e4nv, bitcast=True)


@gluon.jit
def _fragment_e4m3(w0, w1, w2, w3):
    """E4M3 [T, 128] in the E4M3 MMA's logical column order (``column_order.logical_columns``
    at WIDTH 4) from w[j][t, g] = the E4M3 bytes of codes 4 j .. 4 j + 3 of group g of token
    t (byte i: code 4 j + i): the bench's E4M3-MMA probe.

    Physical (g, c) = (2 tig + gh, 8 kl + 4 h + e) is logical k = 32 (2 gh + kl) + 16 h + 4 tig
    + e: each word is one A register (4 consecutive k); join the bytes into trailing axes
    (e0, e1, h, kl), split g into (tig, gh), and order the axes as k's digits."""
    c0 = gl.join(gl.join(_byte(w0, 0), _byte(w0, 1)), gl.join(_byte(w0, 2), _byte(w0, 3)))
    c1 = gl.join(gl.join(_byte(w1, 0), _byte(w1, 1)), gl.join(_byte(w1, 2), _byte(w1, 3)))
    c2 = gl.join(gl.join(_byte(w2, 0), _byte(w2, 1)), gl.join(_byte(w2, 2), _byte(w2, 3)))
    c3 = gl.join(gl.join(_byte(w3, 0), _byte(w3, 1)), gl.join(_byte(w3, 2), _byte(w3, 3)))
    x = gl.join(gl.join(c0, c1), gl.join(c2, c3))  # [T, g, e0, e1, h, kl]
    T: gl.constexpr = x.shape[0]
    x = gl.reshape(x, [T, 4, 2, 2, 2, 2, 2])  # [T, tig, gh, e0, e1, h, kl]
    x = gl.permute(x, (0, 2, 6, 5, 1, 4, 3))  # [T, gh, kl, h, tig, e1, e0]
    return gl.reshape(x, [T, 128])


# A scale byte loaded on its own, zero-extended (the ``_IF`` form: 0 where $2 is 0, nothing
# read). Left to the compiler, a lane's two adjacent scale bytes become one 16-bit load that
# two ALU-pipe instructions take apart again. Not pure: the loads stay where the kernel puts
# them (after ``gdc_wait`` where the kernel waits before loading).
_LOAD_SCALE = gl.constexpr("ld.global.u8 $0, [$1];")
_LOAD_SCALE_IF = gl.constexpr("{\n.reg .pred p;\nsetp.ne.b32 p, $2, 0;\nmov.b32 $0, 0;\n@p ld.global.u8 $0, [$1];\n}")
# Entry $1 of the table at {$3, $4} (low, high 32 bits of its address), $2 bytes an entry.
# Only the low word is computed: the table is 2 KB-aligned (``scale_tables``), so it never
# straddles a 4 GB boundary. ptxas turns a multiply-add by a literal 8 into LEA / LEA.HI.X
# on the ALU pipe; by a runtime stride it stays one IMAD on the FMA pipe (the high word's
# copy, when one is needed, is an IMAD.MOV).
_GATHER_TABLE = gl.constexpr(
    "{\n.reg .b32 lo;\n.reg .b64 at;\nmad.lo.u32 lo, $1, $2, $3;\nmov.b64 at, {lo, $4};\nld.global.b64 $0, [at];\n}"
)


@gluon.jit
def _load_scales(ptrs, live, MASKED: gl.constexpr):
    """int32 scale bytes at uint8 ``ptrs`` (any shape); MASKED: 0 where ``live`` (a
    scalar) is false, nothing read."""
    if MASKED:
        on = gl.full(ptrs.shape, 0, gl.int32, ptrs.type.layout) + live.to(gl.int32)
        return gl.inline_asm_elementwise(_LOAD_SCALE_IF, "=r,l,r", [ptrs, on], dtype=gl.int32, is_pure=False, pack=1)
    return gl.inline_asm_elementwise(_LOAD_SCALE, "=r,l", [ptrs], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _gather_tables(scales, tab_ptr, tab_stride):
    """int64 ``scale_tables`` entries of int32 ``scales`` (any shape): each group's 8
    magnitudes, from L1. tab_stride: 8, the entry's bytes, as a runtime value."""
    tab = tab_ptr.to(gl.int64)
    zero = gl.zeros_like(scales)
    return gl.inline_asm_elementwise(
        _GATHER_TABLE,
        "=l,r,r,r,r",
        [scales, zero + tab_stride, zero + (tab & 0xFFFFFFFF).to(gl.int32), zero + (tab >> 32).to(gl.int32)],
        dtype=gl.int64,
        is_pure=True,
        pack=1,
    )


@gluon.jit
def _entries(scales, tab_ptr, tab_stride, TABLES: gl.constexpr):
    """Each group's scale-table entry (int64, ``scales``' shape): from the program's copy in
    shared memory (TABLES, ``page_ring.gather_tables``) or through L1 (``_gather_tables``)."""
    if TABLES:
        entries = page_ring.gather_tables(scales, tab_stride)
    else:
        entries = _gather_tables(scales, tab_ptr, tab_stride)
    return entries


@gluon.jit
def _load_block(page_u8, page_i64, live, first_token, MASKED: gl.constexpr):
    """int64 [64, 8] code words and int32 [64, 8] scale bytes of tokens [first_token,
    first_token + 64) of a page, in ``_GROUP_LAYOUT``; MASKED: zeros where ``live`` is
    false, else the page's bytes whatever ``live`` says."""
    t = first_token + gl.arange(0, 64, layout=gl.SliceLayout(1, _GROUP_LAYOUT))
    g = gl.arange(0, 8, layout=gl.SliceLayout(0, _GROUP_LAYOUT))
    if MASKED:
        codes = gl.load(page_i64 + t[:, None] * 8 + g[None, :], mask=live, other=0)
    else:
        codes = gl.load(page_i64 + t[:, None] * 8 + g[None, :])
    return codes, _load_scales(page_u8 + _CODE_BYTES + t[:, None] * 8 + g[None, :], live, MASKED)


@gluon.jit
def _in_cache(page, num_blocks):
    """The block-id guard (one compare a page): True where ``page`` is an id the cache holds.
    A page that fails it is never loaded; its column gets NaN and the epilogue records it."""
    return (page >= 0) & (page < num_blocks)


@gluon.jit
def _load_nth_block(
    k_ptr, k64_ptr, bt_row, first, n, num_blocks, blk, blocks, MASKED: gl.constexpr, GUARD: gl.constexpr
):
    """``_load_block`` of 64-token block ``blk`` of the program's ``blocks`` (page first +
    blk // 2); past the program's blocks or the row's n pages, or where the page's id lies
    outside ``[0, num_blocks)``, zeros (MASKED) or the cache's page 0 (valid memory whenever
    a row has pages; such scores are never stored, or stored as NaN for a bad id).

    A masked load's registers are zeroed first (8 `CS2R` a page), which the mma.sync kernel
    (N = 8) avoids by loading page 0 instead; the wgmma kernel keeps the masks, which did not
    cost it overall."""
    j = first + blk // 2
    live = (blk < blocks) & (j < n)
    page = gl.load(bt_row + j, mask=live, other=0)
    if GUARD:
        live = live & _in_cache(page, num_blocks)
    page = gl.where(live, page, 0).to(gl.int64)
    return _load_block(k_ptr + page * _PAGE_BYTES, k64_ptr + page * (_PAGE_BYTES // 8), live, (blk % 2) * 64, MASKED)


@gluon.jit
def _dequant_fragment(codes, tables, a_layout: gl.constexpr, DECODE: gl.constexpr = "exact"):
    """The A operand: fp16 [64, 128] (E4M3 for the "e4m3" probe), logical column k =
    physical dimension d(k), in ``a_layout`` without moving data (checked at compile time);
    tables: each group's ``scale_tables`` entry (``_entries``). DECODE "exact" (k), or one
    of the bench's probes:
    "signless" (|k|: the decode without its sign step), "none" (the code words' 16-bit
    halves, no decode: ``dequant_prmt``'s docstring) or "e4m3" (k as the E4M3 values it is,
    for an E4M3 MMA: ``_fragment_e4m3``)."""
    if DECODE == "e4m3":
        w = gl.inline_asm_elementwise(
            GROUP_ASM_TABLED_E4M3, "=r,=r,=r,=r,l,l", [codes, tables], dtype=(gl.int32,) * 4, is_pure=True, pack=1
        )
        a = _fragment_e4m3(w[0], w[1], w[2], w[3])
    else:
        asm: gl.constexpr = (
            GROUP_ASM_TABLED
            if DECODE == "exact"
            else (GROUP_ASM_TABLED_SIGNLESS if DECODE == "signless" else GROUP_ASM_MOVES)
        )
        o = gl.inline_asm_elementwise(
            asm,
            "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,l,l",
            [codes, tables],
            dtype=(gl.float16,) * 16,
            is_pure=True,
            pack=1,
        )
        a = _fragment(
            o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7], o[8], o[9], o[10], o[11], o[12], o[13], o[14], o[15]
        )
    return gl.convert_layout(a, a_layout, assert_trivial=True)


@gluon.jit
def _advance(c0, s0, c1, s1, cn, sn, DEPTH: gl.constexpr):
    """The block pipeline one step on: (c0, s0) is decoded next; with DEPTH 2, (c1, s1) is
    the block after it and (cn, sn) the one just loaded."""
    if DEPTH == 2:
        return c1, s1, cn, sn
    else:
        return cn, sn, cn, sn


@gluon.jit
def _block(
    k_ptr,
    k64_ptr,
    tab_ptr,
    tab_stride,
    bt_row,
    first,
    n,
    num_blocks,
    i,
    h: gl.constexpr,
    c0,
    s0,
    c1,
    s1,
    run,
    fold,
    q_op,
    zeros,
    maxima,
    a_layout: gl.constexpr,
    ROWS: gl.constexpr,
    PPP: gl.constexpr,
    DEPTH: gl.constexpr,
    PARTS: gl.constexpr,
    LOADS_ONLY: gl.constexpr,
    GUARD: gl.constexpr,
    TABLES: gl.constexpr,
    DECODE: gl.constexpr,
):
    """Block h (0 or 1) of the program's page i: the block DEPTH ahead loaded, (c0, s0)
    decoded and multiplied by q (``q_op``: registers at ROWS = 8, else the shared tile), the
    page's maxima folded (``page_maxima.page_max``), the pipeline advanced. LOADS_ONLY: the loads alone,
    folded into ``fold``. Returns (c0, s0, c1, s1, run, fold)."""
    cn, sn = _load_nth_block(k_ptr, k64_ptr, bt_row, first, n, num_blocks, 2 * i + h + DEPTH, PPP * 2, ROWS != 8, GUARD)
    if LOADS_ONLY:
        fold = fold ^ c0 ^ _entries(s0, tab_ptr, tab_stride, TABLES)
    else:
        run = _score_block(
            c0, s0, tab_ptr, tab_stride, q_op, zeros, run, maxima, i, h, a_layout, ROWS, PARTS, TABLES, DECODE
        )
    c0, s0, c1, s1 = _advance(c0, s0, c1, s1, cn, sn, DEPTH)
    return c0, s0, c1, s1, run, fold


@gluon.jit
def _score_block(
    codes,
    scales,
    tab_ptr,
    tab_stride,
    q_op,
    zeros,
    run,
    maxima,
    i,
    h: gl.constexpr,
    a_layout: gl.constexpr,
    ROWS: gl.constexpr,
    PARTS: gl.constexpr,
    TABLES: gl.constexpr,
    DECODE: gl.constexpr,
):
    """Block h of page i (``codes``, ``scales``: ``_load_block``'s [64, 8]) decoded,
    multiplied by q (``q_op``: registers at ROWS = 8, else the shared tile) and folded into
    the page's maxima (``page_maxima.page_max``); DECODE: ``_dequant_fragment``'s. Returns
    the running maximum."""
    a = _dequant_fragment(codes, _entries(scales, tab_ptr, tab_stride, TABLES), a_layout, DECODE)
    if _mma_sync(ROWS, DECODE):
        acc = mma_v2(a, q_op, zeros)
    else:
        acc = warpgroup_mma(a, q_op, zeros, use_acc=False)
    return page_max(acc, run, h, maxima, i, PARTS)


@gluon.jit
def _issue_page(k_ptr, bt_row, first, n, num_blocks, NTH: gl.constexpr, RING: gl.constexpr, GUARD: gl.constexpr):
    """Start the program's page NTH on its way into the ring (``page_ring.issue``): the
    cache's page 0 where the page's id lies outside ``[0, num_blocks)`` (its column gets NaN),
    nothing past the row's n pages."""
    j = first + NTH
    live = j < n
    page = gl.load(bt_row + j, mask=live, other=0)
    if GUARD:
        page = gl.where(_in_cache(page, num_blocks), page, 0)
    page_ring.issue(k_ptr + page.to(gl.int64) * _PAGE_BYTES, live, NTH, RING)


@gluon.jit
def score_kernel_wgmma(
    q_ptr,
    q_sel_ptr,
    q_set_stride,  # uint8 tile [.., B, 8, HS, 128] at q_sel[0] * q_set_stride
    k_ptr,  # uint8 [N, 9216] pages
    k64_ptr,  # the same memory as int64 [N, 1152]
    tab_ptr,  # int64 [256]: fast.tables.scale_tables (2 KB-aligned)
    tab_stride,  # 8: its entry's bytes, passed at run time (_GATHER_TABLE says why)
    bt_ptr,
    lens_ptr,
    out_ptr,
    err_ptr,  # int32 [5]: the error record (RECORD)
    num_blocks,  # N: ids outside [0, N) are never loaded; their columns get NaN
    W,
    stride_bt,
    stride_ob,
    stride_or,  # as score_kernel_table's
    HS: gl.constexpr,
    SLOT0: gl.constexpr,  # the first slot scored: rows SLOT0 * HS .. 8 * HS - 1 (the step's queries)
    ROWS: gl.constexpr,  # scorer.mma_rows((8 - SLOT0) * HS): 8 runs mma.sync, else wgmma
    PPP: gl.constexpr,  # pages per program
    DEPTH: gl.constexpr,  # 64-token blocks loaded ahead of the one decoded: 1 or 2 (RING 0)
    PDL: gl.constexpr,
    PREFETCH: gl.constexpr,  # (PDL) the lengths, the table and the first blocks loaded before the wait
    RELEASE: gl.constexpr,  # (PDL) let the dependent grid launch at once
    PARTS: gl.constexpr,  # partial maxima per page and row: partial_maxima(ROWS, PPP)
    RECORD: gl.constexpr,  # record a bad id in err_ptr's record
    LOADS_ONLY: gl.constexpr = False,  # the bench's probe: the same loads, no decode, no MMA, nothing stored
    GUARD: gl.constexpr = True,  # off only in the bench's measure of the guard's cost
    RING: gl.constexpr = 0,  # > 0: pages reach shared memory through a ring of RING (page_ring.py); 0: registers
    TABLES: gl.constexpr = 0,  # 1: the scale table copied into shared memory, gathered there
    DECODE: gl.constexpr = "exact",  # or the bench's probes: "signless" (|k|), "none" (no decode), "e4m3" (E4M3 MMA)
):
    """PPP consecutive pages of request program_id(0) from page program_id(1) * PPP for
    the tile's rows from SLOT0 * HS on (MMA column c is row SLOT0 * HS + c), in
    64-token blocks (one wgmma, or one mma.sync per warp at ROWS = 8; the 4 warps hold 16
    tokens each). Each thread keeps its own maxima of every page in shared memory; one
    barrier and one reduction over them per program then give the PPP columns (a reduction
    across warps or lanes every page would cost a large share of the page's issue).

    Under PDL with RELEASE the kernel lets its dependent (the select) launch at once: its
    launch is then off the critical path, but its programs take the slots the scorer frees
    first, packed onto a few SMs (``score_pages``' release). With PREFETCH the program
    loads its length, its table entries and its first blocks before waiting for the
    producer (the q tile's): only for a producer that releases this kernel after its own
    wait, when nothing earlier in the stream still writes the cache, the table or the
    lengths (``score_pages``' prefetch)."""
    # both MMAs give warp w tokens 16 w .. 16 w + 15 and the same A fragment per warp; the
    # fragment's consecutive k a register: 2 of fp16, 4 of E4M3 (the bench's E4M3-MMA probe:
    # mma.sync m16n8k32, wgmma k32)
    WIDTH: gl.constexpr = 4 if DECODE == "e4m3" else 2
    if _mma_sync(ROWS, DECODE):
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
    else:
        mma: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, ROWS, 8 * WIDTH]
        )
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=WIDTH)
    b = gl.program_id(0)
    first = gl.program_id(1) * PPP
    if PDL:
        if not PREFETCH:
            gdc_wait()
        if RELEASE:
            gdc_launch_dependents()
    length = gl.load(lens_ptr + b)
    n = read_pages(length, W)
    if first < n:
        bt_row = bt_ptr + b.to(gl.int64) * stride_bt
        if RING > 0 or TABLES:
            page_ring.declare(tab_ptr, RING, TABLES)
            gl.thread_barrier()  # the ring's mbarriers initialised for every thread
        if RING > 0:  # the ring's first RING pages on their way
            for p in gl.static_range(RING):
                if p < PPP:
                    _issue_page(k_ptr, bt_row, first, n, num_blocks, p, RING, GUARD)
        else:
            # a pipeline of DEPTH blocks in flight: c0/s0 is decoded now, c1/s1 next (DEPTH 2)
            c0, s0 = _load_nth_block(k_ptr, k64_ptr, bt_row, first, n, num_blocks, 0, PPP * 2, ROWS != 8, GUARD)
            if DEPTH == 2:
                c1, s1 = _load_nth_block(k_ptr, k64_ptr, bt_row, first, n, num_blocks, 1, PPP * 2, ROWS != 8, GUARD)
            else:
                c1, s1 = c0, s0
        if PDL:
            if PREFETCH:
                gdc_wait()  # for the q tile
        # q in logical column order, its rows loaded whole (column_order.py)
        qb = load_q_rows(q_ptr, q_sel_ptr, q_set_stride, b, HS, SLOT0, ROWS)
        q8 = qb.to(gl.float8e4nv, bitcast=True)
        q_in = q8 if DECODE == "e4m3" else q8.to(gl.float16)  # the A fragment's type; fp16 exact
        q_op = store_q_tile(logical_columns(q_in, WIDTH), mma, _mma_sync(ROWS, DECODE))
        # page i's partial maxima at [i, :, :] (pages PPP .. PAD - 1: never written, never stored)
        PAD: gl.constexpr = pad_pow2(PPP)
        maxima = alloc_maxima(PAD, PARTS, ROWS)
        zeros = gl.zeros([64, ROWS], gl.float32, layout=mma)
        run = own_tokens_max(zeros)  # each page's running maximum (its first block overwrites it)
        fold = gl.zeros([64, 8], gl.int64, layout=_GROUP_LAYOUT)  # LOADS_ONLY: what keeps the loads
        # Unrolled at N = 8: the pipeline's blocks then stay in their registers instead of
        # moving one slot on per trip (20 moves a page), and the scale bytes' extraction
        # folds. The wgmma kernel is slower unrolled (its code grows past what it saves), so
        # it keeps the loop. The ring unrolls at every N: its slots and phases are constants.
        late = gl.zeros_like(page_ring.thread_ids())  # a thread's 1: a wait gave up
        if TABLES:
            late = page_ring.wait_tables()
        if RING > 0:
            base = page_ring.ring_base(_GROUP_LAYOUT)
            for i in gl.static_range(PPP):
                late = late | page_ring.wait(first + i < n, i, RING)
                for h in gl.static_range(2):
                    codes = page_ring.read_codes(base, i, h, RING)
                    scales = page_ring.read_scales(base, i, h, RING)
                    run = _score_block(
                        codes,
                        scales,
                        tab_ptr,
                        tab_stride,
                        q_op,
                        zeros,
                        run,
                        maxima,
                        i,
                        h,
                        a_layout,
                        ROWS,
                        PARTS,
                        TABLES,
                        DECODE,
                    )
                if i + RING < PPP:
                    gl.thread_barrier()  # every warp is done with page i's slot
                    _issue_page(k_ptr, bt_row, first, n, num_blocks, i + RING, RING, GUARD)
        elif ROWS == 8:
            # The same page loop as below, unrolled: mma.sync's pages measured faster unrolled
            # (no counter, their slots' addresses constant), wgmma's slower (bench/PERF.md).
            for i in gl.static_range(PPP):
                for h in gl.static_range(2):  # the page's two blocks
                    c0, s0, c1, s1, run, fold = _block(
                        k_ptr,
                        k64_ptr,
                        tab_ptr,
                        tab_stride,
                        bt_row,
                        first,
                        n,
                        num_blocks,
                        i,
                        h,
                        c0,
                        s0,
                        c1,
                        s1,
                        run,
                        fold,
                        q_op,
                        zeros,
                        maxima,
                        a_layout,
                        ROWS,
                        PPP,
                        DEPTH,
                        PARTS,
                        LOADS_ONLY,
                        GUARD,
                        TABLES,
                        DECODE,
                    )
        else:
            for i in range(PPP):
                for h in gl.static_range(2):
                    c0, s0, c1, s1, run, fold = _block(
                        k_ptr,
                        k64_ptr,
                        tab_ptr,
                        tab_stride,
                        bt_row,
                        first,
                        n,
                        num_blocks,
                        i,
                        h,
                        c0,
                        s0,
                        c1,
                        s1,
                        run,
                        fold,
                        q_op,
                        zeros,
                        maxima,
                        a_layout,
                        ROWS,
                        PPP,
                        DEPTH,
                        PARTS,
                        LOADS_ONLY,
                        GUARD,
                        TABLES,
                        DECODE,
                    )
        if RING > 0 or TABLES:
            page_ring.report(late, err_ptr)
        if LOADS_ONLY:  # a store the compiler cannot drop, and no GPU makes
            gl.store(
                out_ptr + gl.zeros([64, 8], gl.int64, layout=_GROUP_LAYOUT),
                fold.to(gl.float32),
                mask=fold == 0x5EED5EED5EED,
            )
            return

        gl.thread_barrier()
        best = column_maxima(maxima, PAD, PARTS, ROWS)  # [PAD pages, ROWS]
        tops: gl.constexpr = gl.SliceLayout(1, maxima_layout(ROWS, PARTS))
        r = SLOT0 * HS + gl.arange(0, ROWS, layout=gl.SliceLayout(0, tops))  # row = slot * HS + head
        page = gl.arange(0, PAD, layout=gl.SliceLayout(1, tops))
        j = first + page
        own = scored_own_page(length, r // HS)  # the slot's causal bound
        keep = (r < 8 * HS)[None, :] & (j[:, None] < own[None, :]) & (j < n)[:, None]
        if PAD != PPP:
            keep = keep & (page < PPP)[:, None]
        # The guard's epilogue: a page whose id is outside the cache was never loaded; its
        # column gets NaN (not a score), and the record names the first such column.
        if GUARD:
            live = (j < n) & (page < PPP)
            ids = gl.load(bt_row + j, mask=live, other=0)
            bad = live & ~_in_cache(ids, num_blocks)
            best = gl.where(bad[:, None], float("nan"), best)
        if RECORD and GUARD:
            column = gl.min(gl.where(bad, j, 2**31 - 1), axis=0)
            if column < 2**31 - 1:
                value = gl.min(gl.where(j == column, ids, 2**31 - 1), axis=0)
                if gl.atomic_cas(err_ptr + _ERR_INPUT, 0, _BAD_BLOCK) == 0:
                    gl.store(err_ptr + _ERR_INPUT + 1, b)
                    gl.store(err_ptr + _ERR_INPUT + 2, column)
                    gl.store(err_ptr + _ERR_INPUT + 3, value)
        # one masked store of the program's [PAD, ROWS] (a thread per row would run every
        # page's loop in all 4 warps at ROWS <= 32)
        out_row = out_ptr + b.to(gl.int64) * stride_ob + r * stride_or
        gl.store(out_row[None, :] + j[:, None], best, mask=keep)
