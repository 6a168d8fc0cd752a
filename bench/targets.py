"""The performance issue's targets, judged on one ``make bench`` report (``bench.suite``'s
dict): each target's figures in that run and whether they meet it. The bench prints the
verdicts last and stores them in results.json, so a run says for itself where it stands;
every ratio is taken within the one run (machines and runs differ by more than some
margins: bench/PERF.md)."""

from __future__ import annotations

from indexer_constants import PAGE

# The scorer: per shape (Hs, slots scored: a query_len), the least fraction of the streaming-
# read ceiling at every batch >= SCORER_BATCH with batch x context >= SCORER_FROM tokens ...
SCORER_GOALS = ((1, 8, 0.85), (4, 1, 0.85), (4, 4, 0.80), (4, 8, 0.70))
SCORER_FROM = 8 * 131072
SCORER_BATCH = 8
# ... and for one request of 1M tokens (a grid of one request: its waves), these shapes.
ONE_REQUEST_CONTEXT, ONE_REQUEST_GOAL = 1048576, 0.75
ONE_REQUEST_SHAPES = ((1, 8), (4, 1))
SPEEDUPS = ((1048576, 1.9), (131072, 1.7))  # (context, least CP / stock) at batch 32, q 1
SPEEDUP_BATCH = 32
OVERHEAD_US = 6.0  # the CP overhead (exchange + push + merge) at batch 64, q 4
OVERHEAD_BATCH, OVERHEAD_QLEN = 64, 4
SHORT_PAGES = 16  # contexts whose rows all hold at most this many pages ...
SHORT_US = 3.0  # ... where CP may be at most this much slower than stock
TOP16_PAGES = 8192  # the stock top-16 against the stock scorer at this many pages
TOP16_SHARE = 0.15
MSA_SCORER_GOAL = 0.90  # the BF16 / FP8 scorers (16 / 32 KB a block: no decode), every shape
GUARD_COST = 0.02  # the scorer's block-id guard: at most this share of its time (8 x 128K)


def judge(report: dict) -> list[dict]:
    """One dict per target: ``target`` (what the issue asks), ``figures`` (this run's
    numbers) and ``met`` (True, False, or None where the run did not measure it)."""
    return [
        *(_scorer(report, hs, slots, least) for hs, slots, least in SCORER_GOALS),
        _one_request(report),
        *(_speedup(report, c, least) for c, least in SPEEDUPS),
        _overhead(report),
        _short_rows(report),
        _top16(report),
        _guard(report),
        *(_msa_scorer(report, fmt) for fmt in ("fp8", "bf16")),
    ]


def _verdict(target: str, figures: str, met: bool | None) -> dict:
    return {"target": target, "figures": figures, "met": met}


def _context(tokens: int) -> str:
    """2048 -> '2K', 1048576 -> '1M'."""
    return f"{tokens >> 20}M" if tokens % (1 << 20) == 0 else f"{tokens >> 10}K"


def _layers(report: dict, **where) -> list[dict]:
    """The per-layer rows whose fields equal ``where``'s."""
    return [r for r in report.get("layers", []) if all(r[k] == v for k, v in where.items())]


def _scorer_rows(report: dict, **where) -> list[dict]:
    """The scorer grid's default rows (no tuning variant) whose fields equal ``where``'s."""
    return [r for r in report.get("scorer", []) if not r.get("variant") and all(r[k] == v for k, v in where.items())]


def _decodes_checked(report: dict) -> bool:
    """Both decodes matched the reference in this run (speedups count only then)."""
    return bool(report["checks"].get("cp")) and bool(report["checks"].get("stock"))


def _shape(hs: int, slots: int) -> str:
    return "Hs 1" if hs == 1 else f"Hs {hs} / {slots} slot{'s' if slots > 1 else ''}"


def _span(fractions: list[float]) -> str:
    low, high = f"{min(fractions):.2f}", f"{max(fractions):.2f}"
    return low + (f"-{high}" if high != low else "")


def _scorer(report: dict, hs: int, slots: int, least: float) -> dict:
    target = (
        f"scorer {_shape(hs, slots)} >= {least:.2f} of the read ceiling at batch >= {SCORER_BATCH},"
        f" batch x context >= 8 x 128K"
    )
    rows = [
        r
        for r in _scorer_rows(report, hs=hs, slots=slots)
        if r["batch"] >= SCORER_BATCH and r["batch"] * r["context"] >= SCORER_FROM
    ]
    if not rows:
        return _verdict(target, "not measured (no such point in this grid)", None)
    fractions = [r["of_read_ceiling"] for r in rows]
    figure = _span(fractions) + _same_bytes(rows) + _reach(rows, least) + _decode_room(report, hs, slots, least)
    return _verdict(target, figure, min(fractions) >= least)


def _decode_room(report: dict, hs: int, slots: int, least: float) -> str:
    """What the bench's no-decode probe (``decode: none``, the kernel with its decode
    replaced by moves) says of the goal, as a figure's tail: at each grid it ran, its
    fraction and, against that grid's default row, the share of today's decode time the goal
    leaves (``_room``), or that the rest of the kernel (its loads, MMA and maxima) misses the
    goal by itself, so no decode can meet it in this kernel; "" where the run has no such
    probe."""
    probes = [
        r
        for r in report.get("scorer", [])
        if r.get("variant") == {"decode": "none"} and r["hs"] == hs and r["slots"] == slots
    ]
    parts = []
    for free in sorted(probes, key=lambda r: (r["context"], r["batch"])):
        default = _scorer_rows(report, hs=hs, slots=slots, batch=free["batch"], context=free["context"])
        room = _room(free, default, least, "the rest of the kernel", "the decode")
        parts.append(f"{free['of_read_ceiling']:.3f} at {free['batch']} x {_context(free['context'])}{room}")
    return "; with no decode at all " + ", ".join(parts) if parts else ""


def _feed_room(report: dict, fmt: str, rows: list[dict]) -> str:
    """What the MSA scorer's ring alone (``loads_only``: its copies and reads, no
    conversion, MMA or maxima) says of the goal, for the shapes whose default row misses it
    at the probe's grid, as a figure's tail: the ring's fraction and the share of the time
    the kernel's work adds that the goal leaves it (``_room``), or that the ring alone misses
    the goal; "" where no such shape or probe is in the run."""
    parts = []
    for feed in report.get("msa_scorer", []):
        if feed["format"] != fmt or feed.get("variant") != {"loads_only": True}:
            continue
        where = (feed["hs"], feed["slots"], feed["batch"], feed["context"])
        default = [r for r in rows if (r["hs"], r["slots"], r["batch"], r["context"]) == where]
        if not default or default[0]["of_read_ceiling"] >= MSA_SCORER_GOAL:
            continue
        room = _room(feed, default, MSA_SCORER_GOAL, "the ring", "the kernel's work")
        grid = f"{feed['batch']} x {_context(feed['context'])}"
        parts.append(f"{_shape(feed['hs'], feed['slots'])} {feed['of_read_ceiling']:.3f} at {grid}{room}")
    return "; its ring alone " + ", ".join(parts) if parts else ""


def _room(probe: dict, default: list[dict], least: float, rest: str, part: str) -> str:
    """A probe row's word on a goal ``least``: " (``rest`` alone misses the goal)" where the
    probe — the kernel less ``part`` — falls short of it, else the share of the time ``part``
    takes (the default row's time less the probe's, in units of bytes over the ceiling) that
    the goal leaves it, ``(1 / least - 1 / probe) / (1 / default - 1 / probe)``; "" without a
    default row slower than the probe; " (met with ``part`` as it is)" where the default row
    meets the goal already."""
    free = probe["of_read_ceiling"]
    if free < least:
        return f" ({rest} alone misses the goal)"
    if not default or default[0]["of_read_ceiling"] >= free:
        return ""
    if default[0]["of_read_ceiling"] >= least:
        return f" (met with {part} as it is)"
    spent = 1 / default[0]["of_read_ceiling"] - 1 / free
    return f" (the goal leaves {part} {(1 / least - 1 / free) / spent:.0%} of its time)"


def _same_bytes(rows: list[dict]) -> str:
    """What bare reads of the judged rows' bytes reached (``bench.same_bytes_section``:
    streamed, and gathered a page at a time through shuffled tables as the scorers read
    them), and each row's fraction of the tighter one, as a figure's tail: the most a scorer
    of those sizes could show, and how near it the rows come; "" where unmeasured."""
    read = [r for r in rows if r.get("same_bytes_read", 0) > 0]
    if not read:
        return ""
    reads = _span([r["same_bytes_read"] for r in read])
    gathered = [r for r in read if r.get("gathered_read", 0) > 0]
    if not gathered:
        near = _span([r["of_read_ceiling"] / r["same_bytes_read"] for r in read])
        return f" (a bare read of the same bytes: {reads}; the rows reach {near} of it)"
    gath = _span([r["gathered_read"] for r in gathered])
    near = _span([r["of_read_ceiling"] / r["gathered_read"] for r in gathered])
    return (
        f" (a bare read of the same bytes: {reads}, of the same pages gathered: {gath};"
        f" the rows reach {near} of the gathered)"
    )


def _reach(rows: list[dict], least: float) -> str:
    """The grids (batch x context) where ``least`` sits above what a bare gather of the
    rows' pages reached (``gathered_read``: no kernel of that grid can meet the goal there),
    and how the rows of the other grids stand against it, as a figure's tail; "" where
    every grid is within reach or none was gathered."""
    gathered = {(r["batch"], r["context"]): r["gathered_read"] for r in rows if r.get("gathered_read", 0) > 0}
    out = {grid: g for grid, g in gathered.items() if g < least}
    if not out:
        return ""
    named = ", ".join(f"{b} x {_context(c)} (gathered {g:.3f})" for (b, c), g in sorted(out.items()))
    within = [r["of_read_ceiling"] for r in rows if (r["batch"], r["context"]) not in out]
    if not within:
        return f"; out of reach at {named}"
    return f"; out of reach at {named}; elsewhere {_span(within)}, {'met' if min(within) >= least else 'missed'}"


def _one_request(report: dict) -> dict:
    shapes = " and ".join(_shape(hs, slots) for hs, slots in ONE_REQUEST_SHAPES)
    context = _context(ONE_REQUEST_CONTEXT)
    target = f"scorer at batch 1 x {context} >= {ONE_REQUEST_GOAL:.2f} of the read ceiling ({shapes})"
    spans, met = [], True
    for hs, slots in ONE_REQUEST_SHAPES:
        rows = _scorer_rows(report, hs=hs, slots=slots, batch=1, context=ONE_REQUEST_CONTEXT)
        if rows:
            spans.append(f"{_shape(hs, slots)} {_span([r['of_read_ceiling'] for r in rows])}")
            met = met and min(r["of_read_ceiling"] for r in rows) >= ONE_REQUEST_GOAL
    if not spans:
        return _verdict(target, "not measured (no such point in this grid)", None)
    return _verdict(target, ", ".join(spans), met if len(spans) == len(ONE_REQUEST_SHAPES) else None)


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
    (the bench's ``guard: False`` variant), same shape, same run."""
    target = f"the block-id guard costs <= {GUARD_COST:.0%} of the scorer at 8 x 128K (Hs 1 and Hs 4, 8 slots)"
    rows = report.get("scorer", [])
    spans, met = [], True
    for hs in (1, 4):
        off = [r["us"] for r in rows if r.get("variant") == {"kernel": "wgmma", "guard": False} and r["hs"] == hs]
        on = [r["us"] for r in _scorer_rows(report, hs=hs, slots=8, context=131072, batch=8)]
        if off and on:
            cost = on[0] / off[0] - 1
            spans.append(f"Hs {hs} {cost:+.1%}")
            met = met and cost <= GUARD_COST
    if not spans:
        return _verdict(target, "not measured (no unguarded variant in this run)", None)
    return _verdict(target, ", ".join(spans), met)


def _msa_scorer(report: dict, fmt: str) -> dict:
    target = (
        f"MSA scorer, {fmt} keys, >= {MSA_SCORER_GOAL:.2f} of the read ceiling at batch >= {SCORER_BATCH},"
        f" batch x context >= 8 x 128K, every shape"
    )
    rows = [
        r
        for r in report.get("msa_scorer", [])
        if r["format"] == fmt
        and not r.get("variant")
        and r["batch"] >= SCORER_BATCH
        and r["batch"] * r["context"] >= SCORER_FROM
    ]
    if not rows:
        return _verdict(target, "not measured (no such point in this grid)", None)
    spans = ", ".join(
        f"{_shape(hs, slots)} {_span([r['of_read_ceiling'] for r in rows if (r['hs'], r['slots']) == (hs, slots)])}"
        for hs, slots in sorted({(r["hs"], r["slots"]) for r in rows})
    )
    return _verdict(
        target,
        spans + _same_bytes(rows) + _reach(rows, MSA_SCORER_GOAL) + _feed_room(report, fmt, rows),
        min(r["of_read_ceiling"] for r in rows) >= MSA_SCORER_GOAL,
    )
