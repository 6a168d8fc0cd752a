"""Run a function on N ranks, one process each: the launcher tests, the demo and the CLI use.

``RankPool`` keeps its processes (and their process group) alive across calls, so a test can
ship many drawn examples to the same ranks. A rank's exception comes back to the parent
with its traceback; on any failure or timeout every child is killed.
"""

from __future__ import annotations

import os
import queue
import tempfile
import traceback
from dataclasses import dataclass, field

import torch.multiprocessing as mp

# Never multicast / NVLS (docs/DESIGN.md §8), in every process we start.
GPU_ENV = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1"}


class RankError(RuntimeError):
    """A rank raised, crashed or did not answer in time; the message holds its traceback."""


@dataclass
class RankContext:
    """What a rank function receives: its rank, the world size, its device and symmetric
    allocator, and ``state``, a dict that lives as long as the pool (per-rank caches)."""

    rank: int
    world: int
    backend: str
    device: object
    symm: object  # a Symmetric, or None where the ranks cannot share memory (see symm_reason)
    symm_reason: str | None = None
    state: dict = field(default_factory=dict)


def _worker(rank: int, world: int, backend: str, init_file: str, commands, results) -> None:
    # Imported here, in the child, after its environment (TRITON_INTERPRET) is in place.
    import torch
    import torch.distributed as dist

    from ..symm import ShmSymmetric, open_cuda_symmetric

    reason = None
    if backend == "cuda":
        gpus = torch.cuda.device_count()
        torch.cuda.set_device(rank % gpus)
        device = torch.device("cuda", torch.cuda.current_device())
        if world <= gpus:
            dist.init_process_group(
                "nccl", init_method=f"file://{init_file}", rank=rank, world_size=world, device_id=device
            )
        else:  # ranks share GPUs: NCCL refuses two ranks on one GPU
            dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        symm, reason = open_cuda_symmetric([r % gpus for r in range(world)])
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        symm = ShmSymmetric()
    ctx = RankContext(rank, world, backend, device, symm, reason)
    results.put((rank, "ready", None))
    while True:
        job = commands.get()
        if job is None:
            break
        fn, args, kwargs = job
        try:
            results.put((rank, "ok", fn(ctx, *args, **kwargs)))
        except BaseException:  # noqa: BLE001 - every failure goes back to the parent
            results.put((rank, "error", traceback.format_exc()))
    dist.destroy_process_group()


def child_env(backend: str, world: int, gpus: int) -> dict:
    """Environment every rank process starts with: multicast and NVLS off always; the
    interpreter on CPU ranks; on GPUs shared by several ranks (``world > gpus``: correctness
    runs only, the ranks are time-sliced), torch's permission for overlapping devices."""
    env = dict(GPU_ENV)
    if backend == "cpu":
        env["TRITON_INTERPRET"] = "1"
    elif world > gpus:
        env["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    return env


class RankPool:
    """``world`` rank processes on ``backend`` ("cpu": Gloo + /dev/shm buffers + the Triton
    interpreter; "cuda": rank r on GPU r mod count, NCCL + symmetric memory — a Gloo group
    where ranks share a GPU)."""

    def __init__(self, world: int, backend: str = "cpu", start_timeout: float = 300.0):
        self.world, self.backend = world, backend
        ctx = mp.get_context("spawn")
        self._dir = tempfile.TemporaryDirectory(prefix="rankpool-")
        init_file = os.path.join(self._dir.name, "rendezvous")
        self._results = ctx.Queue()
        self._commands = [ctx.Queue() for _ in range(world)]
        self._procs = [
            ctx.Process(
                target=_worker, args=(r, world, backend, init_file, self._commands[r], self._results), daemon=True
            )
            for r in range(world)
        ]
        # A spawned child imports the parent's main module before it runs _worker, and
        # Triton reads TRITON_INTERPRET when a kernel is defined: set the children's
        # environment at their start, not inside _worker.
        from ..backend import gpu_count

        env = child_env(backend, world, gpu_count() if backend == "cuda" else 0)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            for p in self._procs:
                p.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v
        self._collect(None, start_timeout, "start")

    def _collect(self, _, timeout: float, what: str) -> list:
        out: list = [None] * self.world
        pending = set(range(self.world))
        errors = []
        while pending:
            try:
                rank, status, value = self._results.get(timeout=timeout)
            except queue.Empty:
                dead = [r for r in pending if not self._procs[r].is_alive()]
                self.close(force=True)
                raise RankError(
                    f"{what}: ranks {sorted(pending)} did not answer within {timeout} s (exited: {dead})"
                ) from None
            pending.discard(rank)
            if status == "error":
                errors.append(f"--- rank {rank} ---\n{value}")
            else:
                out[rank] = value
            if errors and pending:
                # One rank failed; the others may be stuck in a collective or a spin.
                self.close(force=True)
                raise RankError(f"{what} failed:\n" + "\n".join(errors))
        if errors:
            raise RankError(f"{what} failed:\n" + "\n".join(errors))
        return out

    def run(self, fn, *args, timeout: float = 600.0, **kwargs) -> list:
        """Call ``fn(ctx, *args, **kwargs)`` on every rank; return the per-rank results.
        ``fn`` must be importable by name (a module-level function)."""
        if not self._procs:
            raise RankError("the pool is closed")
        for q in self._commands:
            q.put((fn, args, kwargs))
        return self._collect(fn, timeout, getattr(fn, "__name__", str(fn)))

    def close(self, force: bool = False) -> None:
        for q, p in zip(self._commands, self._procs):
            if not force and p.is_alive():
                q.put(None)
        for p in self._procs:
            p.join(timeout=0 if force else 30)
            if p.is_alive():
                p.kill()
                p.join()
        self._procs = []
        self._dir.cleanup()

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close(force=exc[0] is not None)
