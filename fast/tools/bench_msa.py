"""``make bench``'s rows for the BF16 / FP8 format (docs/DESIGN.md §10): the MSA scorer alone
on cold blocks, as read bandwidth and a fraction of the run's streaming-read ceiling, and
the stock MSA decode's stages; plus its correctness gate against the reference."""

from __future__ import annotations

import math

import torch

from indexer_constants import HEAD_DIM, PAGE, SLOTS

from ..msa_scorer import KEY_FORMATS, score_blocks
from ..msa_stock import MsaStockDecode
from .timing import FLUSH_BYTES, disjoint_tables, graph_time_us

# (Hs, slots scored) as the NVFP4 grid's: the stock rank's head, CP's four heads at q 8 and 1.
MSA_SHAPES = ((1, SLOTS), (4, SLOTS), (4, 1))
MSA_CONTEXTS = (131072, 1048576)  # tokens: where the scorer is the decode's time


def block_bytes(key_format: str) -> int:
    """Bytes of one 128-token block: 32 KB bf16, 16 KB fp8."""
    return PAGE * HEAD_DIM * KEY_FORMATS[key_format].itemsize


def random_keys(blocks: int, key_format: str, device) -> torch.Tensor:
    """[blocks, 128, 128] keys ~ N(0, 1) in the format, made on the device."""
    gen = torch.Generator(device=device).manual_seed(3)
    keys = torch.empty(blocks, PAGE, HEAD_DIM, device=device, dtype=torch.bfloat16)
    for start in range(0, blocks, 4096):  # in slices: one fp32 tensor of every key would not fit
        part = keys[start : start + 4096]
        part.copy_(torch.randn(part.shape, generator=gen, device=device))
    return keys.to(KEY_FORMATS[key_format])


def msa_scorer_section(
    device, contexts, batches, read_ceiling: float, gen, timer=graph_time_us, flush_bytes: int = FLUSH_BYTES
) -> list[dict]:
    """One row per (format, context, batch, shape): median µs of ``score_blocks`` over cold
    block sets (together more than ``flush_bytes``), read GB/s and the fraction of the
    ceiling. timer: ``graph_time_us`` or a stand-in (tests)."""
    rows = []
    for fmt in KEY_FORMATS:
        size = block_bytes(fmt)
        need = max(b * c // PAGE for c in contexts for b in batches)
        blocks = max(need, flush_bytes // size) + need  # at least two sets, or one past the flush size
        cache = random_keys(blocks, fmt, device)
        for ctx in contexts:
            pages = ctx // PAGE
            for batch in batches:
                per_set = batch * pages
                sets = max(1, min(64, math.ceil(flush_bytes / (per_set * size)), blocks // per_set))
                tables = disjoint_tables(batch, pages, sets, gen, device)
                lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
                for hs, slots in MSA_SHAPES:
                    tile = torch.randn(batch, SLOTS, hs, HEAD_DIM, generator=gen).to(KEY_FORMATS[fmt]).to(device)
                    out = torch.empty(batch, SLOTS * hs, pages, device=device)

                    def call(i, tile=tile, out=out, tables=tables, lens=lens, pages=pages, slots=slots, cache=cache):
                        score_blocks(tile, cache, tables[i], lens, out, num_pages=pages, first_slot=SLOTS - slots)

                    us = timer(call, len(tables))
                    gbps = per_set * size / us / 1e3
                    rows.append(
                        {
                            "format": fmt,
                            "context": ctx,
                            "batch": batch,
                            "hs": hs,
                            "slots": slots,
                            "us": us,
                            "GBps": gbps,
                            "of_read_ceiling": gbps / read_ceiling,
                        }
                    )
        del cache
        torch.cuda.empty_cache()
    return rows


def msa_stock_stages(
    device, contexts, batches, gen, query_len: int = 1, heads: int = 1, timer=graph_time_us
) -> list[dict]:
    """The stock MSA decode of one rank's head per layer, fp8 and bf16, forced windows 1 + 2:
    µs of the whole forward, of its scorer alone and of its select alone, each in a graph
    (warm cache: the shares CP's scorer split and its push / merge would change). timer: as
    ``msa_scorer_section``'s."""
    rows = []
    for fmt in KEY_FORMATS:
        for ctx in contexts:
            for batch in batches:
                pages = ctx // PAGE
                cache = random_keys(batch * pages, fmt, device)
                (table,) = disjoint_tables(batch, pages, 1, gen, device)
                lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
                q = torch.randn(batch * query_len, heads, HEAD_DIM, generator=gen).to(KEY_FORMATS[fmt]).to(device)
                sd = MsaStockDecode(
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
                        "forward_us": timer(forward, 1),
                        "score_us": timer(score, 1),
                        "select_us": timer(select, 1),
                    }
                )
                del cache
    torch.cuda.empty_cache()
    return rows


def check_msa(device=None) -> bool:
    """The stock MSA decode on ``device`` (default the first GPU) against the reference's
    oracle on exact-arithmetic inputs (long rows, q = 4, both formats): bit for bit."""
    from reference import msa

    from ..msa_stock import msa_stock_decode

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
        on = [x.to(device or torch.device("cuda", 0)) for x in case.args()[:4]]
        got = msa_stock_decode(*on, query_len=4, init_blocks=1, local_blocks=2)
        want = msa.full_decode(*case.args(), init_blocks=1, local_blocks=2)
        ok &= bool(torch.equal(got.cpu(), want))
    return ok


def print_msa(report: dict, file) -> None:
    """The MSA sections of the report, if measured."""
    if report.get("msa_scorer"):
        print("\nMSA scorer alone (bf16 / fp8 keys, cold L2): µs, read GB/s, fraction of the read ceiling", file=file)
        head = f"{'format':>6} {'context':>8} {'batch':>5} {'Hs':>3} {'slots':>5} {'µs':>9} {'GB/s':>7} {'frac':>5}"
        print(head, file=file)
        for r in report["msa_scorer"]:
            print(
                f"{r['format']:>6} {r['context']:>8} {r['batch']:>5} {r['hs']:>3} {r['slots']:>5} {r['us']:>9.1f} "
                f"{r['GBps']:>7.0f} {r['of_read_ceiling']:>5.2f}",
                file=file,
            )
    if report.get("msa_stock"):
        print("\nMSA stock decode, one head, q 1, warm: forward, scorer alone, select alone (graphs), µs", file=file)
        for r in report["msa_stock"]:
            stages = "  ".join(f"{k[:-3]} {v:.1f}" for k, v in r.items() if k.endswith("_us") and k != "forward_us")
            print(
                f"  {r['format']:>4} context {r['context']:>8} batch {r['batch']:>3}: forward {r['forward_us']:.1f}"
                f"  ({stages})",
                file=file,
            )
