"""Device helpers the protocol's kernels share: PDL gates, peer addresses, the
unwritten-query test, and the codes of a process's device error word. Each runs on a GPU
and under the interpreter (PDL compiled out there)."""

import triton
import triton.language as tl

# Device error codes (an int32 word per process; the host reads it in check()).
ERR_Q_TIMEOUT = 1  # the q exchange never completed: a peer's query never arrived
ERR_MERGE_TIMEOUT = 2  # a peer's candidates never arrived


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
