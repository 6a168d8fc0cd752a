"""``python -m bench.bounds [--grids 32x1024 8x1024] [--rounds 2] [--resident]``: what
bounds each wgmma scorer shape, in one call on any GPU: the route's own row beside its
probes and its tuning knobs, all on the same operands, interleaved round by round, each
against the same run's gathered read of the grid's pages (``timing.gathered_read_GBps``:
``g``).

The probes say what a part costs by leaving it out (``variants.variant_launch``): the
decode (``none``; ``signless``, a third of its ALU work), the exact MMA for the E4M3 one,
the page maxima (``nomax``), everything but the loads (``loads_only``). The knobs say
whether the policy's choice still holds on this card: pages a program, the page ring, the
register cap. The fifty-sixth session's H100 table (bench/PERF-HISTORY.md) is this table,
by hand; run it on an H200 to see whether the same arms move there (N 32 reads the same µs
on both cards).

``--resident`` folds every grid's ids onto half the card's L2 (``timing.fold_tables``):
the same arms and bytes with HBM out of the way, so each arm's µs is its own work's floor
on this card's SMs. An H100 and an H200 have the same SMs and clock: on an H100, which hides
a kernel's cost behind its lower bandwidth, this is what the H200 can show at best.
"""

from __future__ import annotations

import argparse

import torch

from fast.route import device_route
from indexer_constants import PAGE, PAGE_BYTES

from .suite import POOL_PAGES, scorer_operands
from .timing import CachePool, cold_time_us, fold_tables, gathered_read_GBps
from .variants import PROBE_DECODES, RING_PROBES, score_variant

# (name, Hs, first slot): the wgmma kernel's N 32, N 16 and N 8 (mma.sync) shapes
SHAPES = (("N32", 4, 0), ("N16", 4, 4), ("N8", 1, 0))
# Each shape's arms: a name and ``variant_launch`` keywords ({}: the route's own launch).
# Pages a program 2 and 1 leave the ring (it needs 4); at N 8 the policy's 8 pages hold 32
# partial maxima; at N 32 the exact route's 8 pages on the large grids are 4 on the small
# one (the E4M3 route's 4 at every grid).
# Ring 3 keeps 5 programs an SM at N 32 with 4 pages (one more page in flight each), as do
# 16 partial maxima (against "ppp4"); with 8 pages neither fits beside the ring of 2.
# "e4m3-piped":
# ``ring_variants.piped_ring_pages`` on the E4M3 route (at N 16 under the cap of 96 it needs
# for its MMAs to overlap), against "e4m3". "nomax" / "e4m3-nomax" (N 32; E4M3 at its cap of
# 80): ``probes.no_maxima_ring_pages``, the ring loop without its page maxima — a probe,
# against "policy" / "e4m3". "ring_loads" / "e4m3-ring_loads" (every N; at N 32 a program
# an SM more than its route's kernel: no q tile): ``probes.ring_loads_ring_pages``, the
# ring's waits, reads and refills alone — a probe, the ring's floor beside "loads_only" (the
# register feed's); "ring_loads3" the same with 3 pages in flight (4 a program at N 32,
# against "ring_loads-ppp4"): if it reads faster, the ring's copies wait on their latency,
# not on the L2's rate; "ring_copies" (N 32, N 16) the ring without its thread reads.
# "held" / "e4m3-held" (N 32, N 16; "none-held" / "e4m3-none-held" with no decode):
# ``probes.held_ring_pages``, the kernel's work on pages that never leave its ring — a
# probe, its floor with no copy or wait, against "policy" / "e4m3" (at N 32 the
# E4M3 one capped at 80: uncapped it takes 82 registers, a program short of the kernel).
ARMS = {
    "N32": (
        ("policy", {}),
        ("none", {"decode": "none"}),
        ("signless", {"decode": "signless"}),
        ("e4m3", {"decode": "e4m3"}),
        ("e4m3-none", {"decode": "e4m3-none"}),
        ("loads_only", {"loads_only": True}),
        ("e4m3-ppp8", {"decode": "e4m3", "pages_per_program": 8}),
        ("ppp4", {"pages_per_program": 4}),
        ("ppp8", {"pages_per_program": 8}),
        ("ppp2", {"pages_per_program": 2}),
        ("ring1", {"ring": 1}),
        ("ring0", {"ring": 0}),
        ("ring3", {"ring": 3, "pages_per_program": 4}),
        ("parts16", {"partials": 16, "pages_per_program": 4}),
        ("uncapped", {"register_cap": None}),
        ("e4m3-piped", {"decode": "e4m3", "ring_scorer": "piped"}),
        ("nomax", {"ring_scorer": "nomax"}),
        ("e4m3-nomax", {"decode": "e4m3", "ring_scorer": "nomax", "register_cap": 80}),
        ("ring_loads", {"ring_scorer": "ring_loads"}),
        ("e4m3-ring_loads", {"decode": "e4m3", "ring_scorer": "ring_loads"}),
        ("ring_copies", {"ring_scorer": "ring_copies"}),
        ("ring_loads-ppp4", {"ring_scorer": "ring_loads", "pages_per_program": 4}),
        ("ring_loads3", {"ring_scorer": "ring_loads", "ring": 3, "pages_per_program": 4}),
        ("held", {"ring_scorer": "held"}),
        ("e4m3-held", {"decode": "e4m3", "ring_scorer": "held", "register_cap": 80}),
        ("none-held", {"decode": "none", "ring_scorer": "held"}),
        ("e4m3-none-held", {"decode": "e4m3-none", "ring_scorer": "held"}),
    ),
    "N16": (
        ("policy", {}),
        ("none", {"decode": "none"}),
        ("e4m3", {"decode": "e4m3"}),
        ("loads_only", {"loads_only": True}),
        ("ppp8", {"pages_per_program": 8}),
        ("ring0", {"ring": 0}),
        ("ring3", {"ring": 3}),
        ("uncapped", {"register_cap": None}),
        ("e4m3-piped", {"decode": "e4m3", "ring_scorer": "piped", "register_cap": 96}),
        ("ring_loads", {"ring_scorer": "ring_loads"}),
        ("ring_loads3", {"ring_scorer": "ring_loads", "ring": 3}),
        ("ring_copies", {"ring_scorer": "ring_copies"}),
        ("held", {"ring_scorer": "held"}),
        ("e4m3-held", {"decode": "e4m3", "ring_scorer": "held"}),
    ),
    "N8": (
        ("policy", {}),
        ("none", {"decode": "none"}),
        ("e4m3", {"decode": "e4m3"}),
        ("loads_only", {"loads_only": True}),
        ("ppp4", {"pages_per_program": 4}),
        ("uncapped", {"register_cap": None}),
        ("ring_loads", {"ring_scorer": "ring_loads"}),
    ),
}
GRIDS = ((32, 1024), (8, 1024))  # batch x pages: 32 x 128K and 8 x 128K
# why an arm that scores is left out when its scores are not its route's: the run goes on
# (a GPU call is scarce) and ends with exit status 1
WRONG_SCORES = "its scores differ from the route's own launch: not timed"


def grid(text: str) -> tuple[int, int]:
    """``BATCHxPAGES`` (argparse's type): a grid the bench's cache pool holds."""
    try:
        batch, pages = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: BATCHxPAGES, e.g. 32x1024") from None
    if batch < 1 or pages < 1 or batch * pages > POOL_PAGES:
        raise argparse.ArgumentTypeError(f"{text!r}: batch, pages >= 1 and batch x pages <= {POOL_PAGES}")
    return batch, pages


def scores_result(variant: dict) -> str | None:
    """The route whose scores an arm's ``out`` holds ("exact" or "e4m3": its knobs and
    structures, held equal to that route's first arm), or None for a probe's (a decode
    probe's, the maxima's, or nothing with ``loads_only``)."""
    decode = variant.get("decode", "exact")
    probe = decode in PROBE_DECODES or variant.get("loads_only") or variant.get("ring_scorer") in RING_PROBES
    return None if probe else decode


def shape_rows(
    pool: CachePool, batch: int, pages: int, shape: str, rounds: int, gen, fold: int = 0, names=None
) -> tuple[dict, dict]:
    """``held_timings`` of ``shape``'s ARMS (``names``: those, ``chosen_arms``) on one set
    of operands ``batch`` x ``pages`` (fold: > 0, the tables' ids folded onto that many
    pages), each arm's scores held to its route's (``scores_result``)."""
    _, hs, slot = next(s for s in SHAPES if s[0] == shape)
    o = scorer_operands(pool, batch, pages, hs, gen)
    tables = fold_tables(o["tables"], fold)

    def run(variant, i):
        score_variant(o["tile"], pool.cache, tables[i], o["lens"], o["out"], first_slot=slot, **variant)

    arms = chosen_arms(ARMS[shape], names, scores_result)
    return held_timings(arms, run, o["out"], scores_result, rounds, len(tables))


def held_timings(arms, run, out: torch.Tensor, route_of, rounds: int, sets: int) -> tuple[dict, dict]:
    """(name -> µs of each of ``arms`` (name, keywords), ``rounds`` timings each by
    ``cold_time_us`` over ``sets`` table sets, the arms taking turns within a round; name ->
    why an arm was left out). ``run(keywords, i)`` launches an arm on table set i, writing
    ``out``. Each arm is first run once: one whose launch refuses (ValueError: a ring its
    policy has not, say) is left out; one that scores (``route_of(keywords)``: its route,
    or None for a probe) has its scores compared with its route's own launch, the route's
    first arm (NaN where it has NaN), and one that differs is left out too, with
    WRONG_SCORES."""
    own, held, left_out = {}, [], {}  # each route's scores, as its first arm gave them
    for name, variant in arms:
        out.fill_(12345.0)  # a column an arm leaves unwritten shows
        try:
            run(variant, 0)
        except ValueError as refused:
            left_out[name] = str(refused)
            continue
        route = route_of(variant)
        if route:
            got = out.nan_to_num(nan=7.0)
            own.setdefault(route, got.clone())
            if not torch.equal(got, own[route]):
                left_out[name] = WRONG_SCORES
                continue
        held.append((name, variant))
    timings = {name: [] for name, _ in held}
    for _ in range(rounds):
        for name, variant in held:
            timings[name].append(cold_time_us(lambda i, variant=variant: run(variant, i), sets))
    return timings, left_out


def chosen_arms(arms, names, route_of) -> tuple:
    """``arms`` cut to those in ``names`` (None: all of them) and each route's first arm,
    which the others' scores are held to (``route_of``, as ``held_timings``)."""
    if names is None:
        return tuple(arms)
    firsts, kept = set(), []
    for name, variant in arms:
        route = route_of(variant)
        if name in names or (route and route not in firsts):
            kept.append((name, variant))
        if route:
            firsts.add(route)
    return tuple(kept)


def print_rows(
    batch: int, pages: int, shape: str, timings: dict, g_GBps: float, left_out=None, file=None, unit_bytes=PAGE_BYTES
) -> None:
    """One line an arm: its µs (every round), its GB/s at the best (``unit_bytes`` a page or
    block) and that over ``g``; then one an arm left out (``shape_rows``), with why."""
    nbytes = batch * pages * unit_bytes
    for name, us in timings.items():
        rate = nbytes / min(us) / 1e3
        spread = " / ".join(f"{u:.1f}" for u in us)
        print(
            f"  {shape:<4} {name:<11} {spread:>18} µs  {rate:6.0f} GB/s  {rate / g_GBps:.2f} g", file=file, flush=True
        )
    for name, why in (left_out or {}).items():
        print(f"  {shape:<4} {name:<11} left out at this grid: {why}", file=file, flush=True)


def resident_pages(l2_bytes: int, unit_bytes: int = PAGE_BYTES) -> int:
    """The pages (blocks of ``unit_bytes``) ``--resident`` folds a grid onto: half an L2 of
    ``l2_bytes``, which holds them once read beside the tables, q and the scores."""
    return l2_bytes // 2 // unit_bytes


def arm_parser(prog: str, doc: str, shapes, arms) -> argparse.ArgumentParser:
    """The command line of ``prog`` (this module's or ``msa_bounds``'): --grids, --rounds,
    --shapes (of ``shapes``' names), --arms (of ``arms``' names: a scarce call times those
    alone, beside each route's first arm), --resident; ``doc``'s first paragraph its
    description."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument(
        "--grids", type=grid, nargs="+", default=list(GRIDS), help="BATCHxPAGES (default 32x1024 8x1024)"
    )
    parser.add_argument("--rounds", type=int, default=2, choices=range(1, 9), metavar="1..8")
    parser.add_argument("--shapes", nargs="+", choices=[s[0] for s in shapes], default=[s[0] for s in shapes])
    parser.add_argument("--arms", nargs="+", choices=sorted({name for name, _ in arms}), help="default: every arm")
    parser.add_argument(
        "--resident", action="store_true", help="every grid's ids folded onto half the L2: each arm's own work's floor"
    )
    return parser


def sm90_device(parser: argparse.ArgumentParser, what: str) -> torch.device:
    """The first GPU, or ``parser``'s error where it is not sm_90 (``what`` needs one)."""
    if not torch.cuda.is_available() or not device_route(torch.device("cuda", 0)).sm90:
        parser.error(f"needs an sm_90 GPU ({what})")
    return torch.device("cuda", 0)


def main(argv=None) -> int:
    """The command line: each grid's ``g``, then each shape's arms (``print_rows``); exit
    status 1 where an arm's scores were not the route's (WRONG_SCORES)."""
    parser = arm_parser("python -m bench.bounds", __doc__, SHAPES, [arm for arms in ARMS.values() for arm in arms])
    args = parser.parse_args(argv)
    device = sm90_device(parser, "the wgmma scorer and its probes")
    fold = resident_pages(torch.cuda.get_device_properties(device).L2_cache_size) if args.resident else 0
    where = f"; every id folded onto {fold} pages, which L2 holds" if fold else ""
    print(f"{torch.cuda.get_device_name(device)}; µs of each arm, round by round; g: the gathered read{where}")
    pool = CachePool(POOL_PAGES, device)
    gen = torch.Generator().manual_seed(0)
    wrong = []
    for batch, pages in args.grids:
        g = gathered_read_GBps(device, batch, pages, PAGE_BYTES, fold=fold)
        print(f"{batch} x {pages * PAGE // 1024}K tokens ({batch} x {pages} pages): g {g:.0f} GB/s", flush=True)
        for shape in args.shapes:
            timings, left_out = shape_rows(pool, batch, pages, shape, args.rounds, gen, fold, args.arms)
            print_rows(batch, pages, shape, timings, g, left_out)
            wrong += [f"{shape} {name} at {batch}x{pages}" for name, why in left_out.items() if why == WRONG_SCORES]
    if wrong:
        print(f"scores not the route's: {', '.join(wrong)}", flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
