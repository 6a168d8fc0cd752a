"""The fast scorer against the reference's scorer contract: exact on exact-arithmetic inputs,
within the fp32-order bound elsewhere, and its launch policy."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
from fast.scorer import run_scorer, score_pages
from indexer_constants import PAGE, SLOTS
from reference.cases import EXACT_PATTERNS, every_element_case, make_case
from reference.cp import plan_rank
from reference.decode import query_tile
from reference.nvfp4 import dequantize_nvfp4
from reference.scores import fp32_order_bound
from support import POISON, on

EXACT = tuple(EXACT_PATTERNS)


@st.composite
def scorer_cases(draw, patterns=EXACT + ("random", "gaussian")):
    hs = draw(st.sampled_from([1, 2, 4, 8]))
    width = draw(st.integers(1, 20))
    lens = draw(st.lists(st.integers(-3, 22 * 128 + 9), min_size=1, max_size=3))
    pattern = draw(st.sampled_from(patterns))
    case = make_case(
        draw(st.integers(0, 2**31 - 1)),
        [8] * len(lens),
        heads=hs,
        query_len=8,
        pattern=pattern,
        table_width=width,
        num_blocks=9,
    )
    tile = query_tile(case.index_q, len(lens), 8)
    return (
        tile,
        case.k_cache,
        case.block_table,
        torch.tensor(lens, dtype=torch.int32),
        pattern,
        draw(st.integers(0, SLOTS - 1)),
    )


@given(scorer_cases())
def test_scorer_matches_reference(args):
    """The contract's stored cells and values; with first_slot, the rows of the earlier slots
    stay untouched and the others are still the reference's (the kernel's N shrinks with
    them: on a GPU first_slot 7 at Hs <= 8 runs mma.sync, others wgmma)."""
    tile, k_cache, table, lens, pattern, first_slot = args
    b, _, hs, _ = tile.shape
    want = torch.full((b, 8 * hs, table.shape[1]), POISON)
    reference.score_pages(tile, k_cache, table, lens, want)
    want[:, : first_slot * hs] = POISON
    got = on(torch.full_like(want, POISON))
    score_pages(on(tile), on(k_cache), on(table), on(lens), got, first_slot=first_slot)
    got = got.cpu()
    written = want != POISON
    assert torch.equal(got != POISON, written), "stored a different set of columns"
    if pattern in EXACT:
        assert torch.equal(got, want)  # exact arithmetic: every order gives the same fp32
    else:
        tol = fp32_order_bound(tile, k_cache, table)
        assert bool(((got - want).abs() <= tol)[written].all())


def contract_cells(lens: list[int], hs: int, width: int, first_slot: int) -> torch.Tensor:
    """bool [B, 8 * Hs, W]: the cells the scorer contract stores, derived here from the
    contract's words (docs/DESIGN.md §4), not from any implementation: row slot * Hs + head
    of a slot >= first_slot, column j < min((len - 1) // 128, W) and j < (len - 8 + slot) //
    128, both rounded down (Python's //, so a negative length stores nothing)."""
    cells = torch.zeros(len(lens), 8 * hs, width, dtype=torch.bool)
    for b, n in enumerate(lens):
        scored = min(max((n - 1) // PAGE, 0), width)
        for slot in range(first_slot, 8):
            own = max((n - 8 + slot) // PAGE, 0)
            cells[b, slot * hs : (slot + 1) * hs, : min(scored, own)] = True
    return cells


# Lengths at every offset around page boundaries where the slots' own pages differ from
# the scored count (len % 128 in 1..8), a length past the table, and non-positive ones.
EDGE_LENS = [0, -3, 1, 8, 9, 128, 129, 135, 136, 137, 256, 257, 263, 264, 3 * 128 + 4, 40 * 128 + 7]


@pytest.mark.parametrize("kernel", ["table"] + (["wgmma"] if torch.cuda.is_available() else []))
@pytest.mark.parametrize("first_slot", [0, 3, 7])
@pytest.mark.parametrize("hs", [1, 4])
def test_scorer_writes_exactly_the_contract_cells(kernel, first_slot, hs):
    """Every cell the contract does not store keeps its poison, at and past each row's own
    page and in the rows of earlier slots, on the backend CI runs (the table kernel) and
    on a GPU's; every stored cell equals the reference's score (exact-arithmetic case)."""
    width = 6
    lens = EDGE_LENS
    case = make_case(11, [8] * len(lens), heads=hs, query_len=8, pattern="exact", table_width=width, num_blocks=9)
    tile = query_tile(case.index_q, len(lens), 8)
    t = torch.tensor(lens, dtype=torch.int32)
    got = on(torch.full((len(lens), 8 * hs, width), POISON))
    run_scorer(on(tile), on(case.k_cache), on(case.block_table), on(t), got, first_slot=first_slot, kernel=kernel)
    got = got.cpu()
    cells = contract_cells(lens, hs, width, first_slot)
    assert torch.equal(got != POISON, cells), f"cells written outside the contract: {(got != POISON) ^ cells}"
    want = torch.full_like(got, POISON)
    reference.score_pages(tile, case.k_cache, case.block_table, t, want)
    assert torch.equal(got[cells], want[cells])


@pytest.mark.gpu  # the interpreter's tl.dot is numpy's matmul, whose summation order follows N
@settings(max_examples=20)
@given(
    cp=st.sampled_from([2, 4, 8]),
    heads=st.sampled_from([1, 2, 4, 8]),
    lens=st.lists(st.integers(9, 40 * 128), min_size=1, max_size=3),
    pattern=st.sampled_from(["random", "gaussian", "clustered"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_compact_column_is_bitwise_the_stock_score(cp, heads, lens, pattern, seed):
    """Random inputs (where summation order shows): rank r's compact score column j, scored
    for all H heads at once, is bit for bit the stock score of page j*CP + r scored for one
    head (Hs = 1, as a TP rank does) — the same kernel, the same arithmetic per column."""
    case = make_case(seed, lens, query_len=8, heads=heads, pattern=pattern, num_blocks=64)
    batch, p = len(lens), case.block_table.shape[1]
    tile = query_tile(case.index_q, batch, 8)  # [B, 8, H, 128]
    width = reference.compact_width(p, cp)
    stock = torch.full((heads, batch, 8, p), POISON)
    for h in range(heads):
        got = on(torch.full((batch, 8, p), POISON))
        score_pages(
            on(tile[:, :, h : h + 1].contiguous()), on(case.k_cache), on(case.block_table), on(case.seq_lens), got
        )
        stock[h] = got.cpu()
    for rank in range(cp):
        cbt, n_local, _ = plan_rank(case.block_table, case.seq_lens, p, width, cp, rank)
        # The lying length for every request (the plan gives requests with no long row 0:
        # nothing scored); this test is about the scorer's arithmetic per column.
        lie = (n_local * PAGE + SLOTS).to(torch.int32)
        compact = on(torch.full((batch, 8 * heads, width), POISON))
        score_pages(on(tile), on(case.k_cache), on(cbt), on(lie), compact)
        compact = compact.cpu().view(batch, 8, heads, width).permute(2, 0, 1, 3)  # [H, B, 8, W]
        pages = torch.arange(width) * cp + rank
        both = (compact != POISON) & (pages < p) & (stock[..., pages.clamp_max(p - 1)] != POISON)
        assert bool(both.any()) or all(n == 0 for n in n_local.tolist())
        assert torch.equal(compact[both].view(torch.int32), stock[..., pages.clamp_max(p - 1)][both].view(torch.int32))


def test_launch_constants_are_one_tensor_a_device_and_options_a_fresh_dict():
    """``first_set`` and ``no_record`` hand every launch on a device the same tensor (made
    once: a graph capture must not allocate), while ``wgmma_options`` hands each plan its
    own dict (``plan_scorer`` adds the launch's PDL and error record to it)."""
    from fast.scorer import first_set, no_record, wgmma_options

    assert first_set("cpu") is first_set("cpu") and no_record("cpu") is no_record("cpu")
    plan = wgmma_options(4, 0, 32, 8192, 132)
    plan.update(PDL=True, launch_pdl=True)
    again = wgmma_options(4, 0, 32, 8192, 132)
    assert again is not plan and "launch_pdl" not in again and "PDL" not in again, again


def test_wgmma_pages_per_program_shrinks_for_small_grids():
    """Long rows get WGMMA_PAGES pages per program (4 at N = 32 on the E4M3 route and in the
    MSA kernel) where that grid still has 16 programs an SM; smaller grids get 4, and grids
    too small to give every SM 4 programs of 4 get fewer, down to 1."""
    from fast.scorer import WGMMA_PAGES, long_row_pages, pages_per_program

    assert WGMMA_PAGES == 8 and all(long_row_pages(n) == WGMMA_PAGES for n in (8, 16, 32, 64))
    assert long_row_pages(32, msa=True) == long_row_pages(32, "e4m3") == 4
    assert long_row_pages(16, msa=True) == long_row_pages(16, "e4m3") == WGMMA_PAGES
    assert pages_per_program(32, 8192, 132, rows=32, mma="e4m3") == 4
    assert pages_per_program(32, 8192, 132) == WGMMA_PAGES  # 1M, batch 32
    assert pages_per_program(32, 8192, 132, rows=16) == pages_per_program(32, 8192, 132, rows=64) == WGMMA_PAGES
    assert pages_per_program(32, 8192, 132, rows=32) == WGMMA_PAGES
    assert pages_per_program(32, 8192, 132, rows=32, msa=True) == 4
    assert pages_per_program(8, 1024, 132, rows=32) == 4  # 1024 programs of 8 < 16 * 132
    assert pages_per_program(32, 1024, 132) == 8  # 4096 programs >= 16 * 132
    assert pages_per_program(1, 8192, 132) == 4  # 1024 programs of 8 < 16 * 132
    assert pages_per_program(8, 1024, 132) == 4
    assert pages_per_program(1, 64, 132) == 1  # 8K context, batch 1
    assert pages_per_program(32, 64, 132) == 2  # 4 would give 512 programs < 4 * 132
    assert pages_per_program(0, 0, 132) == 1


def test_the_ring_policy_only_asks_for_rings_that_launch():
    """Every (N, pages per program) the decode can launch gets a ring the kernel's shared
    memory leaves room for (``max_ring``: a larger one fails at launch), on either MMA route,
    and the policy does use the ring where it measured ahead (N 8, N 16 and N 32 on long
    programs, on both routes)."""
    from fast.scorer import max_ring, mma_rows, pages_per_program, ring_pages

    used = set()
    for mma in ("exact", "e4m3"):
        for live in range(1, 65):
            rows = mma_rows(live)
            for batch, width in ((1, 64), (8, 1024), (32, 8192), (64, 4096)):
                ppp = pages_per_program(batch, width, 132, rows, mma)
                ring = ring_pages(rows, ppp, mma)
                assert 0 <= ring <= max_ring(rows, ppp, None, mma), (rows, ppp, ring, mma)
                used.add((mma, rows, ring))
    assert {("exact", 8, 2), ("exact", 8, 0), ("exact", 16, 2), ("exact", 16, 0), ("exact", 32, 2)} <= used, used
    assert {("e4m3", 32, 2), ("e4m3", 32, 0)} <= used, used


def test_every_scale_and_code_scores_exactly():
    """Each score of this case is one dequantized element: the device's scorer (the wgmma
    kernel on GPUs, fp16 subnormals and saturation included) equals the reference bit for
    bit, and the + and - rows give back the reference's dequantization table."""
    case = every_element_case()
    tile = query_tile(case.index_q, 4, 8)
    want = torch.full((4, 64, 32), POISON)
    reference.score_pages(tile, case.k_cache, case.block_table, case.seq_lens, want)
    got = on(torch.full_like(want, POISON))
    score_pages(on(tile), on(case.k_cache), on(case.block_table), on(case.seq_lens), got)
    assert torch.equal(got.cpu(), want)
    k = (want[:, 0::2] - want[:, 1::2]).permute(2, 0, 1).reshape(32, 128)  # [page, dim] of token 0
    assert torch.equal(k, dequantize_nvfp4(case.k_cache)[:, 0])
