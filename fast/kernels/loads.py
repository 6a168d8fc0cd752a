"""How the Gluon page scorer (``scorer_wgmma.py``) gets a page's bytes: 64-token blocks into
registers (a pipeline of DEPTH blocks), or whole pages into the shared-memory ring
(``page_ring.py``); each group's scale-table entry; and the block-id guard on every id read.

The guard is the kernel's ``IN_CACHE`` (a jit function, ``in_cache`` here): a page whose
id fails it is never loaded, and the epilogue stores its column as NaN (DESIGN §7)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from indexer_constants import CODE_BYTES, PAGE_BYTES

from . import page_ring

_PAGE_BYTES = gl.constexpr(PAGE_BYTES)
_CODE_BYTES = gl.constexpr(CODE_BYTES)
# Where a block's int64 [64, 8] code words (and their scale bytes) live: lane (gid, tig) of
# warp w holds groups 2 tig, 2 tig + 1 of tokens 16 w + gid and 16 w + gid + 8, exactly the
# groups of its A fragment.
GROUP_LAYOUT = gl.constexpr(
    gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [8, 0]],
        lane_bases=[[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]],
        block_bases=[],
        shape=[64, 8],
    )
)

# a scale byte on its own (``_IF``: 0 where $2 is 0), not pure: it stays after a PDL wait
_LOAD_SCALE = gl.constexpr("ld.global.u8 $0, [$1];")
_LOAD_SCALE_IF = gl.constexpr("{\n.reg .pred p;\nsetp.ne.b32 p, $2, 0;\nmov.b32 $0, 0;\n@p ld.global.u8 $0, [$1];\n}")
# entry $1 of the table at {$3, $4}, $2 bytes an entry: the low word alone, one IMAD
_GATHER_TABLE = gl.constexpr(
    "{\n.reg .b32 lo;\n.reg .b64 at;\nmad.lo.u32 lo, $1, $2, $3;\nmov.b64 at, {lo, $4};\nld.global.b64 $0, [at];\n}"
)


@gluon.jit
def in_cache(page, num_blocks):
    """The block-id guard (one compare a page): True where ``page`` is an id the cache holds."""
    return (page >= 0) & (page < num_blocks)


@gluon.jit
def _load_scales(ptrs, live, MASKED: gl.constexpr):
    """int32 scale bytes at uint8 ``ptrs`` (any shape); MASKED: 0 where ``live`` (a
    scalar) is false, nothing read."""
    if MASKED:
        on = gl.full(ptrs.shape, 0, gl.int32, ptrs.type.layout) + live.to(gl.int32)
        return gl.inline_asm_elementwise(_LOAD_SCALE_IF, "=r,l,r", [ptrs, on], dtype=gl.int32, is_pure=False, pack=1)
    return gl.inline_asm_elementwise(_LOAD_SCALE, "=r,l", [ptrs], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _gather_tables(scales, tab_ptr, tab_stride):
    """int64 ``scale_tables`` entries of int32 ``scales`` (any shape), through L1.
    tab_stride: 8, the entry's bytes, as a runtime value."""
    tab = tab_ptr.to(gl.int64)
    zero = gl.zeros_like(scales)
    return gl.inline_asm_elementwise(
        _GATHER_TABLE,
        "=l,r,r,r,r",
        [scales, zero + tab_stride, zero + (tab & 0xFFFFFFFF).to(gl.int32), zero + (tab >> 32).to(gl.int32)],
        dtype=gl.int64,
        is_pure=True,
        pack=1,
    )


@gluon.jit
def entries(scales, tab_ptr, tab_stride, TABLES: gl.constexpr):
    """Each group's scale-table entry (int64, ``scales``' shape): from the program's copy in
    shared memory (TABLES, ``page_ring.gather_tables``) or through L1."""
    if TABLES:
        found = page_ring.gather_tables(scales, tab_stride)
    else:
        found = _gather_tables(scales, tab_ptr, tab_stride)
    return found


@gluon.jit
def _load_block(page_u8, page_i64, live, first_token, MASKED: gl.constexpr):
    """int64 [64, 8] code words and int32 [64, 8] scale bytes of tokens [first_token,
    first_token + 64) of a page, in ``GROUP_LAYOUT``; MASKED: zeros where ``live`` is
    false, else the page's bytes whatever ``live`` says."""
    t = first_token + gl.arange(0, 64, layout=gl.SliceLayout(1, GROUP_LAYOUT))
    g = gl.arange(0, 8, layout=gl.SliceLayout(0, GROUP_LAYOUT))
    if MASKED:
        codes = gl.load(page_i64 + t[:, None] * 8 + g[None, :], mask=live, other=0)
    else:
        codes = gl.load(page_i64 + t[:, None] * 8 + g[None, :])
    return codes, _load_scales(page_u8 + _CODE_BYTES + t[:, None] * 8 + g[None, :], live, MASKED)


@gluon.jit
def load_nth_block(
    k_ptr, k64_ptr, bt_row, first, n, num_blocks, blk, blocks, MASKED: gl.constexpr, IN_CACHE: gl.constexpr
):
    """``_load_block`` of 64-token block ``blk`` of the program's ``blocks`` (page first +
    blk // 2); past the program's blocks or the row's n pages, or where IN_CACHE fails the
    page's id, zeros (MASKED) or the cache's page 0 (valid memory whenever a row has pages;
    such scores are never stored, or stored as NaN for a bad id)."""
    j = first + blk // 2
    live = (blk < blocks) & (j < n)
    page = gl.load(bt_row + j, mask=live, other=0)
    live = live & IN_CACHE(page, num_blocks)
    page = gl.where(live, page, 0).to(gl.int64)
    return _load_block(k_ptr + page * _PAGE_BYTES, k64_ptr + page * (_PAGE_BYTES // 8), live, (blk % 2) * 64, MASKED)


@gluon.jit
def advance(c0, s0, c1, s1, cn, sn, DEPTH: gl.constexpr):
    """The block pipeline one step on: (c0, s0) is decoded next; with DEPTH 2, (c1, s1) is
    the block after it and (cn, sn) the one just loaded."""
    if DEPTH == 2:
        return c1, s1, cn, sn
    else:
        return cn, sn, cn, sn


@gluon.jit
def issue_page(k_ptr, bt_row, first, n, num_blocks, NTH: gl.constexpr, RING: gl.constexpr, IN_CACHE: gl.constexpr):
    """Start the program's page NTH on its way into the ring (``page_ring.issue``): the
    cache's page 0 where IN_CACHE fails its id, nothing past the row's n pages."""
    j = first + NTH
    live = j < n
    page = gl.load(bt_row + j, mask=live, other=0)
    page = gl.where(IN_CACHE(page, num_blocks), page, 0)
    page_ring.issue(k_ptr + page.to(gl.int64) * _PAGE_BYTES, live, NTH, RING)
