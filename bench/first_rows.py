"""``python -m bench.first_rows``: what makes a scorer section's first rows read slow.

In a whole ``make bench`` the NVFP4 section's first row (Hs 1, 8 slots, 8 x 128K) read
slower than the same launch timed later in the run, in its first one or two timings only.
The preludes below found the cause: the cache pool carved from the read ceilings' freed
buffers, kept by PyTorch's caching allocator. Those buffers made and copied with no timed
graph slow the row as much; handed back to the driver (``empty_cache``) before the pool,
they do not. ``timing.ceilings`` now hands them back itself, so the "bench" prelude is the
fixed start and "buffers" the old one. Each prelude runs in a fresh process, then times the
row ROW_TIMINGS times as the suite would (``suite.scorer_us``).

The MSA section had the same mark: its second format's (fp8's) first shapes at 8 x 128K
read slow against the same shapes timed ``again`` at the format's end. The "msa-" preludes
vary what precedes fp8's rows (the NVFP4 pool handed back or kept, bf16's rows, bf16's cache
handed back), then time fp8's rows at the first grid as the section does
(``msa.msa_scorer_section``, one call a format) and print each shape's first and ``again``
µs. None of them reads slow: the mark was the section's one call for both formats, which
kept bf16's cache alive while fp8's was made; each format's rows now have their own
function. The figures: bench/PERF.md, "Leads".
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import torch

from indexer_constants import PAGE, SLOTS

from .msa import MSA_SHAPES, msa_scorer_section
from .suite import POOL_PAGES, scorer_operands, scorer_us
from .timing import CEILING_BYTES, CachePool, ceilings
from .variants import score_variant

BATCH, CONTEXT = 8, 131072  # the section's first grid
ROW_TIMINGS = 4
STEPS = ("ceilings", "buffers", "empty", "pool", "free", "hs4", "untimed", "bf16")
# What runs before the row's timings, in order (STEPS): "ceilings" (``timing.ceilings``, its
# buffers handed back), "pool" (the suite's CachePool), "empty" (``torch.cuda.empty_cache``:
# the freed memory back to the driver), "buffers" (the ceilings' two buffers made, one copied
# into the other, freed to PyTorch's cache: the ceilings as they were before the fix, less
# their timed graphs), "hs4" (a timed row of Hs 4, one slot), "untimed" (one call of that
# row, not timed), "free" (the pool dropped), "bf16" (the MSA section's bf16 rows at the
# first grid, its cache freed to PyTorch's cache as the section leaves it).
PRELUDES = {
    "bench": ("ceilings", "pool"),  # as the suite reaches the row
    "no-ceilings": ("pool",),
    "pool-first": ("pool", "ceilings"),
    "buffers": ("buffers", "pool"),  # the slow start
    "buffers-empty": ("buffers", "empty", "pool"),  # the fix, alone
    "untimed-hs4": ("buffers", "pool", "untimed"),
    "timed-hs4": ("buffers", "pool", "hs4"),
}
# The same for the MSA section's fp8 rows (``msa_row``), each name starting "msa-".
MSA_PRELUDES = {
    "msa-bench": ("ceilings", "pool", "free", "empty", "bf16"),  # as the suite reaches fp8, less its checks
    "msa-kept": ("ceilings", "pool", "free", "bf16"),  # the NVFP4 pool left in PyTorch's cache
    "msa-alone": ("bf16",),  # the section alone in a process (the fiftieth session's driver)
    "msa-empty": ("bf16", "empty"),  # bf16's cache handed back before fp8's is made
    "msa-fresh": (),  # fp8 first
}


def time_row(pool: CachePool, gen, hs: int = 1, slots: int = 8) -> float:
    """Median µs of the row at the first grid, timed as the suite times it (``suite.scorer_us``)."""
    return scorer_us(pool, BATCH, CONTEXT // PAGE, hs, gen, first_slot=SLOTS - slots)


def untimed_call(pool: CachePool, gen, hs: int, slots: int) -> None:
    """One launch of the row's shape ``hs`` / ``slots``, not timed; its operands freed after."""
    o = scorer_operands(pool, BATCH, CONTEXT // PAGE, hs, gen)
    score_variant(o["tile"], pool.cache, o["tables"][0], o["lens"], o["out"], first_slot=SLOTS - slots)
    torch.cuda.synchronize()


def ceiling_buffers(device) -> None:
    """``timing.ceilings``' two 4 GiB buffers made as it makes them and one copied into the
    other, untimed, then freed to PyTorch's cache (not handed back, as the ceilings now do)."""
    src = torch.randint(0, 2**31 - 1, (CEILING_BYTES // 4,), dtype=torch.int32, device=device)
    torch.empty_like(src).copy_(src)
    torch.cuda.synchronize()


def msa_row(device, gen, formats=("fp8",)) -> str:
    """The MSA section at the first grid for ``formats``; for the last, each shape's first
    and ``again`` µs at that grid, as one line's text."""
    rows = msa_scorer_section(device, [CONTEXT], [BATCH], 1.0, gen, formats=formats)  # its cache left cached
    cold = [r for r in rows if r["format"] == formats[-1] and r["batch"] == BATCH and r["context"] == CONTEXT]
    first = {(r["hs"], r["slots"]): r["us"] for r in cold if "variant" not in r}
    again = {(r["hs"], r["slots"]): r["us"] for r in cold if r.get("variant", {}).get("again")}
    return f"{formats[-1]} " + "  ".join(
        f"Hs {hs}/{slots} {first[hs, slots]:.1f} again {again[hs, slots]:.1f}" for hs, slots in MSA_SHAPES
    )


def run_prelude(name: str) -> None:
    """In this process: ``name``'s steps, then the NVFP4 row ROW_TIMINGS times, or for an
    "msa-" prelude fp8's rows (``msa_row``); one line."""
    device = torch.device("cuda", 0)
    gen = torch.Generator().manual_seed(0)
    pool = None
    for step in {**PRELUDES, **MSA_PRELUDES}[name]:
        if step == "ceilings":
            ceilings(device)
        elif step == "buffers":
            ceiling_buffers(device)
        elif step == "empty":
            torch.cuda.empty_cache()
        elif step == "pool":
            pool = CachePool(POOL_PAGES, device)
        elif step == "free":
            pool = None
        elif step == "bf16":
            msa_row(device, gen, formats=("bf16",))
        elif step == "hs4":
            time_row(pool, gen, hs=4, slots=1)
        elif step == "untimed":
            untimed_call(pool, gen, hs=4, slots=1)
        else:
            raise ValueError(f"prelude {name!r}: step {step!r} (one of {STEPS})")
    torch.cuda.synchronize()
    if name in MSA_PRELUDES:
        print(f"{name:<13} {msa_row(device, gen)}  µs", flush=True)
        return
    times = [time_row(pool, gen) for _ in range(ROW_TIMINGS)]
    print(f"{name:<13} " + "  ".join(f"{us:6.1f}" for us in times) + "  µs", flush=True)


def main(argv=None) -> int:
    """Each prelude (all by default) in a child process; its line printed as it ends."""
    parser = argparse.ArgumentParser(prog="python -m bench.first_rows", description=__doc__)
    parser.add_argument(
        "--prelude", choices=[*PRELUDES, *MSA_PRELUDES], action="append", help="one or more (default: all)"
    )
    parser.add_argument("--here", action="store_true", help="run the one --prelude in this process")
    args = parser.parse_args(argv)
    names = args.prelude or [*PRELUDES, *MSA_PRELUDES]
    if args.here:
        if len(names) != 1:
            parser.error("--here: name exactly one --prelude")
        run_prelude(names[0])
        return 0
    print(
        f"{torch.cuda.get_device_name(0)}: the NVFP4 row's {ROW_TIMINGS} timings, or fp8's rows first and again,"
        " after each prelude",
        flush=True,
    )
    failed = 0
    for name in names:
        child = [sys.executable, "-m", "bench.first_rows", "--here", "--prelude", name]
        done = subprocess.run(child, capture_output=True, text=True, timeout=300)
        print(done.stdout, end="", flush=True)
        if done.returncode != 0:
            failed = 1
            print(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}", file=sys.stderr, flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
