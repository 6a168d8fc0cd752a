"""A ring of 64-token half-blocks in shared memory for the MSA mma scorer
(``scorer_mma.py``), filled by tensor copies through the cache's map (128-byte swizzle) or
by 1D bulk copies; every thread reads back its own 16-byte runs. Protocol, the swizzle and
why the copy engine: docs/KERNELS.md, "The MSA block ring"."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.runtime.jit import constexpr_function

from ...kernels.page_ring import bulk_copy_asm, fits_shared, init_asm, thread_ids, wait_asm

MAX_STAGES = 8  # the deepest ring a kernel may ask for (score_blocks' stages: 2 .. 8)
BOX_ROWS = 64  # a tensor copy's box: a half-block's tokens ...
BOX_ROW_BYTES = 128  # ... by the 128-byte swizzle's span (a row of E4M3, half a row of BF16)
_BOX_BYTES = BOX_ROWS * BOX_ROW_BYTES
_BOX = gl.constexpr(_BOX_BYTES)  # the same, for the read-back's address
_RING = "fast_block_ring"
_BARS = "fast_block_bars"
# the mbarriers, padded: the dynamic buffers after the ring stay 1 KB aligned (wgmma's swizzle)
_BAR_BYTES = 1024


@constexpr_function
def slot_bytes(element_bytes: int) -> int:
    """A slot: one 64-token half-block of 128 elements a token."""
    return 64 * 128 * element_bytes


def ring_bytes(stages: int, element_bytes: int) -> int:
    """Static shared memory of a ring of ``stages`` slots (the mbarriers included)."""
    return stages * slot_bytes(element_bytes) + _BAR_BYTES


def max_stages(dynamic_bytes: int, element_bytes: int) -> int:
    """The deepest ring (at most MAX_STAGES) beside ``dynamic_bytes`` of dynamic shared
    memory (``page_ring.fits_shared``); 0 if none."""
    fits = (s for s in range(1, MAX_STAGES + 1) if fits_shared(ring_bytes(s, element_bytes), dynamic_bytes))
    return max(fits, default=0)


@constexpr_function
def _declare_asm(stages, element_bytes):
    """The ring's arrays, and thread $1 == 0 initialising one mbarrier a slot (count 1:
    the issuing thread's arrive), made visible to the copy engine."""
    return (
        f".shared .align 1024 .b8 {_RING}[{stages * slot_bytes(element_bytes)}];\n"
        f".shared .align 1024 .b64 {_BARS}[{_BAR_BYTES // 8}];\n"
        "{\n.reg .pred p;\nsetp.eq.b32 p, $1, 0;\n" + init_asm(_BARS, range(stages)) + "mov.b32 $0, 0;\n}"
    )


@constexpr_function
def _issue_asm(slot, element_bytes):
    """Thread $1 == 0: slot ``slot``'s mbarrier expects a half-block, and its bulk copy
    from global address $2 lands there."""
    size = slot_bytes(element_bytes)
    return (
        "{\n.reg .pred p;\n.reg .b64 g;\nsetp.eq.b32 p, $1, 0;\ncvta.to.global.u64 g, $2;\n"
        + bulk_copy_asm(f"[{_RING}+{slot * size}]", f"[{_BARS}+{8 * slot}]", size)
        + "mov.b32 $0, 0;\n}"
    )


@constexpr_function
def _issue_tensor_asm(slot, element_bytes):
    """Thread $1 == 0: slot ``slot``'s mbarrier expects a half-block, and its tensor
    copies land there from the tensor map at generic address $2, rows [$3, $3 + 64): one
    box [64 rows, 128 bytes] a copy (E4M3 one, BF16 two: its 128 elements are 256 bytes),
    each box 8 KB of the slot, its 16-byte runs swizzled by the row (``read``)."""
    size = slot_bytes(element_bytes)
    copies = "".join(
        f"mov.b32 c, {BOX_ROW_BYTES // element_bytes * i};\n"
        f"@p cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
        f"[{_RING}+{slot * size + i * _BOX_BYTES}], [$2, {{c, $3}}], [{_BARS}+{8 * slot}];\n"
        for i in range(element_bytes)
    )
    return (
        "{\n.reg .pred p;\n.reg .b32 c;\nsetp.eq.b32 p, $1, 0;\n"
        f"@p mbarrier.arrive.expect_tx.shared::cta.b64 _, [{_BARS}+{8 * slot}], {size};\n"
        + copies
        + "mov.b32 $0, 0;\n}"
    )


@constexpr_function
def _wait_asm(slot, phase):
    return wait_asm(f"[{_BARS}+{8 * slot}]", phase)


@constexpr_function
def _read_asm(slot, element_bytes):
    """16 bytes of the slot at the thread's offset $4 (the first packed element's; the
    others' are not used): four 32-bit words."""
    return f"ld.shared.v4.b32 {{$0, $1, $2, $3}}, [$4+{slot * slot_bytes(element_bytes)}];"


@constexpr_function
def _read_constraints(pack):
    return "=r,=r,=r,=r," + ",".join(["r"] * pack)


_BASE = gl.constexpr(f"mov.b32 $0, {_RING};")


@gluon.jit
def declare(STAGES: gl.constexpr, ELEMENT_BYTES: gl.constexpr):
    """Declare the program's ring of STAGES half-blocks of ELEMENT_BYTES-byte elements and
    initialise its mbarriers; the caller then puts a CTA barrier before the first issue."""
    gl.inline_asm_elementwise(
        _declare_asm(STAGES, ELEMENT_BYTES), "=r,r", [thread_ids()], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def issue(src, NTH: gl.constexpr, STAGES: gl.constexpr, ELEMENT_BYTES: gl.constexpr):
    """Start the copy of the program's half-block NTH (its first element at ``src``, a
    scalar pointer, 16-byte aligned) into slot NTH % STAGES: one thread arms the slot's
    mbarrier and issues it. Past the first STAGES, only after a CTA barrier that every
    thread reached having read half-block NTH - STAGES."""
    tid = thread_ids()
    gl.inline_asm_elementwise(
        _issue_asm(NTH % STAGES, ELEMENT_BYTES),
        "=r,r,l",
        [tid, src + gl.zeros_like(tid)],
        dtype=gl.int32,
        is_pure=False,
        pack=1,
    )


@gluon.jit
def issue_tensor(desc_ptr, row, NTH: gl.constexpr, STAGES: gl.constexpr, ELEMENT_BYTES: gl.constexpr):
    """``issue``'s tensor-copy twin: half-block NTH is rows [row, row + 64) of the cache
    seen as [N * 128, 128] (``tensor_map``: ``desc_ptr`` the int64 address of its map),
    landing swizzled in slot NTH % STAGES (``read`` with SWIZZLED)."""
    tid = thread_ids()
    gl.inline_asm_elementwise(
        _issue_tensor_asm(NTH % STAGES, ELEMENT_BYTES),
        "=r,r,l,r",
        [tid, desc_ptr + gl.zeros_like(tid).to(gl.int64), row + gl.zeros_like(tid)],
        dtype=gl.int32,
        is_pure=False,
        pack=1,
    )


@gluon.jit
def wait(NTH: gl.constexpr, STAGES: gl.constexpr):
    """Wait until half-block NTH has landed (its slot's mbarrier done with phase (NTH //
    STAGES) % 2), at most ``page_ring.POLLS`` polls. Returns int32 [128], a thread's 1
    where it gave up: OR them and hand them to ``page_ring.report``."""
    on = gl.full_like(thread_ids(), 1)
    return gl.inline_asm_elementwise(
        _wait_asm(NTH % STAGES, (NTH // STAGES) % 2), "=r,r", [on], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def slot_address(t, b, BYTES: gl.constexpr, SWIZZLED: gl.constexpr):
    """[len(t), len(b)] shared addresses, within slot 0 of the ring, of byte ``b`` of token
    ``t``'s row (128 elements of BYTES bytes): as a 1D copy lays the half-block, row after
    row; SWIZZLED, as tensor copies lay it — byte b in box b // 128 (a box is 64 rows of 128
    bytes), its 16-byte run j of row t at run j ^ (t % 8) (the 128-byte swizzle)."""
    zero = t[:, None] * 0 + b[None, :] * 0
    base = gl.inline_asm_elementwise(_BASE, "=r,r", [zero], dtype=gl.int32, is_pure=True, pack=1)
    if SWIZZLED:
        swz = (t % 8)[:, None] * 16
        if BYTES == 1:  # one box: b < 128
            at = base + t[:, None] * 128 + (b[None, :] ^ swz)
        else:
            at = base + (b[None, :] // 128) * _BOX + t[:, None] * 128 + ((b[None, :] % 128) ^ swz)
    else:
        at = base + t[:, None] * (128 * BYTES) + b[None, :]
    return at


@gluon.jit
def read(NTH: gl.constexpr, STAGES: gl.constexpr, layout: gl.constexpr, IS_FP8: gl.constexpr, SWIZZLED: gl.constexpr):
    """Half-block NTH's raw elements [64 tokens, 128] — E4M3 bytes as uint8 (IS_FP8), else
    BF16 bits as int16 — in ``layout``, whose threads hold runs of 16 bytes along a token's
    row, one 16-byte shared load a run; SWIZZLED: the slot as ``issue_tensor`` fills it,
    else as ``issue`` does. Not pure: the loads stay after the ``wait``."""
    BYTES: gl.constexpr = 1 if IS_FP8 else 2
    d = gl.arange(0, 128, layout=gl.SliceLayout(0, layout))
    at = slot_address(gl.arange(0, 64, layout=gl.SliceLayout(1, layout)), d * BYTES, BYTES, SWIZZLED)
    if IS_FP8:
        raw = gl.inline_asm_elementwise(
            _read_asm(NTH % STAGES, 1), _read_constraints(16), [at], dtype=gl.uint8, is_pure=False, pack=16
        )
    else:
        raw = gl.inline_asm_elementwise(
            _read_asm(NTH % STAGES, 2), _read_constraints(8), [at], dtype=gl.int16, is_pure=False, pack=8
        )
    return raw
