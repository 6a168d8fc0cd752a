"""Run a function on N ranks, one process each: the launcher tests, the demo and the CLI use.

``RankPool`` keeps its processes (and their process group) alive across calls, so a test can
ship many drawn examples to the same ranks. A rank's exception comes back to the parent
with its traceback; a rank that dies (an exit, a signal: a segfault, the OOM killer) is
reported within ``POLL_S`` with its exit status and the end of what it printed; on any
failure or timeout every child is killed. Each rank's stdout and stderr go to a log file
the parent reads: it is quoted when the rank dies and copied to the parent's stderr when
the pool closes.
"""

from __future__ import annotations

import faulthandler
import os
import queue
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field

import torch.multiprocessing as mp

# Never multicast / NVLS (docs/DESIGN.md §8), in every process we start.
GPU_ENV = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1"}


# How often a waiting parent looks for ranks that died: a dead rank is reported this soon.
POLL_S = 0.5
LOG_TAIL_LINES = 40  # of a dead rank's output, quoted in the error


class RankError(RuntimeError):
    """A rank raised, died or did not answer in time; the message holds its traceback, or its
    exit status and the end of what it printed."""


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


def _worker(rank: int, world: int, backend: str, init_file: str, commands, results, log_path: str) -> None:
    # Everything this rank prints, and the traceback of a fatal signal, goes to its log.
    log = open(log_path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout.reconfigure(line_buffering=True)  # a rank that dies keeps what it printed
    faulthandler.enable(file=log)
    try:
        ctx = _start_rank(rank, world, backend, init_file)
    except BaseException:  # noqa: BLE001 - a start failure goes back to the parent too
        results.put((rank, "error", traceback.format_exc()))
        return
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
    import torch.distributed as dist

    dist.destroy_process_group()


def _start_rank(rank: int, world: int, backend: str, init_file: str) -> RankContext:
    """This rank's device, process group and symmetric allocator."""
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
    return RankContext(rank, world, backend, device, symm, reason)


def exit_status(code: int | None) -> str:
    """A process's exit code in words ("exit code 3", "killed by SIGSEGV")."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


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
        from ..backend import gpu_count

        if backend not in ("cpu", "cuda"):
            raise ValueError(f"backend: {backend!r} (cpu or cuda)")
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ValueError(f"world: {world!r} (the number of ranks, >= 1)")
        if backend == "cuda" and gpu_count() == 0:
            raise ValueError("backend: 'cuda' needs a CUDA GPU, and none is visible (use 'cpu' or 'auto')")
        self.world, self.backend = world, backend
        ctx = mp.get_context("spawn")
        self._dir = tempfile.TemporaryDirectory(prefix="rankpool-")
        init_file = os.path.join(self._dir.name, "rendezvous")
        self._logs = [os.path.join(self._dir.name, f"rank{r}.log") for r in range(world)]
        self._results = ctx.Queue()
        self._commands = [ctx.Queue() for _ in range(world)]
        self._procs = [
            ctx.Process(
                target=_worker,
                args=(r, world, backend, init_file, self._commands[r], self._results, self._logs[r]),
                daemon=True,
            )
            for r in range(world)
        ]
        # A spawned child imports the parent's main module before it runs _worker, and
        # Triton reads TRITON_INTERPRET when a kernel is defined: set the children's
        # environment at their start, not inside _worker.
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

    def _log_tail(self, rank: int, lines: int = LOG_TAIL_LINES) -> str:
        try:
            with open(self._logs[rank], errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def _died(self, what: str, dead: list[int], errors: list[str]) -> RankError:
        """The error for ranks that died: their exit status, what they printed last, and the
        tracebacks the other ranks sent (every child is killed first)."""
        report = []
        for r in dead:
            tail = self._log_tail(r)
            status = exit_status(self._procs[r].exitcode)
            report.append(f"--- rank {r}: {status} ---\n" + (tail or "(it printed nothing)\n"))
        self.close(force=True, echo=False)
        ranks = ", ".join(str(r) for r in dead)
        return RankError(f"{what}: rank {ranks} died\n" + "".join(report) + "\n".join(errors))

    def _collect(self, _, timeout: float, what: str) -> list:
        out: list = [None] * self.world
        pending = set(range(self.world))
        errors = []
        deadline = time.monotonic() + timeout
        while pending:
            try:
                rank, status, value = self._results.get(timeout=POLL_S)
            except queue.Empty:
                dead = [r for r in sorted(pending) if self._procs[r].exitcode is not None]
                if dead:
                    # What a rank sent just before it died is read first: its traceback says more.
                    try:
                        while True:
                            rank, status, value = self._results.get(timeout=POLL_S)
                            pending.discard(rank)
                            if status == "error":
                                errors.append(f"--- rank {rank} ---\n{value}")
                    except queue.Empty:
                        pass
                    raise self._died(what, dead, errors) from None
                if time.monotonic() > deadline:
                    self.close(force=True, echo=False)
                    raise RankError(f"{what}: ranks {sorted(pending)} did not answer within {timeout} s") from None
                continue
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

    def close(self, force: bool = False, echo: bool = True) -> None:
        """Stop every rank (``force``: kill them) and remove the pool's files; with ``echo``,
        what each rank printed is copied to this process's stderr first."""
        if not self._procs:
            return
        for q, p in zip(self._commands, self._procs):
            if not force and p.is_alive():
                q.put(None)
        for p in self._procs:
            p.join(timeout=0 if force else 30)
            if p.is_alive():
                p.kill()
                p.join()
        if echo:
            for r in range(self.world):
                text = self._log_tail(r, lines=10_000)
                if text:
                    sys.stderr.write("".join(f"[rank {r}] {line}\n" for line in text.splitlines()))
        self._procs = []
        self._dir.cleanup()

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close(force=exc[0] is not None)
