"""A ring of 64-token half-blocks in shared memory for the MSA mma scorer
(``msa_scorer_mma.py``): one bulk copy a half-block (``cp.async.bulk``: 8 KB of E4M3 or
16 KB of BF16, as it lies in memory), issued by one thread and completing on the slot's
mbarrier; every thread then reads its own 16-byte runs of the slot back.

Why: a ring of per-thread ``cp.async`` copies costs every thread four (E4M3) or eight
(BF16) 16-byte copies a half-block, each an instruction with its own address, and holds
them in the LSU's queues; a bulk copy is one instruction of one thread, and the copy
engine moves the bytes. Measured faster at every shape but the smallest grid's
(fast/tools/PERF.md).

Why PTX, as ``page_ring.py`` says for the NVFP4 ring: Gluon's shared-memory analysis would
put a CTA barrier around every copy and mbarrier operation. Here the ring is a ``.shared``
array the analysis never sees, and each slot, phase and offset a constant in the
instruction. The copy and the bounded wait are ``page_ring``'s own instructions.

Protocol (a kernel that unrolls its half-blocks; ring slot ``n % STAGES`` holds half-block
n): ``declare`` once per program, then a CTA barrier; ``issue`` half-blocks 0 .. STAGES - 2
before the loop; at half-block k ``wait``, ``read``, and (k + STAGES - 1 exists) a CTA
barrier — every thread has read half-block k - 1, whose slot that copy overwrites — then
``issue`` it. Every issued half-block is waited for, so none is in flight when the program
ends. The barrier measured no slower than a second mbarrier a slot on which the readers
arrive and the issuing thread waits (fast/tools/PERF.md).

The slot is the half-block as it lies, token t's row of 128 elements at t * 128: a thread
reading 16 bytes of two tokens 128 bytes apart (E4M3) meets a 2-way bank conflict — cheap
next to the ~470 cycles an SM may spend on a half-block at the read ceiling.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.runtime.jit import constexpr_function

from .page_ring import bulk_copy_asm, fits_shared, init_asm, thread_ids, wait_asm

MAX_STAGES = 8  # the deepest ring a kernel may ask for (score_blocks' stages: 2 .. 8)
_RING = "fast_block_ring"
_BARS = "fast_block_bars"
_BAR_BYTES = 1024  # the mbarriers, padded: the dynamic buffers after the ring stay 1 KB aligned


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
def wait(NTH: gl.constexpr, STAGES: gl.constexpr):
    """Wait until half-block NTH has landed (its slot's mbarrier done with phase (NTH //
    STAGES) % 2), at most ``page_ring.POLLS`` polls. Returns int32 [128], a thread's 1
    where it gave up: OR them and hand them to ``page_ring.report``."""
    on = gl.full_like(thread_ids(), 1)
    return gl.inline_asm_elementwise(
        _wait_asm(NTH % STAGES, (NTH // STAGES) % 2), "=r,r", [on], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def read(NTH: gl.constexpr, STAGES: gl.constexpr, layout: gl.constexpr, IS_FP8: gl.constexpr):
    """Half-block NTH's raw elements [64 tokens, 128] — E4M3 bytes as uint8 (IS_FP8), else
    BF16 bits as int16 — in ``layout``, whose threads hold runs of 16 bytes along a token's
    row, one 16-byte shared load a run. Not pure: the loads stay after the ``wait``."""
    t = gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
    d = gl.arange(0, 128, layout=gl.SliceLayout(0, layout))
    zero = t[:, None] * 0 + d[None, :] * 0
    base = gl.inline_asm_elementwise(_BASE, "=r,r", [zero], dtype=gl.int32, is_pure=True, pack=1)
    if IS_FP8:
        at = base + t[:, None] * 128 + d[None, :]
        raw = gl.inline_asm_elementwise(
            _read_asm(NTH % STAGES, 1), _read_constraints(16), [at], dtype=gl.uint8, is_pure=False, pack=16
        )
    else:
        at = base + (t[:, None] * 128 + d[None, :]) * 2
        raw = gl.inline_asm_elementwise(
            _read_asm(NTH % STAGES, 2), _read_constraints(8), [at], dtype=gl.int16, is_pure=False, pack=8
        )
    return raw
