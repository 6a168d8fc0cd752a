"""The GPU MSA block scorer (docs/DESIGN.md §10.2) for E4M3 (and BF16) keys: 64-token
half-blocks reach a shared-memory ring by tensor copies (``msa/kernels/block_ring.py``: one thread, the
cache's tensor map, the 128-byte swizzle), each thread reads back the key bytes of its own
MMA fragment and widens them in registers (Gluon); the block maxima stay per thread until
the program's end. Without a map (a CUDA graph captured before the cache's first call:
``tensor_map.cached``) the same ring is filled by 1D bulk copies of the half-blocks as
they lie. Where that ring does not fit the static shared memory (``fast.msa.scorer.ring_feed``),
each thread copies its own bytes into a dynamic ring by 16-byte ``cp.async`` copies
instead (BULK off).

Why: the ``tl.dot`` scorer (``scorer_dot.py``, the interpreter's) hands the compiler a
converted [128, 128] tile that it stages through shared memory, and reduces each block's
maximum across warps; for E4M3 that costs a third or more of the read ceiling. Loading the
fragments straight into registers instead (one block ahead) leaves the loads' timing to
ptxas, which at N 32 issues the next block's loads only after the current block's MMA (the
registers are taken): a memory latency a block. The ring's copies hold no registers, so
STAGES - 1 half-blocks stay in flight whatever the MMA does (bench/PERF.md).

The trick: the dot product's dimension may be permuted if q is permuted alike
(``column_order.py``: the NVFP4 scorer's order), so a lane's 32 columns of a token are 32
contiguous elements: 32 bytes of E4M3 (two 16-byte shared loads) or 64 of BF16 (four).
E4M3 widens to f16 exactly (``cvt``, two elements an instruction); BF16 is the operand as
it lies. Once per program, after its block ids (one load: none in the loop) and its first
copies went out, q is loaded in the same order.

Up to 8 rows the MMA is the per-warp ``mma.sync`` m16n8k16 (q in registers); above, wgmma
with A from registers and q from shared memory, N the rows rounded up to a power of two.
Each 64-token half-block gives a thread tokens 16 w + gid and 16 w + gid + 8 of every row;
the token-level mask applies only on a block some scored row cannot see whole (the last one
or two of a request). The page maxima are ``page_maxima.py``'s. Scores equal the
reference's within its fp32-order bound and, on exact-arithmetic inputs, bit for bit.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma
from triton.language.extra.cuda import gdc_wait
from triton.runtime.jit import constexpr_function

from indexer_constants import HEAD_DIM, PAGE

from ...kernels import page_ring
from ...kernels.column_order import load_q_rows, logical_columns, store_q_tile
from ...kernels.guards import BAD_BLOCK, ERR_INPUT
from ...kernels.page_maxima import alloc_maxima, column_maxima, maxima_layout, own_tokens_max, pad_pow2, page_max
from ...kernels.rules import query_position, read_blocks
from . import block_ring
from .scorer_dot import is_nan_element, to_operand  # arithmetic only: Gluon calls them as Triton does

_PAGE = gl.constexpr(PAGE)
_DIM = gl.constexpr(HEAD_DIM)
_ERR_INPUT = gl.constexpr(ERR_INPUT)
_BAD_BLOCK = gl.constexpr(BAD_BLOCK)
_NONE = gl.constexpr(2**31 - 1)

# A 64-token half-block's raw elements [64 tokens, 128 physical dimensions]: lane (gid, tig)
# of warp w holds tokens 16 w + gid and 16 w + gid + 8, dimensions [32 tig, 32 tig + 32) in
# its registers in order (so each thread's reads are 16 bytes wide).
_RAW_LAYOUT = gl.constexpr(
    gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [8, 0]],
        lane_bases=[[0, 32], [0, 64], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]],
        block_bases=[],
        shape=[64, 128],
    )
)


@constexpr_function
def _ids_layout(pad):
    """The program's block ids [pad], every thread holding all of them (lanes and warps
    repeat): picking column n's id is then a register, no load in the loop."""
    return gl.DistributedLinearLayout(
        reg_bases=[[1 << i] for i in range(pad.bit_length() - 1)],
        lane_bases=[[0]] * 5,
        warp_bases=[[0]] * 2,
        block_bases=[],
        shape=[pad],
    )


@gluon.jit
def _copy_half(ring, n: gl.constexpr, STAGES: gl.constexpr, k_ptr, blocks):
    """The other feed (BULK off): start copying the program's half-block n into ring slot
    n % STAGES of a dynamic shared-memory ring, each thread the bytes it will read back
    (_RAW_LAYOUT) by 16-byte ``cp.async`` copies."""
    t = gl.arange(0, 64, layout=gl.SliceLayout(1, _RAW_LAYOUT))
    d = gl.arange(0, 128, layout=gl.SliceLayout(0, _RAW_LAYOUT))
    page = _half_block(k_ptr, blocks, n)
    async_copy.async_copy_global_to_shared(ring.index(n % STAGES), page + t[:, None] * _DIM + d[None, :])


@gluon.jit
def _column_block(blocks, n: gl.constexpr):
    """The block of the program's half-block n: ``blocks[n // 2]`` (a register pick)."""
    cols = gl.arange(0, blocks.shape[0], layout=blocks.type.layout)
    return gl.sum(gl.where(cols == n // 2, blocks, 0), axis=0)


@gluon.jit
def _half_block(k_ptr, blocks, n: gl.constexpr):
    """The first element of the program's half-block n: tokens [64 (n % 2), + 64) of its
    column n // 2."""
    return k_ptr + _column_block(blocks, n).to(gl.int64) * (_PAGE * _DIM) + (n % 2) * (64 * _DIM)


@gluon.jit
def _half_row(blocks, n: gl.constexpr):
    """The same half-block's first row in the cache seen as [N * 128, 128] (a tensor map's
    rows; an int32, as the copy's coordinate: ``tensor_map.MAX_BLOCKS``)."""
    return _column_block(blocks, n) * _PAGE + (n % 2) * 64


@gluon.jit
def _issue_half(
    k_ptr, desc_ptr, blocks, n: gl.constexpr, STAGES: gl.constexpr, BYTES: gl.constexpr, TENSOR: gl.constexpr
):
    """The bulk ring's copy of the program's half-block n: a tensor copy through the map
    at ``desc_ptr`` (TENSOR), else a 1D copy from the cache at ``k_ptr``."""
    if TENSOR:
        block_ring.issue_tensor(desc_ptr, _half_row(blocks, n), n, STAGES, BYTES)
    else:
        block_ring.issue(_half_block(k_ptr, blocks, n), n, STAGES, BYTES)


@gluon.jit
def _refill(
    k_ptr,
    desc_ptr,
    blocks,
    k: gl.constexpr,
    STAGES: gl.constexpr,
    BYTES: gl.constexpr,
    TENSOR: gl.constexpr,
    HALVES: gl.constexpr,
    BEFORE_WAIT: gl.constexpr,
):
    """The bulk ring's copy at step k, called before half-block k's wait and after its read
    (BEFORE_WAIT says which): half k + STAGES - 1 (where the program's HALVES have one) into
    the slot half k - 1 used, after a barrier (every thread has read that slot). It goes out
    at one of the two calls. Two slots: before the wait — else a program waiting on k has
    nothing else in flight — and at k = 0 without the barrier (the slot is fresh). From
    three slots: after the read, as the early order measured level or slower there
    (bench/PERF.md)."""
    if BEFORE_WAIT == (STAGES == 2) and k + STAGES - 1 < HALVES:
        if k > 0 or not BEFORE_WAIT:
            gl.thread_barrier()
        _issue_half(k_ptr, desc_ptr, blocks, k + STAGES - 1, STAGES, BYTES, TENSOR)


@gluon.jit
def _hold_dynamic(PAD: gl.constexpr, PARTS: gl.constexpr, ROWS: gl.constexpr):
    """LOADS_ONLY: take the dynamic shared memory the scoring path's q tile and maxima
    take (``fast.msa.scorer.dynamic_bytes``: at N 8 the larger of the two, which the compiler
    lets share), so that the probe shares an SM with as many programs as the scorer's
    shared memory allows (the scorer's own count but where its registers bound it lower).
    Returns 0, read back from every buffer: unread, the compiler drops them."""
    smem: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    regs: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
    TILE: gl.constexpr = ROWS * 64
    MAXIMA: gl.constexpr = PAD * PARTS * ROWS
    tile: gl.constexpr = [ROWS, 64]  # int32 words of q's 16-bit [ROWS, 128] tile
    maxima: gl.constexpr = [PAD * PARTS, ROWS]
    if ROWS != 8:  # both live at once, as in the scorer (wgmma reads q's tile at every block)
        a = gl.allocate_shared_memory(gl.int32, tile, smem, gl.zeros(tile, gl.int32, regs))
        b = gl.allocate_shared_memory(gl.int32, maxima, smem, gl.zeros(maxima, gl.int32, regs))
        held = gl.max(gl.max(a.load(regs), axis=1), axis=0) + gl.max(gl.max(b.load(regs), axis=1), axis=0)
    else:
        larger: gl.constexpr = tile if TILE >= MAXIMA else maxima
        a = gl.allocate_shared_memory(gl.int32, larger, smem, gl.zeros(larger, gl.int32, regs))
        held = gl.max(gl.max(a.load(regs), axis=1), axis=0)
    return held


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
    q_sel_ptr,  # int64 [1]: which tile set to read (see q_set_stride)
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
    LOADS_ONLY: gl.constexpr = False,  # BULK: the bench's probe, the ring alone (block_ring.read_folded)
    E4M3_MMA: gl.constexpr = False,  # IS_FP8: the E4M3-MMA route (DESIGN §4.1), wgmma k32 at every N
):
    """Program ``b * C + c`` (C = ceil(width / PPP) programs a request) scores columns
    ``c * PPP ..`` of request b as ``msa_score_kernel`` does (the same contract,
    docs/DESIGN.md §10.2): a column is computed when its global block ``g < min(ceil(len /
    128), P)`` and stored in a row when also ``128 g <= pos``; a row whose query holds a NaN
    element stores NaN; an id outside ``[0, N)`` is never loaded, its stored rows get NaN
    and with RECORD the program's first is recorded (the first writer of the record wins).

    Why one axis with a request's programs adjacent: programs start in id order, so
    neighbouring column chunks of a row run at the same time and their stores into the
    row's 32-byte sectors land together. At 4 columns a program (N 32) a row's store is 16
    bytes, half a sector; interleaving the requests (a [B, C] grid) measured slower there
    (bench/PERF.md), half sectors written far apart being the likely cause.

    E4M3_MMA: the E4M3 bytes are the operands as they lie, by wgmma k32 at every N (sm_90
    has no E4M3 ``mma.sync`` of its own), so that a score never depends on N."""
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
        # the block each column copies, loaded once: a column not computed, or whose id is
        # outside [0, N), copies block 0 (valid memory; its scores are never stored, or
        # stored as NaN)
        cols = gl.arange(0, PAD, layout=_ids_layout(PAD))
        readable = (first + cols < width) & ((first + cols) * stride + offset < computed) & (cols < PPP)
        ids = gl.load(bt_row + first + cols, mask=readable, other=0)
        blocks = gl.where(readable & (ids >= 0) & (ids < num_blocks), ids, 0)
        # the first half-blocks go out before q is gathered
        BYTES: gl.constexpr = k_ptr.dtype.element_ty.primitive_bitwidth // 8
        if BULK:
            block_ring.declare(STAGES, BYTES)
            gl.thread_barrier()  # the ring's mbarriers initialised for every thread
            late = gl.zeros_like(page_ring.thread_ids())  # a thread's 1: a wait gave up
            for n in gl.static_range(STAGES - 1):  # STAGES - 1 <= 2 PPP
                _issue_half(k_ptr, desc_ptr, blocks, n, STAGES, BYTES, TENSOR)
        else:
            ring = gl.allocate_shared_memory(
                k_ptr.dtype.element_ty, [STAGES, 64, 128], gl.SwizzledSharedLayout(16 // BYTES, 1, 8, [1, 0])
            )
            for n in gl.static_range(STAGES - 1):
                _copy_half(ring, n, STAGES, k_ptr, blocks)
                async_copy.commit_group()
        if LOADS_ONLY:  # the ring's copies, waits and read-back, nothing else
            held = _hold_dynamic(PAD, PARTS, ROWS)
            fold = gl.zeros([64, 8 * BYTES], gl.int32, layout=block_ring.runs_layout(BYTES))
            for k in gl.static_range(2 * PPP):  # the scorer's order of copies, waits and reads
                _refill(k_ptr, desc_ptr, blocks, k, STAGES, BYTES, TENSOR, 2 * PPP, True)
                late = late | block_ring.wait(k, STAGES)
                fold = block_ring.read_folded(k, STAGES, IS_FP8, TENSOR, fold)
                _refill(k_ptr, desc_ptr, blocks, k, STAGES, BYTES, TENSOR, 2 * PPP, False)
            page_ring.report(late, err_ptr)
            # a store the compiler cannot drop, and no real width makes
            gl.store(
                out_ptr + gl.zeros_like(fold).to(gl.int64), fold.to(gl.float32), mask=fold == width - 0x5EED5EED + held
            )
            return
        # q in logical column order, its rows loaded whole (column_order.py). A row holding
        # a NaN element is unwritten: its scores come out NaN or not (the maxima may drop a
        # NaN) and are stored as NaN either way, so its elements go in as they are.
        q_raw = load_q_rows(q_ptr, q_sel_ptr, q_set_stride, b, HS, SLOT0, ROWS)
        q_unwritten = gl.max(is_nan_element(q_raw, IS_FP8).to(gl.int32), axis=1)  # [ROWS]
        q_op = store_q_tile(_operand(q_raw, IS_FP8, E4M3_MMA), mma, MMA_SYNC)
        # the lowest position of a scored row: a block that ends at or before it needs no mask
        pos_low = query_position(length, SLOT0)
        maxima = alloc_maxima(PAD, PARTS, ROWS)
        zeros = gl.zeros([64, ROWS], gl.float32, layout=mma)
        run = own_tokens_max(zeros)
        # half-block k is read from slot k % STAGES; the copy of half k + STAGES - 1 goes out
        # into the slot of half k - 1 as k is read (bulk: ``_refill``, before k's wait in a
        # ring of two slots). cp.async: every step commits a group,
        # empty past the program's last half, so "STAGES - 2 groups pending" always means
        # half k has landed.
        for k in gl.static_range(2 * PPP):
            if BULK:
                _refill(k_ptr, desc_ptr, blocks, k, STAGES, BYTES, TENSOR, 2 * PPP, True)
                late = late | block_ring.wait(k, STAGES)
                raw = block_ring.read(k, STAGES, _RAW_LAYOUT, IS_FP8, TENSOR)
                _refill(k_ptr, desc_ptr, blocks, k, STAGES, BYTES, TENSOR, 2 * PPP, False)
            else:
                async_copy.wait_group(STAGES - 2)
                raw = ring.index(k % STAGES).load(_RAW_LAYOUT)
                # a compile-time test: kept inline, as a name assigned in the loop would be a
                # run-time value, and a cp.async under a run-time branch fails Triton's lowering
                if k + STAGES - 1 < 2 * PPP:
                    _copy_half(ring, k + STAGES - 1, STAGES, k_ptr, blocks)
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
            run = page_max(acc, run, k % 2, maxima, k // 2, PARTS)

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
