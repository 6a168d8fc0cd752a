"""``python -m bench`` (``make bench``): ceilings, scorer bandwidth (NVFP4, FP8, BF16) and
per-layer CP vs stock in CUDA graphs, on the GPUs present."""

from __future__ import annotations

import argparse
import sys

from reference.cli import run_command

from .suite import run_bench


def main(argv=None) -> int:
    """The benchmark's command line; returns the exit status (2: a bad argument, one line)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        epilog="example: python -m bench --quick --out results/today",
    )
    parser.add_argument("--out", help="results folder (default results/bench-<time>)")
    parser.add_argument("--quick", action="store_true", help="3 contexts x 2 batches instead of 5 x 4")
    parser.add_argument("--world", type=int, help="CP ranks for the per-layer section (default: GPUs with P2P)")
    parser.add_argument("--contexts", type=int, nargs="+", help="contexts in tokens (multiples of 128)")
    parser.add_argument("--batches", type=int, nargs="+")
    parser.set_defaults(run=lambda a: run_bench(a.out, a.quick, a.world, a.contexts, a.batches))
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
