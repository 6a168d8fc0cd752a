"""``python -m bench`` (``make bench``): the performance evidence, measured in one run.

Prints a table (machine header first) and writes ``results.json`` and PNG plots under
``--out``. Sections:
1. ceilings: a large device-to-device copy and a read-only streaming kernel (GB/s);
2. the scorer alone, Hs = 1 (stock) and Hs = 4 (CP compact) on the whole 8-slot tile, and
   Hs = 4 on 4 slots and on one (query_len 4 and 1 steps: the MMA's N is 16 and 8), over contexts x
   batches, as read GB/s and as a fraction of the read ceiling; the table dequantization
   and the kernel's tuning variants at one size;
3. the stock top-16 alone (in and out of the layer) and the stock scorer alone (their
   ratio at 8192 pages); the CP push alone (its local top-16 and stores);
4. per layer, CUDA graphs, stock vs CP on the GPUs present (``world`` ranks), query_len 1
   and 4: µs, speedup, and the CP fixed overhead, by difference (CP layer minus its compact
   scorer alone) and by stage (the exchange, push and merge alone, in the same graphs).
   A layer's time is the difference of graphs of 2L and L layers over L: the first
   layer's wait for the slowest rank's launch, paid once per step, cancels (the L-layer
   graph's time per layer is reported too); the scorers and top-16 alone are timed the
   same way, so the overhead compares the same layers. Context 2048 is the short-rows
   case (every row <= 16 pages);
5. a plain PyTorch stock path (dequantize, matmul, max, topk): what a user would write;
6. the scorer where a decode runs it, at the small grids: one GPU's PDL-chained CP and
   stock layers, the layer's µs beside the scorer's (``bench.layers.chained_section``);
7. the performance issues' targets judged on this run's figures (``bench.targets``): each
   scorer row against the same run's gathered read of its pages.

Every timed input is cold in L2: scorer calls rotate over disjoint page sets of a multi-GB
cache (at least 16 calls a graph, ``timing.cold_time_us``; the bare reads beside them
alike), layer replays follow a 256 MB L2 flush. Correctness is checked first, at one size,
against the reference; a speedup is reported only for paths that passed in this run.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton

import reference
from fast.backend import p2p_gpus, sm_count
from fast.route import device_route
from fast.scorer import mma_rows
from fast.select.policy import force_select, select_split
from fast.symm import SingleRankSymmetric
from fast.tables import dequant_lut
from fast.tools.launcher import RankPool
from fast.tools.programs import run_case
from indexer_constants import MAX_PAGES, PAGE, PAGE_BYTES, SLOTS, SUPPORTED_CP, TOPK
from reference.cases import make_case
from reference.decode import query_tile
from reference.scores import fp32_order_bound

from .layers import bench_layers_on_rank, chained_section, print_chained
from .msa import (
    MSA_CONTEXTS,
    block_bytes,
    check_msa,
    msa_cp_vs_stock,
    msa_feed_section,
    msa_scorer_section,
    msa_stock_stages,
    print_msa,
)
from .stages import StagedCP, StagedStock
from .targets import NVFP4_GOALS, judge
from .timing import (
    FLUSH_BYTES,
    CachePool,
    ceilings,
    cold_time_us,
    gathered_read_GBps,
    gpu_state,
    gpu_state_line,
    graph_time_us,
    random_tile,
    read_cell,
    same_bytes_read_GBps,
    variant_cell,
)
from .variants import probe_runs, score_variant

CONTEXTS = (2048, 8192, 32768, 131072, 524288, 1048576)  # tokens; 2048: every row <= 16 pages
BATCHES = (1, 8, 32, 64)
QUICK_CONTEXTS = (2048, 131072, 1048576)
QUICK_BATCHES = (1, 32)
HEADS = 4
LAYERS = 4  # layers per captured graph (distinct caches, as a model's layers have)


def progress(items, desc: str):
    """A progress bar on stderr where tqdm is installed, else the plain iterable."""
    try:
        from tqdm import tqdm

        return tqdm(items, desc=desc, file=sys.stderr, leave=False)
    except ImportError:
        return items


def source_commit(root: str | None = None) -> str:
    """The report header's commit: BENCH_COMMIT where set, else git's short HEAD of the tree
    at ``root`` (default: the one holding this package) with "+dirty" where tracked files
    differ from it — numbers of uncommitted code must not carry a clean commit's name —
    or "unknown" without git."""
    if commit := os.environ.get("BENCH_COMMIT"):
        return commit
    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, check=True).stdout.strip()

    try:
        return git("rev-parse", "--short", "HEAD") + (
            "+dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_header() -> dict:
    """The report's first line: GPU (name, count, SMs, memory), torch, triton, the source
    commit (``+dirty`` for a changed tree) and the date."""
    commit = source_commit()
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "gpus": torch.cuda.device_count(),
        "sms": props.multi_processor_count,
        "memory_gib": round(props.total_memory / 2**30),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


# the NVFP4 section's cache pool: the largest grid's pages and spare (``bench.first_rows`` too)
POOL_PAGES = max(BATCHES) * max(CONTEXTS) // PAGE + 1024


def scorer_operands(pool: CachePool, batch: int, pages: int, hs: int, gen, hot: bool = False) -> dict:
    """A scorer row's operands by name, in the order they are made: ``tables`` (int32
    [batch, pages] a cold set, together past FLUSH_BYTES; hot: every id 0), ``tile`` (e4m3
    [batch, 8, hs, 128]), ``lens`` (int32 [batch]) and ``out`` (fp32 [batch, 8 hs, pages])
    (``scorer_us`` and ``bench.first_rows`` time rows on them)."""
    device = pool.device
    tables = pool.tables(batch, pages, min(math.ceil(FLUSH_BYTES / (batch * pages * PAGE_BYTES)), 64), gen)
    if hot:
        tables = [torch.zeros_like(t) for t in tables]
    tile = random_tile(batch, hs, gen, device)
    lens = torch.full((batch,), pages * PAGE + 1, dtype=torch.int32, device=device)
    out = torch.empty(batch, SLOTS * hs, pages, device=device)
    return {"tables": tables, "tile": tile, "lens": lens, "out": out}


def scorer_us(pool: CachePool, batch: int, pages: int, hs: int, gen, hot: bool = False, **variant) -> float:
    """Median µs of one scorer call on ``batch`` rows of ``pages`` cold pages each (hot: every
    column one page, which L1 / L2 serve: the kernel without HBM); variant:
    ``scorer_variants.variant_launch`` keywords (kernel, pages_per_program, loads_only, ...)."""
    o = scorer_operands(pool, batch, pages, hs, gen, hot)
    tables = o["tables"]
    return cold_time_us(
        lambda i: score_variant(o["tile"], pool.cache, tables[i], o["lens"], o["out"], **variant), len(tables)
    )


def torch_stock_us(pool: CachePool, batch: int, pages: int, query_len: int, gen) -> float:
    """The plain PyTorch stock path a user would write: gather pages, dequantize through the
    table, matmul, max over tokens, mask, topk(15). One head (the TP rank's)."""
    device = pool.device
    lut = dequant_lut(str(device))
    table = pool.tables(batch, pages, 1, gen)[0].long()
    q = torch.randn(batch, query_len, 128, generator=gen).to(torch.float8_e4m3fn).to(device)
    own = torch.full((batch, query_len), pages, device=device)

    def run(_):
        raw = pool.cache.view(-1, PAGE_BYTES)[table]  # [B, P, 9216]
        codes = raw[..., : PAGE * 64].view(batch, pages, PAGE, 64).long()
        scales = (
            raw[..., PAGE * 64 :]
            .view(batch, pages, PAGE, 8, 1)
            .long()
            .expand(-1, -1, -1, -1, 8)
            .reshape(batch, pages, PAGE, 64)
        )
        k = torch.stack([lut[scales * 16 + (codes & 15)], lut[scales * 16 + (codes >> 4)]], -1).view(
            batch, pages, PAGE, 128
        )
        s = torch.einsum("bqd,bptd->bqpt", q.to(torch.float16), k).float().amax(-1)  # [B, q, P]
        s = s.masked_fill(torch.arange(pages, device=device) >= own[..., None], float("-inf"))
        return s.topk(15, dim=-1).indices

    return graph_time_us(run, 1, reps=5)


# (Hs, slots scored): the stock rank's head and the CP rank's four on the whole tile (the
# contract's worst case), and the four on a query_len 4 step's four slots (speculative
# decoding) and on a query_len 1 step's one slot (what CP runs at q 1).
SCORER_SHAPES = ((1, SLOTS), (4, SLOTS), (4, 4), (4, 1))


# Versions for fast/PERF.md at one size (8 x 128K, Hs 1 and 4 on 8 slots): the table
# gather, the prmt kernel (tile staged through shared memory) at its default, the wgmma
# kernel's pages per program and blocks ahead (fed from registers), its feed at its own
# pages per program (registers, or 1-2 pages in its shared-memory ring: at 8 pages N 32's
# maxima leave no room for one), the scale table gathered from global memory instead of
# shared memory, the wgmma kernel without its register cap, and without its block-id
# guard (the guard's cost: the default row over this one, in the same run).
SCORER_VARIANTS = (
    [dict(kernel="table", pages_per_program=1), dict(kernel="prmt")]
    + [dict(kernel="wgmma", pages_per_program=v, blocks_ahead=a) for v, a in ((1, 1), (4, 1), (2, 2), (4, 2), (8, 2))]
    + [dict(kernel="wgmma", ring=r) for r in (0, 1, 2)]
    + [dict(kernel="wgmma", tables=False)]
    + [dict(kernel="wgmma", register_cap=None)]
    # the guard's cost from two rows timed side by side: the section's first row, the
    # grid's default, can read slow for the run's order alone (bench/PERF.md, Leads)
    + [dict(kernel="wgmma", guard=True), dict(kernel="wgmma", guard=False)]
)
# At N 8 (Hs 1) beside them: the E4M3 route's own launch (a cap of 64 registers, 8 partial
# maxima: 8 programs an SM) and the same at the cap before, 80, with 32 partials (6-7): what
# the cap buys that route. The exact route's is the register_cap=None row above (the
# compiler's own 80).
N8_VARIANTS = (dict(decode="e4m3"), dict(decode="e4m3", register_cap=80, partials=32))


def scorer_section(pool: CachePool, contexts, batches, read_ceiling: float, gen) -> list[dict]:
    """The NVFP4 scorer's rows: every (context, batch, shape) cold, by the Hopper route's
    kernel and the portable route's (``variant`` {"route": "portable"}), the variants at 8 x 128K,
    Gaussian keys at batch 32, ``hot`` / ``loads_only`` and the decode probes at 32 x 128K,
    the no-decode probe at 8 x 1M too (where the grid has them), the E4M3-MMA route at
    every grid, and last the first grid's default rows timed ``again``; each row's µs, read
    GB/s and fraction of ``read_ceiling``."""
    rows = []

    def measure(
        cache: CachePool,
        ctx: int,
        batch: int,
        hs: int,
        slots: int,
        variant: dict | None = None,
        label: dict | None = None,
    ) -> None:
        """One row: ``scorer_us`` with ``variant``'s keywords (none: the default) and its read
        bandwidth as a fraction of the ceiling; the row's "variant" is ``label`` or
        ``variant`` (a default row has none)."""
        us = scorer_us(cache, batch, ctx // PAGE, hs, gen, first_slot=SLOTS - slots, **(variant or {}))
        gbps = batch * (ctx // PAGE) * PAGE_BYTES / us / 1e3
        row = {
            "context": ctx,
            "batch": batch,
            "hs": hs,
            "slots": slots,
            "us": us,
            "GBps": gbps,
            "of_read_ceiling": gbps / read_ceiling,
        }
        if label or variant:
            row["variant"] = label or variant
        rows.append(row)

    # The E4M3-MMA route (DESIGN §4.1: the wgmma kernel's E4M3 decode) at every grid, tried
    # in a child first: wgmma at N 8 faulted once in an early Triton scorer
    e4m3 = probe_runs("e4m3", SCORER_SHAPES)
    if not e4m3:
        print("the E4M3-MMA route failed in a child process: its rows are left out", file=sys.stderr)
    grid = [(c, b, hs, q) for c in contexts for b in batches for hs, q in SCORER_SHAPES]
    for ctx, batch, hs, q in progress(grid, "scorer"):
        measure(pool, ctx, batch, hs, q)
        # the portable route's scorer (fast.route: every GPU but sm_90) beside it, same grid
        measure(pool, ctx, batch, hs, q, dict(kernel="table"), label={"route": "portable"})
        if e4m3:
            measure(pool, ctx, batch, hs, q, dict(decode="e4m3"), label={"mma": "e4m3"})
    for hs in (1, 4):
        n8 = [v for v in N8_VARIANTS if e4m3 or "decode" not in v] if hs == 1 else []
        for variant in (*SCORER_VARIANTS, *n8):
            measure(pool, 131072, 8, hs, SLOTS, variant)
    # The same calls on a cache of quantized Gaussian keys: the scale bytes of a real cache
    # cluster, and the kernel's per-group table gathers then touch fewer distinct lines
    # than random bytes' do.
    real = CachePool(32 * 8192 + 1024, pool.device, keys="gaussian")
    for ctx in (131072, 1048576):
        for hs, q in SCORER_SHAPES:
            measure(real, ctx, 32, hs, q, label={"keys": "gaussian"})
    del real
    # What bounds the default kernel (32 x 128K): the same call on one page that L1 / L2
    # serve (its decode and MMA without HBM), and its loads alone (no decode, no MMA). A hot
    # time near the cold one and a loads-only one near the ceiling say compute, not memory;
    # the decode without its sign step (a third of its ALU work, scores of |k|) says what a
    # cheaper exact decode would be worth, and the kernel with no decode at all what a free
    # one would: the most a decode leaves the scorer.
    # The E4M3 route's no-decode probe beside them (where the route ran), for its goals.
    free = (dict(decode="none"),) + ((dict(decode="e4m3-none"),) if e4m3 else ())
    probes = (dict(hot=True), dict(loads_only=True), dict(decode="signless"), *free)
    for hs, q in SCORER_SHAPES:
        for variant in probes:
            measure(pool, 131072, 32, hs, q, variant)
    # The no-decode probes on a large grid as well, where the goals are within a bare read's
    # reach: the targets weigh each goal against them at both grids.
    if 1048576 in contexts and 8 in batches:
        for hs, q in SCORER_SHAPES:
            for variant in free:
                measure(pool, 1048576, 8, hs, q, variant)
    # The first grid's default rows again, last (fresh tables): a row that reads slower
    # first than again says the run's order cost it, not the kernel (bench/PERF.md, Leads)
    for hs, q in SCORER_SHAPES:
        measure(pool, contexts[0], batches[0], hs, q, label={"again": True})
    return rows


def same_bytes_section(report: dict, device, timer=cold_time_us, flush_bytes: int = FLUSH_BYTES) -> None:
    """Give every scorer row (NVFP4 and MSA) two bare reads of its bytes, as fractions of the
    ceiling in the same timing: ``same_bytes_read``, streamed (``timing.same_bytes_read_GBps``:
    a small grid's launch, ramp and last wave), and ``gathered_read``, its pages fetched
    through shuffled tables as the scorer fetches them (``timing.gathered_read_GBps``: the
    scattered pages' DRAM cost besides). A scorer of that size can reach no more than the
    streamed read, and no more than the gathered one without changing where its pages lie:
    the ceiling is a 4 GiB read. The report gets ``same_bytes_reads`` (bytes, GB/s) and
    ``gathered_reads`` (batch, pages, page bytes, GB/s). timer / flush_bytes: both reads'
    (tests pass stand-ins)."""
    rows = [(r, PAGE_BYTES) for r in report["scorer"]]
    rows += [(r, block_bytes(r["format"])) for r in report.get("msa_scorer", [])]
    sizes = sorted({r["batch"] * (r["context"] // PAGE) * size for r, size in rows})
    reads = {n: same_bytes_read_GBps(device, n, flush_bytes, timer) for n in progress(sizes, "same-bytes reads")}
    report["same_bytes_reads"] = [{"bytes": n, "GBps": gbps} for n, gbps in reads.items()]
    shapes = sorted({(r["batch"], r["context"] // PAGE, size) for r, size in rows})
    gathered = {
        shape: gathered_read_GBps(device, *shape, flush_bytes=flush_bytes, timer=timer)
        for shape in progress(shapes, "gathered reads")
    }
    report["gathered_reads"] = [
        {"batch": b, "pages": p, "page_bytes": size, "GBps": gbps} for (b, p, size), gbps in gathered.items()
    ]
    ceiling = report["ceilings"]["stream_read_GBps"]
    for r, size in rows:
        r["same_bytes_read"] = reads[r["batch"] * (r["context"] // PAGE) * size] / ceiling
        r["gathered_read"] = gathered[(r["batch"], r["context"] // PAGE, size)] / ceiling


def select_section(device, gen) -> list[dict]:
    """Stock top-16 alone over rows of 2048 and 8192 random scores, 2 heads (TP = 2), hot in
    L2: the select's own time, with its rows split over programs as the decode does
    (``select.policy.select_split``) and unsplit, each launched plainly; and the default
    split once more under PDL, as the decode launches it (after the scorer, its launch
    hidden: the layer's stock top-16 stage)."""
    rows = []
    for pages, batch in progress([(p, b) for p in (2048, 8192) for b in (1, 8, 32)], "top-16"):
        split = select_split(batch * 2, pages, sm_count(str(device)))
        for s, pdl in [(split, False), (split, True)] + ([(1, False)] if split != 1 else []):
            decode = force_select(StagedStock(heads=2, max_reqs=batch, device=device, pdl=pdl), split=s)
            table = torch.zeros(batch, pages, dtype=torch.int32, device=device)
            plan = decode.plan(table, torch.full((batch,), pages * PAGE + 1, dtype=torch.int32, device=device))
            plan.scores.copy_(torch.randn(plan.scores.shape, generator=gen))
            out = torch.empty(batch, 2, 16, dtype=torch.int32, device=device)
            us = graph_time_us(lambda _: decode.select(plan, out, 1, num_blocks=1), 8)  # a table of page 0
            rows.append(
                {"pages": pages, "batch": batch, "heads": 2, "split": s, "default": s == split, "pdl": pdl, "us": us}
            )
    return rows


# (columns, batch, query_len) of the CP push alone: what a CP = 2 rank ranks at 128K, 512K, 1M
PUSH_SHAPES = ((512, 32, 1), (512, 64, 4), (2048, 64, 4), (4096, 32, 1), (4096, 64, 4))


def push_case(device, gen, columns: int, batch: int, pdl: bool = False):
    """(decode, layer, plan) for the push and merge alone: a CP = 1 decode of HEADS heads
    whose rows are all long, the last query's own page the last, so each ranks ``columns``
    - 1 pages of random scores (``plan.scores``: fp32 [batch, 8 * HEADS, columns + 1]);
    its kernels launched under PDL where ``pdl`` (GPUs)."""
    decode = StagedCP(heads=HEADS, max_reqs=batch, symm=SingleRankSymmetric(device), pdl=pdl)
    lens = torch.full((batch,), columns * PAGE, dtype=torch.int32, device=device)
    plan = decode.plan(torch.zeros(batch, columns, dtype=torch.int32, device=device), lens)
    plan.scores.copy_(torch.randn(plan.scores.shape, generator=gen))
    return decode, decode.new_layer(), plan


def push_section(device, gen, shapes=PUSH_SHAPES, timer=graph_time_us) -> list[dict]:
    """The CP push alone (``bench.stages.CPStages.push``) and the push and merge together,
    random scores hot in L2 (as the scorer leaves them), on one GPU (``push_case``): a
    CP = 1 decode whose rows rank as many columns as a CP = 2 rank's at twice the context —
    the push's work is its programs x columns, only where the keys go differs. The merge
    (the pair less the push) then selects each head's best of 16 candidates from one rank,
    not CP = 2's 32 from two, and polls nothing in flight over NVLink. µs per call
    (``timer(fn, calls)``), launched plainly, then both once more under PDL, as the decode
    launches them (each launch hidden under the kernel before it; the merge polls while
    the push runs). With the push's programs, warps (``select.policy.push_warps``) and
    select shape (chunk, supers, per super, group)."""
    rows = []
    for columns, batch, q in progress(shapes, "push, merge"):
        decode, layer, plan = push_case(device, gen, columns, batch)
        split_plan = decode._split(batch * q)
        split, s = split_plan[0], split_plan[2]
        warps, keys = decode._push_plan(batch * q, split_plan)
        out = torch.empty(batch * q, HEADS, TOPK, dtype=torch.int32, device=device)

        def push_then_merge(d, layer, plan):
            d.push(layer, plan, q, num_blocks=1)  # push_case's table is all page 0
            d.merge(layer, plan, q, out, num_blocks=1)

        push_us = timer(lambda _: decode.push(layer, plan, q, num_blocks=1), 8)
        layer.recv.local.fill_(-1)  # the push alone leaves its keys: the merge re-arms them
        pair_us = timer(lambda _: push_then_merge(decode, layer, plan), 8)
        pdl_decode, pdl_layer, pdl_plan = push_case(device, gen, columns, batch, pdl=True)
        pdl_us = timer(lambda _: pdl_decode.push(pdl_layer, pdl_plan, q, num_blocks=1), 8)
        pdl_layer.recv.local.fill_(-1)
        pdl_pair_us = timer(lambda _: push_then_merge(pdl_decode, pdl_layer, pdl_plan), 8)
        rows.append(
            {
                "columns": columns,
                "batch": batch,
                "query_len": q,
                "programs": batch * q * HEADS * split,
                "split": split,
                "warps": warps,
                "warp_select": keys,
                "shape": [s.chunk, s.supers, s.per_super, s.group],
                "us": push_us,
                "push_merge_us": pair_us,
                "pdl_us": pdl_us,
                "pdl_push_merge_us": pdl_pair_us,
            }
        )
    return rows


def check_against_reference(pool_ranks) -> dict:
    """The correctness gate of this run: scorer within tolerance on random inputs, and CP and
    stock decode bit-exact on exact-arithmetic inputs (long rows, q = 4) on the ranks."""
    case = make_case(1, [3000 * 128 + 5, 700 * 128, 9 * 128 + 1], query_len=4, heads=HEADS, pattern="exact")
    return {
        "cp": bool(torch.equal(run_case(pool_ranks, case, "cp", poison=True), reference.full_decode(*case.args()))),
        "stock": bool(torch.equal(run_case(pool_ranks, case, "stock"), reference.stock_decode(*case.args()))),
    }


def check_scorer() -> bool:
    """Both GPU scorers (wgmma, prmt) vs the reference on random inputs, within the
    fp32-order bound."""
    case = make_case(5, [400 * 128 + 3, 51 * 128], query_len=8, heads=4, pattern="gaussian")
    tile = query_tile(case.index_q, 2, 8)
    want = torch.full((2, 32, case.block_table.shape[1]), 1e30)
    reference.score_pages(tile, case.k_cache, case.block_table, case.seq_lens, want)
    bound = fp32_order_bound(tile, case.k_cache, case.block_table)
    written = want != 1e30
    ok = True
    for kernel in ("wgmma", "prmt"):
        got = torch.full_like(want, 1e30).cuda()
        score_variant(
            tile.cuda(), case.k_cache.cuda(), case.block_table.cuda(), case.seq_lens.cuda(), got, kernel=kernel
        )
        got = got.cpu()
        ok &= bool(torch.equal(got != 1e30, written) and ((got - want).abs() <= bound)[written].all())
    return ok


def layer_section(world: int, contexts, batches, quick: bool) -> tuple[dict, list[dict]]:
    """Stock vs CP per layer on ``world`` GPU ranks (one process per GPU)."""
    grid = [(c, b, q) for c in contexts for b in batches for q in (1, 4)]
    with RankPool(world, "cuda") as ranks:
        checks = check_against_reference(ranks)
        rows = []
        for ctx, batch, q in progress(grid, f"layers (CP={world})"):
            res = ranks.run(
                bench_layers_on_rank,
                ctx // PAGE,
                batch,
                q,
                heads=HEADS,
                layers=LAYERS,
                reps=5 if quick else 15,
                timeout=900,
            )
            worst = {k: max(r[k] for r in res) for k in res[0]}
            rows.append({"context": ctx, "batch": batch, "query_len": q, **worst})
    return checks, rows


def print_report(report: dict, file=sys.stdout) -> None:
    """The report as text (``report.txt``): header, ceilings, every section's table, the
    targets' verdicts."""
    h = report["machine"]
    print(
        f"# {h['gpu']} x{h['gpus']} ({h['sms']} SMs, {h['memory_gib']} GiB) | torch {h['torch']} | triton "
        f"{h['triton']} | commit {h['commit']} | {h['date']}",
        file=file,
    )
    c = report["ceilings"]
    print(
        f"ceilings: copy {c['copy_read_plus_write_GBps']:.0f} GB/s (read+write), streaming read "
        f"{c['stream_read_GBps']:.0f} GB/s",
        file=file,
    )
    print(
        f"checks: scorer vs reference {'ok' if report['checks']['scorer'] else 'FAILED'}; "
        + ", ".join(f"{k} decode {'ok' if v else 'FAILED'}" for k, v in report["checks"].items() if k != "scorer"),
        file=file,
    )
    if line := gpu_state_line(report.get("gpu_state", [])):
        print(line, file=file)
    print(
        "\nscorer alone (cold L2): µs and read GB/s, fraction of the streaming-read ceiling; read / gath: the "
        "fraction a bare read of the same bytes reaches, streamed / its pages gathered through shuffled tables",
        file=file,
    )
    print(
        f"{'context':>8} {'batch':>5} {'Hs':>3} {'slots':>5} {'µs':>9} {'GB/s':>7} {'frac':>5} {'read':>5} {'gath':>5}"
        "  variant",
        file=file,
    )
    for r in report["scorer"]:
        print(
            f"{r['context']:>8} {r['batch']:>5} {r['hs']:>3} {r['slots']:>5} {r['us']:>9.1f} {r['GBps']:>7.0f} "
            f"{r['of_read_ceiling']:>5.2f} {read_cell(r)} {read_cell(r, 'gathered_read')}  {variant_cell(r)}",
            file=file,
        )
    print_msa(report, file)
    print_chained(report, file)
    if report.get("torch_stock"):
        print("\nplain PyTorch stock path (one head), µs", file=file)
        for r in report["torch_stock"]:
            print(f"  context {r['context']:>8} batch {r['batch']:>3} q {r['query_len']}: {r['us']:.0f}", file=file)
    if report.get("select"):
        print(
            "\nstock top-16 alone (2 heads, scores hot in L2), µs per call, by programs per row; 'PDL': launched as "
            "the decode does",
            file=file,
        )
        for r in report["select"]:
            note = "  (not the default)" if not r["default"] else "  (PDL)" if r.get("pdl") else ""
            print(
                f"  {r['pages']:>5} pages  batch {r['batch']:>3}  split {r['split']:>2}: {r['us']:.1f}{note}", file=file
            )
    if report.get("push"):
        print(
            f"\nCP push alone and push + merge ({HEADS} heads, scores hot in L2, CP = 1 on one GPU: the merge's 16 "
            "candidates a head from one rank), µs per call; 'PDL': launched as the decode does (the push alone, and "
            "the pair)",
            file=file,
        )
        for r in report["push"]:
            if r["columns"] <= r["shape"][0]:
                shape = "warp select" if r.get("warp_select") else "one chunk"
            else:  # two levels through the warp select (its keys: the groups'), or three
                shape = (
                    f"{r['warp_select']} groups, warp select"
                    if r.get("warp_select")
                    else "x".join(map(str, r["shape"][1:]))
                )
            print(
                f"  {r['columns']:>5} columns  batch {r['batch']:>3} q {r['query_len']}: {r['programs']:>5} programs, "
                f"{r['warps']} warps, {shape}: "
                f"push {r['us']:.1f} ({r['pdl_us']:.1f} PDL), + merge {r['push_merge_us']:.1f} "
                f"({r['pdl_push_merge_us']:.1f} PDL; "
                f"merge {r['push_merge_us'] - r['us']:.1f} by difference)",
                file=file,
            )
    if report.get("layers"):
        ok = report["checks"].get("cp") and report["checks"].get("stock")
        print(
            f"\nper layer in CUDA graphs, CP={report['world']} vs stock (TP={report['world']}, "
            f"{HEADS // report['world'] or 1} heads/rank), µs (max over ranks)",
            file=file,
        )
        print(
            f"{'context':>8} {'batch':>5} {'q':>2} {'stock':>9} {'cp':>9} {'speedup':>7} {'cp score':>9} "
            f"{'overhead':>8} {'stages':>7} {'st.score':>9} {'st.top16':>8} {'first st/cp':>13}",
            file=file,
        )
        print(
            f"  (per layer, every column but 'first': (T({2 * LAYERS} layers) - T({LAYERS} layers)) / {LAYERS}, each "
            "graph cold after a barrier, a GPU spin and a rendezvous of the GPUs that starts the ranks together; "
            "what the first layer pays once per step cancels;",
            file=file,
        )
        print(
            "   'overhead': cp - cp score; 'stages': the CP overhead by stage, a graph of the exchange, push and "
            "merge alone, on the scores the CP layers left;",
            file=file,
        )
        print(f"   'first': T({LAYERS} layers) / {LAYERS}, all included)", file=file)
        for r in report["layers"]:
            speed = f"{r['stock_us'] / r['cp_us']:.2f}x" if ok else "n/a"
            print(
                f"{r['context']:>8} {r['batch']:>5} {r['query_len']:>2} {r['stock_us']:>9.1f} {r['cp_us']:>9.1f} "
                f"{speed:>7} "
                f"{r['cp_score_us']:>9.1f} {r['cp_us'] - r['cp_score_us']:>8.1f} {r['cp_stages_us']:>7.1f} "
                f"{r['stock_score_us']:>9.1f} {r['stock_top16_us']:>8.1f} "
                f"{r['stock_first_us']:>6.1f}/{r['cp_first_us']:<6.1f}",
                file=file,
            )
    if report.get("targets"):
        print("\nthe performance issue's targets, this run (bench/targets.py)", file=file)
        for t in report["targets"]:
            verdict = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
            if t.get("noise"):  # the worst figure within targets.NOISE of its goal
                verdict = f"{verdict}, within noise"
            print(f"  [{verdict}] {t['target']}: {t['figures']}", file=file)


def plot(report: dict, out: Path) -> list[str]:
    """PNG plots next to results.json (skipped without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made = []
    fig, axes = plt.subplots(1, len(SCORER_SHAPES), figsize=(16, 4), sharey=True)
    for ax, (hs, q) in zip(axes, SCORER_SHAPES):
        for batch in sorted({r["batch"] for r in report["scorer"]}):
            pts = [
                (r["context"], r["of_read_ceiling"] / r["gathered_read"])
                for r in report["scorer"]
                if (r["hs"], r["slots"]) == (hs, q)
                and r["batch"] == batch
                and "variant" not in r
                and r.get("gathered_read", 0) > 0
            ]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"batch {batch}")
        goal = next(large for n, large, _ in NVFP4_GOALS if n == mma_rows(hs * q))
        ax.axhline(goal, color="gray", ls="--", lw=0.8)
        ax.set(
            xscale="log",
            title=f"scorer, Hs = {hs}, {q} slot{'s' if q > 1 else ''}",
            xlabel="context (tokens)",
            ylabel="fraction of the gathered read",
        )
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "scorer.png", dpi=120)
    made.append("scorer.png")
    if report.get("layers"):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        for ax, q in zip(axes, (1, 4)):
            for batch in sorted({r["batch"] for r in report["layers"]}):
                pts = [
                    (r["context"], r["stock_us"] / r["cp_us"])
                    for r in report["layers"]
                    if r["query_len"] == q and r["batch"] == batch
                ]
                ax.plot(*zip(*pts), marker="o", label=f"batch {batch}")
            ax.axhline(report["world"], color="gray", ls="--", lw=0.8)
            ax.set(
                xscale="log",
                title=f"CP={report['world']} speedup per layer, query_len {q}",
                xlabel="context (tokens)",
                ylabel="stock / CP time",
            )
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / "speedup.png", dpi=120)
        made.append("speedup.png")
    return made


def check_grid(contexts, batches, world: int | None) -> None:
    """``run_bench``'s own arguments, judged before anything is measured (a bad one would
    otherwise surface minutes in, after the ceilings): a ValueError naming the argument.
    contexts: tokens, positive multiples of PAGE up to the table's MAX_PAGES pages; batches:
    positive; world: a supported CP size."""
    for c in contexts or ():
        if not 0 < c <= MAX_PAGES * PAGE or c % PAGE:
            raise ValueError(f"contexts: {c} is not a multiple of {PAGE} tokens in 1..{MAX_PAGES * PAGE}")
    for b in batches or ():
        if b <= 0:
            raise ValueError(f"batches: {b} is not a batch size (1 or more)")
    if world is not None and world not in SUPPORTED_CP:
        raise ValueError(f"world: must be one of {SUPPORTED_CP}, got {world}")


def run_bench(
    out: str | None = None, quick: bool = False, world: int | None = None, contexts=None, batches=None
) -> int:
    """The whole benchmark; returns a process exit code (1 if a correctness check failed).
    Bad arguments raise ValueError (``check_grid``) first, on any machine."""
    check_grid(contexts, batches, world)
    if not torch.cuda.is_available():
        print("make bench needs a CUDA GPU; none is visible (nothing measured)")
        return 2
    route = device_route(torch.device("cuda", 0))
    if not route.sm90:  # the lab times the Hopper kernels and their variants beside the portable ones
        raise ValueError(f"device: make bench measures the Hopper route's kernels (sm_90); this is {route.device}")
    if world is not None and world > torch.cuda.device_count():
        raise ValueError(f"world: {world} ranks need {world} GPUs, {torch.cuda.device_count()} visible")
    out_dir = Path(out or f"results/bench-{time.strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)
    contexts = tuple(contexts or (QUICK_CONTEXTS if quick else CONTEXTS))
    batches = tuple(batches or (QUICK_BATCHES if quick else BATCHES))
    device = torch.device("cuda", 0)
    gen = torch.Generator().manual_seed(0)
    report: dict = {"machine": machine_header(), "quick": quick}
    report["ceilings"] = ceilings(device)
    report["gpu_state"] = [gpu_state("ceilings")]
    report["checks"] = {"scorer": check_scorer()}
    pool = CachePool(POOL_PAGES, device)
    report["scorer"] = scorer_section(pool, contexts, batches, report["ceilings"]["stream_read_GBps"], gen)
    report["gpu_state"].append(gpu_state("nvfp4 scorer"))
    report["torch_stock"] = [
        {"context": c, "batch": b, "query_len": 1, "us": torch_stock_us(pool, b, c // PAGE, 1, gen)}
        for c in contexts
        for b in batches
        if b * c // PAGE <= 8 * 8192
    ]
    report["select"] = select_section(device, gen)
    report["push"] = push_section(device, gen)
    del pool
    torch.cuda.empty_cache()
    report["checks"]["msa stock + one-rank cp"] = check_msa()
    msa_contexts = [c for c in contexts if c in MSA_CONTEXTS] or list(MSA_CONTEXTS[:1])
    msa_batches = [b for b in batches if b >= 8] or [8]
    read = report["ceilings"]["stream_read_GBps"]
    report["gpu_state"].append(gpu_state("select, push, msa checks"))
    report["msa_scorer"] = msa_scorer_section(device, msa_contexts, msa_batches, read, gen)
    torch.cuda.empty_cache()  # the section's last cache
    report["msa_feeds"] = msa_feed_section(device, read, gen)
    report["gpu_state"].append(gpu_state("msa scorer"))
    report["msa_stock"] = msa_stock_stages(device, msa_contexts, [1, 32], gen)
    report["msa_cp"] = msa_cp_vs_stock(device, msa_contexts, sorted({1, *msa_batches}), gen)
    same_bytes_section(report, device)
    report["chained"] = chained_section(device, contexts, batches, heads=HEADS, layers=LAYERS, reps=5 if quick else 15)
    report["gpu_state"].append(gpu_state("chained layers"))
    world = world or p2p_gpus()
    report["world"] = world
    if world >= 2:
        layer_checks, report["layers"] = layer_section(world, contexts, batches, quick)
        report["checks"].update(layer_checks)
    else:
        report["layers"] = []
        print("per-layer CP vs stock needs 2+ GPUs with P2P; skipped", file=sys.stderr)
    report["targets"] = judge(report)
    (out_dir / "results.json").write_text(json.dumps(report, indent=1))
    report["plots"] = plot(report, out_dir)
    print_report(report)
    with open(out_dir / "report.txt", "w") as f:
        print_report(report, f)
    print(f"\nwritten: {out_dir}/results.json, report.txt, {', '.join(report['plots'])}")
    return 0 if all(report["checks"].values()) else 1


def scorer_once(batch: int = 8, pages: int = 1024, hs: int = 1, calls: int = 3, **variant) -> None:
    """A few plain scorer launches on cold random pages, for a profiler to attach to
    (``ncu --kernel-name regex:score_kernel_wgmma python -c 'from bench.suite import
    scorer_once; scorer_once()'``); variant: ``scorer_variants.variant_launch`` keywords."""
    gen = torch.Generator().manual_seed(0)
    pool = CachePool(batch * pages * calls, torch.device("cuda", 0))
    tables = pool.tables(batch, pages, calls, gen)
    tile = random_tile(batch, hs, gen, pool.device)
    lens = torch.full((batch,), pages * PAGE + 1, dtype=torch.int32, device=pool.device)
    out = torch.empty(batch, SLOTS * hs, pages, device=pool.device)
    for table in tables:
        score_variant(tile, pool.cache, table, lens, out, **variant)
    torch.cuda.synchronize()
