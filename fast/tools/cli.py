"""``python -m fast``: decode a saved case on N ranks, or run the demo (the benchmark is
``python -m bench``, beside the runtime)."""

from __future__ import annotations

import argparse
import time

import torch

from indexer_constants import MMA_ROUTES, SUPPORTED_CP
from reference import msa
from reference.cases import Case
from reference.cli import OUTPUT_HELP, check_out, run_command, summary
from reference.cli import load_case as read_case
from reference.inputs import check_decode_inputs
from reference.msa.inputs import check_msa_inputs

from ..backend import gpu_count
from .demo import run_demo
from .launcher import RankPool
from .programs import run_case


def _backend(name: str) -> str:
    return ("cuda" if gpu_count() else "cpu") if name == "auto" else name


def load_case(path: str) -> Case | msa.MsaCase:
    """A saved case of either format (an MSA case holds its forced windows), checked by the
    reference's input rules for its format in this process, before any rank starts: a
    missing, unreadable or invalid case is a ValueError naming what is wrong."""
    case = read_case(path)
    if isinstance(case, msa.MsaCase):
        check_msa_inputs(*case.args(), **case.windows())
    else:
        check_decode_inputs(*case.args())
    return case


def _decode(args) -> int:
    if args.cp not in SUPPORTED_CP:
        raise ValueError(f"cp: must be one of {SUPPORTED_CP}, got {args.cp}")
    backend = _backend(args.backend)
    if backend == "cuda" and args.cp > gpu_count():
        raise ValueError(f"cp: {args.cp} ranks need {args.cp} GPUs, {gpu_count()} visible")
    check_out(args.out)
    start = time.monotonic()
    case = load_case(args.case)
    with RankPool(args.cp, backend) as pool:
        out = run_case(pool, case, args.path, mma=args.mma)
    torch.save({"out": out}, args.out)
    print(summary(f"fast ({backend})", args.path, args.cp, case, out, args.out, time.monotonic() - start))
    return 0


def main(argv=None) -> int:
    """``python -m fast``'s subcommands; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m fast", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser(
        "decode",
        help="decode a saved case (see python -m reference make-case) on N ranks",
        description="Decode a saved case with fast's kernels on N rank processes (GPUs, or CPU ranks under the "
        "Triton interpreter) and save the output, assembled over heads.",
        epilog="example: python -m fast decode --case case.pt --path cp --cp 4 --out got.pt\n" + OUTPUT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("--case", required=True)
    d.add_argument("--path", choices=["cp", "stock"], required=True)
    d.add_argument("--cp", type=int, required=True, help="ranks (stock: each decodes its heads)")
    d.add_argument("--backend", choices=["auto", "cpu", "cuda"], default="auto")
    d.add_argument(
        "--mma",
        choices=MMA_ROUTES,
        default="exact",
        help="the scorer's MMA route (e4m3: Hopper's E4M3 MMA, sm_90 only; DESIGN §4.1)",
    )
    d.add_argument("--out", required=True)
    d.set_defaults(run=_decode)
    m = sub.add_parser(
        "demo",
        help="CP and stock on a synthetic workload, checked against the reference",
        epilog="example: python -m fast demo --backend cpu   (CPU ranks: a few minutes; a table row per decode)",
    )
    m.add_argument("--backend", choices=["auto", "cpu", "cuda"], default="auto")
    m.set_defaults(run=lambda a: 0 if run_demo(a.backend) else 1)
    return run_command(parser.parse_args(argv))
