"""Ring loops of the wgmma scorer for the benchmark to time in place of the kernel's own
(its ``RING_PAGES`` hook, ``scorer_wgmma.ring_pages``; ``variants.variant_launch``'s
``ring_scorer``), with ``ring_pages``' signature and scores bit for bit equal to it.

``halves_ring_pages`` (the exact route's wgmma: N 16 and 32): each 64-token block as two K
halves — a thread's first groups feed k-steps 0-3, its second 4-7 — chained on one
accumulator by asynchronous wgmma and streamed: a half is decoded while the half before
multiplies, and its registers are free as soon as its MMA is done. Under a cap of 80 at
N 32 it compiles unspilled for 6 programs an SM, but ptxas then waits after every HGMMA.
Neither form beats the kernel (bench/PERF-HISTORY.md, fifty-sixth and fifty-seventh
sessions).

``piped_ring_pages`` (the E4M3 route's wgmma, N 16 and 32): the blocks software-pipelined.
Block j's MMA is issued asynchronously and block j - 1's maxima are folded while it runs;
block j + 1 is decoded while j's MMA may still run, then waited for. Two A fragments and
two accumulators live at once: 92 registers at N 32 (5 programs an SM, not 6), 96 at N 16
under a cap of 96 (5, as the kernel: its shared memory binds; under the policy's cap ptxas
waits after every MMA). On the exact route ptxas waits after every HGMMA at N 16 and needs
132 registers at N 32, so the loop does not run there.

A ring loop with no CTA barrier in its pages (slots freed by "read" mbarriers, the maxima
stored by PTX) lost 0.03-0.08 in three H100 runs and was removed (fifty-eighth session; its
code is ``slotbars_ring_pages`` at 90dd1a7).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from fast.kernels import page_ring
from fast.kernels.loads import GROUP_LAYOUT, entries, issue_page
from fast.kernels.page_maxima import folds_by_layout, page_max
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
                run = page_max(acc, run, 1 - h, maxima, i - 1 + h, PARTS, folds_by_layout(ROWS, PARTS))
            acc = warpgroup_mma(a0, q_op.slice(0, 64, 0), zeros, use_acc=False, is_async=True)
            a1 = _half_operand(c_hi, t_hi, a_layout, GROUP_DECODE)
            acc = warpgroup_mma(a1, q_op.slice(64, 64, 0), acc, is_async=True)
            a0 = warpgroup_mma_wait(1, deps=[a0])  # the low half done: its registers free
        if i + RING < PPP:
            gl.thread_barrier()  # every warp is done with page i's slot
            issue_page(k_ptr, bt_row, first, n, num_blocks, i + RING, RING, IN_CACHE)
    acc, a1 = warpgroup_mma_wait(0, deps=[acc, a1])  # the last block's high half
    run = page_max(acc, run, 1, maxima, PPP - 1, PARTS, folds_by_layout(ROWS, PARTS))
    return run, late


@gluon.jit
def piped_ring_pages(
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
    """``ring_pages`` with the blocks software-pipelined (the module's second structure):
    block j decoded, block j - 1's MMA waited for, block j's issued, then block j - 1's
    maxima folded while it runs."""
    base = page_ring.ring_base(GROUP_LAYOUT)
    acc = zeros  # the block in flight's accumulator (none before the first)
    for i in gl.static_range(PPP):
        late = late | page_ring.wait(first + i < n, i, RING)
        for h in gl.static_range(2):
            tables = entries(page_ring.read_scales(base, i, h, RING), tab_ptr, tab_stride, TABLES)
            codes = page_ring.read_codes(base, i, h, RING)
            a = dequant_fragment(codes, tables, a_layout, E4M3_MMA, GROUP_DECODE, GROUP_DECODE_E4M3)
            done = acc
            if i + h > 0:  # the block before: its product (an E4M3 A fragment cannot be a wait's
                # dependency in Gluon; ptxas keeps the registers of one in flight until it is done)
                done = warpgroup_mma_wait(0, deps=[acc])
            acc = warpgroup_mma(a, q_op, zeros, use_acc=False, is_async=True)
            if i + h > 0:  # its maxima, while this block multiplies
                run = page_max(done, run, 1 - h, maxima, i - 1 + h, PARTS, folds_by_layout(ROWS, PARTS))
        if i + RING < PPP:
            gl.thread_barrier()  # every warp is done with page i's slot
            issue_page(k_ptr, bt_row, first, n, num_blocks, i + RING, RING, IN_CACHE)
    acc = warpgroup_mma_wait(0, deps=[acc])  # the last block
    run = page_max(acc, run, 1, maxima, PPP - 1, PARTS, folds_by_layout(ROWS, PARTS))
    return run, late
