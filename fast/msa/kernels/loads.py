"""How the MSA mma scorer (``scorer_mma.py``) gets a column's keys: each 64-token
half-block into the shared-memory ring (``block_ring.py``: a tensor copy through the cache's
map, or a 1D bulk copy), or, where that ring does not fit, each thread's own bytes by
``cp.async`` into a dynamic ring; and the program's block ids, read once."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.runtime.jit import constexpr_function

from indexer_constants import HEAD_DIM, PAGE

from . import block_ring

_PAGE = gl.constexpr(PAGE)
_DIM = gl.constexpr(HEAD_DIM)

# A 64-token half-block's raw elements [64 tokens, 128 physical dimensions]: lane (gid, tig)
# of warp w holds tokens 16 w + gid and 16 w + gid + 8, dimensions [32 tig, 32 tig + 32) in
# its registers in order (so each thread's reads are 16 bytes wide).
RAW_LAYOUT = gl.constexpr(
    gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [8, 0]],
        lane_bases=[[0, 32], [0, 64], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]],
        block_bases=[],
        shape=[64, 128],
    )
)


@constexpr_function
def ids_layout(pad):
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
def copy_half(ring, n: gl.constexpr, STAGES: gl.constexpr, k_ptr, blocks):
    """The other feed (BULK off): start copying the program's half-block n into ring slot
    n % STAGES of a dynamic shared-memory ring, each thread the bytes it will read back
    (RAW_LAYOUT) by 16-byte ``cp.async`` copies."""
    t = gl.arange(0, 64, layout=gl.SliceLayout(1, RAW_LAYOUT))
    d = gl.arange(0, 128, layout=gl.SliceLayout(0, RAW_LAYOUT))
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
def issue_half(
    k_ptr, desc_ptr, blocks, n: gl.constexpr, STAGES: gl.constexpr, BYTES: gl.constexpr, TENSOR: gl.constexpr
):
    """The bulk ring's copy of the program's half-block n: a tensor copy through the map
    at ``desc_ptr`` (TENSOR), else a 1D copy from the cache at ``k_ptr``."""
    if TENSOR:
        block_ring.issue_tensor(desc_ptr, _half_row(blocks, n), n, STAGES, BYTES)
    else:
        block_ring.issue(_half_block(k_ptr, blocks, n), n, STAGES, BYTES)


@gluon.jit
def refill(
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
    the slot half k - 1 used, after a barrier (every thread has read that slot): before the
    wait in a ring of two (at k = 0 without the barrier), after the read from three."""
    if BEFORE_WAIT == (STAGES == 2) and k + STAGES - 1 < HALVES:
        if k > 0 or not BEFORE_WAIT:
            gl.thread_barrier()
        issue_half(k_ptr, desc_ptr, blocks, k + STAGES - 1, STAGES, BYTES, TENSOR)


@gluon.jit
def column_blocks(bt_row, first, width, stride, offset, computed, num_blocks, PPP: gl.constexpr, PAD: gl.constexpr):
    """The block each of the program's PPP columns from ``first`` copies, loaded once
    (``ids_layout``: [PAD] in every thread): a column not computed, or whose id is outside
    [0, N), copies block 0 (valid memory; its scores are never stored, or stored as NaN)."""
    cols = gl.arange(0, PAD, layout=ids_layout(PAD))
    readable = (first + cols < width) & ((first + cols) * stride + offset < computed) & (cols < PPP)
    ids = gl.load(bt_row + first + cols, mask=readable, other=0)
    return gl.where(readable & (ids >= 0) & (ids < num_blocks), ids, 0)
