"""Ring loops of the wgmma scorer for the benchmark to time in place of the kernel's own
(its ``RING_PAGES`` hook, ``scorer_wgmma.ring_pages``; ``variants.variant_launch``'s
``ring_scorer``), with ``ring_pages``' signature and scores bit for bit equal to it.

``piped_ring_pages`` (the E4M3 route's wgmma, N 16 and 32): the blocks software-pipelined.
Block j's MMA is issued asynchronously and block j - 1's maxima are folded while it runs;
block j + 1 is decoded while j's MMA may still run, then waited for. Two A fragments and
two accumulators live at once: 92 registers at N 32 (5 programs an SM, not 6), 96 at N 16
under a cap of 96 (5, as the kernel: its shared memory binds; under the policy's cap ptxas
waits after every MMA). On the exact route ptxas waits after every HGMMA at N 16 and needs
132 registers at N 32, so the loop does not run there.

Removed once measured behind (bench/PERF-HISTORY.md):
- a ring loop with no CTA barrier in its pages (slots freed by "read" mbarriers, the maxima
  stored by PTX): 0.03-0.08 in three H100 runs (fifty-eighth session; ``slotbars_ring_pages``
  at 90dd1a7);
- each block as two streamed K halves on asynchronous wgmma (the exact route, N 16 and 32),
  uncapped and under a cap of 80: ahead by 1-3% resident, behind by 0.03-0.04 at 32 x 1M in
  the A/B it owed (fifty-ninth session; ``halves_ring_pages`` at 6ae99b2);
- each refill's page id loaded a page early, off the copy's path after the barrier: level
  resident and cold on either route at N 16 and 32 (sixtieth session; ``early_ids_ring_pages``
  at 6ae7652);
- each block's MMAs asynchronous with the next block's scale bytes, entries (and on the exact
  route code words) read under them: level resident on the exact route, 1-4% behind on the
  E4M3 route, 0.05-0.08 behind cold at 32 x 128K and 32 x 1M on the exact route (sixtieth
  session; ``ahead_ring_pages`` at 6ae7652).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from fast.kernels import page_ring
from fast.kernels.loads import GROUP_LAYOUT, entries, issue_page
from fast.kernels.page_maxima import folds_by_layout, page_max
from fast.kernels.scorer_wgmma import dequant_fragment


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
