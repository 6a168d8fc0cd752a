"""The wgmma scorer's timing probes, which the bench passes in (``variants.variant_launch``):
never a decode, never in ``fast``.

- ``signless_groups`` (GROUP_DECODE): the exact decode without its sign step (the two
  sign-replicate ``prmt`` and two ``lop3`` of each 8 codes, a third of the decode's ALU
  work), so its scores are those of |k|: what a decode 4 ALU instructions cheaper per 8
  codes would give the scorer.
- ``moves_groups`` (GROUP_DECODE): no decode. The group's 16 fp16 are the code word's four
  16-bit halves, each four times, the first two XORed with the table entry's low word — one
  ``lop3`` a group, which keeps the scale bytes and their entries loaded as the decode has
  them: what a free decode would reach, the most any decode leaves the scorer.
- ``moves_words`` (GROUP_DECODE_E4M3): the E4M3 route's no-decode probe. A group's four
  words of E4M3 bytes are its code word's 32-bit halves, twice, the first XORed with the
  table entry's low word (one ``lop3`` a group, as ``moves_groups``): what a free decode
  would leave the E4M3 route.
- ``every_id`` (IN_CACHE): no block-id guard, to price it.
- ``score_kernel_loads``: the register-fed kernel's memory side alone — its loads, the q
  tile, each block's table entries gathered through L1 — folded into one store no GPU makes.
- ``no_maxima_ring_pages`` (RING_PAGES, wgmma at N 32, either route): the ring loop
  without its page maxima — each block's product folded into one running maximum of a
  thread's own tokens, no shuffle and no shared-memory store a page (and no barrier Gluon
  would put before one); that maximum stored once, as page 0's: what the maxima cost. At
  the E4M3 route's cap of 80 (its registers otherwise leave it a program short); at N 16 it
  spills at any cap, so it does not run there.
- ``ring_loads_ring_pages`` (RING_PAGES, every N the ring runs, either route): the ring's
  memory side alone — each page waited for, its code words, scale bytes and table entries
  read as the kernel reads them and XORed into one word, its slot freed and refilled; no
  decode, MMA or maxima: the ring's own floor, as ``score_kernel_loads`` is the register
  feed's. ``ring_copies_ring_pages``: the same without the reads — the copies, waits and
  barriers alone.
- ``held_ring_pages`` (RING_PAGES, wgmma at N 16 and 32, either route): the ring loop on
  pages that stay in it — the first RING pages waited for once, every page after scored
  from slot i % RING with no id load, copy or wait: the kernel's reads, decode, MMA and
  maxima on shared memory alone, what it would take were its pages never late. Its CTA
  barrier a page stays (Gluon puts one before each page's maxima fold, whose scratch the
  kernel's refill barrier guards too).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from fast.kernels import page_ring
from fast.kernels.column_order import load_q_rows, logical_columns, store_q_tile
from fast.kernels.dequant_prmt import LOOKUP_STEP, TABLE_FROM_ENTRY, WIDEN_STEP, group_asm
from fast.kernels.loads import GROUP_LAYOUT, advance, entries, in_cache, issue_page, load_nth_block
from fast.kernels.page_maxima import folds_by_layout, own_tokens_max, partials_of
from fast.kernels.rules import read_pages
from fast.kernels.scorer_wgmma import dequant_fragment, score_block

# The sign step's place in the signless probe: the magnitudes as they are.
_NO_SIGN_STEP = "mov.b32 e0, p0;\nmov.b32 e1, p1;\n"
_SIGNLESS_ASM = gl.constexpr(group_asm(TABLE_FROM_ENTRY, LOOKUP_STEP + _NO_SIGN_STEP + WIDEN_STEP, 8))
# Output 4 i + j is the code word's 16-bit half j, but outputs 0 and 1 are the halves of
# (low word ^ the table entry's low word).
_MOVES_ASM = gl.constexpr(
    "{\n.reg .b32 wlo, whi, tlo, thi, x;\nmov.b64 {wlo, whi}, $16;\nmov.b64 {tlo, thi}, $17;\n"
    "xor.b32 x, wlo, tlo;\nmov.b32 {$0, $1}, x;\nmov.b32 {$2, $3}, whi;\n"
    + "".join(f"mov.b32 {{${k}, ${k + 1}}}, wlo;\nmov.b32 {{${k + 2}, ${k + 3}}}, whi;\n" for k in (4, 8, 12))
    + "}\n"
)
_F16_OUTPUTS = gl.constexpr("=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,=h,l,l")
# Word 0 is (low word ^ the table entry's low word), words 1-3 the code word's halves.
_MOVES_E4M3_ASM = gl.constexpr(
    "{\n.reg .b32 wlo, whi, tlo, thi;\nmov.b64 {wlo, whi}, $4;\nmov.b64 {tlo, thi}, $5;\n"
    "xor.b32 $0, wlo, tlo;\nmov.b32 $1, whi;\nmov.b32 $2, wlo;\nmov.b32 $3, whi;\n}\n"
)


@gluon.jit
def signless_groups(codes, tables):
    """``decode_groups`` without the sign step: 16 fp16 [64, 8] of |k|."""
    return gl.inline_asm_elementwise(
        _SIGNLESS_ASM, _F16_OUTPUTS, [codes, tables], dtype=(gl.float16,) * 16, is_pure=True, pack=1
    )


@gluon.jit
def moves_groups(codes, tables):
    """No decode: 16 fp16 [64, 8] of the code words' 16-bit halves (the module's docstring)."""
    return gl.inline_asm_elementwise(
        _MOVES_ASM, _F16_OUTPUTS, [codes, tables], dtype=(gl.float16,) * 16, is_pure=True, pack=1
    )


@gluon.jit
def moves_words(codes, tables):
    """No E4M3 decode: 4 int32 [64, 8] of the code words' 32-bit halves (the module's
    docstring)."""
    return gl.inline_asm_elementwise(
        _MOVES_E4M3_ASM, "=r,=r,=r,=r,l,l", [codes, tables], dtype=(gl.int32,) * 4, is_pure=True, pack=1
    )


@gluon.jit
def every_id(page, num_blocks):
    """No block-id guard: every id passes."""
    return True


@gluon.jit
def _loads(
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
    fold,
    ROWS: gl.constexpr,
    PPP: gl.constexpr,
    DEPTH: gl.constexpr,
):
    """The scorer's ``_block`` without its scoring: the block DEPTH ahead loaded, (c0, s0)
    and its table entries folded into ``fold``, the pipeline advanced."""
    cn, sn = load_nth_block(
        k_ptr, k64_ptr, bt_row, first, n, num_blocks, 2 * i + h + DEPTH, PPP * 2, ROWS != 8, in_cache
    )
    fold = fold ^ c0 ^ entries(s0, tab_ptr, tab_stride, 0)
    c0, s0, c1, s1 = advance(c0, s0, c1, s1, cn, sn, DEPTH)
    return c0, s0, c1, s1, fold


@gluon.jit
def score_kernel_loads(
    q_ptr,
    q_sel_ptr,
    q_set_stride,
    k_ptr,
    k64_ptr,
    tab_ptr,
    tab_stride,
    bt_ptr,
    lens_ptr,
    out_ptr,
    err_ptr,
    num_blocks,
    W,
    stride_bt,
    stride_ob,
    stride_or,
    HS: gl.constexpr,
    SLOT0: gl.constexpr,
    ROWS: gl.constexpr,
    PPP: gl.constexpr,
    DEPTH: gl.constexpr,
    PDL: gl.constexpr,
    PREFETCH: gl.constexpr,
    RELEASE: gl.constexpr,
    PARTS: gl.constexpr,
    RECORD: gl.constexpr,
):
    """``score_kernel_wgmma``'s operands and grid, fed from registers (RING 0, TABLES 0):
    the same loads in the same loop, no decode, no MMA, ``out`` untouched."""
    if ROWS == 8:
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
    else:
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, ROWS, 16])
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
        c0, s0 = load_nth_block(k_ptr, k64_ptr, bt_row, first, n, num_blocks, 0, PPP * 2, ROWS != 8, in_cache)
        if DEPTH == 2:
            c1, s1 = load_nth_block(k_ptr, k64_ptr, bt_row, first, n, num_blocks, 1, PPP * 2, ROWS != 8, in_cache)
        else:
            c1, s1 = c0, s0
        if PDL:
            if PREFETCH:
                gdc_wait()
        # the q tile, loaded and stored as the scorer does (its loads and its shared memory)
        q8 = load_q_rows(q_ptr, q_sel_ptr, q_set_stride, b, HS, SLOT0, ROWS, 0)[0].to(gl.float8e4nv, bitcast=True)
        store_q_tile(logical_columns(q8.to(gl.float16), 2), mma, ROWS == 8)
        fold = gl.zeros([64, 8], gl.int64, layout=GROUP_LAYOUT)
        if ROWS == 8:  # unrolled, as the scorer is there
            for i in gl.static_range(PPP):
                for h in gl.static_range(2):
                    c0, s0, c1, s1, fold = _loads(
                        k_ptr, k64_ptr, tab_ptr, tab_stride, bt_row, first, n, num_blocks, i, h, c0, s0, c1, s1, fold,
                        ROWS, PPP, DEPTH,
                    )  # fmt: skip
        else:
            for i in range(PPP):
                for h in gl.static_range(2):
                    c0, s0, c1, s1, fold = _loads(
                        k_ptr, k64_ptr, tab_ptr, tab_stride, bt_row, first, n, num_blocks, i, h, c0, s0, c1, s1, fold,
                        ROWS, PPP, DEPTH,
                    )  # fmt: skip
        # a store the compiler cannot drop, and no GPU makes
        gl.store(
            out_ptr + gl.zeros([64, 8], gl.int64, layout=GROUP_LAYOUT),
            fold.to(gl.float32),
            mask=fold == 0x5EED5EED5EED,
        )


@gluon.jit
def no_maxima_ring_pages(
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
    """``ring_pages`` without the page maxima (the module's probe of them; wrong scores):
    the same waits, decode, MMA and refills, each product folded into one running maximum
    of a thread's own tokens, stored once after the pages as page 0's partial maxima."""
    base = page_ring.ring_base(GROUP_LAYOUT)
    for i in gl.static_range(PPP):
        late = late | page_ring.wait(first + i < n, i, RING)
        for h in gl.static_range(2):
            tables = entries(page_ring.read_scales(base, i, h, RING), tab_ptr, tab_stride, TABLES)
            a = dequant_fragment(
                page_ring.read_codes(base, i, h, RING), tables, a_layout, E4M3_MMA, GROUP_DECODE, GROUP_DECODE_E4M3
            )
            run = gl.maximum(run, own_tokens_max(warpgroup_mma(a, q_op, zeros, use_acc=False)))
        if i + RING < PPP:
            gl.thread_barrier()  # every warp is done with page i's slot
            issue_page(k_ptr, bt_row, first, n, num_blocks, i + RING, RING, IN_CACHE)
    maxima.index(0).store(partials_of(run, PARTS, folds_by_layout(ROWS, PARTS)))
    return run, late


# A move the compiler keeps in place: the words folded by then (not held to the end).
_SETTLED = gl.constexpr("mov.b64 $0, $1;")


@gluon.jit
def _settled(x):
    """``x`` (int64, any shape) as it is at this point of the program."""
    return gl.inline_asm_elementwise(_SETTLED, "=l,l", [x], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _ring_alone(
    k_ptr,
    bt_row,
    first,
    n,
    num_blocks,
    tab_ptr,
    tab_stride,
    run,
    maxima,
    late,
    ROWS: gl.constexpr,
    PPP: gl.constexpr,
    RING: gl.constexpr,
    PARTS: gl.constexpr,
    TABLES: gl.constexpr,
    IN_CACHE: gl.constexpr,
    READS: gl.constexpr,
):
    """The ring's waits, barriers and refills, and with READS each page's words read as
    ``ring_pages`` reads them and XORed into one, whose maximum goes into page 0's partial
    maxima (read or not: the probe's one store). Returns (run, late)."""
    base = page_ring.ring_base(GROUP_LAYOUT)
    seen = gl.zeros([64, 8], gl.int64, GROUP_LAYOUT)
    for i in gl.static_range(PPP):
        late = late | page_ring.wait(first + i < n, i, RING)
        if READS:
            for h in gl.static_range(2):
                tables = entries(page_ring.read_scales(base, i, h, RING), tab_ptr, tab_stride, TABLES)
                seen = seen ^ page_ring.read_codes(base, i, h, RING) ^ tables
            seen = _settled(seen)
        if i + RING < PPP:
            gl.thread_barrier()  # every warp is done with page i's slot
            issue_page(k_ptr, bt_row, first, n, num_blocks, i + RING, RING, IN_CACHE)
    run = run + gl.max(gl.max(seen.to(gl.float32), axis=1), axis=0)  # every bit of every word read
    maxima.index(0).store(partials_of(run, PARTS, folds_by_layout(ROWS, PARTS)))
    return run, late


@gluon.jit
def ring_loads_ring_pages(
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
    """``ring_pages``' waits, reads and refills alone (the module's probe of the ring; wrong
    scores)."""
    return _ring_alone(
        k_ptr,
        bt_row,
        first,
        n,
        num_blocks,
        tab_ptr,
        tab_stride,
        run,
        maxima,
        late,
        ROWS,
        PPP,
        RING,
        PARTS,
        TABLES,
        IN_CACHE,
        True,
    )


@gluon.jit
def ring_copies_ring_pages(
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
    """``ring_pages``' waits and refills alone, no read of a page (the module's probe of the
    ring's copies; wrong scores)."""
    return _ring_alone(
        k_ptr,
        bt_row,
        first,
        n,
        num_blocks,
        tab_ptr,
        tab_stride,
        run,
        maxima,
        late,
        ROWS,
        PPP,
        RING,
        PARTS,
        TABLES,
        IN_CACHE,
        False,
    )


@gluon.jit
def held_ring_pages(
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
    """``ring_pages`` on the pages the kernel issued first, held (the module's probe of the
    kernel's own work; wrong scores past page RING - 1): each waited for once, then page i
    read from slot i % RING and scored by the kernel's own ``score_block``, with no refill
    or wait after them."""
    base = page_ring.ring_base(GROUP_LAYOUT)
    for i in gl.static_range(PPP):
        if i < RING:
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
    return run, late
