"""Device helpers the protocol's kernels share: PDL gates, peer addresses, the
unwritten-query test, the clock that bounds every spin in time, and the codes of the error
record's protocol word. Each runs on a GPU and under the interpreter (PDL compiled out
there; the clock is the host's)."""

import time

import triton
import triton.language as tl


def _host_ns(**_):
    """The host's monotonic nanoseconds: the interpreter runs kernels as Python and calls this
    at every poll. A GPU compile never reaches it (``clock_ns`` takes it only with WALL); the
    marker below keeps Triton's scan of a kernel's globals from refusing a plain function."""
    return time.monotonic_ns()


_host_ns.__triton_builtin__ = True


# The protocol word's codes (word 0 of a process's error record, ``guards``; check() reads it).
ERR_Q_TIMEOUT = 1  # the q exchange never completed: a peer's query never arrived
ERR_MERGE_TIMEOUT = 2  # a peer's candidates never arrived
ERR_PAGE_COPY_TIMEOUT = 3  # a page's bulk copy into the scorer's ring never landed (page_ring.py)


@triton.jit
def clock_ns(WALL: tl.constexpr):
    """Nanoseconds on a clock every program of a grid shares, for spins bounded in time:
    the GPU's global timer, or with WALL (the interpreter) the host's monotonic clock."""
    if WALL:
        return tl.full([], _host_ns(), tl.int64)
    else:
        return tl.extra.cuda.globaltimer()


@triton.jit
def deadline_ns(timeout_ns, WALL: tl.constexpr):
    """``clock_ns`` ``timeout_ns`` from now (int64: a GPU clock reads ~2^60)."""
    return clock_ns(WALL) + timeout_ns.to(tl.int64)


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Wait for the producer grid (PDL); a no-op where PDL is off (interpreter)."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def pdl_release(PDL: tl.constexpr):
    """Let the dependent grid launch early (PDL); a no-op where PDL is off."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def peer_ptr(ptrs, rank, DTYPE: tl.constexpr):
    """Rank `rank`'s buffer as a typed pointer, from an int64 array of peer addresses; a
    block of ranks gives the block of their pointers."""
    return tl.load(ptrs + rank).to(tl.pointer_type(DTYPE))


@triton.jit
def has_ff_byte(words):
    """True if any byte of these int32 words is 0xFF (an unwritten E4M3 query byte)."""
    ff = (
        ((words & 0xFF) == 0xFF)
        | (((words >> 8) & 0xFF) == 0xFF)
        | (((words >> 16) & 0xFF) == 0xFF)
        | (((words >> 24) & 0xFF) == 0xFF)
    )
    return tl.max(ff.to(tl.int32), axis=0) > 0


@triton.jit
def has_unwritten(words, HALVES: tl.constexpr):
    """True if any element of these int32 words is the all-ones "unwritten" pattern: a 0xFF
    byte (E4M3 queries), or with HALVES a 0xFFFF half-word (bf16 queries, whose bytes may be
    0xFF in a finite value)."""
    if HALVES:
        ff = ((words & 0xFFFF) == 0xFFFF) | (((words >> 16) & 0xFFFF) == 0xFFFF)
        found = tl.max(ff.to(tl.int32), axis=0) > 0
    else:
        found = has_ff_byte(words)
    return found
