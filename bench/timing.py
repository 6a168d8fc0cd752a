"""The benchmark's instruments: graph-replay timing, the bandwidth ceilings, bare reads of a
given number of bytes — streamed, and gathered a page at a time through the scorers' own
shuffled tables (what a scorer of that size and access can reach) — and cold inputs (a
cache pool to carve disjoint page sets from, random query tiles)."""

from __future__ import annotations

import math
import subprocess
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from indexer_constants import HEAD_DIM, PAGE, PAGE_BYTES, SLOTS

FLUSH_BYTES = 256 << 20  # > 4x the H200's 60 MB L2


GAUSSIAN_PAGES = 2048  # distinct pages of CachePool(keys="gaussian"): 19 MB, quantized on the CPU


def graph_time_us(fn, calls: int, reps: int = 10, least: int = 1) -> float:
    """Median µs per call of ``fn(i)`` for i in range(calls), captured in one CUDA graph and
    replayed ``reps`` times (after a warm-up run that also compiles); where ``calls`` is
    under ``least``, the graph cycles them (``fn(i % calls)``) to ``least`` calls."""
    for i in range(calls):
        fn(i)
    torch.cuda.synchronize()
    captured = max(calls, least)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(captured):
            fn(i % calls)
    graph.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / captured)
    times.sort()
    return times[len(times) // 2]


# A graph that times one call per cold set holds at least this many calls (the sets
# cycled): a replay's start is charged to its calls, and at the small grids, where a
# flush's worth of bytes makes only one to four sets, it would weigh on each (bench/PERF.md).
# Cycled sets stay cold: each is at least a flush (far past L2) from its next use.
COLD_CALLS = 16


def cold_time_us(fn, calls: int) -> float:
    """``graph_time_us`` of one call per cold set (``calls`` sets), at least COLD_CALLS
    calls a graph: the timer of the scorer rows and the bare reads beside them."""
    return graph_time_us(fn, calls, least=COLD_CALLS)


def launch_ns(fn, reps: int) -> float:
    """Median ns of ``fn()`` launched plainly, each launch timed by CUDA events (after a
    warm-up launch that also compiles): for kernels long enough (~0.1 ms and up) that the
    launch does not count, where a graph would add nothing."""
    fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e6)
    times.sort()
    return times[reps // 2]


@triton.jit
def _read_kernel(x_ptr, out_ptr, n_words, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """Streams ITERS blocks of int32 words per program; one xor per word, one store."""
    start = tl.program_id(0).to(tl.int64) * (BLOCK * ITERS)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(ITERS):
        offs = start + i * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(x_ptr + offs, mask=offs < n_words, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.reduce(acc, 0, _xor))


@triton.jit
def _xor(a, b):
    return a ^ b


CEILING_BYTES = 4 << 30  # each of the ceilings' two buffers


def ceilings(device) -> dict:
    """Copy and streaming-read bandwidth over CEILING_BYTES (GB/s, 1e9 bytes); its two
    buffers are handed back to the driver before it returns."""
    copy_us, read_us = _ceiling_times(device)
    # not left in PyTorch's cache: a cache pool carved from those blocks reads its first one
    # or two timed scorer rows slow (bench/PERF.md, "Leads"; bench.first_rows)
    torch.cuda.empty_cache()
    return {
        "copy_read_plus_write_GBps": 2 * CEILING_BYTES / copy_us / 1e3,
        "copy_read_GBps": CEILING_BYTES / copy_us / 1e3,
        "stream_read_GBps": CEILING_BYTES / read_us / 1e3,
    }


def _ceiling_times(device) -> tuple[float, float]:
    """µs of one copy and of one streaming read of CEILING_BYTES, each a graph's median
    replay; the buffers die with the call."""
    src = torch.randint(0, 2**31 - 1, (CEILING_BYTES // 4,), dtype=torch.int32, device=device)
    dst = torch.empty_like(src)
    copy_us = graph_time_us(lambda i: dst.copy_(src), 1)
    block, iters = 4096, 16
    grid = triton.cdiv(src.numel(), block * iters)
    sink = torch.empty(grid, dtype=torch.int32, device=device)
    read_us = graph_time_us(lambda i: _read_kernel[(grid,)](src, sink, src.numel(), BLOCK=block, ITERS=iters), 1)
    return copy_us, read_us


# A bare read's program shapes (int32 words a block, blocks a program, warps): small programs
# win on reads of a few hundred MB (the grid fills the GPU sooner and ends in a fuller wave),
# large ones on GBs; the best of them is what a read of that many bytes can reach.
READ_SHAPES = ((512, 4, 4), (1024, 16, 4), (4096, 2, 4), (4096, 4, 8))


def same_bytes_read_GBps(device, nbytes: int, flush_bytes: int = FLUSH_BYTES, timer=cold_time_us) -> float:
    """GB/s of a bare streaming read of ``nbytes`` (a multiple of 4), timed as the scorers
    are: one call per cold set (together more than ``flush_bytes``, at most 64) in one
    graph (``cold_time_us``: at least COLD_CALLS calls), the median replay; the best of
    ``READ_SHAPES``. What a kernel that reads those
    bytes once can reach in this timing: below the ceiling on small reads (launch, ramp
    and last wave weigh more), at it on large ones."""
    words = nbytes // 4
    sets = max(1, min(64, math.ceil(flush_bytes / nbytes)))
    pool = torch.randint(0, 2**31 - 1, (sets, words), dtype=torch.int32, device=device)
    best = 0.0
    for block, iters, warps in READ_SHAPES:
        grid = triton.cdiv(words, block * iters)
        sink = torch.empty(grid, dtype=torch.int32, device=device)

        def read(i, grid=grid, sink=sink, block=block, iters=iters, warps=warps):
            _read_kernel[(grid,)](pool[i], sink, words, BLOCK=block, ITERS=iters, num_warps=warps)

        best = max(best, nbytes / timer(read, sets) / 1e3)
    return best


@triton.jit
def _gather_kernel(x_ptr, table_ptr, out_ptr, width, WORDS: tl.constexpr, CHUNK: tl.constexpr, UNITS: tl.constexpr):
    """Program ``b * C + c`` (C = ceil(width / UNITS)) reads the pages of table row b's
    columns ``c * UNITS ..`` (WORDS int32 words a page, CHUNK at a time) as the scorers lay
    their programs out; one xor per word, one store."""
    chunks = tl.cdiv(width, UNITS)
    b = tl.program_id(0) // chunks
    first = (tl.program_id(0) % chunks) * UNITS
    acc = tl.zeros([CHUNK], dtype=tl.int32)
    for i in range(UNITS):
        live = first + i < width
        page = tl.load(table_ptr + b.to(tl.int64) * width + first + i, mask=live, other=0).to(tl.int64)
        for j in range(WORDS // CHUNK):
            offs = page * WORDS + j * CHUNK + tl.arange(0, CHUNK)
            acc ^= tl.load(x_ptr + offs, mask=live, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.reduce(acc, 0, _xor))


# A gathered read's program shapes (pages a program, warps); the best of them is reported.
GATHER_SHAPES = ((1, 4), (2, 4), (4, 4), (4, 8))


def gathered_read_GBps(
    device,
    batch: int,
    pages: int,
    page_bytes: int,
    flush_bytes: int = FLUSH_BYTES,
    timer=cold_time_us,
    fold: int = 0,
) -> float:
    """GB/s of a bare read of ``batch`` x ``pages`` pages of ``page_bytes`` each (a multiple
    of 4), each page fetched where a table shuffled as the scorers' (``disjoint_tables``)
    puts it, timed as they are (``cold_time_us``), the best of
    ``GATHER_SHAPES``. Below the streamed read of as many bytes
    (``same_bytes_read_GBps``) where pages scattered over the pool cost DRAM more than one
    run does: what a scorer reading those pages through such tables can reach. fold: > 0,
    the tables' ids folded onto that many pages (``fold_tables``)."""
    words = page_bytes // 4
    chunk = math.gcd(words, 1024)  # the largest power of 2 <= 1024 dividing a page's words
    need = batch * pages
    sets = max(1, min(64, math.ceil(flush_bytes / (need * page_bytes))))
    pool = torch.randint(0, 2**31 - 1, (sets * need * words,), dtype=torch.int32, device=device)
    tables = fold_tables(disjoint_tables(batch, pages, sets, torch.Generator().manual_seed(0), device), fold)
    best = 0.0
    for units, warps in GATHER_SHAPES:
        grid = batch * triton.cdiv(pages, units)
        sink = torch.empty(grid, dtype=torch.int32, device=device)

        def read(i, grid=grid, sink=sink, units=units, warps=warps):
            _gather_kernel[(grid,)](
                pool, tables[i], sink, pages, WORDS=words, CHUNK=chunk, UNITS=units, num_warps=warps
            )

        best = max(best, need * page_bytes / timer(read, sets) / 1e3)
    return best


def read_cell(row: dict, key: str = "same_bytes_read") -> str:
    """A scorer row's bare-read fraction ``key`` (``same_bytes_read`` or ``gathered_read``:
    ``bench.same_bytes_section``) as the report's 5-wide column, blank where the run did not
    measure it."""
    return f"{row[key]:>5.2f}" if key in row else " " * 5


def variant_cell(row: dict) -> str:
    """A scorer row's ``variant`` (a dict of launch keywords) as the report's last column:
    ``k=v`` pairs, or "default" for the policy's own launch."""
    return " ".join(f"{k}={v}" for k, v in row.get("variant", {}).items()) or "default"


# What nvidia-smi reports of the GPU as a bench section ends, and the report's names for it:
# the SM clock, its maximum, the temperature and the power, which every reading has; then the
# memory's clock and temperature and the driver's active clock-event reasons (a bit mask:
# power, thermal, ... caps), read where the GPU and driver give them. A memory bound kernel
# answers to the memory's clock, and HBM heats apart from the die.
GPU_STATE = {"clocks.sm": "sm_mhz", "clocks.max.sm": "max_sm_mhz", "temperature.gpu": "temp_c", "power.draw": "power_w"}
GPU_MEMORY_STATE = {
    "clocks.mem": "mem_mhz",
    "temperature.memory": "mem_temp_c",
    "clocks_event_reasons.active": "events",
}
_GPU_IDLE = 0x1  # the event "GPU idle", set at every section's end: the line leaves it out


def _smi(fields, index: int) -> list[str] | None:
    """nvidia-smi's values of ``fields`` for GPU ``index`` as strings, or None where it is
    missing, fails (an older driver refuses a field it does not know) or answers another
    number of values."""
    query = [f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-i", str(index)]
    try:
        done = subprocess.run(["nvidia-smi", *query], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    values = [v.strip() for v in done.stdout.strip().split(",")]
    return values if len(values) == len(fields) else None


def _number(value: str) -> float | None:
    """A reading as a number: decimal, or hexadecimal (the event mask); None for "[N/A]"
    and the like."""
    try:
        return float(int(value, 16)) if value.lower().startswith("0x") else float(value)
    except ValueError:
        return None


def gpu_state(after: str, index: int = 0) -> dict:
    """``{"after": after, "sm_mhz", "max_sm_mhz", "temp_c", "power_w"}`` of GPU ``index``, and
    of ``mem_mhz``, ``mem_temp_c`` and ``events`` those the GPU reports as numbers, read with
    nvidia-smi as a bench section ends: the sections run minutes apart, and a GPU that heats
    clocks its later sections lower (the clock is read as the GPU goes idle; the
    temperature lags less). Only ``after`` where nvidia-smi is missing, fails or answers
    something else than numbers for the first four."""
    fields = {**GPU_STATE, **GPU_MEMORY_STATE}
    values = _smi(fields, index)
    if values is None:  # asked again for the four every GPU and driver answer
        fields, values = GPU_STATE, _smi(GPU_STATE, index)
    if values is None:
        return {"after": after}
    read = dict(zip(fields.values(), map(_number, values)))
    if any(read[name] is None for name in GPU_STATE.values()):
        return {"after": after}
    return {"after": after} | {name: value for name, value in read.items() if value is not None}


def _state_cell(s: dict) -> str:
    """One reading of ``gpu_state`` as the report's line words it."""
    cell = f"{s['after']} {s['sm_mhz']:.0f} MHz (max {s['max_sm_mhz']:.0f}), {s['temp_c']:.0f} C, {s['power_w']:.0f} W"
    if "mem_mhz" in s:
        cell += f", memory {s['mem_mhz']:.0f} MHz"
        cell += f" {s['mem_temp_c']:.0f} C" if "mem_temp_c" in s else ""
    if int(s.get("events", 0)) & ~_GPU_IDLE:
        cell += f", clock events {int(s['events']):#x}"
    return cell


def gpu_state_line(states: list[dict]) -> str:
    """The report's one line of ``gpu_state`` readings ("" where none has numbers)."""
    read = [s for s in states if "sm_mhz" in s]
    if not read:
        return ""
    return "GPU as each section ended (nvidia-smi): " + "; ".join(map(_state_cell, read))


@dataclass
class CachePool:
    """One big NVFP4 cache to carve disjoint page sets from. keys "random": random bytes
    (valid positive scales, 64 distinct scale bytes spread over the table: the scorer's
    worst case for its scale-table gathers); "gaussian": keys ~ N(0, 1) through the
    contract's quantizer (``reference.nvfp4.quantize_nvfp4``; ~28 neighbouring scale bytes,
    clustered as a real cache's are), GAUSSIAN_PAGES distinct pages repeated."""

    pages: int
    device: torch.device
    keys: str = "random"
    cache: torch.Tensor = field(init=False)

    def __post_init__(self):
        if self.keys == "gaussian":
            from reference.nvfp4 import quantize_nvfp4

            gen = torch.Generator().manual_seed(1)
            unique = quantize_nvfp4(torch.randn(GAUSSIAN_PAGES, PAGE, HEAD_DIM, generator=gen)).to(self.device)
            self.cache = unique.repeat(-(-self.pages // GAUSSIAN_PAGES), 1, 1)[: self.pages]
            return
        flat = torch.randint(0, 256, (self.pages, PAGE_BYTES), dtype=torch.uint8, device=self.device)
        flat[:, PAGE * 64 :] &= 0x77  # scales: positive, no NaN (at most 240)
        self.cache = flat.view(self.pages, PAGE, PAGE_BYTES // PAGE)

    def tables(self, batch: int, pages: int, sets: int, gen: torch.Generator) -> list[torch.Tensor]:
        """``sets`` block tables int32 [batch, pages] over disjoint page ranges (as many as the
        pool holds)."""
        return disjoint_tables(batch, pages, max(1, min(sets, self.pages // (batch * pages))), gen, self.device)


def disjoint_tables(batch: int, pages: int, sets: int, gen: torch.Generator, device) -> list[torch.Tensor]:
    """``sets`` block tables int32 [batch, pages], table s a shuffle of the ids
    ``s * batch * pages ..`` (no two share an id: each set's pages are cold after the others)."""
    need = batch * pages
    return [
        (torch.randperm(need, generator=gen) + s * need).view(batch, pages).to(torch.int32).to(device)
        for s in range(sets)
    ]


def fold_tables(tables: list[torch.Tensor], fold: int) -> list[torch.Tensor]:
    """``tables`` (int32 [batch, pages] each) with every id taken modulo ``fold`` (> 0; 0:
    as they are): a grid's pages folded onto the first ``fold`` of the pool, which a cache
    that size holds once read — the kernels' own work timed with HBM out of the way."""
    return [t % fold for t in tables] if fold > 0 else tables


def random_tile(batch: int, hs: int, gen, device) -> torch.Tensor:
    """A query tile [B, 8, Hs, 128] of e4m3 values in [-2, 2] (no NaN)."""
    return (torch.randn(batch, SLOTS, hs, 128, generator=gen).clamp(-2, 2)).to(torch.float8_e4m3fn).to(device)
