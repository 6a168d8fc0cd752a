"""Symmetric buffers: one allocation per rank, every rank holding every peer's address.

Two implementations of one small interface:
- ``ShmSymmetric`` (CPU): each rank's buffer is a file in /dev/shm that every rank maps with
  ``torch.from_file(..., shared=True)``; peer pointers are host addresses, which the Triton
  interpreter dereferences directly. Stores by one process are seen by the others.
- ``CudaSymmetric``: ``torch.distributed._symmetric_memory`` (``empty`` + ``rendezvous``);
  peer pointers are device addresses reachable over NVLink.

``alloc`` is collective: every rank calls it in the same order with the same arguments.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .backend import resolve_device

SHM_DIR = "/dev/shm"


@dataclass
class SymmetricTensor:
    """local: this rank's buffer; ptrs: int64 [world] base address of every rank's buffer
    (on the buffers' device). ``keep`` holds whatever keeps the peer mappings alive: freeing
    it unmaps memory peers may still write."""

    local: torch.Tensor
    ptrs: torch.Tensor
    keep: list = field(default_factory=list, repr=False)


class Symmetric:
    """The interface: ``alloc(numel, dtype, fill)`` -> SymmetricTensor (collective)."""

    world: int
    rank: int
    device: torch.device

    def alloc(self, numel: int, dtype: torch.dtype, fill: int) -> SymmetricTensor:
        """Collective: a buffer [numel] of ``dtype`` on every rank, each filled with
        ``fill`` before any rank returns, and every rank's address."""
        raise NotImplementedError

    def barrier(self) -> None:
        """Collective: return once this rank's device work is done and every rank got here."""
        raise NotImplementedError


class SingleRankSymmetric(Symmetric):
    """CP = 1 in one process (no process group): the buffer is its own only peer."""

    def __init__(self, device="cpu"):
        self.world, self.rank, self.device = 1, 0, resolve_device(device)

    def alloc(self, numel: int, dtype: torch.dtype, fill: int) -> SymmetricTensor:
        """The buffer, its own address the one peer's."""
        local = torch.full((numel,), fill, dtype=dtype, device=self.device)
        return SymmetricTensor(local, torch.tensor([local.data_ptr()], dtype=torch.int64, device=self.device))

    def barrier(self) -> None:
        """This process's device work done (there is no other rank)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class ShmSymmetric(Symmetric):
    """CPU ranks (one process each, a Gloo group): buffers are shared files in /dev/shm."""

    def __init__(self, group=None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.device = torch.device("cpu")
        name = [f"cpdecode-{uuid.uuid4().hex[:12]}" if self.rank == 0 else None]
        dist.broadcast_object_list(name, src=0, group=group)
        self.prefix = name[0]
        self.count = 0

    def _path(self, index: int, rank: int) -> str:
        return os.path.join(SHM_DIR, f"{self.prefix}-{index}-r{rank}")

    def alloc(self, numel: int, dtype: torch.dtype, fill: int) -> SymmetricTensor:
        """A file a rank, mapped by every rank; the names unlinked once all are mapped."""
        index, self.count = self.count, self.count + 1
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        mine = self._path(index, self.rank)
        with open(mine, "wb") as f:
            f.truncate(nbytes)
        local = torch.from_file(mine, shared=True, size=numel, dtype=dtype)
        local.fill_(fill)
        dist.barrier(group=self.group)
        peers = [
            local if r == self.rank else torch.from_file(self._path(index, r), shared=True, size=numel, dtype=dtype)
            for r in range(self.world)
        ]
        dist.barrier(group=self.group)
        os.unlink(mine)  # every rank has mapped it; the mappings outlive the name
        ptrs = torch.tensor([p.data_ptr() for p in peers], dtype=torch.int64)
        return SymmetricTensor(local, ptrs, peers)

    def barrier(self) -> None:
        """The group's barrier (CPU ranks: their kernels ran before it)."""
        dist.barrier(group=self.group)


def p2p_problem(devices: list[int], can_access=None) -> str | None:
    """Why ranks on these CUDA devices (rank r on ``devices[r]``) cannot store into each
    other's memory, or None. can_access(a, b) defaults to torch's peer-access query."""
    can_access = can_access or torch.cuda.can_device_access_peer
    for a in sorted(set(devices)):
        for b in sorted(set(devices)):
            if a != b and not can_access(a, b):
                return f"GPU {a} has no peer access to GPU {b} (no P2P between the ranks' GPUs)"
    return None


def open_cuda_symmetric(devices: list[int], group=None) -> tuple[CudaSymmetric | None, str | None]:
    """Collective over ``group``: a CudaSymmetric for this rank, or (None, why) on every rank
    if any rank lacks P2P to another or torch's symmetric memory fails on any rank."""
    why = p2p_problem(devices)
    symm = None
    if why is None:
        try:
            symm = CudaSymmetric(group)
            symm.alloc(1, torch.int32, 0)  # a probe: rendezvous works or raises here
        except Exception as exc:  # noqa: BLE001 - any failure means: use the stock decode
            why, symm = f"torch symmetric memory failed: {type(exc).__name__}: {exc}", None
    reasons = [None] * dist.get_world_size(group)
    dist.all_gather_object(reasons, why, group=group)
    why = next((r for r in reasons if r is not None), None)
    return (symm, None) if why is None else (None, why)


class CudaSymmetric(Symmetric):
    """GPU ranks (one process per GPU, NCCL group): torch's symmetric memory over NVLink."""

    def __init__(self, group=None):
        import torch.distributed._symmetric_memory as symm_mem

        self._symm = symm_mem
        self.group = group or dist.group.WORLD
        self.world = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.device = torch.device("cuda", torch.cuda.current_device())

    def alloc(self, numel: int, dtype: torch.dtype, fill: int) -> SymmetricTensor:
        """torch's symmetric buffer, filled, rendezvoused; every rank past its fill."""
        local = self._symm.empty(numel, dtype=dtype, device=self.device)
        local.fill_(fill)
        handle = self._symm.rendezvous(local, self.group.group_name)
        torch.cuda.synchronize()
        dist.barrier(group=self.group)
        ptrs = torch.tensor(list(handle.buffer_ptrs), dtype=torch.int64, device=self.device)
        return SymmetricTensor(local, ptrs, [handle])

    def barrier(self) -> None:
        """This rank's kernels done, then the group's barrier."""
        torch.cuda.synchronize(self.device)
        dist.barrier(group=self.group)
