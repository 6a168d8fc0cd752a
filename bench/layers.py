"""What each rank runs for the benchmark's layer section: the stock and CP layers, their
scorers, the stock top-16 and the CP stages, each as CUDA graphs of L and 2L layers."""

from __future__ import annotations

import sys

import torch

from fast.graphs import GraphedDecode
from fast.layout import HeadLayout
from fast.scorer import score_pages
from fast.symm import SingleRankSymmetric
from fast.tools.launcher import RankContext
from indexer_constants import PAGE, SLOTS

from .rendezvous import Rendezvous
from .stages import StagedCP, StagedStock
from .timing import FLUSH_BYTES, CachePool, random_tile

_START_SPIN_CYCLES = 1_000_000  # ~0.5 ms at 2 GHz: longer than a host takes to launch a graph
# The small grids (batch, context) where a scorer call's launch ramp and drain weigh most,
# and the CP steps' query lengths (the scorer's N 8, 16, 32 at four heads).
CHAINED_GRIDS = ((8, 131072), (1, 1048576))
CHAINED_QUERY_LENS = (1, 4, 8)


def bench_layers_on_rank(
    ctx,
    pages: int,
    batch: int,
    query_len: int,
    *,
    heads: int,
    layers: int,
    reps: int,
    stock_heads: int | None = None,
    paths: tuple = ("stock", "cp"),
) -> dict:
    """Per-layer µs on this rank's GPU for ``batch`` requests of ``pages`` full pages each:
    stock (tensor parallel: this rank's H / world heads over every page) and CP (all heads
    over 1 / world of the pages). Each path runs as two CUDA graphs of ``layers`` and
    ``2 * layers`` layers (distinct caches, one table), each replayed after a 256 MB L2 flush,
    a barrier, a fixed GPU spin and a rendezvous of the GPUs (the ranks start within a
    poll of each other: ``fast.rendezvous``); the per layer time is their difference over
    ``layers`` (``{path}_us``): what the first layer pays once per step (a rank's wait for
    the other's launch, what skew is left) cancels out; ``{path}_first_us`` is the short
    graph's time per layer, all of it included. Plus each path's scorer alone and the stock
    top-16 alone, by the same difference (so ``cp_us - cp_score_us`` compares the same
    layers: the second half of a long graph runs slower than the first at the largest
    sizes), and the CP layer's other stages without it (``cp_stages_us``:
    the overhead by stage), each graph's time the median of ``reps``. Every rank draws the
    same inputs. stock_heads: the stock layer's heads on this rank (default H / world, at
    least one); paths: the layers to time, of "stock" and "cp"."""
    import torch.distributed as dist

    dev = ctx.device
    need = batch * pages
    pool = ctx.state.get("pool")
    if pool is None or pool.pages < 2 * layers * need:
        ctx.state.pop("pool", None)
        torch.cuda.empty_cache()
        pool = ctx.state["pool"] = CachePool(2 * layers * need, dev)
        ctx.state["flush"] = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=dev)
    flush, token = ctx.state["flush"], torch.zeros(1, device=dev)
    if "rendezvous" not in ctx.state:
        ctx.state["rendezvous"] = Rendezvous(ctx.symm) if ctx.world > 1 else None
    meet = ctx.state["rendezvous"]
    caches = [pool.cache[i * need : (i + 1) * need] for i in range(2 * layers)]
    gen = torch.Generator().manual_seed(pages * 131 + batch * 7 + query_len)
    table = torch.randperm(need, generator=gen).view(batch, pages).to(torch.int32).to(dev)
    lens = torch.full((batch,), pages * 128, dtype=torch.int32, device=dev)
    q_all = (torch.randn(batch * query_len, heads, 128, generator=gen).clamp(-2, 2)).to(torch.float8_e4m3fn)

    def timed(run, per: int = layers) -> float:
        """Median µs of run() over ``per`` (layers)."""
        run()  # compiles, captures
        times = []
        for _ in range(reps):
            flush.zero_()
            if meet is not None:
                dist.all_reduce(token)
            # A fixed spin lets each host enqueue the graph before its GPU gets there; the
            # rendezvous after it starts the ranks' graphs within a poll of each other. The
            # spin alone leaves them tens of µs apart (GPUs leave the all-reduce together
            # but not the spin), which the first layer's exchange waits out and the
            # T(2L) - T(L) difference cancels only when both graphs drew the same skew.
            torch.cuda._sleep(_START_SPIN_CYCLES)
            if meet is not None:
                meet()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / per)
        if meet is not None:
            meet.check()
        return sorted(times)[len(times) // 2]

    def graphed(fn, *args):
        """fn(*args) captured in a CUDA graph (after one eager call); the replay function."""
        g = torch.cuda.CUDAGraph()
        fn(*args)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            fn(*args)
        return g.replay

    def per_layer(fn, *args) -> float:
        """µs per layer of fn(caches[:n], *args): (T(2 * layers) - T(layers)) / layers."""
        return timed(graphed(fn, caches[: 2 * layers], *args)) - timed(
            graphed(fn, caches[:layers], *args)
        )  # each / layers

    result = {}
    for path in paths:
        if path == "cp":
            decode = StagedCP(heads=heads, max_reqs=batch, symm=ctx.symm, pdl=True)
            mine = list(HeadLayout(ctx.world, heads).heads_of(ctx.rank))
        else:  # tensor parallel: H / world heads per rank (replicated when world > H)
            hr = stock_heads or max(1, heads // ctx.world)
            decode = StagedStock(heads=hr, max_reqs=batch, device=dev, pdl=True)
            mine = [(ctx.rank * hr + k) % heads for k in range(hr)]
        runs = {}
        for n in (layers, 2 * layers):
            g = GraphedDecode(
                decode, query_len=query_len, table_width=pages, k_caches=caches[:n], layers=n, sizes=(batch,)
            )
            s = g.prepare(table, lens, q_all[:, mine].to(dev))
            runs[n] = timed(lambda: g.replay(s), per=1)
        result[f"{path}_first_us"] = runs[layers] / layers
        result[f"{path}_us"] = (runs[2 * layers] - runs[layers]) / layers
        if path == "cp":
            tile = random_tile(batch, heads, gen, dev)
            result["cp_score_us"] = per_layer(
                _score_layers, tile, s.plan.block_table, s.plan.score_lens, s.plan.scores, query_len
            )
            result["cp_stages_us"] = per_layer(cp_stage_layers, decode, g.decode_layers, s, query_len)
        else:
            result["stock_score_us"] = per_layer(_score_layers, s.plan.tile, table, lens, s.plan.scores, query_len)
            result["stock_top16_us"] = per_layer(_select_layers, decode, s.plan, s.out[0], query_len)
    return result


def _score_layers(caches, tile, table, lens, scores, query_len: int) -> None:
    """The scorer once per layer cache, on the slots a step of query_len fills, as the
    decode runs it (the benchmark's scorer-alone graphs)."""
    for cache in caches:
        score_pages(tile, cache, table, lens, scores, first_slot=SLOTS - query_len)


def cp_stage_layers(caches, decode, cp_layers, s, query_len: int) -> None:
    """The CP layer's stages but its scorer — exchange, push, merge — once per layer cache
    (the caches only count the layers), on the scores the CP graphs left in ``s.plan``:
    the CP overhead by stage (the benchmark's ``cp_stages_us``), steady where the layer
    less its scorer swings by more than the overhead (1M). Every rank runs it alike."""
    for i, cache in enumerate(caches):
        decode.exchange(cp_layers[i], s.plan, s.index_q[i], query_len)
        decode.push(cp_layers[i], s.plan, query_len, num_blocks=cache.shape[0])
        decode.merge(cp_layers[i], s.plan, query_len, s.out[i], num_blocks=cache.shape[0])


def _select_layers(caches, decode, plan, out, query_len: int) -> None:
    """The stock top-16 stage once per layer cache (the benchmark's top-16-alone graphs; it
    reads the scores, not the caches)."""
    for cache in caches:
        decode.select(plan, out, query_len, num_blocks=cache.shape[0])


def chained_section(
    device, contexts, batches, heads: int, layers: int, reps: int = 15, grids=CHAINED_GRIDS
) -> list[dict]:
    """The scorer where a decode runs it, on one GPU at the small grids (the (batch,
    context) pairs of ``grids`` that ``contexts`` x ``batches`` holds): the CP layer of one
    rank (``heads`` heads, CP = 1: exchange, scorer, push, merge, chained by PDL) at each of
    ``CHAINED_QUERY_LENS``, and the stock layer of one head (scorer, top-16) at q 8, timed as
    ``bench_layers_on_rank`` times them. One row a layer: the scorer row it stands beside (``hs``, ``slots``,
    ``batch``, ``context``), ``layer_us`` (the layer), ``others_us`` (its stages but the
    scorer, chained alone) and ``scorer_chained_us`` (the scorer alone, chained to itself
    layer after layer); ``layer_us - others_us`` is what the scorer adds to the layer."""
    ctx = RankContext(rank=0, world=1, backend="cuda", device=device, symm=SingleRankSymmetric(device))
    rows = []
    for batch, context in grids:
        if context not in contexts or batch not in batches:
            continue
        for q in CHAINED_QUERY_LENS:
            paths = ("stock", "cp") if q == SLOTS else ("cp",)
            got = bench_layers_on_rank(
                ctx, context // PAGE, batch, q, heads=heads, layers=layers, reps=reps, stock_heads=1, paths=paths
            )
            where = {"context": context, "batch": batch, "query_len": q}
            rows.append(
                where
                | {"path": "cp", "hs": heads, "slots": q}
                | {"layer_us": got["cp_us"], "others_us": got["cp_stages_us"], "scorer_chained_us": got["cp_score_us"]}
            )
            if "stock" in paths:
                rows.append(
                    where
                    | {"path": "stock", "hs": 1, "slots": q, "layer_us": got["stock_us"]}
                    | {"others_us": got["stock_top16_us"], "scorer_chained_us": got["stock_score_us"]}
                )
    ctx.state.clear()
    torch.cuda.empty_cache()
    return rows


def print_chained(report: dict, file=sys.stdout) -> None:
    """``chained_section``'s rows as a table (nothing where the run has none)."""
    if not report.get("chained"):
        return
    print(
        "\nthe scorer in a PDL-chained layer, one GPU (CP = 1: exchange, scorer, push, merge; stock: scorer, "
        "top-16), µs per layer: the layer, its other stages alone, what the scorer adds (the difference), the "
        "scorer chained to itself",
        file=file,
    )
    print(
        f"{'context':>8} {'batch':>5} {'path':>5} {'Hs':>3} {'slots':>5} {'layer':>8} {'others':>7} {'adds':>7}"
        f" {'scorers':>8}",
        file=file,
    )
    for r in report["chained"]:
        print(
            f"{r['context']:>8} {r['batch']:>5} {r['path']:>5} {r['hs']:>3} {r['slots']:>5} {r['layer_us']:>8.1f} "
            f"{r['others_us']:>7.1f} {r['layer_us'] - r['others_us']:>7.1f} {r['scorer_chained_us']:>8.1f}",
            file=file,
        )
