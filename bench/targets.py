"""The performance issues' targets, judged on one ``make bench`` report (``bench.suite``'s
dict): each target's figures in that run and whether they meet it. The bench prints the
verdicts last and stores them in results.json, so a run says for itself where it stands;
every ratio is taken within the one run (machines and runs differ by more than some
margins: bench/PERF.md)."""

from __future__ import annotations

from fast.scorer import mma_rows
from indexer_constants import PAGE

# The scorers (issue 65): each row against the same run's gathered read of its pages
# (``gathered_read``: those pages read bare through the same shuffled tables — the most any
# kernel of that grid shows in this harness), at every grid of batch x context >= JUDGED_FROM
# tokens; a shape's large-grid goal from LARGE_GRID up, its small-grid goal below.
JUDGED_FROM = 8 * 131072
LARGE_GRID = 32 * 131072
NVFP4_GOALS = ((8, 0.90, 0.85), (16, 0.85, 0.80), (32, 0.72, 0.65))  # (the MMA's N, large grids, small)
MSA_GOALS = (("fp8", 0.95), ("bf16", 0.97))  # every shape and grid
# NVFP4 pages a second over the FP8 scorer's blocks a second (both 128 tokens), same shape
# and grid: the 4.5-bit cache should read its 1.78x fewer bytes faster.
PARITY_GOALS = ((8, 1.5), (16, 1.5), (32, 1.25))
NOISE = 0.02  # a verdict this near its goal is the run's noise: said, not claimed
SPEEDUPS = ((1048576, 1.9), (131072, 1.7))  # (context, least CP / stock) at batch 32, q 1
SPEEDUP_BATCH = 32
OVERHEAD_US = 6.0  # the CP overhead (exchange + push + merge) at batch 64, q 4
OVERHEAD_BATCH, OVERHEAD_QLEN = 64, 4
SHORT_PAGES = 16  # contexts whose rows all hold at most this many pages ...
SHORT_US = 3.0  # ... where CP may be at most this much slower than stock
TOP16_PAGES = 8192  # the stock top-16 against the stock scorer at this many pages
TOP16_SHARE = 0.15
GUARD_COST = 0.02  # the scorer's block-id guard: at most this share of its time (8 x 128K)
# The E4M3-MMA route (DESIGN §4.1; rows variant {"mma": "e4m3"}): the same judged grids,
# one goal a shape at every size; FP8 blocks; its NVFP4 over its FP8 rate at every N.
E4M3 = {"mma": "e4m3"}
E4M3_GOALS = ((8, 0.95), (16, 0.93), (32, 0.88))
E4M3_MSA_GOAL = 0.97
E4M3_PARITY = 1.6


def judge(report: dict) -> list[dict]:
    """One dict per target: ``target`` (what the issue asks), ``figures`` (this run's
    numbers), ``met`` (True, False, or None where the run did not measure it) and, where
    the worst figure lies within NOISE of its goal, ``noise`` (the verdict is not a result)."""
    return [
        *(_nvfp4(report, n, large, small) for n, large, small in NVFP4_GOALS),
        *(_msa(report, fmt, least) for fmt, least in MSA_GOALS),
        *(_parity(report, n, least) for n, least in PARITY_GOALS),
        *(_speedup(report, c, least) for c, least in SPEEDUPS),
        _overhead(report),
        _short_rows(report),
        _top16(report),
        _guard(report),
        *(_e4m3_nvfp4(report, n, least) for n, least in E4M3_GOALS),
        _e4m3_msa(report),
        _e4m3_parity(report),
    ]


def _verdict(target: str, figures: str, met: bool | None, margin: float | None = None) -> dict:
    """A target's verdict; ``margin``: the worst figure less its goal (noise within NOISE)."""
    verdict = {"target": target, "figures": figures, "met": met}
    if margin is not None and abs(margin) <= NOISE:
        verdict["noise"] = True
    return verdict


def _context(tokens: int) -> str:
    """2048 -> '2K', 1048576 -> '1M'."""
    return f"{tokens >> 20}M" if tokens % (1 << 20) == 0 else f"{tokens >> 10}K"


def _tokens(tokens: int) -> str:
    """A grid's size in tokens as batches of 128K: 4194304 -> '32 x 128K'."""
    return f"{tokens // 131072} x 128K"


def _grid(row: dict) -> str:
    """A row's grid: '8 x 128K'."""
    return f"{row['batch']} x {_context(row['context'])}"


def _layers(report: dict, **where) -> list[dict]:
    """The per-layer rows whose fields equal ``where``'s."""
    return [r for r in report.get("layers", []) if all(r[k] == v for k, v in where.items())]


def _scorer_rows(report: dict, **where) -> list[dict]:
    """The scorer grid's default rows (no tuning variant) whose fields equal ``where``'s."""
    return [r for r in report.get("scorer", []) if not r.get("variant") and all(r[k] == v for k, v in where.items())]


def _judged(rows: list[dict], variant: dict | None = None, gathered: bool = True) -> list[dict]:
    """The rows of ``variant`` (None: the default rows) that a scorer goal judges: batch x
    context >= JUDGED_FROM and, if ``gathered``, a gathered read to hold them to; by shape,
    then grid."""
    rows = [
        r
        for r in rows
        if (r.get("variant") or None) == variant
        and r["batch"] * r["context"] >= JUDGED_FROM
        and (r.get("gathered_read", 0) > 0 or not gathered)
    ]
    return sorted(rows, key=lambda r: (-r["hs"], -r["slots"], r["context"], r["batch"]))


def _goal(row: dict, large: float, small: float) -> float:
    return large if row["batch"] * row["context"] >= LARGE_GRID else small


def _point(row: dict) -> tuple:
    """A row's point of the grid: (hs, slots, batch, context); rows of two sections (a probe
    and its default, a chained layer and its scorer, the two formats) pair on it."""
    return row["hs"], row["slots"], row["batch"], row["context"]


def _at_n(rows: list[dict], n: int) -> list[dict]:
    """The rows whose shape runs the scorer's MMA at N = ``n`` (``mma_rows``)."""
    return [r for r in rows if mma_rows(r["hs"] * r["slots"]) == n]


def _of_gathered(row: dict) -> float:
    """A row's fraction of the ceiling over its gathered read's: what the goals judge."""
    return row["of_read_ceiling"] / row["gathered_read"]


def _decodes_checked(report: dict) -> bool:
    """Both decodes matched the reference in this run (speedups count only then)."""
    return bool(report["checks"].get("cp")) and bool(report["checks"].get("stock"))


def _shape(hs: int, slots: int) -> str:
    return "Hs 1" if hs == 1 else f"Hs {hs} / {slots} slot{'s' if slots > 1 else ''}"


def _by_shape(rows: list[dict], cell) -> str:
    """'Hs 1: cell(r), cell(r); Hs 4 / 8 slots: ...' over ``rows`` (sorted by shape)."""
    shapes: dict = {}
    for r in rows:
        shapes.setdefault((r["hs"], r["slots"]), []).append(cell(r))
    return "; ".join(f"{_shape(*shape)}: {', '.join(cells)}" for shape, cells in shapes.items())


def _worst(judged: list[tuple[dict, float, float]], unit: str = "") -> str:
    """'; worst Hs 4 / 8 slots at 8 x 128K, 0.53 against 0.65' for the (row, figure, goal)
    whose figure falls furthest under its goal."""
    row, figure, goal = min(judged, key=lambda j: j[1] - j[2])
    return f"; worst {_shape(row['hs'], row['slots'])} at {_grid(row)}, {figure:.2f}{unit} against {goal:.2f}{unit}"


def _nvfp4(report: dict, n: int, large: float, small: float) -> dict:
    """The exact NVFP4 scorer at the MMA's N = ``n``: each shape's rows (default, and on
    the Gaussian-key cache) as fractions of their gathered read, ``large`` from LARGE_GRID
    up and ``small`` below. Where the bench timed the scorer in a PDL-chained layer
    (``chained``: the small grids), the small grid is judged there, where a decode runs it:
    what the scorer adds to the layer (the layer less its other stages) in place of its
    time alone, against the same gathered read; both are printed."""
    target = (
        f"NVFP4 scorer at N {n} >= {large:.2f} of the gathered read at batch x context >= {_tokens(LARGE_GRID)},"
        f" >= {small:.2f} from {_tokens(JUDGED_FROM)} (in the chained layer where measured)"
    )
    rows = _at_n(_judged(report.get("scorer", [])), n)
    if not rows:
        return _verdict(target, "not measured (no such point in this grid)", None)
    judged, cells = [], {}
    for r in rows:
        goal, alone = _goal(r, large, small), _of_gathered(r)
        cells[id(r)] = f"{alone:.2f} at {_grid(r)}"
        figure = alone
        layer = _chained(report, r)
        if layer is not None:
            figure = alone * r["us"] / layer["adds_us"] if layer["adds_us"] > 0 else 0.0
            cells[id(r)] += (
                f" ({r['us']:.1f} µs alone; in the chained layer {figure:.2f}: it adds {layer['adds_us']:.1f} µs to"
                f" {layer['layer_us']:.1f}, {layer['scorer_chained_us']:.1f} chained to itself)"
            )
        judged.append((r, figure, goal))
    figures = _by_shape(rows, lambda r: cells[id(r)])
    gaussian = _at_n(_judged(report.get("scorer", []), {"keys": "gaussian"}), n)
    if gaussian:
        figures += "; Gaussian keys " + _by_shape(gaussian, lambda r: f"{_of_gathered(r):.2f} at {_grid(r)}")
        judged += [(r, _of_gathered(r), _goal(r, large, small)) for r in gaussian]
    figures += _worst(judged) + _decode_room(report, rows, large, small)
    figures += _again(report.get("scorer", []), rows, lambda r: _goal(r, large, small))
    margin = min(figure - goal for _, figure, goal in judged)
    return _verdict(target, figures, margin >= 0, margin)


def _chained(report: dict, row: dict) -> dict | None:
    """The chained-layer row (``bench.layers.chained_section``) that stands beside scorer
    ``row``, with ``adds_us``: the layer less its other stages; None where none was timed."""
    for c in report.get("chained", []):
        if _point(c) == _point(row):
            return c | {"adds_us": c["layer_us"] - c["others_us"]}
    return None


def _decode_room(report: dict, rows: list[dict], large: float, small: float, probe: str = "none") -> str:
    """What the bench's no-decode probe (``decode: none``, the kernel with its decode
    replaced by moves; ``probe`` "e4m3-none": the E4M3 route's) says of the goal, as a
    figure's tail: at each grid it ran, its
    fraction of the gathered read and, against that grid's default row, the share of
    today's decode time the goal leaves (``_room``), or that the rest of the kernel (its
    loads, MMA and maxima) misses the goal by itself, so no decode can meet it in this
    kernel; "" where the run has no such probe."""
    probes = {_point(r): r for r in report.get("scorer", []) if r.get("variant") == {"decode": probe}}
    parts = []
    for default in rows:
        free = probes.get(_point(default))
        if free is None:
            continue
        least = _goal(default, large, small) * default["gathered_read"]
        room = _room(free, [default], least, "the rest of the kernel", "the decode")
        fraction = free["of_read_ceiling"] / default["gathered_read"]
        parts.append(f"{_shape(default['hs'], default['slots'])} {fraction:.2f} at {_grid(default)}{room}")
    return "; with no decode at all " + ", ".join(parts) if parts else ""


def _each_at_least(target: str, rows: list[dict], least: float, tail: str = "") -> dict:
    """Every row's fraction of its gathered read >= ``least``: the verdict, ``tail`` after
    its figures."""
    if not rows:
        return _verdict(target, "not measured (no such point in this grid)", None)
    judged = [(r, _of_gathered(r), least) for r in rows]
    figures = _by_shape(rows, lambda r: f"{_of_gathered(r):.2f} at {_grid(r)}") + _worst(judged) + tail
    margin = min(figure - least for _, figure, _ in judged)
    return _verdict(target, figures, margin >= 0, margin)


def _msa(report: dict, fmt: str, least: float) -> dict:
    """The MSA scorer on ``fmt`` keys: every shape's rows as fractions of their gathered
    read, each >= ``least``; where a shape misses, its ring alone (``_feed_room``)."""
    target = f"MSA scorer, {fmt} keys, >= {least:.2f} of the gathered read at every shape from {_tokens(JUDGED_FROM)}"
    rows = [r for r in _judged(report.get("msa_scorer", [])) if r["format"] == fmt]
    section = [r for r in report.get("msa_scorer", []) if r["format"] == fmt]
    return _each_at_least(
        target, rows, least, _feed_room(report, fmt, rows, least) + _again(section, rows, lambda r: least)
    )


def _again(section: list[dict], rows: list[dict], goal) -> str:
    """For the ``rows`` under their ``goal(row)`` that the ``section`` timed again at its
    end (the same launch, fresh tables), the figure again, as a tail: a first timing far
    under it is the run's order, not the kernel (bench/PERF.md, Leads). The verdict stays
    on the first."""
    again = {_point(r): r for r in section if r.get("variant") == {"again": True} and r.get("gathered_read")}
    parts = [
        f"{_shape(r['hs'], r['slots'])} {_of_gathered(again[_point(r)]):.2f} at {_grid(r)}"
        for r in rows
        if _of_gathered(r) < goal(r) and _point(r) in again
    ]
    return "; timed again at the section's end " + ", ".join(parts) if parts else ""


def _feed_room(report: dict, fmt: str, rows: list[dict], least: float) -> str:
    """What the MSA scorer's ring alone (``loads_only``: its copies and reads, no
    conversion, MMA or maxima) says of the goal, for the rows that miss it at the probe's
    grid, as a figure's tail: the ring's fraction of the gathered read and the share of the
    time the kernel's work adds that the goal leaves it (``_room``), or that the ring alone
    misses the goal; "" where no such row or probe is in the run."""
    parts = []
    for feed in report.get("msa_scorer", []):
        if feed["format"] != fmt or feed.get("variant") != {"loads_only": True}:
            continue
        default = [r for r in rows if _point(r) == _point(feed)]
        if not default:
            continue
        gathered = default[0]["gathered_read"]
        if default[0]["of_read_ceiling"] >= least * gathered:
            continue
        room = _room(feed, default, least * gathered, "the ring", "the kernel's work")
        fraction = feed["of_read_ceiling"] / gathered
        parts.append(f"{_shape(feed['hs'], feed['slots'])} {fraction:.2f} at {_grid(feed)}{room}")
    return "; its ring alone " + ", ".join(parts) if parts else ""


def _room(probe: dict, default: list[dict], least: float, rest: str, part: str) -> str:
    """A probe row's word on a goal ``least`` (a fraction of the ceiling): " (``rest``
    alone misses the goal)" where the probe — the kernel less ``part`` — falls short of it,
    else the share of the time ``part`` takes (the default row's time less the probe's, in
    units of bytes over the ceiling) that the goal leaves it, ``(1 / least - 1 / probe) /
    (1 / default - 1 / probe)``; "" without a default row slower than the probe; " (met
    with ``part`` as it is)" where the default row meets the goal already."""
    free = probe["of_read_ceiling"]
    if free < least:
        return f" ({rest} alone misses the goal)"
    if not default or default[0]["of_read_ceiling"] >= free:
        return ""
    if default[0]["of_read_ceiling"] >= least:
        return f" (met with {part} as it is)"
    spent = 1 / default[0]["of_read_ceiling"] - 1 / free
    return f" (the goal leaves {part} {(1 / least - 1 / free) / spent:.0%} of its time)"


def _parity(report: dict, n: int, least: float) -> dict:
    """NVFP4 pages a second over the FP8 scorer's blocks a second (the FP8 row's µs over
    the NVFP4 row's, same shape and grid), at N = ``n``: each >= ``least``."""
    target = f"NVFP4 pages a second >= {least:.2f}x the FP8 scorer's blocks at N {n}, from {_tokens(JUDGED_FROM)}"
    return _pages_over_blocks(target, report, _at_n(_judged(report.get("scorer", []), gathered=False), n), None, least)


def _pages_over_blocks(target: str, report: dict, rows: list[dict], variant: dict | None, least: float) -> dict:
    """Each NVFP4 row of ``rows`` against the FP8 MSA row of ``variant`` (None: the default
    rows) at its point: the FP8 row's µs over the NVFP4 row's, each >= ``least``."""
    fp8 = {
        _point(r): r
        for r in report.get("msa_scorer", [])
        if r["format"] == "fp8" and (r.get("variant") or None) == variant
    }
    pairs = [(r, fp8[_point(r)]["us"] / r["us"]) for r in rows if _point(r) in fp8]
    if not pairs:
        return _verdict(target, "not measured (no grid with both formats' rows)", None)
    ratio = {id(r): x for r, x in pairs}
    figures = _by_shape([r for r, _ in pairs], lambda r: f"{ratio[id(r)]:.2f}x at {_grid(r)}")
    figures += _worst([(r, x, least) for r, x in pairs], "x")
    margin = min(x for _, x in pairs) - least
    return _verdict(target, figures, margin >= 0, margin)


def _speedup(report: dict, context: int, least: float) -> dict:
    target = f"CP / stock >= {least}x per layer at {_context(context)}, batch {SPEEDUP_BATCH}, q 1"
    rows = _layers(report, context=context, batch=SPEEDUP_BATCH, query_len=1)
    if not rows:
        return _verdict(target, "not measured", None)
    if not _decodes_checked(report):
        return _verdict(target, "not reported: a decode failed its check in this run", False)
    speedup = rows[0]["stock_us"] / rows[0]["cp_us"]
    return _verdict(target, f"{speedup:.2f}x ({rows[0]['stock_us']:.1f} / {rows[0]['cp_us']:.1f} µs)", speedup >= least)


def _overhead(report: dict) -> dict:
    target = (
        f"CP overhead <= {OVERHEAD_US:.0f} µs at batch {OVERHEAD_BATCH}, q {OVERHEAD_QLEN}"
        " (by stage; by difference in brackets)"
    )
    rows = sorted(_layers(report, batch=OVERHEAD_BATCH, query_len=OVERHEAD_QLEN), key=lambda r: r["context"])
    if not rows:
        return _verdict(target, "not measured", None)
    figures = ", ".join(
        f"{_context(r['context'])} {r['cp_stages_us']:.1f} ({r['cp_us'] - r['cp_score_us']:.1f})" for r in rows
    )
    return _verdict(target, figures, all(r["cp_stages_us"] <= OVERHEAD_US for r in rows))


def _short_rows(report: dict) -> dict:
    target = f"rows of <= {SHORT_PAGES} pages: CP no slower than stock + {SHORT_US:.0f} µs"
    rows = [r for r in report.get("layers", []) if r["context"] <= SHORT_PAGES * PAGE]
    if not rows:
        return _verdict(target, "not measured", None)
    worst = max(rows, key=lambda r: r["cp_us"] - r["stock_us"])
    excess = worst["cp_us"] - worst["stock_us"]
    return _verdict(
        target,
        f"worst CP - stock {excess:+.1f} µs ({_context(worst['context'])}, batch {worst['batch']}, q "
        f"{worst['query_len']})",
        excess <= SHORT_US,
    )


def _top16(report: dict) -> dict:
    """Alone: the default split under PDL (as the decode launches it) against the Hs 1
    scorer of one request of TOP16_PAGES pages; in the layer: the stock decode's top-16
    stage against its scorer at batch 1, q 1. Met only where every measured one is."""
    target = f"stock top-16 <= {TOP16_SHARE:.0%} of the stock scorer at {TOP16_PAGES} pages (alone; in the layer)"
    shares = []
    select = [
        r
        for r in report.get("select", [])
        if r["pages"] == TOP16_PAGES and r["batch"] == 1 and r["default"] and r.get("pdl")
    ]
    scorer = _scorer_rows(report, context=TOP16_PAGES * PAGE, batch=1, hs=1, slots=8)
    if select and scorer:
        shares.append(("alone", select[0]["us"], scorer[0]["us"]))
    for r in _layers(report, context=TOP16_PAGES * PAGE, batch=1, query_len=1):
        shares.append(("in the layer", r["stock_top16_us"], r["stock_score_us"]))
    if not shares:
        return _verdict(target, "not measured", None)
    figures = "; ".join(
        f"{where} {top:.1f} / {scorer_us:.1f} µs = {top / scorer_us:.1%}" for where, top, scorer_us in shares
    )
    return _verdict(target, figures, all(top / scorer_us <= TOP16_SHARE for _, top, scorer_us in shares))


def _guard(report: dict) -> dict:
    """The block-id guard's cost: the guarded scorer against the same kernel without it
    (the bench's ``guard: False`` variant), same shape, same run — the guarded row timed
    beside it (``guard: True``), or where a report has none the grid's default row."""
    target = f"the block-id guard costs <= {GUARD_COST:.0%} of the scorer at 8 x 128K (Hs 1 and Hs 4, 8 slots)"
    rows = report.get("scorer", [])
    spans, met = [], True
    for hs in (1, 4):
        off, twin = (
            [r["us"] for r in rows if r.get("variant") == {"kernel": "wgmma", "guard": guarded} and r["hs"] == hs]
            for guarded in (False, True)
        )
        on = twin or [r["us"] for r in _scorer_rows(report, hs=hs, slots=8, context=131072, batch=8)]
        if off and on:
            cost = on[0] / off[0] - 1
            spans.append(f"Hs {hs} {cost:+.1%}")
            met = met and cost <= GUARD_COST
    if not spans:
        return _verdict(target, "not measured (no unguarded variant in this run)", None)
    return _verdict(target, ", ".join(spans), met)


def _e4m3_nvfp4(report: dict, n: int, least: float) -> dict:
    """The E4M3-MMA route's NVFP4 scorer at the MMA's N = ``n``: each row >= ``least`` of
    its gathered read."""
    target = f"E4M3-MMA route: NVFP4 scorer at N {n} >= {least:.2f} of the gathered read from {_tokens(JUDGED_FROM)}"
    rows = _at_n(_judged(report.get("scorer", []), E4M3), n)
    return _each_at_least(target, rows, least, _decode_room(report, rows, least, least, "e4m3-none"))


def _e4m3_msa(report: dict) -> dict:
    """The E4M3-MMA route's MSA scorer on FP8 keys: every shape >= E4M3_MSA_GOAL."""
    target = (
        f"E4M3-MMA route: MSA scorer, fp8 keys, >= {E4M3_MSA_GOAL:.2f} of the gathered read at every shape"
        f" from {_tokens(JUDGED_FROM)}"
    )
    rows = [r for r in _judged(report.get("msa_scorer", []), E4M3) if r["format"] == "fp8"]
    return _each_at_least(target, rows, E4M3_MSA_GOAL)


def _e4m3_parity(report: dict) -> dict:
    """The E4M3-MMA route's NVFP4 pages a second over its FP8 blocks a second, same shape
    and grid: each >= E4M3_PARITY."""
    target = f"E4M3-MMA route: NVFP4 pages a second >= {E4M3_PARITY:.2f}x its FP8 blocks at every N"
    return _pages_over_blocks(
        target, report, _judged(report.get("scorer", []), E4M3, gathered=False), E4M3, E4M3_PARITY
    )
