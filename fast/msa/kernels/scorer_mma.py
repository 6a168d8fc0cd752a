"""The GPU MSA block scorer (docs/DESIGN.md §10.2) for E4M3 and BF16 keys (Gluon, sm_90):
half-blocks through the ring (``block_ring.py``, fed by ``loads.py``), each thread's
fragment widened in registers, maxima per thread until the program's end.
Why this structure: docs/KERNELS.md, "The MSA mma scorer"."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma
from triton.language.extra.cuda import gdc_wait

from indexer_constants import PAGE

from ...kernels import page_ring
from ...kernels.column_order import load_q_rows, logical_columns, store_q_tile
from ...kernels.guards import BAD_BLOCK, ERR_INPUT, record_input
from ...kernels.page_maxima import alloc_maxima, column_maxima, maxima_layout, own_tokens_max, pad_pow2, page_max
from ...kernels.rules import query_position
from . import block_ring
from .loads import RAW_LAYOUT, column_blocks, copy_half, issue_half, refill
from .rules import read_blocks
from .scorer_dot import is_nan_element, to_operand  # arithmetic only: Gluon calls them as Triton does

_PAGE = gl.constexpr(PAGE)
_ERR_INPUT = gl.constexpr(ERR_INPUT)
_BAD_BLOCK = gl.constexpr(BAD_BLOCK)
_NONE = gl.constexpr(2**31 - 1)


@gluon.jit
def _operand(raw, IS_FP8: gl.constexpr, E4M3_MMA: gl.constexpr):
    """Raw elements [R, 128] as the MMA's operand in logical column order
    (``column_order.logical_columns``): E4M3 as it is for the E4M3 MMA (k 4 a register),
    else widened to 16 bits."""
    if E4M3_MMA:
        x = logical_columns(raw.to(gl.float8e4nv, bitcast=True), 4)
    else:
        x = logical_columns(to_operand(raw, IS_FP8, False, True))
    return x


@gluon.jit
def _fragment(raw, a_layout: gl.constexpr, IS_FP8: gl.constexpr, E4M3_MMA: gl.constexpr):
    """The A operand [64, 128] from a half-block's raw elements (``_operand``; no data
    moves between threads: checked at compile time)."""
    return gl.convert_layout(_operand(raw, IS_FP8, E4M3_MMA), a_layout, assert_trivial=True)


@gluon.jit
def msa_score_kernel_mma(
    q_ptr,  # [.., B, 8, HS, 128] query tile, raw: E4M3 bytes (uint8) or BF16 bits (int16)
    q_sel_ptr,  # int64 [1]: which tile set to read (SETS > 0; see q_set_stride)
    q_set_stride,  # elements between tile sets (0 where there is one)
    k_ptr,  # [N, 128, 128] keys, raw as the tile
    bt_ptr,  # int32 [B, W]: column j holds global block j * stride + offset
    lens_ptr,  # int32 [B]
    out_ptr,  # fp32 [B, 8 * HS, W]
    err_ptr,  # int32 [5]: the error record (RECORD; a bulk ring's wait that gives up sets its protocol word)
    width,
    num_pages,  # P: blocks the full table holds
    stride,
    offset,
    num_blocks,  # N: ids outside [0, N) are never loaded
    stride_bt,
    stride_ob,
    stride_or,
    desc_ptr,  # int64 address of the cache's tensor map (TENSOR), else unused
    HS: gl.constexpr,
    SLOT0: gl.constexpr,  # the first slot scored: rows of earlier slots are left alone
    ROWS: gl.constexpr,  # the MMA's N: 8 (mma.sync), else a power of two >= 16 (wgmma)
    PPP: gl.constexpr,  # columns (blocks) per program
    PARTS: gl.constexpr,  # partial maxima per block and row (fast.msa.scorer.mma_partials)
    IS_FP8: gl.constexpr,
    RECORD: gl.constexpr,  # record a bad id in err_ptr's record
    PDL: gl.constexpr,
    STAGES: gl.constexpr,  # half-blocks in the ring (2 .. 2 PPP + 1): STAGES - 1 in flight
    BULK: gl.constexpr,  # the ring static, filled by bulk copies (block_ring.py); else dynamic, by cp.async
    TENSOR: gl.constexpr,  # BULK: by tensor copies through desc_ptr's map (swizzled), else 1D bulk copies
    FOLD: gl.constexpr,  # the page maxima folded by layout (fast.msa.scorer.mma_folds), else by shuffles
    E4M3_MMA: gl.constexpr = False,  # IS_FP8: the E4M3-MMA route (DESIGN §4.1), wgmma k32 at every N
    SETS: gl.constexpr = 0,  # q_sel[0] picks one of SETS tile sets (outside them: NaN); 0: the tile, q_sel unread
):
    """Program ``b * C + c`` (C = ceil(width / PPP) programs a request) scores columns
    ``c * PPP ..`` of request b as ``msa_score_kernel`` does (the same contract,
    docs/DESIGN.md §10.2): a column is computed when its global block ``g < min(ceil(len /
    128), P)`` and stored in a row when also ``128 g <= pos``; a row whose query holds a NaN
    element stores NaN; an id outside ``[0, N)`` is never loaded, its stored rows get NaN
    and with RECORD the program's first is recorded (the first writer of the record wins)."""
    MMA_SYNC: gl.constexpr = ROWS == 8 and not E4M3_MMA
    WIDTH: gl.constexpr = 4 if E4M3_MMA else 2  # the operand's consecutive k a register
    if MMA_SYNC:
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
    else:
        mma: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, ROWS, 8 * WIDTH]
        )
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=WIDTH)
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
        # the first half-blocks go out before q is gathered
        BYTES: gl.constexpr = k_ptr.dtype.element_ty.primitive_bitwidth // 8
        if BULK:
            block_ring.declare(STAGES, BYTES)
            gl.thread_barrier()  # the ring's mbarriers initialised for every thread
            late = gl.zeros_like(page_ring.thread_ids())  # a thread's 1: a wait gave up
            for n in gl.static_range(STAGES - 1):  # STAGES - 1 <= 2 PPP
                issue_half(k_ptr, desc_ptr, blocks, n, STAGES, BYTES, TENSOR)
        else:
            ring = gl.allocate_shared_memory(
                k_ptr.dtype.element_ty, [STAGES, 64, 128], gl.SwizzledSharedLayout(16 // BYTES, 1, 8, [1, 0])
            )
            for n in gl.static_range(STAGES - 1):
                copy_half(ring, n, STAGES, k_ptr, blocks)
                async_copy.commit_group()
        # q in logical column order; a NaN row's elements go in as they are (stored NaN anyway)
        q_raw, set_code, set_value = load_q_rows(q_ptr, q_sel_ptr, q_set_stride, b, HS, SLOT0, ROWS, SETS)
        q_unwritten = gl.max(is_nan_element(q_raw, IS_FP8).to(gl.int32), axis=1)  # [ROWS]
        if SETS > 0:  # a tile set outside the sets: every row NaN, the record names it
            q_unwritten = q_unwritten | (set_code != 0).to(gl.int32)
            if RECORD:
                record_input(err_ptr, set_code, -1, -1, set_value)
        q_op = store_q_tile(_operand(q_raw, IS_FP8, E4M3_MMA), mma, MMA_SYNC)
        # the lowest position of a scored row: a block that ends at or before it needs no mask
        pos_low = query_position(length, SLOT0)
        maxima = alloc_maxima(PAD, PARTS, ROWS)
        zeros = gl.zeros([64, ROWS], gl.float32, layout=mma)
        run = own_tokens_max(zeros)
        # half k from slot k % STAGES; half k + STAGES - 1 refills the slot of half k - 1
        for k in gl.static_range(2 * PPP):
            if BULK:
                refill(k_ptr, desc_ptr, blocks, k, STAGES, BYTES, TENSOR, 2 * PPP, True)
                late = late | block_ring.wait(k, STAGES)
                raw = block_ring.read(k, STAGES, RAW_LAYOUT, IS_FP8, TENSOR)
                refill(k_ptr, desc_ptr, blocks, k, STAGES, BYTES, TENSOR, 2 * PPP, False)
            else:
                async_copy.wait_group(STAGES - 2)
                raw = ring.index(k % STAGES).load(RAW_LAYOUT)
                # a compile-time test: kept inline, as a name assigned in the loop would be a
                # run-time value, and a cp.async under a run-time branch fails Triton's lowering
                if k + STAGES - 1 < 2 * PPP:
                    copy_half(ring, k + STAGES - 1, STAGES, k_ptr, blocks)
                async_copy.commit_group()
            # its MMA; the token mask where some scored row sees only part of the block
            g = (first + k // 2) * stride + offset
            a = _fragment(raw, a_layout, IS_FP8, E4M3_MMA)
            if MMA_SYNC:
                acc = mma_v2(a, q_op, zeros)
            else:
                acc = warpgroup_mma(a, q_op, zeros, use_acc=False)
            if (g + 1) * _PAGE - 1 > pos_low:
                # built here, not before the loop: ROWS positions a thread would hold throughout
                t_idx = gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
                pos = query_position(length, (SLOT0 * HS + gl.arange(0, ROWS, layout=gl.SliceLayout(0, mma))) // HS)
                visible = (g * _PAGE + 64 * (k % 2) + t_idx)[:, None] <= pos[None, :]
                acc = gl.where(visible, acc, float("-inf"))
            run = page_max(acc, run, k % 2, maxima, k // 2, PARTS, FOLD)

        if BULK:
            page_ring.report(late, err_ptr)
        gl.thread_barrier()
        best = column_maxima(maxima, PAD, PARTS, ROWS)  # [PAD columns, ROWS]
        tops: gl.constexpr = gl.SliceLayout(1, maxima_layout(ROWS, PARTS))
        r = SLOT0 * HS + gl.arange(0, ROWS, layout=gl.SliceLayout(0, tops))
        col = gl.arange(0, PAD, layout=gl.SliceLayout(1, tops))
        j = first + col
        gj = j * stride + offset
        live = (j < width) & (gj < computed) & (col < PPP)
        ids = gl.load(bt_row + j, mask=live, other=0)
        bad = live & ((ids < 0) | (ids >= num_blocks))
        q_unwritten = gl.convert_layout(q_unwritten, gl.SliceLayout(0, tops)) > 0
        best = gl.where(bad[:, None] | q_unwritten[None, :], float("nan"), best)
        row_pos = query_position(length, r // HS)
        keep = live[:, None] & (r < 8 * HS)[None, :] & (gj[:, None] * _PAGE <= row_pos[None, :])
        out_row = out_ptr + b.to(gl.int64) * stride_ob + r * stride_or
        gl.store(out_row[None, :] + j[:, None], best, mask=keep)
        if RECORD:
            column = gl.min(gl.where(bad, j, _NONE), axis=0)
            if column < _NONE:
                value = gl.min(gl.where(j == column, ids, _NONE), axis=0)
                if gl.atomic_cas(err_ptr + _ERR_INPUT, 0, _BAD_BLOCK) == 0:
                    gl.store(err_ptr + _ERR_INPUT + 1, b)
                    gl.store(err_ptr + _ERR_INPUT + 2, column)
                    gl.store(err_ptr + _ERR_INPUT + 3, value)
