"""The order of the dot product's 128 columns in the Gluon scorers and the load of a query
tile's rows in that order: logical column k is physical dimension
``d(k) = 32 tig + 4 kb + 2 h + e``, so a lane's 32 columns are contiguous (docs/KERNELS.md,
"The column order")."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared
from triton.runtime.jit import constexpr_function

from .guards import tile_set


@constexpr_function
def row_layout(vec):
    """[ROWS, 128] rows as they lie in memory: ``vec`` elements (16 bytes) a thread and
    load, the lanes of a warp along a row first, 4 warps."""
    along = 128 // vec
    return gl.BlockedLayout([1, vec], [32 // along, along], [4, 1], [1, 0])


@gluon.jit
def load_q_rows(
    q_ptr, q_sel_ptr, q_set_stride, b, HS: gl.constexpr, SLOT0: gl.constexpr, ROWS: gl.constexpr, SETS: gl.constexpr
):
    """(rows, code, value): request b's query rows SLOT0 * HS .. SLOT0 * HS + ROWS - 1 as
    they lie, raw elements [ROWS, 128] in ``row_layout`` (16 bytes a thread and load; rows
    past 8 * HS are 0) of the [B, 8, HS, 128] tile at ``q_ptr`` (SETS 0: q_sel unread) or
    of set ``q_sel[0]`` of SETS, ``q_set_stride`` elements apart (a multiple of 16), with
    ``guards.tile_set``'s code and value (set 0 read for an index outside them)."""
    layout: gl.constexpr = row_layout(128 // q_ptr.dtype.element_ty.primitive_bitwidth)
    qr = SLOT0 * HS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    d = gl.arange(0, 128, layout=gl.SliceLayout(0, layout))
    q_set, code, value = tile_set(q_sel_ptr, SETS)
    tile = q_ptr + gl.multiple_of(q_set * q_set_stride, 16) + b.to(gl.int64) * (8 * HS * 128)
    rows = gl.load(tile + qr[:, None] * 128 + d[None, :], mask=(qr < 8 * HS)[:, None], other=0)
    return rows, code, value


@gluon.jit
def logical_columns(x, WIDTH: gl.constexpr = 2):
    """``x`` [R, 128] in physical dimension order, returned in logical column order:
    column k of the result is dimension d(k) of ``x`` (a permutation of each thread's
    registers wherever a thread holds whole groups of 32 dimensions). WIDTH: the A
    fragment's consecutive k a register: 2 for 16-bit operands, 4 for E4M3 ones."""
    r: gl.constexpr = x.shape[0]
    x = gl.reshape(x, [r, 4, 16 // WIDTH, 2, WIDTH])  # [r, tig, kb, h, e]: d = 32 tig + 2 WIDTH kb + WIDTH h + e
    x = gl.permute(x, (0, 2, 3, 1, 4))  # [r, kb, h, tig, e]: k = 8 WIDTH kb + 4 WIDTH h + WIDTH tig + e
    return gl.reshape(x, [r, 128])


@gluon.jit
def store_q_tile(q16, mma: gl.constexpr, IN_REGISTERS: gl.constexpr):
    """The MMA's q operand from q16 [ROWS, 128] (16-bit, or E4M3 for the E4M3-MMA
    route; logical column order): stored k contiguous in shared memory, then for
    ``mma.sync`` (IN_REGISTERS) loaded once into the B operand's registers, else the tile's
    transposed view (wgmma reads it there)."""
    ROWS: gl.constexpr = q16.shape[0]
    q_smem = gl.allocate_shared_memory(
        q16.dtype, [ROWS, 128], gl.NVMMASharedLayout.get_default_for([ROWS, 128], q16.dtype), q16
    )
    fence_async_shared()
    gl.thread_barrier()
    if IN_REGISTERS:
        width: gl.constexpr = 32 // q16.dtype.primitive_bitwidth  # consecutive k a register
        q_op = q_smem.permute((1, 0)).load(gl.DotOperandLayout(operand_index=1, parent=mma, k_width=width))
    else:
        q_op = q_smem.permute((1, 0))
    return q_op
