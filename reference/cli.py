"""``python -m reference``: decode a saved case, explain one row rank by rank, make cases, demo."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from indexer_constants import MAX_QUERY_LEN, PAGE, SUPPORTED_CP, SUPPORTED_HEADS

from . import msa
from .cases import PATTERNS, Case, make_case, read_case_file, seq_len_for
from .cp import cp_decode
from .decode import full_decode, stock_decode
from .explain import explain
from .inputs import check_decode_inputs, check_int
from .msa.cases import DTYPES as MSA_DTYPES
from .msa.cases import PATTERNS as MSA_PATTERNS
from .msa.cases import WINDOW_FIELDS
from .msa.explain import explain as explain_msa
from .msa.inputs import check_msa_inputs

PATHS = {"full": full_decode, "stock": stock_decode, "cp": cp_decode}
# The decode commands' output file (reference's and fast's), as their --help says it.
OUTPUT_HELP = (
    "output: a torch.save dict {'out': int32 [B * query_len, H, 16]}: per row (request b's query i\n"
    "at b * query_len + i) and index head, nvfp4 keys: 15 ranked pages and the own page last;\n"
    "bf16 / fp8 keys: the chosen block ids ascending, -1 padded. Rows of <= 16 pages list them in order."
)
# The MSA format has one oracle: its stock path must output it too (docs/DESIGN.md §10.3).
MSA_PATHS = {"full": msa.full_decode, "stock": msa.full_decode, "cp": msa.cp_decode}
FORMATS = ("nvfp4",) + tuple(MSA_DTYPES)


def load_case(path) -> Case | msa.MsaCase:
    """A saved case of either format: an MSA case also holds its forced windows."""
    d = read_case_file(path)  # read once: the fields say the format
    return msa.MsaCase.load(path, d) if any(name in d for name in WINDOW_FIELDS) else Case.load(path, d)


def check_out(path: str) -> None:
    """An output path whose folder exists, checked before the work that fills it."""
    if not Path(path).resolve().parent.is_dir():
        raise ValueError(f"out: the folder of {path} does not exist")


def summary(tool: str, path: str, cp: int | None, case, out: torch.Tensor, file: str, seconds: float) -> str:
    """The one line a decode command prints: what ran, on what, and where the output went."""
    rows, heads = case.index_q.shape[:2]
    fmt = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8"}.get(case.k_cache.dtype, "nvfp4") + " keys"
    ranks = f", CP {cp}" if cp is not None else ""
    shape = "x".join(map(str, out.shape))
    return (
        f"{tool} decode: path {path}{ranks}, {rows} rows x {heads} heads ({fmt}, query_len {case.query_len}) -> "
        f"{file} {{'out': int32 [{shape}]}} in {seconds:.1f} s"
    )


def _decode(args) -> int:
    if args.path == "cp" and args.cp is None:
        raise ValueError("cp: --path cp needs --cp N, the ranks simulated (one of 1, 2, 4, 8)")
    if args.cp is not None and args.path != "cp":
        raise ValueError(f"cp: --cp applies to --path cp only, not --path {args.path}")
    check_out(args.out)
    start = time.monotonic()
    case = load_case(args.case)
    is_msa = isinstance(case, msa.MsaCase)
    fn = (MSA_PATHS if is_msa else PATHS)[args.path]
    kwargs = {"cp": args.cp} if args.path == "cp" else {}
    if is_msa:
        kwargs.update(case.windows())
    out = fn(*case.args(), **kwargs)
    torch.save({"out": out}, args.out)
    print(summary("reference", args.path, args.cp, case, out, args.out, time.monotonic() - start))
    return 0


def _explain(args) -> int:
    case = load_case(args.case)
    how = explain_msa if isinstance(case, msa.MsaCase) else explain
    return 0 if how(case, args.row, args.head, args.cp) else 1


def _make_case(args) -> int:
    try:
        lens = [int(n) for n in args.seq_lens.split(",")]
    except ValueError:
        raise ValueError(f"seq-lens: {args.seq_lens!r} is not a comma-separated list of ints") from None
    check_int("query-len", args.query_len, low=1, high=MAX_QUERY_LEN)
    check_int("heads", args.heads, allowed=SUPPORTED_HEADS)
    if args.table_width is not None:
        check_int("table-width", args.table_width, low=1)
    check_out(args.out)
    if args.format == "nvfp4":
        if args.init_blocks is not None or args.local_blocks is not None:
            raise ValueError("init-blocks: forced windows belong to the bf16 / fp8 formats, not nvfp4")
        builder, patterns, check, dtype, windows = make_case, PATTERNS, check_decode_inputs, {}, {}
    else:
        builder, patterns, check, dtype = msa.make_case, MSA_PATTERNS, check_msa_inputs, {"dtype": args.format}
        windows = {
            "init_blocks": 1 if args.init_blocks is None else args.init_blocks,
            "local_blocks": 1 if args.local_blocks is None else args.local_blocks,
        }
    if args.pattern not in patterns:
        raise ValueError(f"pattern: the {args.format} format takes one of {patterns}, got {args.pattern!r}")
    case = builder(
        args.seed,
        lens,
        query_len=args.query_len,
        heads=args.heads,
        pattern=args.pattern,
        table_width=args.table_width,
        **dtype,
        **windows,
    )
    check(*case.args(), **windows)  # a case that decode would refuse is not written
    case.save(args.out)
    print(
        f"wrote {args.out}: {case.name}, {len(lens)} requests, {case.index_q.shape[1]} heads, P_table "
        f"{case.block_table.shape[1]}"
    )
    return 0


def demo(file=None) -> bool:
    """Reference-only demo: CP (every size) vs the full oracle on a mixed synthetic workload."""
    file = file or sys.stdout
    lens = [seq_len_for(p, 5) for p in (0, 15, 16, 17, 129, 1000, 2049, 4096)]
    print(f"{'query_len':>9} {'pattern':>9} {'cp':>3} {'rows':>5} {'agree':>6} {'full s':>7} {'cp s':>7}", file=file)
    ok = True
    for query_len in (1, 4):
        for pattern in ("random", "exact"):
            case = make_case(7, lens, query_len=query_len, heads=4, pattern=pattern)
            t0 = time.perf_counter()
            full = full_decode(*case.args())
            t_full = time.perf_counter() - t0
            for cp in SUPPORTED_CP:
                t0 = time.perf_counter()
                out = cp_decode(*case.args(), cp=cp)
                t_cp = time.perf_counter() - t0
                agree = torch.equal(out, full)
                ok &= agree
                print(
                    f"{query_len:>9} {pattern:>9} {cp:>3} {out.shape[0]:>5} {'yes' if agree else 'NO':>6} "
                    f"{t_full:>7.3f} {t_cp:>7.3f}",
                    file=file,
                )
    print(f"requests: {len(lens)} with {[(n - 1) // PAGE for n in lens]} pages of history; H = 4", file=file)
    print("all CP sizes agree with the full oracle" if ok else "MISMATCH between CP and the full oracle", file=file)
    return ok


def main(argv=None) -> int:
    """``python -m reference``'s subcommands; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m reference", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser(
        "decode",
        help="decode a saved case with the full, CP or stock path",
        description="Decode a saved case (make-case writes one) with the reference and save the output.",
        epilog="example: python -m reference decode --case case.pt --path cp --cp 4 --out want.pt\n" + OUTPUT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("--case", required=True)
    d.add_argument("--path", choices=sorted(PATHS), required=True)
    d.add_argument("--cp", type=int, help="ranks simulated (--path cp only, and required there)")
    d.add_argument("--out", required=True)
    d.set_defaults(run=_decode)
    e = sub.add_parser(
        "explain",
        help="show rank by rank what one row's head saw",
        epilog="example: python -m reference explain --case case.pt --row 0 --head 2 --cp 4",
    )
    e.add_argument("--case", required=True)
    e.add_argument("--row", type=int, required=True, help="request b's query i is row b * query_len + i")
    e.add_argument("--head", type=int, required=True)
    e.add_argument("--cp", type=int, required=True, help="ranks simulated (1, 2, 4 or 8)")
    e.set_defaults(run=_explain)
    m = sub.add_parser(
        "make-case",
        help="write a synthetic case file",
        epilog="example: python -m reference make-case --out case.pt --seq-lens 70000,300 --query-len 2 --pattern ties",
    )
    m.add_argument("--out", required=True)
    m.add_argument("--seq-lens", required=True, help="comma-separated lengths, one per request")
    m.add_argument("--query-len", type=int, default=1)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--format", choices=FORMATS, default="nvfp4", help="the index-K format (default nvfp4)")
    m.add_argument("--pattern", choices=sorted(set(PATTERNS) | set(MSA_PATTERNS)), default="random")
    m.add_argument("--init-blocks", type=int, help="bf16 / fp8: the forced first blocks (default 1)")
    m.add_argument("--local-blocks", type=int, help="bf16 / fp8: the forced last blocks (default 1)")
    m.add_argument("--table-width", type=int)
    m.add_argument("--seed", type=int, default=0)
    m.set_defaults(run=_make_case)
    sub.add_parser(
        "demo", help="CP vs full on a synthetic workload", epilog="example: python -m reference demo"
    ).set_defaults(run=lambda _: 0 if demo() else 1)
    return run_command(parser.parse_args(argv))


def run_command(args) -> int:
    """Run a parsed sub-command; bad input (ValueError/TypeError) is a one-line error, exit 2."""
    try:
        return args.run(args)
    except (ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
