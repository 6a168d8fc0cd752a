"""The E4M3-MMA route in ``fast`` (docs/DESIGN.md §4.1): on an sm_90 GPU the scorers and
decodes give the reference's E4M3-MMA scores and selections bit for bit, at every N and
feed; elsewhere every entry refuses ``mma="e4m3"`` by name before anything runs."""

import pytest
import torch

import reference
from bench.variants import score_block_variant, score_variant
from fast import IndexerDecodeCP, MsaDecodeCP, MsaStockDecode, StockDecode, score_blocks, score_pages
from fast.route import route_for
from fast.symm import SingleRankSymmetric
from indexer_constants import SLOTS
from reference import msa
from reference.cases import make_case, seq_len_for
from reference.decode import query_tile
from reference.msa.decode import query_tile as msa_query_tile
from support import DEV, POISON, on

E4M3 = "e4m3"
CAPABILITIES = [((9, 0), "", True), ((9, 0), "portable", False), ((8, 9), "", False), ((10, 0), "", False)]


@pytest.mark.parametrize("capability,force,runs", CAPABILITIES)
def test_the_route_runs_where_hoppers_e4m3_mma_is(capability, force, runs):
    assert route_for(capability, "gpu", force).e4m3_mma is runs
    assert route_for(None).e4m3_mma is False


def _states(mma: str, key_format: str = "nvfp4") -> list:
    """Build each decode state of ``key_format`` on DEV with ``mma``."""
    windows = dict(init_blocks=1, local_blocks=1)
    if key_format == "nvfp4":
        return [
            StockDecode(heads=2, max_reqs=4, device=DEV, mma=mma),
            IndexerDecodeCP(heads=2, max_reqs=4, symm=SingleRankSymmetric(DEV), mma=mma),
        ]
    return [
        MsaStockDecode(heads=2, max_reqs=4, device=DEV, key_format=key_format, mma=mma, **windows),
        MsaDecodeCP(heads=2, max_reqs=4, symm=SingleRankSymmetric(DEV), key_format=key_format, mma=mma, **windows),
    ]


@pytest.mark.parametrize("key_format", ["nvfp4", "fp8", "bf16"])
@pytest.mark.parametrize("mma", ["E4M3", "fp8", "", None, 1, True])
def test_an_unknown_route_is_refused_by_name(key_format, mma):
    with pytest.raises(ValueError, match="^mma: must be one of"):
        _states(mma, key_format)


@pytest.mark.parametrize("key_format", ["nvfp4", "fp8", "bf16"])
def test_the_e4m3_route_is_refused_where_it_cannot_run(key_format):
    """Off the Hopper route every state refuses it naming the route; BF16 keys everywhere."""
    if DEV.type == "cuda" and route_for(torch.cuda.get_device_capability()).e4m3_mma and key_format != "bf16":
        pytest.skip("this device runs the route")
    with pytest.raises(ValueError, match="^mma: 'e4m3'"):
        _states(E4M3, key_format)


def test_the_scorers_refuse_it_before_launching():
    case = make_case(0, [seq_len_for(3, 5)], heads=1, query_len=1, pattern="random")
    tile, out = on(query_tile(case.index_q, 1, 1)), on(torch.full((1, SLOTS, 4), POISON))
    for bad in ("bogus", None):
        with pytest.raises(ValueError, match="^mma:"):
            score_pages(tile, on(case.k_cache), on(case.block_table), on(case.seq_lens), out, mma=bad)
    bf16 = msa.make_case(0, [seq_len_for(3, 5)], dtype="bf16", heads=1, query_len=1)
    with pytest.raises(ValueError, match="^mma: 'e4m3'"):
        score_blocks(
            on(msa_query_tile(bf16.index_q, 1, 1)),
            on(bf16.k_cache),
            on(bf16.block_table),
            on(bf16.seq_lens),
            out,
            num_pages=4,
            mma=E4M3,
        )
    assert bool((out.cpu() == POISON).all())


# --- an sm_90 GPU: bit for bit against the reference's model

# (heads, first slot): N 8 (one row, and a full tile of one head), 16, 32, 64
SHAPES = [(1, 7), (1, 0), (4, 4), (4, 0), (8, 0)]
# the wgmma kernel's feeds: the policy's (score_pages; at these small grids programs of
# 1-2 pages), the page ring of 2 on 8-page programs (N 8 and 16, where it fits), the
# register pipeline on 3-page programs, and N 32's ring on its 4-page programs
FEEDS = [(hs, slot, None) for hs, slot in SHAPES]
FEEDS += [(hs, slot, dict(pages_per_program=8, ring=2)) for hs, slot in SHAPES[:3]]
FEEDS += [(hs, slot, dict(pages_per_program=3, ring=0)) for hs, slot in SHAPES]
FEEDS += [(4, 0, dict(pages_per_program=4))]  # N 32's policy on 4-page programs: the ring of 2


def _nvfp4_case(seed: int, heads: int, pattern: str = "random"):
    lens = [seq_len_for(37, 100), seq_len_for(9, 7), seq_len_for(20, 127), 0]
    return make_case(seed, lens, heads=heads, query_len=8, pattern=pattern, table_width=40)


@pytest.mark.gpu
@pytest.mark.hopper
@pytest.mark.parametrize("hs,first_slot,feed", FEEDS)
@pytest.mark.parametrize("pattern", ["random", "gaussian"])
def test_score_pages_gives_the_reference_e4m3_scores(hs, first_slot, feed, pattern):
    """Every stored score is the model's, bit for bit; every other cell is untouched."""
    case = _nvfp4_case(hs + first_slot, hs, pattern)
    tile = query_tile(case.index_q, 4, 8)
    want = torch.full((4, SLOTS * hs, 40), POISON)
    reference.score_pages(tile, case.k_cache, case.block_table, case.seq_lens, want, mma=E4M3)
    keep = torch.arange(SLOTS * hs) < first_slot * hs
    want[:, keep] = POISON  # rows of earlier slots are left alone
    got = on(torch.full_like(want, POISON))
    args = (on(tile), on(case.k_cache), on(case.block_table), on(case.seq_lens), got)
    if feed is None:
        score_pages(*args, first_slot=first_slot, mma=E4M3)
    else:
        score_variant(*args, first_slot=first_slot, decode=E4M3, **feed)
    assert torch.equal(got.cpu().view(torch.int32), want.view(torch.int32))


@pytest.mark.gpu
@pytest.mark.hopper
@pytest.mark.parametrize("hs,first_slot", SHAPES)
@pytest.mark.parametrize("ring", [dict(), dict(stages=2), dict(ppp=2, stages=5), dict(tensor_copies=False)])
def test_score_blocks_gives_the_reference_e4m3_scores(hs, first_slot, ring):
    """FP8 keys, the token mask, a compact table of rank 1 of 2: every score the model's."""
    lens = [seq_len_for(30, 77), seq_len_for(6, 127), seq_len_for(11, 0), 0]
    case = msa.make_case(hs * 8 + first_slot, lens, dtype="fp8", query_len=8, heads=hs, table_width=32)
    table = case.block_table[:, 1::2].contiguous()
    tile = msa_query_tile(case.index_q, 4, 8)
    want = torch.full((4, SLOTS * hs, table.shape[1]), POISON)
    msa.score_blocks(tile, case.k_cache, table, case.seq_lens, want, num_pages=32, stride=2, offset=1, mma=E4M3)
    want[:, torch.arange(SLOTS * hs) < first_slot * hs] = POISON
    got = on(torch.full_like(want, POISON))
    score_block_variant(
        on(tile),
        on(case.k_cache),
        on(table),
        on(case.seq_lens),
        got,
        num_pages=32,
        stride=2,
        offset=1,
        first_slot=first_slot,
        mma=E4M3,
        **ring,
    )
    assert torch.equal(got.cpu().view(torch.int32), want.view(torch.int32))


def _decode(state, case, query_len: int) -> torch.Tensor:
    layer = state.new_layer()
    plan = state.plan(on(case.block_table), on(case.seq_lens))
    out = on(torch.full((case.index_q.shape[0], case.index_q.shape[1], 16), -7, dtype=torch.int32))
    state.forward(layer, plan, on(case.index_q), on(case.k_cache), out, query_len)
    state.check()
    return out.cpu()


@pytest.mark.gpu
@pytest.mark.hopper
@pytest.mark.parametrize("query_len", [1, 4])
def test_the_decodes_select_as_the_reference_route(query_len):
    """Stock and CP (one rank) decodes of the route equal the reference's of the same route."""
    lens = [seq_len_for(60, 3), seq_len_for(17, 100), 5]
    case = make_case(11, lens, heads=2, query_len=query_len, pattern="random", table_width=64)
    stock, cp = _states(E4M3)
    assert torch.equal(_decode(stock, case, query_len), reference.stock_decode(*case.args(), mma=E4M3))
    assert torch.equal(_decode(cp, case, query_len), reference.full_decode(*case.args(), mma=E4M3))
    m = msa.make_case(12, lens, dtype="fp8", heads=2, query_len=query_len, table_width=64)
    want = msa.full_decode(*m.args(), **m.windows(), mma=E4M3)
    for state in _states(E4M3, "fp8"):
        assert torch.equal(_decode(state, m, query_len), want)
