"""A rendezvous of the ranks' GPUs, for timing: each rank's stream passes it only once every
rank's stream has reached it, within one poll of each other.

Why the benchmark needs it: a CP layer's first exchange waits for the slowest rank, so a
timed CP graph includes how far apart the ranks started. A host barrier followed by a fixed
GPU spin still leaves them tens of µs apart, enough to move a per-layer difference of two
graphs (the performance log has the figures). The spin still goes first (the hosts enqueue the graph
while it runs); the rendezvous then lines the GPUs up.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fast.checks import spin_timeout
from fast.cp import DEFAULT_TIMEOUT_S  # the decode's bounds: a rendezvous waits as its spins do
from fast.kernels.device import clock_ns, deadline_ns, peer_ptr
from fast.symm import Symmetric


@triton.jit(do_not_specialize=["epoch"])  # a new value every call: one compile
def _rendezvous_kernel(flag_ptrs, err_ptr, epoch, timeout_ns, CP: tl.constexpr, RANK: tl.constexpr, WALL: tl.constexpr):
    """Store ``epoch`` into slot RANK of every rank's flags, then poll this rank's flags
    until every slot holds it (epochs only grow), for at most ``timeout_ns`` (the device
    clock; the host's under the interpreter, WALL); on timeout set the error flag."""
    for dst in tl.static_range(CP):
        tl.store(peer_ptr(flag_ptrs, dst, tl.int64) + RANK, epoch)
    mine = peer_ptr(flag_ptrs, RANK, tl.int64) + tl.arange(0, CP)
    pending = tl.min(tl.load(mine, volatile=True), axis=0) < epoch
    deadline = deadline_ns(timeout_ns, WALL)
    while pending & (clock_ns(WALL) < deadline):
        pending = tl.min(tl.load(mine, volatile=True), axis=0) < epoch
    if pending:
        tl.store(err_ptr, 1)


class Rendezvous:
    """Collective to build (it allocates symmetric memory); then ``__call__`` enqueues one
    rendezvous on the current stream of every rank, and ``check()`` raises if one gave up.

    symm: the ranks' ``Symmetric``; timeout_s: seconds before giving up (default by device).
    """

    def __init__(self, symm: Symmetric, timeout_s: float | None = None):
        self.world, self.rank, self.device = symm.world, symm.rank, symm.device
        self.flags = symm.alloc(symm.world, torch.int64, 0)
        self.error = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.timeout_s = spin_timeout(DEFAULT_TIMEOUT_S[self.device.type] if timeout_s is None else timeout_s)
        self.epoch = 0

    def __call__(self) -> None:
        """Every rank calls it the same number of times; no host sync."""
        self.epoch += 1
        _rendezvous_kernel[(1,)](
            self.flags.ptrs,
            self.error,
            self.epoch,
            int(self.timeout_s * 1e9),
            CP=self.world,
            RANK=self.rank,
            WALL=self.device.type != "cuda",
            num_warps=1,
        )

    def check(self) -> None:
        """Raise RuntimeError if a rendezvous of this rank gave up (a host sync)."""
        if int(self.error.item()):
            raise RuntimeError(
                f"rank {self.rank}: a rendezvous gave up after {self.timeout_s:g} s: a peer never arrived"
            )
