"""The GPU page scorer (Gluon, sm_90): NVFP4 codes decoded straight into the MMA's register
A fragment (``dequant_prmt.py``), so the fp16 tile never goes through shared memory; the
page's tokens on M, the rows scored on N (``mma.sync`` up to 8 rows, else wgmma; the
E4M3-MMA route wgmma k32 at every N). Why, and the column order that makes it possible:
docs/KERNELS.md, "The NVFP4 wgmma scorer". Launch policy: ``fast.scorer``."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.runtime.jit import constexpr_function

from . import page_ring
from .column_order import load_q_rows, logical_columns, store_q_tile
from .dequant_prmt import GROUP_ASM, GROUP_ASM_E4M3
from .guards import BAD_BLOCK, ERR_INPUT, record_input
from .loads import GROUP_LAYOUT, advance, entries, in_cache, issue_page, load_nth_block
from .page_maxima import (
    alloc_maxima,
    column_maxima,
    folds_by_layout,
    maxima_layout,
    own_tokens_max,
    pad_pow2,
    page_max,
)
from .rules import read_pages, scored_own_page

_ERR_INPUT = gl.constexpr(ERR_INPUT)
_BAD_BLOCK = gl.constexpr(BAD_BLOCK)


@gluon.jit
def join_codes(o0, o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11, o12, o13, o14, o15):
    """[T, G, 2, 2, 2, 2] from o[c][t, g], the 16 decoded codes of a group: code c = 8 e + 4 h
    + 2 kl0 + kl1 at [t, g, e, h, kl0, kl1] (``_fragment`` orders these axes as k's digits;
    so does the bench's half fragment, ``bench/ring_variants.py``)."""
    c0 = gl.join(gl.join(o0, o1), gl.join(o2, o3))
    c1 = gl.join(gl.join(o4, o5), gl.join(o6, o7))
    c2 = gl.join(gl.join(o8, o9), gl.join(o10, o11))
    c3 = gl.join(gl.join(o12, o13), gl.join(o14, o15))
    return gl.join(gl.join(c0, c1), gl.join(c2, c3))


@gluon.jit
def _fragment(o0, o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11, o12, o13, o14, o15):
    """fp16 [T, 128] in logical column order from o[c][t, g] = element 16 g + c of token t."""
    x = join_codes(o0, o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11, o12, o13, o14, o15)  # [T, g, e, h, kl0, kl1]
    T: gl.constexpr = x.shape[0]
    x = gl.reshape(x, [T, 4, 2, 2, 2, 2, 2])  # [T, tig, gh, e, h, kl0, kl1]
    x = gl.permute(x, (0, 2, 6, 5, 4, 1, 3))  # [T, gh, kl1, kl0, h, tig, e]
    return gl.reshape(x, [T, 128])


@constexpr_function
def _mma_sync(rows, e4m3_mma):
    """Whether the kernel multiplies by ``mma.sync`` m16n8k16 (each warp on its own) rather
    than wgmma: up to 8 rows, fp16 operands. sm_90 has no E4M3 ``mma.sync`` of its own
    (ptxas widens it to two fp16 halves), so the E4M3 route runs wgmma there."""
    return rows == 8 and not e4m3_mma


@gluon.jit
def _byte(w, i: gl.constexpr):
    """Byte i of int32 ``w`` (any shape) as an E4M3 value."""
    return (w >> (8 * i)).to(gl.int8).to(gl.float8e4nv, bitcast=True)


@gluon.jit
def _fragment_e4m3(w0, w1, w2, w3):
    """E4M3 [T, 128] in the E4M3 MMA's logical column order (``column_order.logical_columns``
    at WIDTH 4) from w[j][t, g] = the E4M3 bytes of codes 4 j .. 4 j + 3 of group g of token
    t (byte i: code 4 j + i)."""
    c0 = gl.join(gl.join(_byte(w0, 0), _byte(w0, 1)), gl.join(_byte(w0, 2), _byte(w0, 3)))
    c1 = gl.join(gl.join(_byte(w1, 0), _byte(w1, 1)), gl.join(_byte(w1, 2), _byte(w1, 3)))
    c2 = gl.join(gl.join(_byte(w2, 0), _byte(w2, 1)), gl.join(_byte(w2, 2), _byte(w2, 3)))
    c3 = gl.join(gl.join(_byte(w3, 0), _byte(w3, 1)), gl.join(_byte(w3, 2), _byte(w3, 3)))
    x = gl.join(gl.join(c0, c1), gl.join(c2, c3))  # [T, g, e0, e1, h, kl]
    T: gl.constexpr = x.shape[0]
    x = gl.reshape(x, [T, 4, 2, 2, 2, 2, 2])  # [T, tig, gh, e0, e1, h, kl]
    x = gl.permute(x, (0, 2, 6, 5, 1, 4, 3))  # [T, gh, kl, h, tig, e1, e0]
    return gl.reshape(x, [T, 128])


@gluon.jit
def decode_groups(codes, tables):
    """The exact decode: 16 fp16 [64, 8] (output c: code c of each group) from int64 code
    words and their ``scale_tables`` entries (the kernel's GROUP_DECODE)."""
    return gl.inline_asm_elementwise(
        GROUP_ASM,
        "=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,l,l",
        [codes, tables],
        dtype=(gl.float16,) * 16,
        is_pure=True,
        pack=1,
    )


@gluon.jit
def decode_groups_e4m3(codes, tables):
    """The E4M3 route's decode: 4 int32 [64, 8] (word j: the E4M3 bytes of codes 4 j ..
    4 j + 3 of each group) from the same operands (the kernel's GROUP_DECODE_E4M3)."""
    return gl.inline_asm_elementwise(
        GROUP_ASM_E4M3, "=r,=r,=r,=r,l,l", [codes, tables], dtype=(gl.int32,) * 4, is_pure=True, pack=1
    )


@gluon.jit
def dequant_fragment(
    codes,
    tables,
    a_layout: gl.constexpr,
    E4M3_MMA: gl.constexpr,
    GROUP_DECODE: gl.constexpr,
    GROUP_DECODE_E4M3: gl.constexpr,
):
    """The A operand [64, 128] in ``a_layout``, logical column k = physical dimension d(k),
    without moving data (checked at compile time): fp16 by GROUP_DECODE, or with E4M3_MMA
    the E4M3 values GROUP_DECODE_E4M3 gives (the decode before it widens them)."""
    if E4M3_MMA:
        w = GROUP_DECODE_E4M3(codes, tables)
        a = _fragment_e4m3(w[0], w[1], w[2], w[3])
    else:
        o = GROUP_DECODE(codes, tables)
        a = _fragment(
            o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7], o[8], o[9], o[10], o[11], o[12], o[13], o[14], o[15]
        )
    return gl.convert_layout(a, a_layout, assert_trivial=True)


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
    q_op,
    zeros,
    maxima,
    a_layout: gl.constexpr,
    ROWS: gl.constexpr,
    PPP: gl.constexpr,
    DEPTH: gl.constexpr,
    PARTS: gl.constexpr,
    TABLES: gl.constexpr,
    E4M3_MMA: gl.constexpr,
    GROUP_DECODE: gl.constexpr,
    GROUP_DECODE_E4M3: gl.constexpr,
    IN_CACHE: gl.constexpr,
):
    """Block h (0 or 1) of the program's page i, fed from registers: the block DEPTH ahead
    loaded, (c0, s0) scored (``score_block``), the pipeline advanced. Returns (c0, s0, c1,
    s1, run)."""
    cn, sn = load_nth_block(
        k_ptr, k64_ptr, bt_row, first, n, num_blocks, 2 * i + h + DEPTH, PPP * 2, ROWS != 8, IN_CACHE
    )
    run = score_block(
        c0,
        s0,
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
        E4M3_MMA,
        GROUP_DECODE,
        GROUP_DECODE_E4M3,
    )
    c0, s0, c1, s1 = advance(c0, s0, c1, s1, cn, sn, DEPTH)
    return c0, s0, c1, s1, run


@gluon.jit
def score_block(
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
    E4M3_MMA: gl.constexpr,
    GROUP_DECODE: gl.constexpr,
    GROUP_DECODE_E4M3: gl.constexpr,
):
    """Block h of page i (``codes``, ``scales``: [64, 8] in ``GROUP_LAYOUT``) decoded,
    multiplied by q (``q_op``: registers for mma.sync, else the shared tile) and folded into
    the page's maxima (``page_maxima.page_max``). Returns the running maximum."""
    tables = entries(scales, tab_ptr, tab_stride, TABLES)
    a = dequant_fragment(codes, tables, a_layout, E4M3_MMA, GROUP_DECODE, GROUP_DECODE_E4M3)
    if _mma_sync(ROWS, E4M3_MMA):
        acc = mma_v2(a, q_op, zeros)
    else:
        acc = warpgroup_mma(a, q_op, zeros, use_acc=False)
    return page_max(acc, run, h, maxima, i, PARTS, folds_by_layout(ROWS, PARTS))


@gluon.jit
def ring_pages(
    k_ptr,
    bt_row,
    first,
    n,
    num_blocks,
    tab_ptr,
    tab_stride,
    q_op,
    zeros,
    run,
    maxima,
    late,
    a_layout: gl.constexpr,
    ROWS: gl.constexpr,
    PPP: gl.constexpr,
    RING: gl.constexpr,
    PARTS: gl.constexpr,
    TABLES: gl.constexpr,
    E4M3_MMA: gl.constexpr,
    GROUP_DECODE: gl.constexpr,
    GROUP_DECODE_E4M3: gl.constexpr,
    IN_CACHE: gl.constexpr,
):
    """The program's PPP pages through the ring (the kernel's RING_PAGES; the ring's first
    RING pages already issued): each page waited for, its two blocks scored
    (``score_block``), its slot freed by one CTA barrier and refilled with the page RING
    on. ``late``: the waits' flags so far (``page_ring.wait``). Returns (run, late)."""
    base = page_ring.ring_base(GROUP_LAYOUT)
    for i in gl.static_range(PPP):
        late = late | page_ring.wait(first + i < n, i, RING)
        for h in gl.static_range(2):
            codes = page_ring.read_codes(base, i, h, RING)
            scales = page_ring.read_scales(base, i, h, RING)
            run = score_block(
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
                E4M3_MMA,
                GROUP_DECODE,
                GROUP_DECODE_E4M3,
            )
        if i + RING < PPP:
            gl.thread_barrier()  # every warp is done with page i's slot
            issue_page(k_ptr, bt_row, first, n, num_blocks, i + RING, RING, IN_CACHE)
    return run, late


@gluon.jit
def score_kernel_wgmma(
    q_ptr,
    q_sel_ptr,
    q_set_stride,  # uint8 tile [.., B, 8, HS, 128] at q_sel[0] * q_set_stride (SETS > 0)
    k_ptr,  # uint8 [N, 9216] pages
    k64_ptr,  # the same memory as int64 [N, 1152]
    tab_ptr,  # int64 [256]: fast.tables.scale_tables (2 KB-aligned)
    tab_stride,  # 8: its entry's bytes, passed at run time (loads._GATHER_TABLE says why)
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
    PARTS: gl.constexpr,  # partial maxima per page and row: partial_maxima(ROWS, PPP, mma)
    RECORD: gl.constexpr,  # record a bad id in err_ptr's record
    SETS: gl.constexpr = 0,  # q_sel[0] picks one of SETS tile sets (outside them: NaN); 0: the tile, q_sel unread
    RING: gl.constexpr = 0,  # > 0: pages reach shared memory through a ring of RING (page_ring.py); 0: registers
    TABLES: gl.constexpr = 0,  # 1: the scale table copied into shared memory, gathered there
    E4M3_MMA: gl.constexpr = False,  # the E4M3-MMA route (DESIGN §4.1): wgmma k32 at every N
    GROUP_DECODE: gl.constexpr = decode_groups,  # a group's 16 fp16 (jit function)
    GROUP_DECODE_E4M3: gl.constexpr = decode_groups_e4m3,  # its 4 words of E4M3 bytes (E4M3_MMA)
    IN_CACHE: gl.constexpr = in_cache,  # the block-id guard (jit function)
    RING_PAGES: gl.constexpr = ring_pages,  # (RING) the pages through the ring (jit function)
):
    """PPP consecutive pages of request program_id(0) from page program_id(1) * PPP for
    the tile's rows from SLOT0 * HS on (MMA column c is row SLOT0 * HS + c), in 64-token
    blocks (the 4 warps hold 16 tokens each). Each thread keeps its own maxima of every page
    in shared memory; one barrier and one reduction over them per program then give the PPP
    columns (a reduction across warps every page would cost a large share of its issue)."""
    WIDTH: gl.constexpr = 4 if E4M3_MMA else 2  # the fragment's consecutive k a register
    if _mma_sync(ROWS, E4M3_MMA):
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
                    issue_page(k_ptr, bt_row, first, n, num_blocks, p, RING, IN_CACHE)
        else:
            # a pipeline of DEPTH blocks in flight: c0/s0 is decoded now, c1/s1 next (DEPTH 2)
            c0, s0 = load_nth_block(k_ptr, k64_ptr, bt_row, first, n, num_blocks, 0, PPP * 2, ROWS != 8, IN_CACHE)
            if DEPTH == 2:
                c1, s1 = load_nth_block(k_ptr, k64_ptr, bt_row, first, n, num_blocks, 1, PPP * 2, ROWS != 8, IN_CACHE)
            else:
                c1, s1 = c0, s0
        if PDL:
            if PREFETCH:
                gdc_wait()  # for the q tile
        # q in logical column order, its rows loaded whole (column_order.py)
        qb, set_code, set_value = load_q_rows(q_ptr, q_sel_ptr, q_set_stride, b, HS, SLOT0, ROWS, SETS)
        q8 = qb.to(gl.float8e4nv, bitcast=True)
        q_in = q8 if E4M3_MMA else q8.to(gl.float16)  # the A fragment's type; fp16 exact
        q_op = store_q_tile(logical_columns(q_in, WIDTH), mma, _mma_sync(ROWS, E4M3_MMA))
        # page i's partial maxima at [i, :, :] (pages PPP .. PAD - 1: never written, never stored)
        PAD: gl.constexpr = pad_pow2(PPP)
        maxima = alloc_maxima(PAD, PARTS, ROWS)
        zeros = gl.zeros([64, ROWS], gl.float32, layout=mma)
        run = own_tokens_max(zeros)  # each page's running maximum (its first block overwrites it)
        # Unrolled at N = 8 (the pipeline's blocks stay in their registers, the scale bytes'
        # extraction folds) and through the ring (its slots and phases are constants); the
        # register-fed wgmma kernel keeps the loop, its code measured slower unrolled.
        late = gl.zeros_like(page_ring.thread_ids())  # a thread's 1: a wait gave up
        if TABLES:
            late = page_ring.wait_tables()
        if RING > 0:
            run, late = RING_PAGES(
                k_ptr,
                bt_row,
                first,
                n,
                num_blocks,
                tab_ptr,
                tab_stride,
                q_op,
                zeros,
                run,
                maxima,
                late,
                a_layout,
                ROWS,
                PPP,
                RING,
                PARTS,
                TABLES,
                E4M3_MMA,
                GROUP_DECODE,
                GROUP_DECODE_E4M3,
                IN_CACHE,
            )
        elif ROWS == 8:
            for i in gl.static_range(PPP):
                for h in gl.static_range(2):  # the page's two blocks
                    c0, s0, c1, s1, run = _block(
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
                        q_op,
                        zeros,
                        maxima,
                        a_layout,
                        ROWS,
                        PPP,
                        DEPTH,
                        PARTS,
                        TABLES,
                        E4M3_MMA,
                        GROUP_DECODE,
                        GROUP_DECODE_E4M3,
                        IN_CACHE,
                    )
        else:
            for i in range(PPP):
                for h in gl.static_range(2):
                    c0, s0, c1, s1, run = _block(
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
                        q_op,
                        zeros,
                        maxima,
                        a_layout,
                        ROWS,
                        PPP,
                        DEPTH,
                        PARTS,
                        TABLES,
                        E4M3_MMA,
                        GROUP_DECODE,
                        GROUP_DECODE_E4M3,
                        IN_CACHE,
                    )
        if RING > 0 or TABLES:
            page_ring.report(late, err_ptr)

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
        live = (j < n) & (page < PPP)
        ids = gl.load(bt_row + j, mask=live, other=0)
        bad = live & ~(live & IN_CACHE(ids, num_blocks))  # so that a hook returning True folds
        best = gl.where(bad[:, None], float("nan"), best)
        if SETS > 0:  # a tile set outside the sets: every column NaN, the record names it
            best = gl.where(set_code != 0, float("nan"), best)
            if RECORD:
                record_input(err_ptr, set_code, -1, -1, set_value)
        if RECORD:
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
