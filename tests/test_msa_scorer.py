"""fast's MSA block scorer (docs/DESIGN.md §10.2) against the reference's: bit for bit on
exact-arithmetic keys (unwritten slots' NaN rows included), within the fp32 order bound on
random ones; a bad id is never loaded, scores NaN and is recorded; the mma kernel's ring
fits its shared memory, and its bounded wait gives up and says so."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from bench.variants import score_block_variant
from fast.errors import new_record
from fast.kernels import page_ring
from fast.msa.kernels import block_ring
from fast.msa.scorer import run_block_scorer
from indexer_constants import SLOTS
from reference import msa
from reference.cases import seq_len_for
from reference.msa.cases import DTYPES, EXACT_PATTERNS
from reference.msa.decode import query_tile
from reference.msa.scores import fp32_order_bound
from support import DEV, POISON, assert_wait_gives_up, misaligned, on


def fast_scores(tile, case, table, **kw):
    """fast's scores of ``tile`` on ``table`` over a POISON-filled output, on the CPU."""
    rows = SLOTS * tile.shape[2]
    got = on(torch.full((tile.shape[0], rows, table.shape[1]), POISON))
    score_block_variant(on(tile), on(case.k_cache), on(table), on(case.seq_lens), got, **kw)
    return got.cpu()


def both(case, table, stride, offset, num_pages):
    """(fast, reference) scores of every slot of the case's queries on ``table``."""
    batch = case.seq_lens.shape[0]
    tile = query_tile(case.index_q, batch, case.query_len)
    want = torch.full((batch, SLOTS * case.index_q.shape[1], table.shape[1]), POISON)
    msa.score_blocks(tile, case.k_cache, table, case.seq_lens, want, num_pages=num_pages, stride=stride, offset=offset)
    return fast_scores(tile, case, table, num_pages=num_pages, stride=stride, offset=offset), want


def same(got, want):
    """Bit for bit, NaN where NaN."""
    return torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())


def strided(table, stride, offset):
    """Rank ``offset``'s compact table: column j holds global block ``j * stride + offset``."""
    cols = torch.arange(-(-table.shape[1] // stride)) * stride + offset
    return table[:, cols.clamp_max(table.shape[1] - 1)].contiguous()


@settings(deadline=None, max_examples=8)
@given(
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from(sorted(DTYPES)),
    heads=st.sampled_from([1, 2, 4, 8]),
    query_len=st.integers(1, SLOTS),
    cp=st.sampled_from([1, 2, 4, 8]),
    pattern=st.sampled_from(EXACT_PATTERNS),
    tokens=st.lists(st.sampled_from([0, 1, 111, 112, 126, 127]), min_size=1, max_size=2),
    pages=st.integers(0, 7),
)
def test_exact_keys_score_bit_for_bit(seed, dtype, heads, query_len, cp, pattern, tokens, pages):
    """Every stride (a CP rank's compact table) and token offset around the mask's edge."""
    lens = [max(query_len, seq_len_for(pages, t)) for t in tokens] + [0]
    case = msa.make_case(seed, lens, dtype=dtype, query_len=query_len, heads=heads, pattern=pattern, table_width=9)
    for rank in sorted({0, cp - 1}):
        got, want = both(case, strided(case.block_table, cp, rank), cp, rank, 9)
        assert same(got, want), (rank, (got - want).abs().nan_to_num().max())


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_random_keys_score_within_the_fp32_order_bound(dtype):
    case = msa.make_case(5, [seq_len_for(6, 37), seq_len_for(3, 127)], dtype=dtype, query_len=8, heads=2)
    got, want = both(case, case.block_table, 1, 0, case.block_table.shape[1])
    stored = want != POISON
    assert torch.equal(got != POISON, stored)
    tile = query_tile(case.index_q, 2, 8)
    for b in range(2):
        # The two sum in different orders: fp32 rounding of a 128-term sum bounds the gap.
        bound = fp32_order_bound(tile[b].reshape(-1, 128), case.k_cache[case.block_table[b].long()])
        assert bool(((got[b] - want[b]).abs() <= bound)[stored[b]].all())
        assert bool((got[b] != want[b])[stored[b]].any()) or dtype == "fp8"  # the bound is needed (bf16)


def test_first_slot_and_the_tile_set_leave_the_rest_alone():
    """first_slot leaves earlier slots' rows as they were; q_sel picks the second tile set."""
    case = msa.make_case(2, [seq_len_for(4, 20), seq_len_for(2, 3)], dtype="bf16", query_len=3, heads=2, pattern="late")
    tile = query_tile(case.index_q, 2, 3)
    _, want = both(case, case.block_table, 1, 0, case.block_table.shape[1])
    junk = torch.zeros_like(tile)
    sets = torch.stack([junk, tile])
    kw = dict(num_pages=case.block_table.shape[1], first_slot=SLOTS - 3)
    rows = SLOTS * 2
    got = on(torch.full((2, rows, case.block_table.shape[1]), POISON))
    sets = on(sets)
    q_sel = on(torch.ones(1, dtype=torch.int64))
    score_block_variant(
        sets[0],
        on(case.k_cache),
        on(case.block_table),
        on(case.seq_lens),
        got,
        q_sel=q_sel,
        q_set_stride=tile.numel(),
        q_sets=2,
        **kw,
    )
    got = got.cpu()
    first_row = (SLOTS - 3) * 2
    assert bool((got[:, :first_row] == POISON).all())
    assert same(got[:, first_row:], want[:, first_row:])


def test_a_bad_id_is_never_loaded_scores_nan_and_is_recorded():
    case = msa.make_case(1, [seq_len_for(5, 3)], dtype="fp8", heads=2, pattern="exact", table_width=6)
    table = case.block_table.clone()
    table[0, 3] = 10**6
    table[0, 2] = -5
    tile = query_tile(case.index_q, 1, 1)
    record = new_record(DEV)
    got = fast_scores(tile, case, table, num_pages=6, error=record)
    assert bool(torch.isnan(got[0, -2:, 2:4]).all())  # the real query's rows (slot 7)
    assert not bool(torch.isnan(got[0, -2:, [0, 1, 4, 5]]).any())
    # BAD_BLOCK, request 0, then a bad column and its id: the first writer wins, and the two
    # columns may lie in different programs (the mma kernel's small grids: one column each)
    assert record.tolist()[1:] in ([1, 0, 2, -5], [1, 0, 3, 10**6])


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda a: a.update(q_tile=a["q_tile"].to(torch.bfloat16)), "q_tile: expected dtype torch.float8_e4m3fn"),
        (lambda a: a.update(k_cache=a["k_cache"].float()), "k_cache: expected dtype bfloat16 or"),
        (lambda a: a.update(k_cache=a["k_cache"][:, :, :64].contiguous()), "k_cache: expected shape"),
        (lambda a: a.update(k_cache=a["k_cache"][:, :, ::2]), "k_cache: must be contiguous"),
        (lambda a: a.update(k_cache=misaligned(a["k_cache"])), "k_cache: its first byte must be 16-byte aligned"),
        (lambda a: a.update(block_table=a["block_table"].long()), "block_table: expected dtype torch.int32"),
        (lambda a: a.update(out=a["out"][:, :, :1]), r"out: expected float32 \[1, 16, 6\]"),
        (lambda a: a.update(lens=a["lens"].repeat(2)), "lens: expected 1 lengths"),
        (lambda a: a.update(offset=4, stride=4), "offset: must be in 0..3"),
        (lambda a: a.update(num_pages=0), "num_pages: must be >= 1"),
        (lambda a: a.update(first_slot=8), "first_slot: must be in 0..7"),
        (lambda a: a.update(q_set_stride=24), "q_set_stride: must be a multiple of 16 elements, got 24"),
        (lambda a: a.update(q_sets=2), "q_sets: counts the tile sets q_sel picks among"),
        (lambda a: a.update(q_sel=a["lens"].long()), r"q_sets: needed with q_sel"),
        (
            lambda a: a.update(q_sel=a["lens"].long(), q_sets=2, q_set_stride=16),
            "q_sets: 2 tile sets 16 elements apart reach past q_tile's storage",
        ),
        (lambda a: a.update(error=a["lens"]), "error: expected 5 words"),
        (lambda a: a.update(tensor_copies=1), "tensor_copies: expected a bool, got int"),
        (lambda a: a.update(loads_only=1), "loads_only: expected a bool, got int"),
        (lambda a: a.update(loads_only=True, kernel="dot"), "loads_only: probes the mma kernel's ring, not the dot"),
    ],
)
def test_bad_arguments_name_themselves(change, match):
    case = msa.make_case(1, [seq_len_for(5, 3)], dtype="fp8", heads=2, pattern="exact")
    args = {
        "q_tile": on(query_tile(case.index_q, 1, 1)),
        "k_cache": on(case.k_cache),
        "block_table": on(case.block_table),
        "lens": on(case.seq_lens),
        "out": on(torch.zeros(1, 16, case.block_table.shape[1])),
        "num_pages": 6,
    }
    change(args)
    with pytest.raises((TypeError, ValueError), match=match):
        score_block_variant(**args)


def test_the_rings_feed_fits_its_shared_memory():
    """``ring_feed``: every depth the policy picks fits a program's 2 ppp half-blocks; a
    bulk ring fits the static shared memory beside the kernel's dynamic buffers (a larger
    one fails at launch), and the cp.async ring is what is left where none fits; both
    formats go bulk at every N up to 32 (the bench's shapes; BF16 on two 16 KB slots)."""
    from fast.msa.scorer import dynamic_bytes, max_stages, ring_feed
    from fast.scorer import long_row_pages

    for dtype in DTYPES.values():
        for rows in (8, 16, 32, 64):
            for ppp in range(1, 17):
                stages, bulk = ring_feed(dtype, rows, ppp)
                assert 2 <= stages <= min(8, 2 * ppp + 1), (dtype, rows, ppp)
                static = page_ring.BASE_STATIC + block_ring.ring_bytes(stages, dtype.itemsize)
                fits = static + dynamic_bytes(rows, ppp) <= page_ring.SHARED_LIMIT
                assert bulk == fits == (stages <= max_stages(dtype, rows, ppp)), (dtype, rows, ppp)
                if rows <= 32 and ppp <= long_row_pages(rows, msa=True):
                    assert bulk, (dtype, rows, ppp)  # at every program size the launch picks
                for asked in range(2, 9):  # a depth the caller asks for: bulk where it fits
                    depth = min(asked, 2 * ppp + 1)
                    assert ring_feed(dtype, rows, ppp, asked) == (depth, depth <= max_stages(dtype, rows, ppp))
    assert [ring_feed(torch.bfloat16, rows, 4)[1] for rows in (8, 16, 32, 64)] == [True, True, True, False]


def test_the_maxima_fold_by_layout_only_where_it_costs_the_ring_and_programs_nothing():
    """``mma_folds``: the page maxima are folded by layout (``page_maxima.folds_by_layout``,
    from N 32) only where the conversion's scratch leaves the ring's depth and feed and the
    programs an SM its shared memory holds as they are; the launch's constants carry it. At
    the bench's N 32 (4 columns a program) that is E4M3 keys on the exact MMA, not BF16 (its
    bulk ring would no longer fit) nor the E4M3 route (a program an SM fewer)."""
    from fast.msa.scorer import mma_constants, mma_folds, ring_feed, shared_programs

    for dtype in DTYPES.values():
        for rows in (8, 16, 32, 64):
            for ppp in range(1, 17):
                for mma in ("exact", "e4m3") if dtype == torch.float8_e4m3fn else ("exact",):
                    fold = mma_folds(dtype, rows, ppp, None, mma)
                    assert mma_constants(dtype, rows, ppp, None, mma)["FOLD"] == fold
                    if rows < 32:
                        assert not fold, (dtype, rows, ppp, mma)
                    feed = ring_feed(dtype, rows, ppp, None, mma)
                    same = feed == ring_feed(dtype, rows, ppp, None, mma, fold=True) and (
                        shared_programs(dtype, rows, ppp, *feed, mma, False)
                        == shared_programs(dtype, rows, ppp, *feed, mma, True)
                    )
                    assert fold == (rows >= 32 and same), (dtype, rows, ppp, mma)
    fp8 = torch.float8_e4m3fn
    assert mma_folds(fp8, 32, 4) and not mma_folds(fp8, 32, 4, None, "e4m3") and not mma_folds(torch.bfloat16, 32, 4)
    assert shared_programs(fp8, 32, 4, 3, True, "e4m3", True) < shared_programs(fp8, 32, 4, 3, True, "e4m3", False)


# The GPU kernels (the default mma kernel, and the dot kernel the interpreter runs) over the
# shapes a decode launches: N 8 (mma.sync), 16, 32 and 64 (wgmma), every slot or the last
# few, unwritten slots (NaN rows), a CP rank's stride, and 1 to 8 columns a program.
GPU_SHAPES = [(1, 0, 8), (1, 7, 1), (2, 0, 3), (4, 7, 1), (4, 4, 4), (4, 0, 8), (8, 0, 5), (8, 5, 3)]


def kernel_scores(case, table, stride, offset, query_len, first_slot, **kw):
    """One GPU kernel's scores of the case on ``table`` (from ``first_slot`` on) over POISON."""
    tile = query_tile(case.index_q, case.seq_lens.shape[0], query_len)
    return fast_scores(tile, case, table, num_pages=9, stride=stride, offset=offset, first_slot=first_slot, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("heads,first_slot,query_len", GPU_SHAPES)
@pytest.mark.parametrize(
    "kernel,ppp,stages",
    # the ring filled by bulk copies or (a depth the static shared memory cannot hold: 6,
    # BF16's 3 and 4 but at N 32, N 64's) by cp.async, more slots than half-blocks (2, 5)
    [
        ("mma", 1, 3),
        ("mma", 3, 4),
        ("mma", 8, 6),
        ("mma", 3, 2),
        ("mma", 2, 5),
        ("mma", None, None),
        ("dot", None, None),
    ],
)
def test_gpu_kernels_score_exact_keys_bit_for_bit(dtype, heads, first_slot, query_len, kernel, ppp, stages):
    """Exact-arithmetic keys (the last 16 tokens of each block large: a token mask one off
    moves the partial block's score), token offsets on both sides of the mask's edges."""
    lens = [seq_len_for(7, t) for t in (0, 1, 111, 127)] + [0, query_len, seq_len_for(9, 64)]
    case = msa.make_case(3, lens, dtype=dtype, query_len=query_len, heads=heads, pattern="late", table_width=9)
    for stride, offset in ((1, 0), (4, 3)):
        table = strided(case.block_table, stride, offset)
        tile = query_tile(case.index_q, len(lens), query_len)
        want = torch.full((len(lens), SLOTS * heads, table.shape[1]), POISON)
        msa.score_blocks(tile, case.k_cache, table, case.seq_lens, want, num_pages=9, stride=stride, offset=offset)
        got = kernel_scores(case, table, stride, offset, query_len, first_slot, kernel=kernel, ppp=ppp, stages=stages)
        first_row = first_slot * heads
        assert bool((got[:, :first_row] == POISON).all())
        assert same(got[:, first_row:], want[:, first_row:]), (stride, (got - want).abs().nan_to_num().max())


@pytest.mark.gpu
@pytest.mark.hopper
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("heads,first_slot,query_len", GPU_SHAPES)
def test_gpu_kernels_score_random_keys_within_the_bound(dtype, heads, first_slot, query_len):
    lens = [seq_len_for(8, 37), seq_len_for(3, 127), seq_len_for(9, 0)]
    case = msa.make_case(4, lens, dtype=dtype, query_len=query_len, heads=heads, table_width=9)
    tile = query_tile(case.index_q, len(lens), query_len)
    want = torch.full((len(lens), SLOTS * heads, 9), POISON)
    msa.score_blocks(tile, case.k_cache, case.block_table, case.seq_lens, want, num_pages=9)
    first_row = first_slot * heads
    for kw in ({"kernel": "mma"}, {"kernel": "mma", "stages": 2}, {"kernel": "dot"}):
        got = kernel_scores(case, case.block_table, 1, 0, query_len, first_slot, **kw)
        assert torch.equal(got[:, first_row:] != POISON, want[:, first_row:] != POISON)
        assert torch.equal(got[:, first_row:].isnan(), want[:, first_row:].isnan())
        for b in range(len(lens)):
            # fp32 rounding of a 128-term sum in another order bounds the gap
            bound = fp32_order_bound(tile[b].reshape(-1, 128), case.k_cache[case.block_table[b].long()])
            stored = (want[b] != POISON) & ~want[b].isnan()
            stored[:first_row] = False
            assert bool(((got[b] - want[b]).abs() <= bound)[stored].all()), (kw, b)


@pytest.mark.gpu
@pytest.mark.hopper
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("heads,first_slot,query_len", [(1, 0, 8), (4, 7, 1), (4, 4, 4), (4, 0, 8)])
def test_tensor_copies_and_1d_copies_fill_the_ring_alike(dtype, heads, first_slot, query_len):
    """The bulk ring's two feeds — tensor copies, swizzled (the default), and 1D copies of
    the half-blocks as they lie (a graph captured before the cache's first call) — give
    the same bits at every N the ring serves (both formats at 8 / 16 / 32; at N 64 the
    cp.async ring runs both ways), on random keys: a run read from another row's
    swizzle slot shows. And a graph captured on a cache no call has seen scores as the
    eager call does, through the 1D copies, its map built by the first eager call."""
    from fast.msa import tensor_map

    lens = [seq_len_for(8, 37), seq_len_for(3, 127), seq_len_for(9, 0), 0]
    case = msa.make_case(5, lens, dtype=dtype, query_len=query_len, heads=heads, table_width=9)
    table = strided(case.block_table, 1, 0)
    one = {"num_pages": 9, "first_slot": first_slot, "kernel": "mma"}
    eager = {
        copies: kernel_scores(case, table, 1, 0, query_len, first_slot, kernel="mma", tensor_copies=copies)
        for copies in (True, False)
    }
    assert same(eager[True], eager[False])
    assert bool((eager[True][:, first_slot * heads :] != POISON).any())  # scored something
    tile, cache = on(query_tile(case.index_q, len(lens), query_len)), on(case.k_cache).clone()  # no map yet
    bt, sl = on(table), on(case.seq_lens)
    out = on(torch.full((len(lens), SLOTS * heads, 9), POISON))
    run_block_scorer(tile, cache, bt, sl, out, **one)  # compiles the launch, and builds the map
    key_of_cache = tensor_map.key(cache)
    assert tensor_map._maps.pop(key_of_cache, None) is not None  # as if the capture came first
    out.fill_(POISON)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_block_scorer(tile, cache, bt, sl, out, **one)
    assert key_of_cache not in tensor_map._maps  # none built under capture
    graph.replay()
    assert same(out.cpu(), eager[True])
    run_block_scorer(tile, cache, bt, sl, out, **one)
    assert key_of_cache in tensor_map._maps


@pytest.mark.gpu
@pytest.mark.hopper
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("heads,first_slot", [(1, 0), (4, 4), (4, 0)])
def test_the_ring_probe_writes_nothing_and_needs_a_bulk_ring(dtype, heads, first_slot):
    """``loads_only`` (the bench's probe of the mma kernel's ring) runs where the ring is
    bulk — both formats at N 8 / 16 / 32 — records nothing and leaves ``out`` as it was, by
    tensor copies and by 1D copies; a cp.async ring (a depth the static shared memory cannot
    hold) is refused before any launch. (``tests/test_sass.py`` holds what it reads.)"""
    lens = [seq_len_for(8, 37), seq_len_for(3, 127), 0]
    case = msa.make_case(3, lens, dtype=dtype, query_len=8, heads=heads, table_width=9)
    args = (on(query_tile(case.index_q, len(lens), 8)), on(case.k_cache), on(case.block_table), on(case.seq_lens))
    out = on(torch.full((len(lens), SLOTS * heads, 9), POISON))
    record = new_record(DEV)
    one = {"num_pages": 9, "first_slot": first_slot, "kernel": "mma", "loads_only": True, "error": record}
    for copies in (True, False):
        score_block_variant(*args, out, tensor_copies=copies, **one)
    assert bool((out == POISON).all()) and record.tolist() == [0] * 5
    with pytest.raises(ValueError, match="loads_only: probes a bulk ring"):
        score_block_variant(*args, out, ppp=8, stages=6, **one)  # 6 slots: no static ring holds them


@gluon.jit
def _wait_for_a_half_block_never_copied(err_ptr):
    block_ring.declare(2, 1)
    gl.thread_barrier()
    page_ring.report(block_ring.wait(1, 2), err_ptr)


@pytest.mark.gpu
@pytest.mark.hopper
def test_the_block_rings_wait_gives_up_and_says_so():
    """A wait for a half-block never copied gives up and says so (``assert_wait_gives_up``)."""
    assert_wait_gives_up(lambda record: _wait_for_a_half_block_never_copied[(2,)](record, num_warps=4))
