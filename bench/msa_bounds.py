"""``python -m bench.msa_bounds [--formats fp8 bf16] [--grids 32x1024 8x1024] [--rounds 2]
[--resident]``: what bounds the MSA mma kernel (docs/DESIGN.md §10.2), as ``bench.bounds``
does the NVFP4 scorer: each shape's own launch beside its ring alone and its knobs, on the
same operands, the arms taking turns round by round, each against the same run's gathered
read of the grid's blocks (``timing.gathered_read_GBps``: ``g``).

The arms (``variants.block_variant_launch``'s keywords): the ring alone (``loads_only``, a
bulk ring's copies, waits and read-back: the feed's own rate), the E4M3 route (fp8 keys),
the ring's depth and the columns a program. ``--resident`` folds every grid's ids onto half
the card's L2 (``timing.fold_tables``): each arm's µs is then its own work's floor on the
SMs, which an H100 shares with an H200 — on an H100, the most an H200 run can read.
"""

from __future__ import annotations

import torch

from fast.msa.scorer import KEY_FORMATS
from indexer_constants import HEAD_DIM, PAGE, SLOTS

from .bounds import WRONG_SCORES, arm_parser, chosen_arms, held_timings, print_rows, resident_pages, sm90_device
from .msa import block_bytes, cold_sets, random_keys
from .timing import FLUSH_BYTES, disjoint_tables, fold_tables, gathered_read_GBps
from .variants import score_block_variant

# (name, Hs, slots scored): the bench's MSA shapes (``msa.MSA_SHAPES``) by the MMA's N
SHAPES = (("N32", 4, 8), ("N16", 4, 4), ("N8", 1, 8), ("N8q1", 4, 1))
# Each arm: a name and ``block_variant_launch`` keywords ({}: the decode's own launch). The
# ring alone is a probe (its ``out`` untouched); the others score, each held equal to its
# route's own launch, the route's first arm. The E4M3 route is fp8's alone.
ARMS = (
    ("policy", {}),
    ("loads_only", {"loads_only": True}),
    ("e4m3", {"mma": "e4m3"}),
    ("stages2", {"stages": 2}),
    ("stages4", {"stages": 4}),
    ("ppp2", {"ppp": 2}),
    ("ppp8", {"ppp": 8}),
)


def format_arms(key_format: str) -> tuple:
    """ARMS a format takes: the E4M3 route only with fp8 keys."""
    return tuple(arm for arm in ARMS if key_format == "fp8" or arm[1].get("mma") != "e4m3")


def scores_route(variant: dict) -> str | None:
    """The route whose scores an arm's ``out`` holds ("exact" or "e4m3"), or None for the
    ring alone's."""
    return None if variant.get("loads_only") else variant.get("mma", "exact")


def shape_rows(
    cache: torch.Tensor,
    key_format: str,
    batch: int,
    blocks: int,
    shape: str,
    rounds: int,
    gen,
    fold: int = 0,
    names=None,
) -> tuple[dict, dict]:
    """``bounds.held_timings`` of the format's arms (``names``: those,
    ``bounds.chosen_arms``) on one set of operands ``batch`` x
    ``blocks`` over ``cache`` (fold: > 0, the tables' ids folded onto that many blocks),
    each arm's scores held to its route's (``scores_route``); an arm the launch refuses (a
    bulk ring's probe on a cp.async ring, say) is left out with why."""
    _, hs, slots = next(s for s in SHAPES if s[0] == shape)
    dtype = KEY_FORMATS[key_format]
    device = cache.device
    per_set = batch * blocks
    sets = min(cold_sets(batch, blocks, key_format, FLUSH_BYTES), cache.shape[0] // per_set)
    tables = fold_tables(disjoint_tables(batch, blocks, sets, gen, device), fold)
    tile = torch.randn(batch, SLOTS, hs, HEAD_DIM, generator=gen).to(dtype).to(device)
    lens = torch.full((batch,), blocks * PAGE, dtype=torch.int32, device=device)
    out = torch.empty(batch, SLOTS * hs, blocks, device=device)
    common = {"num_pages": blocks, "first_slot": SLOTS - slots, "kernel": "mma"}

    def run(variant, i):
        score_block_variant(tile, cache, tables[i], lens, out, **common, **variant)

    arms = chosen_arms(format_arms(key_format), names, scores_route)
    return held_timings(arms, run, out, scores_route, rounds, len(tables))


def main(argv=None) -> int:
    """The command line: per format and grid, ``g``, then each shape's arms
    (``bounds.print_rows``); exit status 1 where an arm's scores were not its route's."""
    parser = arm_parser("python -m bench.msa_bounds", __doc__, SHAPES, ARMS)
    parser.add_argument("--formats", nargs="+", choices=tuple(KEY_FORMATS), default=["fp8", "bf16"])
    args = parser.parse_args(argv)
    device = sm90_device(parser, "the MSA mma kernel and its probe")
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    print(f"{torch.cuda.get_device_name(device)}; µs of each arm, round by round; g: the gathered read", flush=True)
    gen = torch.Generator().manual_seed(0)
    wrong = []
    for key_format in args.formats:
        size = block_bytes(key_format)
        fold = resident_pages(l2, size) if args.resident else 0
        most = max(b * p for b, p in args.grids)
        cache = random_keys(max(2 * most, FLUSH_BYTES // size + most), key_format, device)  # a cold set or two
        where = f"; every id folded onto {fold} blocks, which L2 holds" if fold else ""
        print(f"{key_format} keys ({size // 1024} KB a block){where}", flush=True)
        for batch, blocks in args.grids:
            g = gathered_read_GBps(device, batch, blocks, size, fold=fold)
            print(f"{batch} x {blocks * PAGE // 1024}K tokens ({batch} x {blocks} blocks): g {g:.0f} GB/s", flush=True)
            for shape in args.shapes:
                timings, left_out = shape_rows(
                    cache, key_format, batch, blocks, shape, args.rounds, gen, fold, args.arms
                )
                print_rows(batch, blocks, shape, timings, g, left_out, unit_bytes=size)
                wrong += [
                    f"{key_format} {shape} {n} at {batch}x{blocks}" for n, w in left_out.items() if w == WRONG_SCORES
                ]
        del cache
        torch.cuda.empty_cache()
    if wrong:
        print(f"scores not the route's: {', '.join(wrong)}", flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
