"""Rank programs: what each rank runs for the CLI, the demo and the multi-rank tests, and
the parent-side assembly of the ranks' outputs into ``[rows, H, 16]``."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from indexer_constants import SLOTS

from .cp import IndexerDecodeCP, build_cp_decode
from .layout import HeadLayout
from .rendezvous import Rendezvous
from .stock import StockDecode


def _to(device, case: dict) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in case.items()}


def decode_on_rank(
    ctx,
    case: dict,
    path: str,
    *,
    steps: int = 1,
    spin_limit: int | None = None,
    max_chunk: int | None = None,
    split: int | None = None,
    skip_forward: bool = False,
    poison: bool = False,
    time_stages: bool = False,
    warmup: int = 0,
    pdl: bool = False,
) -> dict:
    """Run one decode case on this rank: ``path`` is "cp", "stock", or "auto" (CP where
    ``build_cp_decode`` allows it, else the stock decode with the reason logged).

    case: the CLI case dict (CPU tensors). Runs ``steps`` back-to-back forwards of one layer
    (nothing else synchronizes the ranks between them) and returns
    ``{"heads": [...], "out": int32 [rows, len(heads), 16] (last step), "all_equal": bool,
    "seconds": per-step wall time}``. ``skip_forward`` makes this rank plan but never call
    forward (the missing-peer test). ``poison`` fills the CP score buffer with 1e30 before
    every forward, so a read of a column the scorer did not write would rank first.
    ``time_stages`` adds ``"stages"``: CP stage seconds per step (plan included).
    ``warmup`` untimed steps run first (kernel compilation). ``pdl``: PDL launches (GPUs).
    ``max_chunk`` / ``split``: the top-16 select's (``IndexerDecodeCP``, ``StockDecode``).
    ``"path"`` in the result says which path ran.
    """
    c = _to(ctx.device, case)
    q, heads = c["index_q"], c["index_q"].shape[1]
    layout = HeadLayout(ctx.world, heads)
    owned = list(layout.heads_of(ctx.rank))
    rows = q.shape[0]
    batch = c["seq_lens"].shape[0]
    extra = {"split": split} | ({} if max_chunk is None else {"max_chunk": max_chunk})
    if path not in ("cp", "stock", "auto"):
        raise ValueError(f"path: expected 'cp', 'stock' or 'auto', got {path!r}")
    state = None
    if path == "auto":
        state = build_cp_decode(
            heads=heads, max_reqs=max(1, batch), max_query_len=c["query_len"], symm=ctx.symm, world=ctx.world,
            symm_reason=ctx.symm_reason, spin_limit=spin_limit, pdl=pdl, **extra,
        )  # fmt: skip
        path = "stock" if state is None else "cp"
    if path == "cp":
        state = state or IndexerDecodeCP(heads=heads, max_reqs=max(1, batch), symm=ctx.symm, spin_limit=spin_limit, pdl=pdl, **extra)
        layer = state.new_layer()
    else:
        state = StockDecode(heads=len(owned), max_reqs=max(1, batch), device=ctx.device, pdl=pdl, split=split)
    q_mine = q[:, owned].contiguous()
    outs = []
    stages: dict | None = None
    start = time.perf_counter()
    for step in range(warmup + steps):
        if step == warmup:
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
            stages = {} if time_stages else None
            start = time.perf_counter()
        out = torch.full((rows, len(owned), 16), -7, dtype=torch.int32, device=ctx.device)
        if path == "cp":
            t0 = time.perf_counter()
            plan = state.plan(c["block_table"], c["seq_lens"])
            if stages is not None:
                stages["plan"] = stages.get("plan", 0.0) + time.perf_counter() - t0
            if poison:
                plan.scores.fill_(1e30)
            if not skip_forward:
                state.forward(layer, plan, q_mine, c["k_cache"], out, c["query_len"], stage_times=stages)
        else:
            state.plan(c["block_table"], c["seq_lens"])
            state.forward(q_mine, c["k_cache"], out, c["query_len"])
        outs.append(out)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / max(1, steps)
    if path == "cp" and not skip_forward:
        state.check()
    last = outs[-1].cpu() if outs else None
    return {
        "path": path,
        "heads": owned,
        "out": last,
        "all_equal": all(torch.equal(o.cpu(), last) for o in outs),
        "seconds": seconds,
        "stages": {k: v / max(1, steps) for k, v in (stages or {}).items()},
    }


def changing_queries_on_rank(
    ctx, case: dict, short_lens: torch.Tensor, *, steps: int, seed: int, lag: dict | None = None, pdl: bool = False
) -> list[torch.Tensor]:
    """``steps`` back-to-back CP forwards of one layer with new queries every step (drawn
    from ``seed``, the same on every rank: ``step_queries``), on ``case``'s table; steps
    ``s`` with ``(s // 2) % 2 == 0`` use ``short_lens`` (int32 [B], every row short), the
    others the case's lengths. Returns this rank's outputs, int32 [rows, Hr, 16] per step.
    A step whose rows are all short re-arms its tile without waiting for anyone; the step
    two later uses the same buffer set with long rows, so a query store that landed after
    that re-arm would be scored as if fresh — repeating one query would hide it. ``lag``:
    seconds this rank sleeps before each step, by rank (a peer that falls behind)."""
    c = _to(ctx.device, case)
    heads = c["index_q"].shape[1]
    owned = list(HeadLayout(ctx.world, heads).heads_of(ctx.rank))
    state = IndexerDecodeCP(heads=heads, max_reqs=c["seq_lens"].shape[0], symm=ctx.symm, pdl=pdl)
    layer = state.new_layer()
    short = short_lens.to(ctx.device)
    outs = []
    for step, q in enumerate(step_queries(case["index_q"].shape, steps, seed)):
        time.sleep((lag or {}).get(ctx.rank, 0.0))
        out = torch.full((q.shape[0], len(owned), 16), -7, dtype=torch.int32, device=ctx.device)
        plan = state.plan(c["block_table"], short if (step // 2) % 2 == 0 else c["seq_lens"])
        state.forward(layer, plan, q[:, owned].contiguous().to(ctx.device), c["k_cache"], out, c["query_len"])
        outs.append(out)
    state.check()
    return [o.cpu() for o in outs]


def stages_after_forward_on_rank(ctx, case: dict, *, pdl: bool = False) -> list[dict]:
    """A CP forward of one layer, then its stages but the scorer (``_cp_stage_layers``: the
    benchmark's overhead by stage) twice on the scores it left; each run's ``{"heads",
    "out"}`` (int32 [rows, Hr, 16]), forward's first. The stages' runs land in the layer's
    other buffer set and then back in the forward's, so both sets' re-arms are checked."""
    c = _to(ctx.device, case)
    heads = c["index_q"].shape[1]
    owned = list(HeadLayout(ctx.world, heads).heads_of(ctx.rank))
    state = IndexerDecodeCP(heads=heads, max_reqs=c["seq_lens"].shape[0], symm=ctx.symm, pdl=pdl)
    layer = state.new_layer()
    plan = state.plan(c["block_table"], c["seq_lens"])
    q = c["index_q"][:, owned].contiguous()
    outs = [torch.full((q.shape[0], len(owned), 16), -7, dtype=torch.int32, device=ctx.device) for _ in range(3)]
    state.forward(layer, plan, q, c["k_cache"], outs[0], c["query_len"])
    for out in outs[1:]:
        _cp_stage_layers([None], state, [layer], SimpleNamespace(plan=plan, index_q=q[None], out=out[None]), c["query_len"])
    state.check()
    return [{"heads": owned, "out": o.cpu()} for o in outs]


def short_step_skipped_on_rank(ctx, case: dict, short_lens: torch.Tensor, *, skip_rank: int, pdl: bool = False) -> dict:
    """Three CP steps of one layer: the case's lengths, ``short_lens`` (int32 [B], every row
    short), the case's lengths again; rank ``skip_rank`` never calls the middle step's
    forward. A step without a long request waits for nobody and keeps the parity, so the
    other ranks finish it alone and every rank meets again in the third step. Returns
    ``{"heads", "outs": 3 x int32 [rows, Hr, 16] (None where skipped), "parity": the
    layer's parity after each step}``."""
    c = _to(ctx.device, case)
    heads = c["index_q"].shape[1]
    owned = list(HeadLayout(ctx.world, heads).heads_of(ctx.rank))
    state = IndexerDecodeCP(heads=heads, max_reqs=c["seq_lens"].shape[0], symm=ctx.symm, pdl=pdl)
    layer = state.new_layer()
    q = c["index_q"][:, owned].contiguous()
    outs, parity = [], []
    for step, lens in enumerate([c["seq_lens"], short_lens.to(ctx.device), c["seq_lens"]]):
        out = None
        if not (step == 1 and ctx.rank == skip_rank):
            out = torch.full((q.shape[0], len(owned), 16), -7, dtype=torch.int32, device=ctx.device)
            state.forward(layer, state.plan(c["block_table"], lens), q, c["k_cache"], out, c["query_len"])
            out = out.cpu()
        outs.append(out)
        parity.append(int(layer.parity.item()))
    state.check()
    return {"heads": owned, "outs": outs, "parity": parity}


def step_queries(shape, steps: int, seed: int) -> list[torch.Tensor]:
    """``exact_queries`` of ``shape``, one per step, drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return [exact_queries(shape, gen) for _ in range(steps)]


def exact_queries(shape, gen: torch.Generator) -> torch.Tensor:
    """float8_e4m3fn queries of ``shape`` with exact-arithmetic values (multiples of 0.5 in
    [-1, 1]: every summation order gives the same fp32 score)."""
    return (torch.randint(-2, 3, tuple(shape), generator=gen).float() * 0.5).to(torch.float8_e4m3fn)


def random_step(gen: torch.Generator, batch: int, pages: int, blocks: int, query_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode step's block table (int32 [batch, pages], distinct blocks per request out of
    ``blocks``) and lengths (int32 [batch]) covering every length class: the first rows at 0,
    16 and 15 pages (short, the 16-page switch), the rest up to 40 pages past the table."""
    table = torch.stack([torch.randperm(blocks, generator=gen)[:pages] for _ in range(batch)]).to(torch.int32)
    n_pages = torch.randint(0, pages + 40, (batch,), generator=gen)
    n_pages[: min(batch, 3)] = torch.tensor([0, 16, 15])[: min(batch, 3)]
    lens = (n_pages * 128 + 1 + torch.randint(0, 128, (batch,), generator=gen)).clamp(min=query_len).to(torch.int32)
    return table, lens


def assemble(results: list[dict], heads: int) -> torch.Tensor:
    """Per-rank outputs -> int32 [rows, H, 16]; replicas of a head must agree exactly."""
    rows = results[0]["out"].shape[0]
    out = torch.full((rows, heads, 16), -7, dtype=torch.int32)
    seen: dict[int, torch.Tensor] = {}
    for rank, res in enumerate(results):
        for k, h in enumerate(res["heads"]):
            part = res["out"][:, k]
            if h in seen and not torch.equal(seen[h], part):
                raise RuntimeError(f"rank {rank}: head {h} differs from another replica's")
            seen[h] = part
            out[:, h] = part
    return out


def run_case(pool, case, path: str, **kwargs) -> torch.Tensor:
    """Run a ``reference.cases.Case`` on every rank of ``pool``; the assembled output."""
    results = pool.run(decode_on_rank, case.to_dict(), path, **kwargs)
    return assemble(results, case.index_q.shape[1])


def graph_replay_on_rank(ctx, *, steps: int, check_every: int, pdl: bool, seed: int = 0, heads: int = 4, query_len: int = 4, pages: int = 300) -> dict:
    """CP decode through ``GraphedDecode`` on this rank's GPU: ``steps`` back-to-back replays
    (nothing else synchronizes the ranks) with a new batch size (1..8, padded to 1/2/4/8),
    block table, lengths and queries every step, planned between replays. Every
    ``check_every`` steps and at the last, this rank's heads are compared with
    ``reference.full_decode``; a mismatch raises. Every rank draws the same steps (same seed).
    Returns ``{"checked": n, "graphs": capture sizes used}``."""
    import reference
    from reference.cases import make_case

    from .graphs import GraphedDecode

    gen = torch.Generator().manual_seed(seed)
    base = make_case(seed, [query_len] * 8, query_len=query_len, heads=heads, pattern="exact", table_width=pages, num_blocks=1024)
    k_cache = base.k_cache.to(ctx.device)
    owned = list(HeadLayout(ctx.world, heads).heads_of(ctx.rank))
    state = IndexerDecodeCP(heads=heads, max_reqs=8, symm=ctx.symm, pdl=pdl)
    graphed = GraphedDecode(state, heads=len(owned), query_len=query_len, table_width=pages, k_caches=[k_cache], sizes=(1, 2, 4, 8))
    checked = 0
    for step in range(steps):
        batch = int(torch.randint(1, 9, (), generator=gen))
        table, lens = random_step(gen, batch, pages, k_cache.shape[0], query_len)
        q = exact_queries((batch * query_len, heads, 128), gen)
        out = graphed.step(table.to(ctx.device), lens.to(ctx.device), q[:, owned].to(ctx.device))
        if step % check_every == 0 or step == steps - 1:
            want = reference.full_decode(q, base.k_cache, table, lens, query_len)[:, owned]
            got = out[0].cpu()
            if not torch.equal(got, want):
                raise AssertionError(f"rank {ctx.rank} step {step} (batch {batch}): CP graph replay differs from the reference")
            checked += 1
    torch.cuda.synchronize()
    state.check()
    return {"checked": checked, "graphs": graphed.captured}


_START_SPIN_CYCLES = 1_000_000  # ~0.5 ms at 2 GHz: longer than a host takes to launch a graph


def bench_layers_on_rank(ctx, pages: int, batch: int, query_len: int, *, heads: int, layers: int, reps: int) -> dict:
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
    sizes, ~2.5% at 1M / 64), and the CP layer's other stages without it (``cp_stages_us``:
    the overhead by stage), each graph's time the median of ``reps``. Every rank draws the
    same inputs."""
    import torch.distributed as dist

    from .bench import FLUSH_BYTES, CachePool, random_tile
    from .graphs import GraphedDecode

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
            # spin alone left them ~30-80 µs apart in most replays (GPUs leave the all-reduce
            # together but not the spin), which the first layer's exchange waits out and the
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
        return timed(graphed(fn, caches[: 2 * layers], *args)) - timed(graphed(fn, caches[:layers], *args))  # each / layers

    result = {}
    for path in ("stock", "cp"):
        if path == "cp":
            layout = HeadLayout(ctx.world, heads)
            decode, hr, mine = IndexerDecodeCP(heads=heads, max_reqs=batch, symm=ctx.symm, pdl=True), layout.heads_per_rank, list(layout.heads_of(ctx.rank))
        else:  # tensor parallel: H / world heads per rank (replicated when world > H)
            hr = max(1, heads // ctx.world)
            decode, mine = StockDecode(heads=hr, max_reqs=batch, device=dev, pdl=True), [(ctx.rank * hr + k) % heads for k in range(hr)]
        runs = {}
        for n in (layers, 2 * layers):
            g = GraphedDecode(decode, heads=hr, query_len=query_len, table_width=pages, k_caches=caches[:n], layers=n, sizes=(batch,))
            s = g.prepare(table, lens, q_all[:, mine].to(dev))
            runs[n] = timed(lambda: g.replay(s), per=1)
        result[f"{path}_first_us"] = runs[layers] / layers
        result[f"{path}_us"] = (runs[2 * layers] - runs[layers]) / layers
        if path == "cp":
            tile = random_tile(batch, heads, gen, dev)
            result["cp_score_us"] = per_layer(_score_layers, tile, s.plan.block_table, s.plan.score_lens, s.plan.scores, query_len)
            result["cp_stages_us"] = per_layer(_cp_stage_layers, decode, g.cp_layers, s, query_len)
        else:
            tile, scores = decode._tiles[batch], decode._scores[batch]
            result["stock_score_us"] = per_layer(_score_layers, tile, table, lens, scores, query_len)
            result["stock_top16_us"] = per_layer(_select_layers, decode, s.out[0], query_len)
    return result


def _score_layers(caches, tile, table, lens, scores, query_len: int) -> None:
    """The scorer once per layer cache, on the slots a step of query_len fills, as the
    decode runs it (the benchmark's scorer-alone graphs)."""
    from .scorer import score_pages

    for cache in caches:
        score_pages(tile, cache, table, lens, scores, first_slot=SLOTS - query_len)


def _cp_stage_layers(caches, decode, cp_layers, s, query_len: int) -> None:
    """The CP layer's stages but its scorer — exchange, push, merge — once per layer cache
    (the caches only count the layers), on the scores the CP graphs left in ``s.plan``:
    the CP overhead by stage (the benchmark's ``cp_stages_us``), steady where the layer
    less its scorer swings by more than the overhead (1M). Every rank runs it alike."""
    for i in range(len(caches)):
        decode.exchange(cp_layers[i], s.plan, s.index_q[i], query_len)
        decode.push(cp_layers[i], s.plan, query_len)
        decode.merge(cp_layers[i], s.plan, query_len, s.out[i])


def _select_layers(caches, decode, out, query_len: int) -> None:
    """The stock top-16 stage once per layer cache (the benchmark's top-16-alone graphs; it
    reads the scores, not the caches)."""
    for _ in caches:
        decode.select(out, query_len)
