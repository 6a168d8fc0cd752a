"""The MSA mma scorer's timing probe, which the bench launches in its place
(``variants.block_variant_launch``): never a decode, never in ``fast``.

``msa_score_kernel_loads``: the bulk ring alone — the scorer's grid, copies, waits and
shared-memory reads in its order, as much shared memory (so as many programs an SM as it
allows), no q, MMA or maxima, nothing written to ``out``.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.language.extra.cuda import gdc_wait
from triton.runtime.jit import constexpr_function

from fast.kernels import page_ring
from fast.kernels.page_maxima import pad_pow2
from fast.msa.kernels import block_ring
from fast.msa.kernels.loads import column_blocks, issue_half, refill
from fast.msa.kernels.rules import read_blocks


@gluon.jit
def _hold_dynamic(PAD: gl.constexpr, PARTS: gl.constexpr, ROWS: gl.constexpr, FOLD: gl.constexpr):
    """Take the dynamic shared memory the scorer's q tile and maxima take
    (``fast.msa.scorer.dynamic_bytes``: at N 8 the larger of the two, which the compiler lets
    share), and with FOLD the maxima's fold scratch (``page_maxima.fold_bytes``), so that the
    probe shares an SM with as many programs as the scorer's shared memory allows. Returns
    0, read back from every buffer: unread, the compiler drops them."""
    smem: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    regs: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
    TILE: gl.constexpr = ROWS * 64
    MAXIMA: gl.constexpr = PAD * PARTS * ROWS
    tile: gl.constexpr = [ROWS, 64]  # int32 words of q's 16-bit [ROWS, 128] tile
    maxima: gl.constexpr = [PAD * PARTS, ROWS]
    if FOLD:  # live beside the others, as in the scorer (read back last)
        scratch: gl.constexpr = [32, ROWS]  # fp32 [4, 8, ROWS] as int32 words
        c = gl.allocate_shared_memory(gl.int32, scratch, smem, gl.zeros(scratch, gl.int32, regs))
    if ROWS != 8:  # both live at once, as in the scorer (wgmma reads q's tile at every block)
        a = gl.allocate_shared_memory(gl.int32, tile, smem, gl.zeros(tile, gl.int32, regs))
        b = gl.allocate_shared_memory(gl.int32, maxima, smem, gl.zeros(maxima, gl.int32, regs))
        held = gl.max(gl.max(a.load(regs), axis=1), axis=0) + gl.max(gl.max(b.load(regs), axis=1), axis=0)
    else:
        larger: gl.constexpr = tile if TILE >= MAXIMA else maxima
        a = gl.allocate_shared_memory(gl.int32, larger, smem, gl.zeros(larger, gl.int32, regs))
        held = gl.max(gl.max(a.load(regs), axis=1), axis=0)
    if FOLD:
        held = held + gl.max(gl.max(c.load(regs), axis=1), axis=0)
    return held


@constexpr_function
def _fold_asm(slot, element_bytes):
    """``block_ring.read``'s 16 bytes at the thread's offset $1, their four words xored
    into the running fold $2, giving $0."""
    return (
        "{\n.reg .b32 a, b, c, d;\n"
        f"ld.shared.v4.b32 {{a, b, c, d}}, [$1+{slot * block_ring.slot_bytes(element_bytes)}];\n"
        "xor.b32 a, a, b;\nxor.b32 c, c, d;\nxor.b32 a, a, c;\nxor.b32 $0, a, $2;\n}"
    )


@constexpr_function
def runs_layout(element_bytes):
    """A half-block's 16-byte runs [64 tokens, 8 (E4M3) or 16 (BF16) a token], each thread
    holding those the scorer's read-back gives it (``fast.msa.kernels.loads.RAW_LAYOUT``):
    2 runs of a token for E4M3, 4 for BF16."""
    per = 2 * element_bytes  # runs of a thread's 32 elements
    own = [[0, 1 << i] for i in range(per.bit_length() - 1)]
    return gl.DistributedLinearLayout(
        reg_bases=own + [[8, 0]],
        lane_bases=[[0, per], [0, 2 * per], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]],
        block_bases=[],
        shape=[64, 8 * element_bytes],
    )


@gluon.jit
def read_folded(NTH: gl.constexpr, STAGES: gl.constexpr, IS_FP8: gl.constexpr, SWIZZLED: gl.constexpr, fold):
    """``block_ring.read``'s loads, each 16-byte run folded to one int32 in PTX
    (``runs_layout``), which keeps every load live at one register a run instead of the
    run's 16 elements. Each run is xored into ``fold`` (int32, ``runs_layout``: the runs folded so far) inside the same
    asm: folded outside it, the compiler regrouped the chain of xors into a tree over the
    program's half-blocks and held each one's words to the end (at BF16 N 8, more
    registers than the scorer it probes)."""
    BYTES: gl.constexpr = 1 if IS_FP8 else 2
    layout: gl.constexpr = runs_layout(BYTES)
    r = gl.arange(0, 8 * BYTES, layout=gl.SliceLayout(0, layout))
    at = block_ring.slot_address(gl.arange(0, 64, layout=gl.SliceLayout(1, layout)), r * 16, BYTES, SWIZZLED)
    return gl.inline_asm_elementwise(
        _fold_asm(NTH % STAGES, BYTES), "=r,r,r", [at, fold], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def msa_score_kernel_loads(
    q_ptr,
    q_sel_ptr,
    q_set_stride,
    k_ptr,
    bt_ptr,
    lens_ptr,
    out_ptr,
    err_ptr,
    width,
    num_pages,
    stride,
    offset,
    num_blocks,
    stride_bt,
    stride_ob,
    stride_or,
    desc_ptr,
    HS: gl.constexpr,
    SLOT0: gl.constexpr,
    ROWS: gl.constexpr,
    PPP: gl.constexpr,
    PARTS: gl.constexpr,
    IS_FP8: gl.constexpr,
    RECORD: gl.constexpr,
    PDL: gl.constexpr,
    STAGES: gl.constexpr,
    BULK: gl.constexpr,
    TENSOR: gl.constexpr,
    FOLD: gl.constexpr,
):
    """``msa_score_kernel_mma``'s operands, grid and bulk ring (BULK), its loads alone (the
    module's docstring)."""
    chunks = (width + PPP - 1) // PPP
    b = gl.program_id(0) // chunks
    first = (gl.program_id(0) % chunks) * PPP
    if PDL:
        gdc_wait()
    length = gl.load(lens_ptr + b)
    computed = read_blocks(length, num_pages)
    if first * stride + offset < computed:
        bt_row = bt_ptr + b.to(gl.int64) * stride_bt
        PAD: gl.constexpr = pad_pow2(PPP)
        blocks = column_blocks(bt_row, first, width, stride, offset, computed, num_blocks, PPP, PAD)
        BYTES: gl.constexpr = k_ptr.dtype.element_ty.primitive_bitwidth // 8
        block_ring.declare(STAGES, BYTES)
        gl.thread_barrier()  # the ring's mbarriers initialised for every thread
        late = gl.zeros_like(page_ring.thread_ids())  # a thread's 1: a wait gave up
        for n in gl.static_range(STAGES - 1):
            issue_half(k_ptr, desc_ptr, blocks, n, STAGES, BYTES, TENSOR)
        held = _hold_dynamic(PAD, PARTS, ROWS, FOLD)
        fold = gl.zeros([64, 8 * BYTES], gl.int32, layout=runs_layout(BYTES))
        for k in gl.static_range(2 * PPP):  # the scorer's order of copies, waits and reads
            refill(k_ptr, desc_ptr, blocks, k, STAGES, BYTES, TENSOR, 2 * PPP, True)
            late = late | block_ring.wait(k, STAGES)
            fold = read_folded(k, STAGES, IS_FP8, TENSOR, fold)
            refill(k_ptr, desc_ptr, blocks, k, STAGES, BYTES, TENSOR, 2 * PPP, False)
        page_ring.report(late, err_ptr)
        # a store the compiler cannot drop, and no real width makes
        gl.store(
            out_ptr + gl.zeros_like(fold).to(gl.int64), fold.to(gl.float32), mask=fold == width - 0x5EED5EED + held
        )
