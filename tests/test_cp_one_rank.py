"""The CP decode on one rank (the buffer is its own peer): the compact table, the push in every
select shape, the causal cut, a timeout."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference
from bench.stages import StagedCP
from fast.cp import IndexerDecodeCP
from fast.errors import PeerTimeoutError
from fast.kernels.cp import compact_table_kernel
from fast.kernels.device import ERR_Q_TIMEOUT
from fast.select.policy import QUEUED_PER_SM, force_select
from fast.symm import SingleRankSymmetric
from fuzz.strategies import decode_configs
from indexer_constants import PAGE, SLOTS
from reference.cases import EXACT_PATTERNS, make_case, seq_len_for
from reference.cp import plan_rank
from reference.decode import query_tile
from reference.rules import long_requests, own_pages
from reference.selection import exact_keys, top_keys
from support import DEV, EDGE_ROW_LENS, POISON, id_bounds, on

EXACT = tuple(EXACT_PATTERNS)


@given(
    cp=st.sampled_from([1, 2, 4, 8]),
    lens=st.lists(st.integers(-300, 40 * 128), min_size=1, max_size=4),
    p_table=st.integers(1, 45),
    extra=st.integers(0, 3),
    ids=st.sampled_from(["distinct", "repeated", "out of range"]),
)
def test_compact_table_matches_reference_plan(cp, lens, p_table, extra, ids):
    """The plan's compact table, lengths and page counts equal the reference's plan, and its
    id bounds (the guards' input) are each request's extremes over every rank's columns."""
    batch = len(lens)
    table = torch.randperm(1000)[: batch * p_table].view(batch, p_table).to(torch.int32)
    if ids == "repeated":
        table = table % 3
    elif ids == "out of range":
        table = table - 500
    seq = torch.tensor(lens, dtype=torch.int32)
    p = min(p_table, 8192)
    width = reference.compact_width(p, cp) + extra
    for rank in range(cp):
        cbt, n_local, score_lens = plan_rank(table, seq.clamp(min=0), p, width, cp, rank)
        outs = [on(torch.full((batch, width), -7, dtype=torch.int32))] + [
            on(torch.full((batch,), -7, dtype=torch.int32)) for _ in range(3)
        ]
        bounds = on(torch.full((batch, 4), -7, dtype=torch.int32))
        compact_table_kernel[(batch,)](
            on(table), on(seq), *outs, bounds, p, p_table, W=width, CP=cp, RANK=rank, BLOCK=16
        )
        got_cbt, got_lens, got_seq, got_n = (o.cpu() for o in outs)
        assert torch.equal(got_cbt, cbt) and torch.equal(got_lens, score_lens)
        assert torch.equal(got_seq, seq) and torch.equal(got_n.long(), n_local)
        assert torch.equal(bounds.cpu(), id_bounds(table, seq, p))


@pytest.mark.parametrize("pages", [17, 2048, 4095, 8192])
def test_cp_score_rows_are_aligned_and_padded(pages):
    """The push's 16-byte loads (select.levels._quad_max) need every row of the CP scores
    16-byte aligned, and a load from any of its W columns inside the row: 3 floats of
    padding past them (cp.score_row_stride)."""
    state = IndexerDecodeCP(heads=4, max_reqs=3, symm=SingleRankSymmetric(DEV))
    plan = state.plan(
        on(torch.zeros(3, pages, dtype=torch.int32)), on(torch.full((3,), pages * PAGE, dtype=torch.int32))
    )
    scores = plan.scores
    assert (
        scores.data_ptr() % 16 == 0
        and scores.stride(0) % 4 == 0
        and scores.stride(1) % 4 == 0
        and scores.stride(2) == 1
    )
    assert scores.stride(1) >= scores.shape[2] + 3 and scores.stride(0) == scores.shape[1] * scores.stride(1)


@pytest.mark.gpu  # the interpreter runs any warps alike
@pytest.mark.parametrize("pattern", ["exact", "ties"])
@pytest.mark.parametrize(
    "max_chunk, pages, warp_select",
    [(1024, (17, 90), False), (16, (17, 90), False), (1024, (520, 1000), True)],
)  # one-chunk selects on one warp (tl.topk, or warp_select's block at 512+ columns), three-level on two
def test_cp1_queued_push_equals_oracle(pattern, max_chunk, pages, warp_select):
    """Enough rows x heads that the push runs on fewer warps (push_warps): the whole CP
    protocol with one rank still equals the reference, massive ties included."""
    from fast.backend import sm_count
    from fast.select.policy import push_warps

    heads, query_len = 4, 4
    batch = -(-QUEUED_PER_SM * sm_count(str(DEV)) // (heads * query_len))
    one_chunk = max_chunk == 1024  # rows of 17-1000 pages: < 1024 columns, > 16
    assert push_warps(batch * query_len * heads, one_chunk, sm_count(str(DEV))) == (1 if one_chunk else 2)
    gen = torch.Generator().manual_seed(3)
    lens = (torch.randint(pages[0] * PAGE, pages[1] * PAGE, (batch,), generator=gen)).tolist()
    case = make_case(11, lens, query_len=query_len, heads=heads, pattern=pattern)
    state = force_select(
        IndexerDecodeCP(heads=heads, max_reqs=batch, symm=SingleRankSymmetric(DEV)), max_chunk=max_chunk
    )
    layer = state.new_layer()
    plan = state.plan(on(case.block_table), on(case.seq_lens))
    split_plan = state._split(batch * query_len)
    assert (state._push_plan(batch * query_len, split_plan)[1] > 0) == warp_select
    out = on(torch.full((batch * query_len, heads, 16), -7, dtype=torch.int32))
    state.forward(layer, plan, on(case.index_q), on(case.k_cache), out, query_len)
    state.check()
    assert torch.equal(out.cpu(), reference.full_decode(*case.args()))


@pytest.mark.gpu  # the PTX block: GPUs only
@pytest.mark.parametrize("pattern", ["random", "ties", "few groups"])
@pytest.mark.parametrize("columns", [2048, 4096])
def test_queued_wide_push_selects_in_two_levels(pattern, columns):
    """Rows of 2048 and 4096 columns (a CP = 2 rank's at 512K and 1M), on the shallowest
    queue that runs them on one warp (push_warps): the push's two levels on one warp
    (warp_groups_top16: the block over 512 groups' keys, groups of 4 and 8 columns, then
    tl.topk over the best 16 groups' members) store each row's exact top 16 keys, as a
    set, in the owner's slots. The scores go in directly: the reference's scorer over
    such rows would take minutes on the CPU. "ties": scores of four values, so groups tie
    at their maxima and keys at their scores; "few groups": rows whose history holds
    fewer than 16 groups."""
    from fast.backend import sm_count
    from fast.select.policy import WARP_SELECT_PER_SM

    heads, query_len = 4, 4
    batch = -(-WARP_SELECT_PER_SM * sm_count(str(DEV)) // (heads * query_len))
    gen = torch.Generator().manual_seed(columns)
    high = 20 * PAGE if pattern == "few groups" else columns * PAGE
    lens = torch.randint(17 * PAGE, high, (batch,), generator=gen, dtype=torch.int32)
    lens[0] = columns * PAGE  # a row as wide as the plan
    state = StagedCP(heads=heads, max_reqs=batch, symm=SingleRankSymmetric(DEV))
    layer = state.new_layer()
    plan = state.plan(on(torch.zeros(batch, columns, dtype=torch.int32)), on(lens))
    split_plan = state._split(batch * query_len)
    assert state._push_plan(batch * query_len, split_plan) == (1, 512)
    scores = torch.randn(plan.scores.shape, generator=gen)
    if pattern == "ties":
        scores = scores.round().clamp(-1, 2)
    plan.scores.copy_(scores)
    state.push(layer, plan, query_len, num_blocks=1)
    torch.cuda.synchronize()
    got = layer.recv.local.view(2, 1, state.rows_max, heads, 16)[0, 0, : batch * query_len].cpu()
    own = own_pages(lens, query_len)  # [rows]
    j = torch.arange(plan.scores.shape[2])
    rows = scores.view(batch, SLOTS, heads, -1)[:, SLOTS - query_len :].reshape(batch * query_len, heads, -1)
    n_rank = torch.minimum(own, plan.n_local.cpu().repeat_interleave(query_len))[:, None, None]
    want = top_keys(exact_keys(rows, j, j < n_rank).view(-1, j.numel()), 16).view(batch * query_len, heads, 16)
    long = own + 1 > 16
    assert bool(long.any()) and torch.equal(got[long].sort(dim=-1, descending=True).values, want[long])


@pytest.mark.heavy
@settings(max_examples=20)
@given(decode_configs(max_pages=60, patterns=EXACT), st.sampled_from([1024, 16]), st.sampled_from([1, 4]))
def test_cp1_in_process_equals_oracle(cfg, max_chunk, split):
    """The whole CP protocol with one rank (the buffer its own only peer); split 4: each
    row's push selects over 4 programs."""
    case = cfg.build()
    heads = case.index_q.shape[1]
    state = IndexerDecodeCP(heads=heads, max_reqs=max(1, len(cfg.seq_lens)), symm=SingleRankSymmetric(DEV))
    force_select(state, max_chunk=max_chunk, split=split)
    layer = state.new_layer()
    plan = state.plan(on(case.block_table), on(case.seq_lens))
    plan.scores.fill_(POISON)
    out = on(torch.full((case.index_q.shape[0], heads, 16), -7, dtype=torch.int32))
    state.forward(layer, plan, on(case.index_q), on(case.k_cache), out, case.query_len)
    state.check()
    assert torch.equal(out.cpu(), reference.full_decode(*case.args()))
    # The step left the buffers armed for the next one, and flipped the parity if it used
    # them (a step without a long request uses no buffer).
    assert bool((layer.recv.local == -1).all()) and bool((layer.tile.local == -1).all())
    used = bool(long_requests(case.seq_lens).any())
    assert int(layer.parity) == int(used) and int(layer.current) == 0 and int(state._counts.abs().sum()) == 0


@pytest.mark.parametrize("max_chunk", [1024, 16])
def test_cp_push_selects_the_last_rankable_column(max_chunk):
    """The push's select spans the W - 1 columns a row can rank (W = ceil(P / CP) + 1, the
    last column the lying length's page), not W: at P = 65 that is 65 columns, the last
    one page 64. Its page is made the second best (a copy of the best page's block), so a
    select one column short would drop it."""
    pages = 65
    case = make_case(7, [pages * PAGE + 40], query_len=1, heads=1, pattern="exact", table_width=pages, num_blocks=pages)
    scores = torch.full((1, 8, pages), POISON)
    reference.score_pages(query_tile(case.index_q, 1, 1), case.k_cache, case.block_table, case.seq_lens, scores)
    table = case.block_table.clone()
    table[0, -1] = table[0, int(scores[0, 7].argmax())]
    state = force_select(IndexerDecodeCP(heads=1, max_reqs=1, symm=SingleRankSymmetric(DEV)), max_chunk=max_chunk)
    layer = state.new_layer()
    plan = state.plan(on(table), on(case.seq_lens))
    out = on(torch.full((1, 1, 16), -7, dtype=torch.int32))
    state.forward(layer, plan, on(case.index_q), on(case.k_cache), out, 1)
    want = reference.full_decode(case.index_q, case.k_cache, table, case.seq_lens, 1)
    assert pages - 1 in want[0, 0, :15].tolist()
    assert torch.equal(out.cpu(), want)


def test_a_step_after_a_timeout_outputs_only_minus_one():
    """With the error flag already set (a spin gave up), every merge program writes its rows
    -1 — short rows, which need no peer, included — and the step still ends: parity
    flipped."""
    case = make_case(
        3, [seq_len_for(40, 5), seq_len_for(3, 0), seq_len_for(90, 1)], query_len=2, heads=2, pattern="exact"
    )
    state = IndexerDecodeCP(heads=2, max_reqs=3, symm=SingleRankSymmetric(DEV), spin_timeout_s=0.05)
    layer = state.new_layer()
    plan = state.plan(on(case.block_table), on(case.seq_lens))
    state.error.fill_(ERR_Q_TIMEOUT)
    out = on(torch.full((case.index_q.shape[0], 2, 16), -7, dtype=torch.int32))
    state.forward(layer, plan, on(case.index_q), on(case.k_cache), out, case.query_len)
    assert bool((out == -1).all())
    assert int(layer.parity) == 1
    with pytest.raises(PeerTimeoutError, match="the q exchange gave up") as info:
        state.check()
    assert info.value.stage == "the q exchange"  # the step after it added nothing of its own


@pytest.mark.parametrize("split", [1, 4])
def test_push_writes_only_its_long_rows_slots(split):
    """The push alone, on random scores: it writes every slot of each long row of a request
    that passes the guard, in the step's set, and nothing else — not the other set, not the
    rows of short, padding or bad requests, not the rows past the step's (all stay -1)."""
    q, heads, columns = 2, 2, 40
    lens = torch.tensor([seq_len_for(38, 3), seq_len_for(9, 0), 0, seq_len_for(30, 1), -5], dtype=torch.int32)
    table = torch.zeros(5, columns, dtype=torch.int32)
    table[3, 4] = 99  # request 3 reads an id past the one-page cache: no rank pushes it
    state = force_select(StagedCP(heads=heads, max_reqs=6, symm=SingleRankSymmetric(DEV)), split=split)
    layer = state.new_layer()
    plan = state.plan(on(table), on(lens))
    plan.scores.copy_(torch.randn(plan.scores.shape, generator=torch.Generator().manual_seed(split)))
    layer.current.fill_(1)  # the step's set: the push reads it, the exchange would have stored it
    state.push(layer, plan, q, num_blocks=1)
    recv = layer.recv.local.view(2, 1, state.rows_max, heads, 16).cpu()
    assert bool((recv[0] == -1).all()), "the push wrote into the other buffer set"
    pushed = recv[1, 0] != -1  # [rows_max, heads, 16]
    want = torch.zeros_like(pushed)
    want[0:q] = True  # request 0: long and good; 1 short, 2 padding, 3 a bad id, 4 a bad length
    assert torch.equal(pushed, want)


def test_rows_at_the_short_long_edge_equal_the_oracle():
    """Short rows (written from their lengths, no push) and long ones (pushed, merged) side
    by side, a request with one of each included (support.EDGE_ROW_LENS)."""
    case = make_case(17, EDGE_ROW_LENS, query_len=2, heads=2, pattern="exact")
    state = IndexerDecodeCP(heads=2, max_reqs=len(EDGE_ROW_LENS), symm=SingleRankSymmetric(DEV))
    out = on(torch.full((case.index_q.shape[0], 2, 16), -7, dtype=torch.int32))
    plan = state.plan(on(case.block_table), on(case.seq_lens))
    state.forward(state.new_layer(), plan, on(case.index_q), on(case.k_cache), out, case.query_len)
    state.check()
    assert torch.equal(out.cpu(), reference.full_decode(*case.args()))


@pytest.mark.parametrize("cp,heads", [(4, 4), (2, 8), (8, 2)])
def test_owned_names_the_heads_a_rank_forward_takes(cp, heads):
    """``decode.owned`` (what the README's integration block slices index_q by) is rank r's
    own range of the model's heads, the reference's layout, not the first heads; the stock
    decode's is every head it was built for."""
    from fast.stock import StockDecode
    from reference.cp import HeadLayout

    class Rank(SingleRankSymmetric):
        def __init__(self, rank):
            super().__init__(DEV)
            self.world, self.rank = cp, rank

    for rank in range(cp):
        state = IndexerDecodeCP(heads=heads, max_reqs=1, symm=Rank(rank))
        assert state.owned == HeadLayout(cp, heads).heads_of(rank)
        assert len(state.owned) == state.local_heads
    assert StockDecode(heads=heads, max_reqs=1, device=DEV).owned == range(heads)
