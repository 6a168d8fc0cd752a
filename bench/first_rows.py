"""``python -m bench.first_rows``: what makes the NVFP4 scorer section's first row read slow.

In a whole ``make bench`` the section's first row (Hs 1, 8 slots, 8 x 128K) reads ~9% slower
than the same launch timed later in the run, and three verdicts read it (bench/PERF.md,
"Leads"). Re-timing the same shape did not move it in a driver; a timed row of another shape
did. A candidate is where the row's small buffers land (its block tables, q tile, lengths,
``out``): the same shape re-timed gets the same freed blocks back, another shape moves them.

Each placement runs in a fresh process that reaches the row as the suite does (the read
ceilings, then the cache pool), then times the row with one of its buffers moved by a pad
held while it is timed (or after another shape's call), then twice more as the suite would
build it; each buffer's address is printed as its 2 MB page and the offset in it. The
placement whose first timing matches the later ones names what the slow row shares.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import torch

from indexer_constants import PAGE, SLOTS

from .suite import BATCHES, CONTEXTS, SCORER_OPERANDS, scorer_operands
from .timing import CachePool, ceilings, cold_time_us
from .variants import score_variant

BATCH, CONTEXT = 8, 131072  # the section's first grid
BUFFERS = SCORER_OPERANDS  # a row's buffers, in the order the suite makes them
PAD_BYTES = 1 << 20  # a small-pool block (PyTorch's caching allocator): moves what follows it
# what comes before the first timed row: its buffers (pad) moved by a pad, or another shape's call
PLACEMENTS = {
    "bench": {},  # as the suite reaches it
    "tables": {"pad": ("tables",)},
    "tile-lens": {"pad": ("tile", "lens")},
    "out": {"pad": ("out",)},
    "all": {"pad": BUFFERS},
    "untimed-hs4": {"before": "untimed"},  # after one untimed call of Hs 4, one slot
    "timed-hs4": {"before": "timed"},  # after a timed row of Hs 4, one slot
}


def address(t: torch.Tensor) -> str:
    """``t``'s address as its 2 MB page and the offset in it ('0x3fe+0x00200')."""
    p = t.data_ptr()
    return f"{p >> 21:#x}+{p & ((1 << 21) - 1):#07x}"


def row_buffers(pool: CachePool, hs: int, gen, pad: tuple = ()) -> tuple[dict, list]:
    """A row's operands at the first grid as ``suite.scorer_us`` makes them
    (``suite.scorer_operands``), each named in ``pad`` made after a held PAD_BYTES block;
    returns (operands by name, the pads to hold while it is timed)."""
    held = []

    def before(name: str) -> None:
        if name in pad:
            held.append(torch.empty(PAD_BYTES, dtype=torch.uint8, device=pool.device))

    return scorer_operands(pool, BATCH, CONTEXT // PAGE, hs, gen, before=before), held


def time_row(pool: CachePool, gen, hs: int = 1, slots: int = 8, pad: tuple = ()) -> tuple[float, dict]:
    """Median µs of the row (``cold_time_us`` over its cold sets, the suite's timer) and
    each buffer's address."""
    b, held = row_buffers(pool, hs, gen, pad)
    tables = b["tables"]

    def call(i):
        score_variant(b["tile"], pool.cache, tables[i], b["lens"], b["out"], first_slot=SLOTS - slots)

    us = cold_time_us(call, len(tables))
    del held
    return us, {name: address(b[name][0] if name == "tables" else b[name]) for name in BUFFERS}


def untimed_call(pool: CachePool, gen, hs: int, slots: int) -> None:
    """One launch of the row's shape ``hs`` / ``slots``, not timed; its buffers freed after."""
    b, _ = row_buffers(pool, hs, gen)
    score_variant(b["tile"], pool.cache, b["tables"][0], b["lens"], b["out"], first_slot=SLOTS - slots)
    torch.cuda.synchronize()


def run_placement(name: str) -> None:
    """In this process: the suite's start (ceilings, the pool), ``name``'s prelude, then the
    row three times; one line a timing."""
    placement = PLACEMENTS[name]
    device = torch.device("cuda", 0)
    gen = torch.Generator().manual_seed(0)
    ceilings(device)
    pool = CachePool(max(BATCHES) * max(CONTEXTS) // PAGE + 1024, device)  # the suite's
    before = placement.get("before")
    if before == "timed":
        time_row(pool, gen, hs=4, slots=1)
    elif before == "untimed":
        untimed_call(pool, gen, hs=4, slots=1)
    for i in range(3):
        us, where = time_row(pool, gen, pad=placement.get("pad", ()) if i == 0 else ())
        spots = "  ".join(f"{k} {v}" for k, v in where.items())
        print(f"{name:<12} timing {i + 1}: {us:6.1f} µs   {spots}", flush=True)


def main(argv=None) -> int:
    """Each placement (all by default) in a child process; its lines printed as it ends."""
    parser = argparse.ArgumentParser(prog="python -m bench.first_rows", description=__doc__)
    parser.add_argument("--placement", choices=list(PLACEMENTS), action="append", help="one or more (default: all)")
    parser.add_argument("--here", action="store_true", help="run the one --placement in this process")
    args = parser.parse_args(argv)
    names = args.placement or list(PLACEMENTS)
    if args.here:
        if len(names) != 1:
            parser.error("--here: name exactly one --placement")
        run_placement(names[0])
        return 0
    print(torch.cuda.get_device_name(0), flush=True)
    failed = 0
    for name in names:
        child = [sys.executable, "-m", "bench.first_rows", "--here", "--placement", name]
        done = subprocess.run(child, capture_output=True, text=True, timeout=300)
        print(done.stdout, end="", flush=True)
        if done.returncode != 0:
            failed = 1
            print(f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}", file=sys.stderr, flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
