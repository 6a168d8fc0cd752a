"""A ring of whole NVFP4 pages in shared memory for the Gluon scorer (``scorer_wgmma.py``):
one bulk copy a page (``cp.async.bulk``, 9216 bytes, completing on an mbarrier), issued by
one thread; every thread then reads its own code words and scale bytes from shared memory.

Why: fed from registers, the scorer's block loads are what ptxas moves — short of
registers it issues each block's loads shortly before their use instead of two blocks
ahead (``python -m fast.tools.sass --load-use``), and the warps wait on them. A page in
flight in shared memory holds no register, and one instruction moves it.

Why PTX: Gluon's shared-memory analysis sees neither that a thread reads back only bytes
a copy has landed (the mbarrier says so) nor that one thread issues the copies, and puts
a CTA barrier around every copy and mbarrier operation. Here the
ring is a ``.shared`` array the analysis never sees; the kernel frees a slot with the one
barrier a page it issues itself. Every slot, phase and offset is a compile-time constant
spelled into the instruction (``[name+offset]``): the ring costs no register and no
address arithmetic.

Protocol (a kernel that unrolls its pages; ``declare`` once per program, ring slot
``i % RING`` holds page i):
- ``issue(page_ptr, live, i, RING)`` before page i is needed (i < RING: in the prologue;
  else right after the barrier that ends page i - RING, which frees the slot);
- ``wait(live, err_ptr, i, RING)`` before reading it (the slot's mbarrier, phase
  (i // RING) % 2);
- ``read_codes`` / ``read_scales`` for each 64-token block.
A page that is not live (past the row) is neither copied nor waited for; its slot keeps
stale bytes, whose scores are never stored. Live pages are a prefix of the program's, so a
skipped copy never leaves a later wait on its slot.

The wait is bounded on the GPU's global timer (``WAIT_NS``): a copy that has not landed by
then records ``ERR_PAGE_COPY_TIMEOUT`` in the error record's protocol word and the program
goes on (its scores are then garbage, and ``check()`` says so). A bulk copy of valid memory
lands in microseconds; the bound exists so that nothing can hang. The policy
(``scorer_wgmma.ring_pages``) does not use the ring today: with this bound it measured no
faster than the register pipeline (fast/tools/PERF.md).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from indexer_constants import CODE_BYTES, PAGE_BYTES

from .device import ERR_PAGE_COPY_TIMEOUT
from .guards import ERR_PROTOCOL

MAX_RING = 4  # the largest ring the asm tables below are built for


def max_ring(rows: int) -> int:
    """The largest ring the wgmma kernel may take at N = ``rows``: its static arrays (RING
    pages and 1 KB) plus the kernel's dynamic shared memory (q's tile, the page maxima)
    must fit the 48 KB a launch gets without opting in — Triton opts in by the dynamic
    size alone, so a larger total fails at launch ("invalid argument"). 0: no ring (N 64)."""
    return {8: MAX_RING, 16: 2, 32: 2}.get(rows, 0)


WAIT_NS = 100_000_000  # a wait's bound: 0.1 s, ~10^4 times a copy's latency
_POLLS = 1024  # polls between two reads of the global timer (a power of 2)

_PAGES = "fast_ring_pages"  # the ring's .shared arrays (one kernel declares them once)
_BARS = "fast_ring_bars"


def _declare_asm(ring: int) -> str:
    """The ring's arrays, and thread $1 == 0 initialising one mbarrier a slot (count 1:
    the issuing thread's arrive), made visible to the copy engine. The arrays are static
    shared memory, which precedes the kernel's dynamic shared memory: they take a multiple
    of 1 KB (the mbarriers padded to one), so the dynamic buffers keep the 1 KB alignment
    that wgmma's swizzled operand layouts assume (misaligned, its q tile reads wrong)."""
    inits = "".join(f"@p mbarrier.init.shared::cta.b64 [{_BARS}+{8 * s}], 1;\n" for s in range(ring))
    return (
        f".shared .align 1024 .b8 {_PAGES}[{PAGE_BYTES * ring}];\n"
        f".shared .align 1024 .b64 {_BARS}[128];\n"
        "{\n.reg .pred p;\nsetp.eq.b32 p, $1, 0;\n" + inits + "fence.mbarrier_init.release.cluster;\n"
        "fence.proxy.async.shared::cta;\nmov.b32 $0, 0;\n}"
    )


def _issue_asm(slot: int) -> str:
    """Thread 0 ($1 == 0) and a live page ($2 != 0): slot ``slot``'s mbarrier expects the
    page's bytes, and the bulk copy of the page at global address $3 lands there."""
    bar = f"[{_BARS}+{8 * slot}]"
    return (
        "{\n.reg .pred p, q;\n.reg .b64 g;\nsetp.eq.b32 p, $1, 0;\nsetp.ne.b32 q, $2, 0;\nand.pred p, p, q;\n"
        "cvta.to.global.u64 g, $3;\n"
        f"@p mbarrier.arrive.expect_tx.shared::cta.b64 _, {bar}, {PAGE_BYTES};\n"
        f"@p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
        f"[{_PAGES}+{PAGE_BYTES * slot}], [g], {PAGE_BYTES}, {bar};\nmov.b32 $0, 0;\n}}"
    )


def _wait_asm(slot: int, phase: int) -> str:
    """A live page ($1 != 0): spin until slot ``slot``'s mbarrier completes phase ``phase``,
    at most WAIT_NS on the global timer; on the bound, record the timeout at $2 (the error
    record's protocol word, first code kept) and return. The timer is read once every
    _POLLS polls (the clock starts at the _POLLS-th), so the poll loop stays two
    instructions; each poll is bounded by ``try_wait``'s own time limit, so the polls before
    the clock starts are too."""
    bar = f"[{_BARS}+{8 * slot}]"
    return (
        "{\n.reg .pred p, q;\n.reg .b32 k, r;\n.reg .b64 t0, t;\n"
        "setp.eq.b32 q, $1, 0;\n@q bra DONE_${:uid};\nmov.b32 k, 0;\nSPIN_${:uid}:\n"
        f"mbarrier.try_wait.parity.shared::cta.b64 p, {bar}, {phase};\n@p bra DONE_${{:uid}};\n"
        f"add.u32 k, k, 1;\nand.b32 r, k, {_POLLS - 1};\nsetp.ne.b32 q, r, 0;\n@q bra SPIN_${{:uid}};\n"
        f"setp.ne.b32 q, k, {_POLLS};\n@q bra CHECK_${{:uid}};\n"
        "mov.u64 t0, %globaltimer;\nbra SPIN_${:uid};\nCHECK_${:uid}:\n"
        f"mov.u64 t, %globaltimer;\nsub.u64 t, t, t0;\nsetp.lt.u64 q, t, {WAIT_NS};\n@q bra SPIN_${{:uid}};\n"
        f"atom.global.cas.b32 r, [$2], 0, {ERR_PAGE_COPY_TIMEOUT};\n"
        "DONE_${:uid}:\nmov.b32 $0, 0;\n}"
    )


# 16 code bytes (two int64) at $2 + the block's offset, and one scale byte at $1 + its
# offset: the thread's own offset in a register, the slot's and the block's in the asm.
def _codes_asm(slot: int, half: int) -> str:
    return f"ld.shared.v2.b64 {{$0, $1}}, [$2+{PAGE_BYTES * slot + CODE_BYTES // 2 * half}];"


def _scale_asm(slot: int, half: int) -> str:
    return f"ld.shared.u8 $0, [$1+{PAGE_BYTES * slot + CODE_BYTES + CODE_BYTES // 16 * half}];"


_DECLARE = gl.constexpr(tuple(_declare_asm(r) for r in range(MAX_RING + 1)))
_ISSUE = gl.constexpr(tuple(_issue_asm(s) for s in range(MAX_RING)))
_WAIT = gl.constexpr(tuple(_wait_asm(k // 2, k % 2) for k in range(2 * MAX_RING)))
_CODES = gl.constexpr(tuple(_codes_asm(k // 2, k % 2) for k in range(2 * MAX_RING)))
_SCALES = gl.constexpr(tuple(_scale_asm(k // 2, k % 2) for k in range(2 * MAX_RING)))
_BASE = gl.constexpr(f"mov.b32 $0, {_PAGES};")
_ERR_PROTOCOL = gl.constexpr(ERR_PROTOCOL)


@gluon.jit
def thread_ids():
    """int32 [128]: each thread of the program's 4 warps its own index, once."""
    return gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0]))


@gluon.jit
def declare(RING: gl.constexpr):
    """Declare the program's ring of RING pages and initialise its mbarriers; the caller
    then puts a CTA barrier before the first ``issue`` or ``wait``."""
    gl.inline_asm_elementwise(_DECLARE[RING], "=r,r", [thread_ids()], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def issue(page_ptr, live, NTH: gl.constexpr, RING: gl.constexpr):
    """Start the copy of the program's page NTH (at ``page_ptr``, a uint8 scalar pointer)
    into its slot where ``live`` (a scalar) holds: one thread arms the slot's mbarrier and
    issues it."""
    SLOT: gl.constexpr = NTH % RING
    tid = thread_ids()
    on = gl.zeros_like(tid) + live.to(gl.int32)
    gl.inline_asm_elementwise(
        _ISSUE[SLOT], "=r,r,r,l", [tid, on, page_ptr + gl.zeros_like(tid)], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def wait(live, err_ptr, NTH: gl.constexpr, RING: gl.constexpr):
    """Where ``live`` holds, wait until the program's page NTH has landed in its slot (the
    slot's mbarrier done with its (NTH // RING)-th phase), bounded (the module's WAIT_NS);
    ``err_ptr``: the int32 error record."""
    K: gl.constexpr = 2 * (NTH % RING) + (NTH // RING) % 2
    tid = thread_ids()
    on = gl.zeros_like(tid) + live.to(gl.int32)
    word = err_ptr + _ERR_PROTOCOL + gl.zeros_like(tid)
    gl.inline_asm_elementwise(_WAIT[K], "=r,r,l", [on, word], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def ring_base(layout: gl.constexpr):
    """The ring's shared-memory address as an int32 [64, 8] in ``layout`` (a pure asm:
    the compiler computes it once)."""
    t = gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
    g = gl.arange(0, 8, layout=gl.SliceLayout(0, layout))
    zero = t[:, None] * 0 + g[None, :] * 0
    return gl.inline_asm_elementwise(_BASE, "=r,r", [zero], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def read_codes(base, NTH: gl.constexpr, HALF: gl.constexpr, RING: gl.constexpr):
    """int64 [64, 8] code words of tokens 64 HALF .. 64 HALF + 63 of the program's page NTH:
    token t's group g at (t, g), in ``base``'s layout (two adjacent groups a thread, as
    ``scorer_wgmma``'s block layout has them: one 16-byte load)."""
    t = gl.arange(0, 64, layout=gl.SliceLayout(1, base.type.layout))
    g = gl.arange(0, 8, layout=gl.SliceLayout(0, base.type.layout))
    at = base + t[:, None] * 64 + g[None, :] * 8
    return gl.inline_asm_elementwise(
        _CODES[2 * (NTH % RING) + HALF], "=l,=l,r,r", [at], dtype=gl.int64, is_pure=False, pack=2
    )


@gluon.jit
def read_scales(base, NTH: gl.constexpr, HALF: gl.constexpr, RING: gl.constexpr):
    """int32 [64, 8] scale bytes (zero-extended) of the same tokens and groups, one byte a
    load (the scale tables are gathered by each byte: a 16-bit load would cost two ALU
    instructions to take apart)."""
    t = gl.arange(0, 64, layout=gl.SliceLayout(1, base.type.layout))
    g = gl.arange(0, 8, layout=gl.SliceLayout(0, base.type.layout))
    at = base + t[:, None] * 8 + g[None, :]
    return gl.inline_asm_elementwise(
        _SCALES[2 * (NTH % RING) + HALF], "=r,r", [at], dtype=gl.int32, is_pure=False, pack=1
    )
