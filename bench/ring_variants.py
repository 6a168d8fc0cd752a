"""Ring loops of the wgmma scorer for the benchmark to time in place of the kernel's own
(its ``RING_PAGES`` hook, ``scorer_wgmma.ring_pages``; ``variants.variant_launch``'s
``ring_scorer``), each with ``ring_pages``' signature and scores bit for bit equal to it.

``halves_ring_pages`` (the exact route's wgmma: N 16 and 32): each 64-token block as two K
halves — a thread's first groups feed k-steps 0-3, its second 4-7 — chained on one
accumulator by asynchronous wgmma and streamed: a half is decoded while the half before
multiplies, and its registers are free as soon as its MMA is done. Under a cap of 80 at
N 32 it compiles unspilled for 6 programs an SM, but ptxas then waits after every HGMMA.
Neither form beats the kernel (bench/PERF-HISTORY.md, fifty-sixth and fifty-seventh
sessions).

``slotbars_ring_pages`` (the exact route's wgmma at N 32, 8 partials, up to 4 pages a
program): no CTA barrier in the page loop. The kernel's barrier a page frees a ring slot
for its refill and also orders the page's maxima stores, which Gluon's shared-memory
analysis would otherwise fence with a barrier of its own (fifty-sixth session). Here each
thread arrives on a slot's "read" mbarrier once the page's bytes are in its registers, only
the refilling thread waits on it, and the maxima go by PTX to an array Gluon does not see.
It measured behind the kernel (fifty-seventh session): the barrier is not N 32's bound.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from fast.kernels import page_ring
from fast.kernels.loads import GROUP_LAYOUT, entries, issue_page
from fast.kernels.page_maxima import own_tokens_max, page_max, partials_of
from fast.kernels.scorer_wgmma import dequant_fragment, join_codes


@gluon.jit
def _half_fragment(o0, o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11, o12, o13, o14, o15):
    """fp16 [T, 64] in logical column order from o[c][t, tig] = element c of group 2 tig + gh
    of token t: the A operand of k-steps 4 gh .. 4 gh + 3 (``scorer_wgmma._fragment``'s half)."""
    x = join_codes(o0, o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11, o12, o13, o14, o15)  # [T, tig, e, h, kl0, kl1]
    T: gl.constexpr = x.shape[0]
    x = gl.permute(x, (0, 5, 4, 3, 1, 2))  # [T, kl1, kl0, h, tig, e]
    return gl.reshape(x, [T, 64])


@gluon.jit
def _half_operand(codes, tables, a_layout: gl.constexpr, GROUP_DECODE: gl.constexpr):
    """One K half's A operand [64, 64] in ``a_layout`` from its groups' code words and table
    entries [64, 4] (a thread's first or second groups), without moving data."""
    o = GROUP_DECODE(codes, tables)
    a = _half_fragment(
        o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7], o[8], o[9], o[10], o[11], o[12], o[13], o[14], o[15]
    )
    return gl.convert_layout(a, a_layout, assert_trivial=True)


@gluon.jit
def halves_ring_pages(
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
    """``ring_pages`` with each block as two streamed K halves (the module's first
    structure; the exact route's wgmma only: ``variants.variant_launch`` checks)."""
    base = page_ring.ring_base(GROUP_LAYOUT)
    acc = zeros  # the block in flight's accumulator and high half (none before the first)
    a1 = gl.zeros([64, 64], gl.float16, a_layout)
    for i in gl.static_range(PPP):
        late = late | page_ring.wait(first + i < n, i, RING)
        for h in gl.static_range(2):
            tables = entries(page_ring.read_scales(base, i, h, RING), tab_ptr, tab_stride, TABLES)
            c_lo, c_hi = gl.split(gl.reshape(page_ring.read_codes(base, i, h, RING), [64, 4, 2]))
            t_lo, t_hi = gl.split(gl.reshape(tables, [64, 4, 2]))
            a0 = _half_operand(c_lo, t_lo, a_layout, GROUP_DECODE)
            if i + h > 0:  # the block before: its high half done, its maxima folded
                acc, a1 = warpgroup_mma_wait(0, deps=[acc, a1])
                run = page_max(acc, run, 1 - h, maxima, i - 1 + h, PARTS)
            acc = warpgroup_mma(a0, q_op.slice(0, 64, 0), zeros, use_acc=False, is_async=True)
            a1 = _half_operand(c_hi, t_hi, a_layout, GROUP_DECODE)
            acc = warpgroup_mma(a1, q_op.slice(64, 64, 0), acc, is_async=True)
            a0 = warpgroup_mma_wait(1, deps=[a0])  # the low half done: its registers free
        if i + RING < PPP:
            gl.thread_barrier()  # every warp is done with page i's slot
            issue_page(k_ptr, bt_row, first, n, num_blocks, i + RING, RING, IN_CACHE)
    acc, a1 = warpgroup_mma_wait(0, deps=[acc, a1])  # the last block's high half
    run = page_max(acc, run, 1, maxima, PPP - 1, PARTS)
    return run, late


# ``slotbars_ring_pages``' own shared memory, beside the ring's: a program's partial maxima
# (N 32's: [4 pages, 8 partials, 32 rows] fp32) and one "slot read" mbarrier a slot, each
# array whole kilobytes, as the ring's are: the dynamic buffers after the static ones must
# stay 1 KB aligned for wgmma's swizzle of q's tile.
SLOTBARS_PAGES = 4  # pages a program the maxima array holds (N 32, 8 partials)
_MAXIMA = "bench_slot_maxima"
_MAXIMA_BYTES = SLOTBARS_PAGES * 8 * 32 * 4
_READ = "bench_slot_read"
_DECLARE_SLOTBARS = gl.constexpr(
    f".shared .align 1024 .b8 {_MAXIMA}[{_MAXIMA_BYTES}];\n"
    f".shared .align 1024 .b64 {_READ}[128];\n"
    "{\n.reg .pred p;\nsetp.eq.b32 p, $1, 0;\n"
    + "".join(f"@p mbarrier.init.shared::cta.b64 [{_READ}+{8 * s}], 128;\n" for s in range(page_ring.MAX_RING))
    + "fence.mbarrier_init.release.cluster;\nmov.b32 $0, 0;\n}"
)
_ARRIVE = gl.constexpr(
    tuple(f"mbarrier.arrive.shared::cta.b64 _, [{_READ}+{8 * s}];\nmov.b32 $0, 0;" for s in range(page_ring.MAX_RING))
)
_WAIT_READ = gl.constexpr(
    tuple(page_ring.wait_asm(f"[{_READ}+{8 * (k // 2)}]", k % 2) for k in range(2 * page_ring.MAX_RING))
)
_PAGE_MAXIMA = 8 * 32 * 4  # a page's [8, 32] fp32
_ADDRESS = gl.constexpr(f"{{\n.reg .b32 a;\nmov.b32 a, {_MAXIMA};\nadd.u32 $0, a, $1;\n}}")
_STORE_MAXIMUM = gl.constexpr(
    tuple(
        f"st.shared.v2.f32 [$2+{_PAGE_MAXIMA * i}], {{$4, $5}};\nmov.b32 $0, 0;\nmov.b32 $1, 0;"
        for i in range(page_ring.MAX_RING)
    )
)
_LOAD_MAXIMUM = gl.constexpr("ld.shared.f32 $0, [$1];")


@gluon.jit
def _part_offsets(zeros, PARTS: gl.constexpr):
    """int32 [PARTS, N], the shared address of each of ``page_max``'s partial maxima of a
    program's first page in this module's array (``zeros``: the [64, N] accumulator's), in
    the layout its folds give."""
    N: gl.constexpr = zeros.shape[1]
    like = partials_of(own_tokens_max(zeros), PARTS)  # traced for its layout alone: no code
    p = gl.arange(0, PARTS, layout=gl.SliceLayout(1, like.type.layout))
    c = gl.arange(0, N, layout=gl.SliceLayout(0, like.type.layout))
    at = 4 * (p[:, None] * N + c[None, :])
    return gl.inline_asm_elementwise(_ADDRESS, "=r,r", [at], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _page_max_own(acc, best, H: gl.constexpr, at, i: gl.constexpr, PARTS: gl.constexpr):
    """``page_max`` storing page i's partial maxima into this module's own array (at the
    addresses ``at`` + the page's) by PTX, which Gluon's shared-memory analysis does not see:
    so it puts no barrier before each page's store."""
    own = own_tokens_max(acc)
    if H == 0:
        best = own
    else:
        best = gl.maximum(best, own)
        part = partials_of(best, PARTS)
        # two at a time: a thread's consecutive partial maxima are adjacent columns
        gl.inline_asm_elementwise(_STORE_MAXIMUM[i], "=r,=r,r,r,f,f", [at, part], dtype=gl.int32, is_pure=False, pack=2)
    return best


@gluon.jit
def slotbars_ring_pages(
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
    """``ring_pages`` with no CTA barrier a page (the module's second structure; N 32,
    ``variants.variant_launch`` checks): every thread arrives on its slot's "read"
    mbarrier once it has read the page's last block, and only the thread that refills the
    slot waits for that (the same bounded wait as a page's); the partial maxima go to an
    array of the module's own, copied into ``maxima`` once, after the pages."""
    tid = page_ring.thread_ids()
    gl.inline_asm_elementwise(_DECLARE_SLOTBARS, "=r,r", [tid], dtype=gl.int32, is_pure=False, pack=1)
    gl.thread_barrier()  # the "read" mbarriers initialised for every thread
    at = _part_offsets(zeros, PARTS)
    base = page_ring.ring_base(GROUP_LAYOUT)
    for i in gl.static_range(PPP):
        late = late | page_ring.wait(first + i < n, i, RING)
        for h in gl.static_range(2):
            codes = page_ring.read_codes(base, i, h, RING)
            scales = page_ring.read_scales(base, i, h, RING)
            if h == 1:  # the page's bytes are all in registers: its slot may be refilled
                gl.inline_asm_elementwise(_ARRIVE[i % RING], "=r,r", [tid], dtype=gl.int32, is_pure=False, pack=1)
            tables = entries(scales, tab_ptr, tab_stride, TABLES)
            a = dequant_fragment(codes, tables, a_layout, E4M3_MMA, GROUP_DECODE, GROUP_DECODE_E4M3)
            acc = warpgroup_mma(a, q_op, zeros, use_acc=False)
            run = _page_max_own(acc, run, h, at, i, PARTS)
        if i + RING < PPP:
            refill = ((tid == 0) & (first + i + RING < n)).to(gl.int32)
            late = late | gl.inline_asm_elementwise(
                _WAIT_READ[2 * (i % RING) + (i // RING) % 2], "=r,r", [refill], dtype=gl.int32, is_pure=False, pack=1
            )
            issue_page(k_ptr, bt_row, first, n, num_blocks, i + RING, RING, IN_CACHE)
    gl.thread_barrier()  # every page's maxima stored
    ALL: gl.constexpr = maxima.shape[0] * maxima.shape[1] * maxima.shape[2]
    flat: gl.constexpr = gl.BlockedLayout([ALL // 128], [32], [4], [0])
    k = gl.arange(0, ALL, layout=flat)
    address = gl.inline_asm_elementwise(_ADDRESS, "=r,r", [4 * k], dtype=gl.int32, is_pure=True, pack=1)
    v = gl.inline_asm_elementwise(_LOAD_MAXIMUM, "=f,r", [address], dtype=gl.float32, is_pure=False, pack=1)
    maxima._reinterpret(gl.float32, [ALL], gl.SwizzledSharedLayout(1, 1, 1, [0])).store(v)
    return run, late
