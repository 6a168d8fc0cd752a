"""The Q8KV4 scorer contract (docs/DESIGN.md §4) as the reference implements it."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference import dequantize_nvfp4, score_pages
from reference.cases import make_case
from reference.decode import query_tile
from reference.scores import fp32_order_bound

POISON = 1e30  # any stray write changes it; any stray read would rank it first


def naive_scores(q_tile, k_cache, block_table):
    """Every column, float64 einsum over dequantized pages, rounded once: [B, 8 * Hs, W]."""
    b, slots, hs, _ = q_tile.shape
    k = dequantize_nvfp4(k_cache).double()[block_table.long()]  # [B, W, 128, 128]
    q = q_tile.double().reshape(b, slots * hs, 128)
    dots = torch.einsum("brd,bwtd->brwt", q, k)
    return dots.amax(dim=-1).float() + 0.0


@st.composite
def scorer_inputs(draw):
    seed = draw(st.integers(0, 2**31 - 1))
    hs = draw(st.sampled_from([1, 2, 4, 8]))
    width = draw(st.integers(1, 12))
    # Lengths around every page edge the contract cares about, negatives included.
    lens = draw(st.lists(st.integers(-3, 14 * 128 + 9), min_size=1, max_size=3))
    case = make_case(seed, [8] * len(lens), heads=hs, query_len=8, pattern="random", table_width=width, num_blocks=5)
    tile = query_tile(case.index_q, len(lens), 8)
    return tile, case.k_cache, case.block_table, torch.tensor(lens, dtype=torch.int32)


@given(scorer_inputs())
def test_stores_exactly_the_contract_columns(inputs):
    _check_contract_columns(*inputs)


# Every offset where a slot's own page differs from the scored count (len % 128 in 1..8),
# which random lengths rarely draw, plus a length past the table and non-positive ones.
EDGE_LENS = [0, -3, 1, 8, 9, 128, 129, 135, 136, 137, 256, 257, 263, 264, 3 * 128 + 4, 14 * 128 + 7]


@pytest.mark.parametrize("hs", [1, 4])
def test_stores_exactly_the_contract_columns_at_page_edges(hs):
    case = make_case(5, [8] * len(EDGE_LENS), heads=hs, query_len=8, pattern="random", table_width=6, num_blocks=5)
    tile = query_tile(case.index_q, len(EDGE_LENS), 8)
    _check_contract_columns(tile, case.k_cache, case.block_table, torch.tensor(EDGE_LENS, dtype=torch.int32))


def _check_contract_columns(tile, k_cache, table, lens):
    b, _, hs, _ = tile.shape
    width = table.shape[1]
    out = torch.full((b, 8 * hs, width), POISON)
    score_pages(tile, k_cache, table, lens, out)
    want = naive_scores(tile, k_cache, table)
    for r in range(b):
        n = max(0, min((int(lens[r]) - 1) // 128, width))
        for row in range(8 * hs):
            own = (int(lens[r]) - 8 + row // hs) // 128
            stored = max(0, min(n, own))
            # Both sides compute each dot product exactly and round once: equal bit for bit.
            assert torch.equal(out[r, row, :stored], want[r, row, :stored])
            assert bool((out[r, row, stored:] == POISON).all()), "a column outside the contract was written"


def test_invented_length_stores_every_owned_page_for_every_slot():
    case = make_case(3, [8] * 2, heads=4, query_len=8, table_width=9, num_blocks=9)
    tile = query_tile(case.index_q, 2, 8)
    for n_local in range(0, 9):
        lens = torch.tensor([n_local * 128 + 8] * 2, dtype=torch.int32)
        out = torch.full((2, 32, 9), POISON)
        score_pages(tile, case.k_cache, case.block_table, lens, out)
        assert bool((out[:, :, :n_local] != POISON).all())
        assert bool((out[:, :, n_local:] == POISON).all())


def test_reads_only_the_table_entries_it_scores():
    case = make_case(4, [8], heads=1, query_len=8, table_width=6, num_blocks=3)
    table = case.block_table.clone()
    table[0, 2:] = -12345  # past (len - 1) // 128 = 2: must never be dereferenced
    out = torch.full((1, 8, 6), POISON)
    score_pages(query_tile(case.index_q, 1, 8), case.k_cache, table, torch.tensor([3 * 128], dtype=torch.int32), out)
    assert bool((out[:, :, 2:] == POISON).all())


def test_all_zero_dot_products_score_plus_zero():
    case = make_case(5, [8], heads=2, query_len=8, pattern="zeros", table_width=4)
    q = -case.index_q.float()  # -q * +0 codes gives -0.0 products
    out = torch.full((1, 16, 4), POISON)
    score_pages(
        query_tile(q.to(torch.float8_e4m3fn), 1, 8),
        case.k_cache,
        case.block_table,
        torch.tensor([4 * 128 + 8], dtype=torch.int32),
        out,
    )
    assert bool((out == 0).all()) and not bool(torch.signbit(out).any())


def test_fp32_accumulation_tolerance_on_random_inputs():
    """A kernel that accumulates in fp32 (any order) lands within 128 * 2^-24 * sum|q * k| of
    the reference's exactly-rounded score: the classic bound for a 128-term fp32 sum. This is
    the tolerance the fast scorer is held to on random inputs."""
    case = make_case(6, [8] * 2, heads=4, query_len=8, pattern="random", table_width=5, num_blocks=7)
    tile = query_tile(case.index_q, 2, 8)
    out = torch.full((2, 32, 5), POISON)
    score_pages(tile, case.k_cache, case.block_table, torch.tensor([5 * 128 + 8] * 2, dtype=torch.int32), out)
    k = dequantize_nvfp4(case.k_cache)[case.block_table.long()]  # [B, W, 128, 128] fp32
    q = tile.float().reshape(2, 32, 128)
    fp32 = torch.einsum("brd,bwtd->brwt", q, k).amax(-1)
    bound = fp32_order_bound(tile, case.k_cache, case.block_table)
    assert bool(((fp32 - out).abs() <= bound).all())
