"""``make bench``'s rows for the BF16 / FP8 format (docs/DESIGN.md §10): the MSA scorer alone
on cold blocks, as read bandwidth and a fraction of the run's streaming-read ceiling, and
the stock MSA decode's stages, a CP rank's layer against a stock rank's on one GPU; plus
the correctness gate against the reference."""

from __future__ import annotations

import math

import torch

from fast.msa.cp import MsaDecodeCP
from fast.msa.scorer import KEY_FORMATS, hopper_kernel, score_blocks
from fast.msa.stock import MsaStockDecode
from fast.route import device_route
from fast.scorer import mma_rows
from fast.symm import SingleRankSymmetric
from indexer_constants import HEAD_DIM, PAGE, SLOTS

from .stages import StagedMsaCP, StagedMsaStock
from .timing import FLUSH_BYTES, cold_time_us, disjoint_tables, graph_time_us, read_cell, variant_cell
from .variants import score_block_variant

# (Hs, slots scored): the stock rank's head, CP's four heads at q 8, 4 (speculative decoding)
# and 1.
MSA_SHAPES = ((1, SLOTS), (4, SLOTS), (4, 4), (4, 1))
MSA_CONTEXTS = (131072, 1048576)  # tokens: where the scorer is the decode's time
MSA_WINDOWS = {"init_blocks": 1, "local_blocks": 2}  # the benchmark's forced windows


def block_bytes(key_format: str) -> int:
    """Bytes of one 128-token block: 32 KB bf16, 16 KB fp8."""
    return PAGE * HEAD_DIM * KEY_FORMATS[key_format].itemsize


def random_keys(blocks: int, key_format: str, device) -> torch.Tensor:
    """[blocks, 128, 128] keys ~ N(0, 1) in the format (rounded through bf16), made on the
    device slice by slice straight into the cache (no bf16 copy of the whole cache)."""
    gen = torch.Generator(device=device).manual_seed(3)
    keys = torch.empty(blocks, PAGE, HEAD_DIM, device=device, dtype=KEY_FORMATS[key_format])
    for start in range(0, blocks, 4096):  # in slices: one fp32 tensor of every key would not fit
        part = keys[start : start + 4096]
        part.copy_(torch.randn(part.shape, generator=gen, device=device).to(torch.bfloat16))
    return keys


# msa_scorer_section's hot rows: at HOT_GRID (batch, context) every column one of HOT_BLOCKS
# blocks (1-2 MB: L2 serves them), the kernel's throughput without HBM beside the cold rows.
HOT_GRID = (32, 131072)
HOT_BLOCKS = 64


def msa_scorer_section(
    device,
    contexts,
    batches,
    read_ceiling: float,
    gen,
    timer=cold_time_us,
    flush_bytes: int = FLUSH_BYTES,
    hot_grid=HOT_GRID,
    formats=tuple(KEY_FORMATS),
) -> list[dict]:
    """One row per (format, context, batch, shape): median µs of ``score_blocks`` over cold
    block sets (together more than ``flush_bytes``), read GB/s and the fraction of the
    ceiling; then, per format and shape, a ``hot`` row at ``hot_grid`` (batch, context;
    ``variant``: the same call on HOT_BLOCKS blocks that L2 holds), a ``kernel=dot`` row at
    every cold grid (the portable route's ``tl.dot`` kernel beside the one the Hopper route
    picks, ``hopper_kernel``: the bench's own evidence for that choice) and, on GPUs, a
    ``loads_only`` row there for each shape the mma kernel scores (cold: its ring's copies,
    waits and read-back alone, ``score_blocks``' probe), and last the first cold grid's
    default rows timed ``again`` (fresh tables: what the section's order costs). A hot row far above its cold one
    says memory bounds the cold call; one near it, the kernel's own work; the loads-only row
    is what the ring itself reaches. timer: ``cold_time_us`` or a stand-in; hot_grid:
    smaller in tests; formats: KEY_FORMATS' names in the order timed (``bench.first_rows``
    times one alone). The last cache is left in PyTorch's cache: the caller hands it back."""
    rows = []
    for fmt in formats:
        rows += _format_rows(fmt, device, contexts, batches, read_ceiling, gen, timer, flush_bytes, hot_grid)
    return rows


def _format_rows(fmt, device, contexts, batches, read_ceiling, gen, timer, flush_bytes, hot_grid) -> list[dict]:
    """``msa_scorer_section``'s rows of one format. Its own function so that its cache, held
    by the timed calls' default arguments too, is freed to PyTorch's cache when it returns,
    before the next format's is made (a loop body's names outlive its iteration)."""
    rows = []
    size = block_bytes(fmt)
    grids = [(batch, ctx, {}) for ctx in contexts for batch in batches] + [(*hot_grid, {"hot": True})]
    # the portable route's kernel (fast.route) at every cold grid
    grids += [(batch, ctx, {"kernel": "dot"}) for ctx in contexts for batch in batches]
    grids += [(*hot_grid, {"loads_only": True})] if device.type == "cuda" else []
    # the E4M3-MMA route (DESIGN §4.1) at every cold grid, where the device runs it
    if fmt == "fp8" and device.type == "cuda" and device_route(device).e4m3_mma:
        grids += [(batch, ctx, {"mma": "e4m3"}) for ctx in contexts for batch in batches]
    # the first cold grid's default rows again, last: a row that reads slower first than
    # again says the run's order, not the kernel, cost it (bench/PERF.md, "Leads")
    grids += [(*grids[0][:2], {"again": True})]
    need = max(b * c // PAGE for b, c, variant in grids if not variant.get("hot"))  # cold blocks a set
    blocks = max(need, flush_bytes // size, HOT_BLOCKS) + need  # at least two sets, or one past the flush size
    cache = random_keys(blocks, fmt, device)
    for batch, ctx, variant in grids:
        pages = ctx // PAGE
        per_set = batch * pages
        if variant.get("hot"):
            tables = [torch.randint(0, HOT_BLOCKS, (batch, pages), generator=gen, dtype=torch.int32).to(device)]
        else:
            sets = max(1, min(64, math.ceil(flush_bytes / (per_set * size)), blocks // per_set))
            tables = disjoint_tables(batch, pages, sets, gen, device)
        lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
        # score_blocks' keywords (hot: the tables; again: the default launch)
        launch = {k: v for k, v in variant.items() if k not in ("hot", "again")}
        if launch.get("loads_only"):
            launch["kernel"] = "mma"  # the probe is the mma kernel's
        for hs, slots in MSA_SHAPES:
            if launch.get("loads_only") and hopper_kernel(KEY_FORMATS[fmt], mma_rows(hs * slots)) != "mma":
                continue
            tile = torch.randn(batch, SLOTS, hs, HEAD_DIM, generator=gen).to(KEY_FORMATS[fmt]).to(device)
            out = torch.empty(batch, SLOTS * hs, pages, device=device)

            def call(i, tile=tile, out=out, tables=tables, lens=lens, pages=pages, slots=slots, cache=cache, kw=launch):
                score_block_variant(tile, cache, tables[i], lens, out, num_pages=pages, first_slot=SLOTS - slots, **kw)

            us = timer(call, len(tables))
            gbps = per_set * size / us / 1e3
            row = {"format": fmt, "context": ctx, "batch": batch, "hs": hs, "slots": slots, "us": us}
            rows.append(
                row | {"GBps": gbps, "of_read_ceiling": gbps / read_ceiling} | ({"variant": variant} if variant else {})
            )
    return rows


FEED_GRID = (32, 131072)  # (batch, context) of msa_feed_section: where fp8 misses its goal at N 16 / 32
FEED_ROUNDS = 2  # interleaved rounds of each feed


def msa_feed_section(
    device, read_ceiling: float, gen, grid=FEED_GRID, timer=cold_time_us, flush_bytes: int = FLUSH_BYTES
) -> list[dict]:
    """The mma scorer's two ways into its ring in one run, at ``grid`` (batch, context):
    for each format and shape whose GPU kernel is the mma one (``hopper_kernel``), the
    fraction of the ceiling with tensor copies (the decode's feed) and with 1D bulk copies
    (a graph captured before a cache's first call), each the mean of FEED_ROUNDS rounds,
    interleaved. Empty off GPUs (the mma kernel is a GPU kernel)."""
    if device.type != "cuda":
        return []
    batch, ctx = grid
    pages = ctx // PAGE
    rows = []
    for fmt in KEY_FORMATS:
        dtype, size = KEY_FORMATS[fmt], block_bytes(fmt)
        sets = cold_sets(batch, pages, fmt, flush_bytes)
        cache = random_keys(sets * batch * pages, fmt, device)
        tables = disjoint_tables(batch, pages, sets, gen, device)
        lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
        for hs, slots in MSA_SHAPES:
            if hopper_kernel(dtype, mma_rows(hs * slots)) != "mma":
                continue
            tile = torch.randn(batch, SLOTS, hs, HEAD_DIM, generator=gen).to(dtype).to(device)
            out = torch.empty(batch, SLOTS * hs, pages, device=device)
            fraction = {True: 0.0, False: 0.0}
            for _ in range(FEED_ROUNDS):
                for tensor in (True, False):

                    def call(i, tensor=tensor, tile=tile, out=out, slots=slots, cache=cache):
                        score_block_variant(
                            tile,
                            cache,
                            tables[i],
                            lens,
                            out,
                            num_pages=pages,
                            first_slot=SLOTS - slots,
                            kernel="mma",
                            tensor_copies=tensor,
                        )

                    us = timer(call, len(tables))
                    fraction[tensor] += batch * pages * size / us / 1e3 / read_ceiling / FEED_ROUNDS
            rows.append(
                {"format": fmt, "context": ctx, "batch": batch, "hs": hs, "slots": slots}
                | {"tensor_copies": fraction[True], "copies_1d": fraction[False]}
            )
        del cache
        torch.cuda.empty_cache()
    return rows


CALLS = 8  # calls of a stage a graph (msa_stock_stages)


def msa_stock_stages(
    device, contexts, batches, gen, query_len: int = 1, heads: int = 1, timer=graph_time_us
) -> list[dict]:
    """The stock MSA decode of one rank's head per layer, fp8 and bf16, forced windows 1 + 2:
    µs of the whole forward, of its scorer alone and of its select alone, each a call of
    CALLS in a graph (warm cache: the shares CP's scorer split and its push / merge would
    change; CALLS a graph, as the NVFP4 select's section, so a graph's launch is not
    charged to a call). timer: ``graph_time_us`` or a stand-in."""
    rows = []
    for fmt in KEY_FORMATS:
        for ctx in contexts:
            for batch in batches:
                pages = ctx // PAGE
                cache = random_keys(batch * pages, fmt, device)
                (table,) = disjoint_tables(batch, pages, 1, gen, device)
                lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
                q = torch.randn(batch * query_len, heads, HEAD_DIM, generator=gen).to(KEY_FORMATS[fmt]).to(device)
                sd = StagedMsaStock(
                    heads=heads,
                    max_reqs=batch,
                    device=device,
                    key_format=fmt,
                    init_blocks=1,
                    local_blocks=2,
                    pdl=device.type == "cuda",
                )
                plan = sd.plan(table, lens)
                layer = sd.new_layer()
                out = torch.empty(batch * query_len, heads, 16, dtype=torch.int32, device=device)

                def forward(_, cache=cache):
                    sd.forward(layer, plan, q, cache, out, query_len)

                def score(_, cache=cache):
                    score_blocks(
                        plan.tile, cache, table, lens, plan.scores, num_pages=pages, first_slot=SLOTS - query_len
                    )

                def select(_, cache=cache):
                    sd.select(plan, out, query_len, num_blocks=cache.shape[0])

                rows.append(
                    {
                        "format": fmt,
                        "context": ctx,
                        "batch": batch,
                        "query_len": query_len,
                        "forward_us": timer(forward, CALLS),
                        "score_us": timer(score, CALLS),
                        "select_us": timer(select, CALLS),
                    }
                )
                del cache
    torch.cuda.empty_cache()
    return rows


def cold_sets(batch: int, pages: int, key_format: str, flush_bytes: int) -> int:
    """Disjoint block sets a timed graph cycles through so that each call reads cold blocks:
    together more than ``flush_bytes`` (at most 64)."""
    return max(1, min(64, math.ceil(flush_bytes / (batch * pages * block_bytes(key_format)))))


def msa_cp_vs_stock(
    device,
    contexts,
    batches,
    gen,
    cps=(4, 8),
    heads: int = 4,
    query_len: int = 1,
    timer=cold_time_us,
    flush_bytes: int = FLUSH_BYTES,
) -> list[dict]:
    """A CP rank's layer against a stock rank's on one GPU, per (format, context, batch,
    CP), cold blocks, µs per layer:

    - ``stock_us``: ``MsaStockDecode`` of a tensor-parallel rank's max(1, H / CP) heads over
      every block (plan included);
    - ``cp_us``: ``MsaDecodeCP`` of one rank alone (world 1) on a table of ``ceil(P / CP)``
      blocks, all H heads (plan included): what rank r of CP scores and pushes, but with no
      peer (its stores stay on this GPU; no spin waits on NVLink) and a merge of 16
      candidates, not CP x 16. ``cp_score_us``: its scorer alone.

    Ideal ``stock_us / cp_us`` is CP (1 / CP of the reads). Timing ranks that share one GPU
    would measure time slicing, not CP; this is the one-GPU estimate of the stages."""
    rows = []
    for fmt in KEY_FORMATS:
        dtype = KEY_FORMATS[fmt]
        # A CP rank reads 1 / CP of a set's blocks: the sets are counted on what it reads.
        sets_of = {
            (b, c, cp): cold_sets(b, -(-c // PAGE // cp), fmt, flush_bytes)
            for c in contexts
            for b in batches
            for cp in cps
        }
        blocks = max(b * (c // PAGE) * n for (b, c, _), n in sets_of.items())
        cache = random_keys(blocks, fmt, device)
        for ctx in contexts:
            pages = ctx // PAGE
            for batch in batches:
                lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
                q = torch.randn(batch * query_len, heads, HEAD_DIM, generator=gen).to(dtype).to(device)
                out = torch.empty(batch * query_len, heads, 16, dtype=torch.int32, device=device)
                for cp in cps:
                    sets = sets_of[(batch, ctx, cp)]
                    hr = max(1, heads // cp)
                    q_tp = q[:, :hr].contiguous()
                    out_tp = torch.empty(batch * query_len, hr, 16, dtype=torch.int32, device=device)
                    stock = MsaStockDecode(
                        heads=hr, max_reqs=batch, device=device, key_format=fmt, pdl=True, **MSA_WINDOWS
                    )
                    full = disjoint_tables(batch, pages, sets, gen, device)
                    width = -(-pages // cp)
                    mine = [t[:, :width].contiguous() for t in full]  # a rank's blocks: any 1 / CP of them
                    state = StagedMsaCP(
                        heads=heads,
                        max_reqs=batch,
                        symm=SingleRankSymmetric(device),
                        key_format=fmt,
                        pdl=True,
                        **MSA_WINDOWS,
                    )
                    layer = state.new_layer()

                    def stock_layer(i, stock=stock, full=full, q_tp=q_tp, out_tp=out_tp, cache=cache):
                        plan = stock.plan(full[i], lens)
                        stock.forward(stock.new_layer(), plan, q_tp, cache, out_tp, query_len)

                    def cp_layer(i, state=state, mine=mine, layer=layer, cache=cache):
                        state.forward(layer, state.plan(mine[i], lens), q, cache, out, query_len)

                    def cp_score(i, state=state, mine=mine, layer=layer, cache=cache):
                        state.score(layer, state.plan(mine[i], lens), query_len, k_cache=cache)

                    row = {"format": fmt, "context": ctx, "batch": batch, "cp": cp, "heads": heads}
                    row["stock_us"] = timer(stock_layer, sets)
                    row["cp_us"] = timer(cp_layer, sets)
                    row["cp_score_us"] = timer(cp_score, sets)
                    row["speedup"] = row["stock_us"] / row["cp_us"]
                    rows.append(row)
        del cache
        torch.cuda.empty_cache()
    return rows


def check_msa(device=None) -> bool:
    """The stock MSA decode and a one-rank MSA CP decode on ``device`` (default the first
    GPU) against the reference's oracle on exact-arithmetic inputs (long rows, q = 4, both
    formats): bit for bit."""
    from fast.msa.stock import msa_stock_decode
    from reference import msa

    device = device or torch.device("cuda", 0)
    ok = True
    for fmt in KEY_FORMATS:
        case = msa.make_case(
            2,
            [300 * 128 + 5, 70 * 128, 9 * 128 + 1],
            dtype=fmt,
            query_len=4,
            heads=4,
            pattern="late",
            init_blocks=1,
            local_blocks=2,
        )
        on = [x.to(device) for x in case.args()[:4]]
        got = msa_stock_decode(*on, query_len=4, init_blocks=1, local_blocks=2)
        want = msa.full_decode(*case.args(), init_blocks=1, local_blocks=2)
        ok &= bool(torch.equal(got.cpu(), want))
        state = MsaDecodeCP(
            heads=4, max_reqs=3, symm=SingleRankSymmetric(device), key_format=fmt, init_blocks=1, local_blocks=2
        )
        out = torch.full_like(got, -7)
        state.forward(state.new_layer(), state.plan(on[2], on[3]), on[0], on[1], out, 4)
        state.check()
        ok &= bool(torch.equal(out.cpu(), want))
    return ok


def print_msa(report: dict, file) -> None:
    """The MSA sections of the report, if measured."""
    if report.get("msa_scorer"):
        print(
            "\nMSA scorer alone (bf16 / fp8 keys, cold L2): µs, read GB/s, fraction of the read ceiling; read / gath: "
            "the fraction a bare read of the same bytes reaches, streamed / its blocks gathered through shuffled "
            "tables",
            file=file,
        )
        head = f"{'format':>6} {'context':>8} {'batch':>5} {'Hs':>3} {'slots':>5} {'µs':>9} {'GB/s':>7} {'frac':>5}"
        print(head + f" {'read':>5} {'gath':>5}  variant", file=file)
        for r in report["msa_scorer"]:
            print(
                f"{r['format']:>6} {r['context']:>8} {r['batch']:>5} {r['hs']:>3} {r['slots']:>5} {r['us']:>9.1f} "
                f"{r['GBps']:>7.0f} {r['of_read_ceiling']:>5.2f} {read_cell(r)} {read_cell(r, 'gathered_read')}  "
                + variant_cell(r),
                file=file,
            )
    if report.get("msa_feeds"):
        print(
            "\nMSA mma scorer's ring feeds (cold L2), fraction of the read ceiling: tensor copies (the decode's) and"
            " 1D bulk copies (a graph captured before a cache's first call)",
            file=file,
        )
        print(f"{'format':>6} {'context':>8} {'batch':>5} {'Hs':>3} {'slots':>5} {'tensor':>7} {'1d':>6}", file=file)
        for r in report["msa_feeds"]:
            print(
                f"{r['format']:>6} {r['context']:>8} {r['batch']:>5} {r['hs']:>3} {r['slots']:>5} "
                f"{r['tensor_copies']:>7.3f} {r['copies_1d']:>6.3f}",
                file=file,
            )
    if report.get("msa_cp"):
        print(
            "\nMSA CP rank vs stock rank on one GPU (cold, q 1, windows 1 + 2), µs per layer: stock = a TP rank's "
            "H / CP heads over every block; cp = one rank alone on 1 / CP of the blocks, all heads (no peer: no "
            "NVLink stores or waits, a merge of 16 candidates); ideal stock / cp = CP",
            file=file,
        )
        print(
            f"{'format':>6} {'context':>8} {'batch':>5} {'CP':>3} {'stock':>9} {'cp':>9} {'cp score':>9} {'st/cp':>6}",
            file=file,
        )
        for r in report["msa_cp"]:
            print(
                f"{r['format']:>6} {r['context']:>8} {r['batch']:>5} {r['cp']:>3} {r['stock_us']:>9.1f} "
                f"{r['cp_us']:>9.1f} {r['cp_score_us']:>9.1f} {r['speedup']:>6.2f}",
                file=file,
            )
    if report.get("msa_stock"):
        print(
            "\nMSA stock decode, one head, q 1, warm: forward, scorer alone, select alone"
            f" (µs a call, {CALLS} a graph)",
            file=file,
        )
        for r in report["msa_stock"]:
            stages = "  ".join(f"{k[:-3]} {v:.1f}" for k, v in r.items() if k.endswith("_us") and k != "forward_us")
            print(
                f"  {r['format']:>4} context {r['context']:>8} batch {r['batch']:>3}: forward {r['forward_us']:.1f}"
                f"  ({stages})",
                file=file,
            )
