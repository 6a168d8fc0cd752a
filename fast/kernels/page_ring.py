"""A ring of whole NVFP4 pages in shared memory for the Gluon scorer (``scorer_wgmma.py``):
one bulk copy a page on one thread's instruction, completing on the slot's mbarrier, each
thread reading back its own code words and scale bytes; optionally the scale table too.
Protocol, bounded wait and why PTX: docs/KERNELS.md, "The NVFP4 page ring"."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.runtime.jit import constexpr_function

from indexer_constants import CODE_BYTES, PAGE_BYTES

from .device import ERR_PAGE_COPY_TIMEOUT
from .guards import ERR_PROTOCOL

MAX_RING = 4  # the largest ring the asm tables below are built for


SHARED_LIMIT = 48 * 1024  # static + dynamic shared memory a launch gets without opting in
BASE_STATIC = 1024  # the static shared memory every kernel's cubin declares, ring or not
# the ring's mbarriers, padded to keep the arrays and the dynamic buffers 1 KB aligned
_BAR_BYTES = 1024


def ring_bytes(ring: int, tables: int = 0) -> int:
    """Static shared memory the ring's arrays take: ``ring`` pages, 1 KB of mbarriers and
    with ``tables`` the scale table (0 with neither)."""
    return (PAGE_BYTES * ring + _BAR_BYTES if ring or tables else 0) + TABLE_BYTES * tables


def fits_shared(static_bytes: int, dynamic_bytes: int) -> bool:
    """Whether a kernel's static arrays (``static_bytes`` beside the cubin's own 1 KB) and
    its dynamic buffers fit SHARED_LIMIT — Triton opts in to more by the dynamic size alone,
    so a larger total fails at launch ("invalid argument"). Also ``msa/kernels/block_ring.py``'s."""
    return BASE_STATIC + static_bytes + dynamic_bytes <= SHARED_LIMIT


def max_ring(dynamic_bytes: int, tables: int = 0) -> int:
    """The largest ring (at most MAX_RING) a kernel with ``dynamic_bytes`` of dynamic shared
    memory may declare (``fits_shared``)."""
    return max((r for r in range(MAX_RING + 1) if fits_shared(ring_bytes(r, tables), dynamic_bytes)), default=0)


POLLS = 1 << 15  # a wait's bound, in polls of the slot's mbarrier (~4 µs each on an H200)

_PAGES = "fast_ring_pages"  # the ring's .shared arrays (one kernel declares them once)
_BARS = "fast_ring_bars"
_TABS = "fast_ring_tables"
TABLE_BYTES = 2048  # fast.tables.scale_tables: 256 entries of 8 bytes
TABLE_SLOT = MAX_RING  # the table's mbarrier, after the pages'


def _declare_asm(ring: int, tables: int) -> str:
    """The ring's arrays (whole kilobytes: the dynamic buffers after them stay 1 KB aligned
    for wgmma's swizzle), and thread $1 == 0 initialising one mbarrier a slot; with
    ``tables`` also the copy of the 2 KB scale table at $2 onto its own mbarrier."""
    bars = list(range(ring)) + ([TABLE_SLOT] if tables else [])
    tab = ""
    if tables:
        tab = "cvta.to.global.u64 g, $2;\n" + bulk_copy_asm(f"[{_TABS}]", f"[{_BARS}+{8 * TABLE_SLOT}]", TABLE_BYTES)
    return (
        (f".shared .align 1024 .b8 {_PAGES}[{PAGE_BYTES * ring}];\n" if ring else "")
        + f".shared .align 1024 .b64 {_BARS}[{_BAR_BYTES // 8}];\n"
        + (f".shared .align 1024 .b8 {_TABS}[{TABLE_BYTES}];\n" if tables else "")
        + "{\n.reg .pred p;\n.reg .b64 g;\nsetp.eq.b32 p, $1, 0;\n"
        + init_asm(_BARS, bars)
        + tab
        + "mov.b32 $0, 0;\n}"
    )


@constexpr_function
def init_asm(bars: str, slots) -> str:
    """PTX lines, under predicate p: the mbarriers at ``bars + 8 s`` for each of ``slots``
    initialised with a count of 1 (the issuing thread's arrive), made visible to the copy
    engine. Also ``msa/kernels/block_ring.py``'s."""
    inits = "".join(f"@p mbarrier.init.shared::cta.b64 [{bars}+{8 * s}], 1;\n" for s in slots)
    return inits + "fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n"


@constexpr_function
def bulk_copy_asm(dst: str, bar: str, nbytes: int) -> str:
    """PTX lines, under predicate p: mbarrier ``bar`` expects ``nbytes`` more, and the bulk
    copy of ``nbytes`` from the global address in register g lands at ``dst`` (both
    ``[symbol+offset]``), completing on ``bar``. Also ``msa/kernels/block_ring.py``'s."""
    return (
        f"@p mbarrier.arrive.expect_tx.shared::cta.b64 _, {bar}, {nbytes};\n"
        f"@p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes {dst}, [g], {nbytes}, {bar};\n"
    )


def _issue_asm(slot: int) -> str:
    """Thread 0 ($1 == 0) and a live page ($2 != 0): slot ``slot``'s mbarrier expects the
    page's bytes, and the bulk copy of the page at global address $3 lands there."""
    return (
        "{\n.reg .pred p, q;\n.reg .b64 g;\nsetp.eq.b32 p, $1, 0;\nsetp.ne.b32 q, $2, 0;\nand.pred p, p, q;\n"
        "cvta.to.global.u64 g, $3;\n"
        + bulk_copy_asm(f"[{_PAGES}+{PAGE_BYTES * slot}]", f"[{_BARS}+{8 * slot}]", PAGE_BYTES)
        + "mov.b32 $0, 0;\n}"
    )


def _wait_asm(slot: int, phase: int) -> str:
    """Slot ``slot``'s ``wait_asm``."""
    return wait_asm(f"[{_BARS}+{8 * slot}]", phase)


@constexpr_function
def wait_asm(bar: str, phase: int) -> str:
    """Where $1 != 0 (a live page): poll mbarrier ``bar`` (``[symbol+offset]``) for phase
    ``phase``, at most POLLS times; $0 = 1 if the phase never completed (the caller
    reports it), else 0; one basic block, as a bare ``try_wait`` loop is. Also
    ``msa/kernels/block_ring.py``'s."""
    return (
        "{\n.reg .pred p, q;\n.reg .b32 k;\nmov.b32 $0, 0;\nsetp.eq.b32 q, $1, 0;\n@q bra DONE_${:uid};\n"
        f"mov.b32 k, {POLLS};\nSPIN_${{:uid}}:\n"
        f"mbarrier.try_wait.parity.shared::cta.b64 p, {bar}, {phase};\n"
        "@!p sub.u32 k, k, 1;\nsetp.ne.and.u32 q, k, 0, !p;\n@q bra SPIN_${:uid};\n"
        "selp.b32 $0, 0, 1, p;\nDONE_${:uid}:\n}"
    )


# Where any thread's flag ($1) is set: the timeout into the protocol word at $2, the
# first code kept. Once a program, after its pages.
_REPORT = gl.constexpr(
    "{\n.reg .pred p;\n.reg .b32 r;\nsetp.ne.b32 p, $1, 0;\n"
    f"@p atom.global.cas.b32 r, [$2], 0, {ERR_PAGE_COPY_TIMEOUT};\nmov.b32 $0, 0;\n}}"
)


# 16 code bytes (two int64) at $2 + the block's offset, and one scale byte at $1 + its
# offset: the thread's own offset in a register, the slot's and the block's in the asm.
def _codes_asm(slot: int, half: int) -> str:
    return f"ld.shared.v2.b64 {{$0, $1}}, [$2+{PAGE_BYTES * slot + CODE_BYTES // 2 * half}];"


def _scale_asm(slot: int, half: int) -> str:
    return f"ld.shared.u8 $0, [$1+{PAGE_BYTES * slot + CODE_BYTES + CODE_BYTES // 16 * half}];"


_DECLARE = gl.constexpr(tuple(_declare_asm(k // 2, k % 2) for k in range(2 * MAX_RING + 2)))
_ISSUE = gl.constexpr(tuple(_issue_asm(s) for s in range(MAX_RING)))
_WAIT = gl.constexpr(tuple(_wait_asm(k // 2, k % 2) for k in range(2 * MAX_RING)))
_WAIT_TABLES = gl.constexpr(_wait_asm(TABLE_SLOT, 0))
_CODES = gl.constexpr(tuple(_codes_asm(k // 2, k % 2) for k in range(2 * MAX_RING)))
_SCALES = gl.constexpr(tuple(_scale_asm(k // 2, k % 2) for k in range(2 * MAX_RING)))
_BASE = gl.constexpr(f"mov.b32 $0, {_PAGES};")
_TABLE_BASE = gl.constexpr(f"mov.b32 $0, {_TABS};")
# Entry $1 of the shared table at $3, $2 bytes an entry (a runtime 8: one IMAD on the FMA
# pipe, as scorer_wgmma's global gather).
_GATHER = gl.constexpr("{\n.reg .b32 a;\nmad.lo.u32 a, $1, $2, $3;\nld.shared.b64 $0, [a];\n}")
_ERR_PROTOCOL = gl.constexpr(ERR_PROTOCOL)


@gluon.jit
def thread_ids():
    """int32 [128]: each thread of the program's 4 warps its own index, once."""
    return gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0]))


@gluon.jit
def declare(tab_ptr, RING: gl.constexpr, TABLES: gl.constexpr):
    """Declare the program's ring of RING pages (0: none) and initialise its mbarriers;
    TABLES: start copying the scale table at ``tab_ptr`` (int64 [256]) into shared memory
    (``wait_tables``, ``gather_tables``). The caller then puts a CTA barrier before the
    first ``issue`` or wait."""
    tid = thread_ids()
    tab = tab_ptr + gl.zeros_like(tid)
    gl.inline_asm_elementwise(_DECLARE[2 * RING + TABLES], "=r,r,l", [tid, tab], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def wait_tables():
    """Wait until the scale table ``declare`` started copying has landed, as ``wait``
    does for a page (the same bound; int32 [128] flags for ``report``)."""
    on = gl.full_like(thread_ids(), 1)
    return gl.inline_asm_elementwise(_WAIT_TABLES, "=r,r", [on], dtype=gl.int32, is_pure=False, pack=1)


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
def wait(live, NTH: gl.constexpr, RING: gl.constexpr):
    """Where ``live`` (a scalar) holds, wait until the program's page NTH has landed in its
    slot (the slot's mbarrier done with its (NTH // RING)-th phase), at most POLLS polls.
    Returns int32 [128], a thread's 1 where it gave up: OR them over the program's pages
    and hand the result to ``report``."""
    K: gl.constexpr = 2 * (NTH % RING) + (NTH // RING) % 2
    on = gl.zeros_like(thread_ids()) + live.to(gl.int32)
    return gl.inline_asm_elementwise(_WAIT[K], "=r,r", [on], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def report(late, err_ptr):
    """Where a thread's ``late`` (int32 [128], ``wait``'s flags ORed) is set, record
    ERR_PAGE_COPY_TIMEOUT in the protocol word of ``err_ptr`` (the int32 error record)."""
    word = err_ptr + _ERR_PROTOCOL + gl.zeros_like(late)
    gl.inline_asm_elementwise(_REPORT, "=r,r,l", [late, word], dtype=gl.int32, is_pure=False, pack=1)


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
    load (each byte is gathered by alone)."""
    t = gl.arange(0, 64, layout=gl.SliceLayout(1, base.type.layout))
    g = gl.arange(0, 8, layout=gl.SliceLayout(0, base.type.layout))
    at = base + t[:, None] * 8 + g[None, :]
    return gl.inline_asm_elementwise(
        _SCALES[2 * (NTH % RING) + HALF], "=r,r", [at], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def gather_tables(scales, tab_stride):
    """int64 scale-table entries of int32 ``scales`` (any shape) from the table ``declare``
    copied in (TABLES); tab_stride: 8. Not pure: the reads stay after ``wait_tables``."""
    zero = gl.zeros_like(scales)
    base = gl.inline_asm_elementwise(_TABLE_BASE, "=r,r", [zero], dtype=gl.int32, is_pure=True, pack=1)
    return gl.inline_asm_elementwise(
        _GATHER, "=l,r,r,r", [scales, zero + tab_stride, base], dtype=gl.int64, is_pure=False, pack=1
    )
