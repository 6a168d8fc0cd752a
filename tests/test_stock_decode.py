"""The stock decode in one process: its top-16 on its own scores against the reference's stock
rule, split rows, and end to end."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
from bench.stages import StagedStock
from fast.select.policy import SelectShape, force_select
from fast.stock import StockDecode
from fuzz.strategies import DecodeConfig, decode_configs
from indexer_constants import PAGE
from reference.cases import EXACT_PATTERNS, make_case, seq_len_for
from reference.rules import own_pages
from reference.selection import select
from support import DEV, EDGE_ROW_LENS, POISON, id_bounds, on

EXACT = tuple(EXACT_PATTERNS)


def _stock_case(cfg: DecodeConfig, max_chunk: int, split: int | None = None):
    case = cfg.build()
    layout_heads = case.index_q.shape[1]
    sd = force_select(StockDecode(heads=layout_heads, max_reqs=max(1, len(cfg.seq_lens)), device=DEV), split=split)
    plan = sd.plan(on(case.block_table), on(case.seq_lens))
    sd.shape = SelectShape.for_width(sd.width, max_chunk)
    # Columns the scorer does not write keep this: the select loads whole rows before it
    # knows their lengths, and must drop them (in the range it would squeeze every key).
    plan.scores.fill_(POISON)
    out = on(torch.full((case.index_q.shape[0], layout_heads, 16), -7, dtype=torch.int32))
    sd.forward(sd.new_layer(), plan, on(case.index_q), on(case.k_cache), out, case.query_len)
    return case, sd, plan, out.cpu()


@pytest.mark.heavy
@settings(max_examples=20)
@given(decode_configs(max_pages=60), st.sampled_from([1024, 16]), st.sampled_from([1, 2, 4]))
def test_stock_topk_matches_reference_on_its_own_scores(cfg, max_chunk, split):
    """Selection exactly: the kernel's own scores through the reference's stock selection.
    max_chunk 16 forces the three-level select on rows longer than 16 pages (with split,
    on slices longer than 16); split > 1 splits each row over programs."""
    case, sd, plan, out = _stock_case(cfg, max_chunk, split)
    batch, q, heads = len(cfg.seq_lens), case.query_len, case.index_q.shape[1]
    width = min(case.block_table.shape[1], 8192)
    scores = plan.scores.cpu().view(batch, 8, heads, sd.width)[:, 8 - q :, :, :width]
    rows = scores.reshape(batch * q * heads, width)
    own = own_pages(case.seq_lens, q).repeat_interleave(heads)
    assert torch.equal(out.view(-1, 16), select(rows, own, width, key="stock"))


@pytest.mark.parametrize("split", [1, 2, 4])
def test_stock_select_by_hand_where_the_range_decides(split):
    """The fast stock select on ``RANGE_ROW`` (test_reference_selection): its range must
    span exactly the ranked columns, or 0.5 and 0.50001 fall into one bucket and columns 2
    and 3 swap. The unranked columns hold -100, 100, 0.75 and the poison past them."""
    from test_reference_selection import RANGE_OUT, RANGE_ROW

    width = 64
    sd = force_select(StagedStock(heads=1, max_reqs=1, device=DEV), split=split)
    plan = sd.plan(on(torch.zeros(1, width, dtype=torch.int32)), on(torch.tensor([16 * 128 + 1], dtype=torch.int32)))
    scores = torch.full((1, 8, width), POISON)
    scores[0, 7, : len(RANGE_ROW)] = torch.tensor(RANGE_ROW)
    plan.scores.copy_(on(scores))
    out = on(torch.full((1, 1, 16), -7, dtype=torch.int32))
    sd.select(plan, out, 1, num_blocks=1)
    assert out.cpu()[0, 0].tolist() == RANGE_OUT


@pytest.mark.parametrize("split", [2, 4])
def test_split_slices_longer_than_a_chunk_equal_the_reference(split):
    """Rows split over programs whose slices (96 columns rounded up to 128, over 2 or 4
    programs) are longer than a chunk of 16, so each slice takes the three levels and hands
    its keys on as the row's (its column numbers shifted by the slice's first): the stock
    rule on the same scores, deterministic (a hypothesis draw reaches this shape rarely)."""
    width, heads = 96, 2
    gen = torch.Generator().manual_seed(split)
    lens = torch.tensor([width * 128 + 5, 40 * 128 + 1, 17 * 128 + 9], dtype=torch.int32)
    sd = force_select(StagedStock(heads=heads, max_reqs=3, device=DEV), split=split)
    plan = sd.plan(on(torch.zeros(3, width, dtype=torch.int32)), on(lens))
    sd.shape = SelectShape.for_width(sd.width, 16)
    scores = torch.randn(plan.scores.shape, generator=gen)
    plan.scores.copy_(on(scores))
    out = on(torch.full((3, heads, 16), -7, dtype=torch.int32))
    sd.select(plan, out, 1, num_blocks=1)
    rows = scores.view(3, 8, heads, width)[:, 7].reshape(3 * heads, width)
    own = own_pages(lens, 1).repeat_interleave(heads)
    assert torch.equal(out.cpu().view(-1, 16), select(rows, own, width, key="stock"))


def test_split_stock_topk_rearms_and_repeats():
    """A split select leaves its slice counts at zero, so the next call (a graph replay)
    selects again — to the same pages as the unsplit select."""
    case = make_case(4, [seq_len_for(60, 5), seq_len_for(3, 0), seq_len_for(45, 1)], query_len=2, heads=2)
    outs = []
    for split in (1, 4):
        sd = force_select(StockDecode(heads=2, max_reqs=3, device=DEV), split=split)
        plan = sd.plan(on(case.block_table), on(case.seq_lens))
        for _ in range(2):
            out = on(torch.full((case.index_q.shape[0], 2, 16), -7, dtype=torch.int32))
            sd.forward(sd.new_layer(), plan, on(case.index_q), on(case.k_cache), out, case.query_len)
            outs.append(out.cpu())
            assert int(sd._counts.abs().sum()) == 0
    assert all(torch.equal(o, outs[0]) for o in outs)


@settings(max_examples=20)
@given(decode_configs(max_pages=60, patterns=EXACT))
def test_stock_equals_reference_end_to_end_on_exact_inputs(cfg):
    case, _, _, out = _stock_case(cfg, 1024)
    assert torch.equal(out, reference.stock_decode(*case.args()))


@pytest.mark.parametrize("pages", [-1, 0, 1, 23, 24, 25, 64])
def test_stock_plan_bounds_stop_at_the_table(pages):
    """The stock plan's id bounds (the guards' input) cover the columns a request reads and
    no more: a length past the table (P = 24 here) reads its P columns, never the next row's
    (every row's ids are its own, and rows follow in memory, so a bound that strays names a
    foreign id)."""
    batch, width = 3, 24
    rows = torch.arange((batch + 3) * width, dtype=torch.int32).view(batch + 3, width)
    table = on((rows * 7) % 97 + 1000 * torch.arange(batch + 3, dtype=torch.int32)[:, None])[:batch]
    seq = torch.tensor([pages * PAGE + 1, pages * PAGE, 5 * PAGE + 3], dtype=torch.int32)
    sd = StockDecode(heads=1, max_reqs=batch, device=DEV)
    plan = sd.plan(table, on(seq))
    assert torch.equal(plan.bounds.cpu(), id_bounds(table.cpu(), seq, width))


def test_rows_at_the_short_long_edge_equal_the_reference():
    """Short rows (written from their lengths) and long ones (selected) side by side, a
    request with one of each included (support.EDGE_ROW_LENS)."""
    case = make_case(17, EDGE_ROW_LENS, query_len=2, heads=2, pattern="exact")
    sd = StockDecode(heads=2, max_reqs=len(EDGE_ROW_LENS), device=DEV)
    out = on(torch.full((case.index_q.shape[0], 2, 16), -7, dtype=torch.int32))
    plan = sd.plan(on(case.block_table), on(case.seq_lens))
    sd.forward(sd.new_layer(), plan, on(case.index_q), on(case.k_cache), out, case.query_len)
    sd.check()
    assert torch.equal(out.cpu(), reference.stock_decode(*case.args()))
