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

from ..kernels.device import peer_ptr
from ..symm import Symmetric

# Polls before the rendezvous gives up: a GPU poll takes ~1 µs, an interpreter poll ~0.1 ms.
SPIN_LIMIT = {"cuda": 1 << 24, "cpu": 100_000}


@triton.jit(do_not_specialize=["epoch"])  # a new value every call: one compile
def _rendezvous_kernel(flag_ptrs, err_ptr, epoch, spin_limit, CP: tl.constexpr, RANK: tl.constexpr):
    """Store ``epoch`` into slot RANK of every rank's flags, then poll this rank's flags
    until every slot holds it (epochs only grow), at most ``spin_limit`` times; on timeout
    set the error flag."""
    for dst in tl.static_range(CP):
        tl.store(peer_ptr(flag_ptrs, dst, tl.int64) + RANK, epoch)
    mine = peer_ptr(flag_ptrs, RANK, tl.int64) + tl.arange(0, CP)
    pending = tl.min(tl.load(mine, volatile=True), axis=0) < epoch
    spins = 0
    while pending & (spins < spin_limit):
        pending = tl.min(tl.load(mine, volatile=True), axis=0) < epoch
        spins += 1
    if pending:
        tl.store(err_ptr, 1)


class Rendezvous:
    """Collective to build (it allocates symmetric memory); then ``__call__`` enqueues one
    rendezvous on the current stream of every rank, and ``check()`` raises if one gave up.

    symm: the ranks' ``Symmetric``; spin_limit: polls before giving up (default by device).
    """

    def __init__(self, symm: Symmetric, spin_limit: int | None = None):
        self.world, self.rank, self.device = symm.world, symm.rank, symm.device
        self.flags = symm.alloc(symm.world, torch.int64, 0)
        self.error = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.spin_limit = spin_limit or SPIN_LIMIT[self.device.type]
        self.epoch = 0

    def __call__(self) -> None:
        """Every rank calls it the same number of times; no host sync."""
        self.epoch += 1
        _rendezvous_kernel[(1,)](
            self.flags.ptrs, self.error, self.epoch, self.spin_limit, CP=self.world, RANK=self.rank, num_warps=1
        )

    def check(self) -> None:
        """Raise RuntimeError if a rendezvous of this rank gave up (a host sync)."""
        if int(self.error.item()):
            raise RuntimeError(
                f"rank {self.rank}: a rendezvous gave up after {self.spin_limit} polls: a peer never arrived"
            )
