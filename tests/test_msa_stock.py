"""The fast stock decode for BF16 / FP8 keys (docs/DESIGN.md §10) in one process: its select
on its own scores against the reference's selection, end to end against the oracle on
exact-arithmetic inputs, forced windows, padding, bad inputs caught on the device."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fast.errors import BadBlockIdError, BadLengthError
from fast.msa.stock import MsaStockDecode, msa_stock_decode
from fast.select.policy import SelectShape, force_select
from fuzz.strategies import msa_configs
from indexer_constants import PAGE, SLOTS
from reference import msa
from reference.cases import seq_len_for
from reference.msa.rules import causal_blocks
from reference.msa.selection import select
from support import DEV, POISON, on


def run_stock(case, max_chunk: int = 1024, split: int | None = None):
    """(decode, plan, out) of one forward over POISON-filled scores; max_chunk 16 forces the
    three-level select on rows (slices) longer than 16 candidates; split > 1 splits each
    row over programs."""
    heads = case.index_q.shape[1]
    fmt = "fp8" if case.k_cache.dtype == torch.float8_e4m3fn else "bf16"
    sd = MsaStockDecode(
        heads=heads,
        max_reqs=max(1, case.seq_lens.shape[0]),
        device=DEV,
        key_format=fmt,
        init_blocks=case.init_blocks,
        local_blocks=case.local_blocks,
    )
    force_select(sd, split=split)
    plan = sd.plan(on(case.block_table), on(case.seq_lens))
    sd.shape = SelectShape.for_width(sd.width, max_chunk)
    # columns the scorer leaves alone must never be ranked: the row's padding past the
    # table's width (stock_row_stride) too, which the one-chunk select loads
    padded = plan.scores.as_strided((*plan.scores.shape[:2], plan.scores.stride(1)), plan.scores.stride())
    padded.fill_(POISON)
    out = on(torch.full((case.index_q.shape[0], heads, 16), -7, dtype=torch.int32))
    sd.forward(sd.new_layer(), plan, on(case.index_q), on(case.k_cache), out, case.query_len)
    return sd, plan, out.cpu()


@pytest.mark.heavy
@settings(max_examples=12, deadline=None)
@given(msa_configs(max_pages=60, cps=(1,)), st.sampled_from([1024, 16]), st.sampled_from([1, 2, 4]))
def test_select_matches_the_reference_on_its_own_scores(cfg, max_chunk, split):
    """Selection exactly (forced windows, candidates, ascending order, padding), on the
    kernel's own scores through the reference's selection, rows whole or split."""
    case = cfg.build()
    sd, plan, out = run_stock(case, max_chunk, split)
    batch, q, heads = case.seq_lens.shape[0], case.query_len, case.index_q.shape[1]
    width = plan.pages
    scores = plan.scores.cpu().view(batch, SLOTS, heads, sd.width)[:, SLOTS - q :, :, :width]
    n = causal_blocks(case.seq_lens, q).repeat_interleave(heads)
    want = select(scores.reshape(-1, width), n, width, case.init_blocks, case.local_blocks)
    assert torch.equal(out.view(-1, 16), want)


@pytest.mark.parametrize("pages", [1, 16, 40, 1000])
def test_score_rows_are_a_multiple_of_16_columns_apart(pages):
    """The stock score buffer's rows start 64-byte aligned at any table width, so the
    one-chunk select loads them 16 bytes at a time (tests/test_sass.py holds the loads)."""
    sd = MsaStockDecode(heads=2, max_reqs=3, device=DEV, key_format="fp8", init_blocks=1, local_blocks=1)
    plan = sd.plan(on(torch.zeros(3, pages, dtype=torch.int32)), on(torch.ones(3, dtype=torch.int32)))
    assert plan.scores.shape == (3, SLOTS * 2, pages)
    assert plan.scores.stride(1) == -(-pages // 16) * 16 and plan.scores.stride(0) == SLOTS * 2 * plan.scores.stride(1)


@settings(max_examples=10, deadline=None)
@given(msa_configs(max_pages=40, cps=(1,)))
def test_stock_equals_the_oracle_on_exact_inputs(cfg):
    case = cfg.build()
    if case.index_q.shape[0] == 0:
        return
    _, _, out = run_stock(case)
    want = msa.full_decode(*case.args(), init_blocks=case.init_blocks, local_blocks=case.local_blocks)
    assert torch.equal(out, want)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("windows", [(0, 0), (1, 1), (3, 13), (16, 0), (0, 16), (2, 5)])
def test_forced_windows_and_the_late_tokens(dtype, windows):
    """Lengths around the 16-block edge and past the table (the local window still output),
    the ``late`` pattern: a token mask one token off changes scores."""
    init, local = windows
    lens = [seq_len_for(16, 0), seq_len_for(16, 1), seq_len_for(30, 127), seq_len_for(41, 5), 0]
    case = msa.make_case(
        3, lens, dtype=dtype, query_len=3, heads=2, pattern="late", init_blocks=init, local_blocks=local, table_width=36
    )
    for split in (1, 4):
        sd, _, out = run_stock(case, 16, split)
        want = msa.full_decode(*case.args(), init_blocks=init, local_blocks=local)
        assert torch.equal(out, want), split
        assert not bool(sd._counts.any())  # a split row's count is back at 0


def test_the_convenience_call_equals_the_oracle_and_raises_bad_ids():
    case = msa.make_case(4, [seq_len_for(20, 9), 3], dtype="fp8", query_len=2, heads=4, pattern="exact")
    args = [on(x) for x in case.args()[:4]]
    kw = dict(init_blocks=1, local_blocks=2)
    got = msa_stock_decode(*args, query_len=2, **kw)
    assert torch.equal(got.cpu(), msa.full_decode(*case.args(), **kw))
    bad = case.block_table.clone()
    bad[0, 20] = case.k_cache.shape[0]  # the own block of the last query: read
    args[2] = on(bad)
    with pytest.raises(BadBlockIdError) as err:
        msa_stock_decode(*args, query_len=2, **kw)
    assert (err.value.request, err.value.column, err.value.value) == (0, 20, case.k_cache.shape[0])


def test_bad_rows_are_minus_one_and_the_first_is_named():
    case = msa.make_case(5, [seq_len_for(18, 3), 1, seq_len_for(2, 0)], dtype="bf16", query_len=2, heads=1)
    sd, _, out = run_stock(case)
    assert bool((out[2:4] == -1).all())  # request 1: length 1 < query_len 2
    assert not bool((out[0:2] == -1).all())
    with pytest.raises(BadLengthError):
        sd.check()
    sd.reset()
    sd.check()


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(key_format="nvfp4"), "key_format: must be one of"),
        (dict(init_blocks=9, local_blocks=8), "local_blocks: init_blocks"),
        (dict(init_blocks=-1), "init_blocks: must be in 0..16"),
        (dict(heads=3), "heads: must be one of"),
    ],
)
def test_bad_state_arguments_name_themselves(change, match):
    kw = dict(heads=2, max_reqs=2, device=DEV, key_format="bf16", init_blocks=1, local_blocks=1) | change
    with pytest.raises((TypeError, ValueError), match=match):
        MsaStockDecode(**kw)


def test_forward_refuses_the_other_format():
    case = msa.make_case(6, [seq_len_for(3, 3)], dtype="bf16", heads=2)
    sd = MsaStockDecode(heads=2, max_reqs=1, device=DEV, key_format="fp8", init_blocks=0, local_blocks=0)
    plan = sd.plan(on(case.block_table), on(case.seq_lens))
    out = on(torch.zeros(1, 2, 16, dtype=torch.int32))
    with pytest.raises(TypeError, match="index_q: expected dtype torch.float8_e4m3fn"):
        sd.forward(sd.new_layer(), plan, on(case.index_q), on(case.k_cache), out, 1)
    assert PAGE == 128


@pytest.mark.gpu
def test_graph_replay_of_the_msa_stock_decode():
    """GPU: MsaStockDecode under GraphedDecode (two layers, batch sizes padded to 1/2/4,
    new tables, lengths and queries every step, planned between replays) equals the oracle."""
    from fast.graphs import GraphedDecode

    gen = torch.Generator().manual_seed(4)
    width, heads, q = 40, 2, 2
    for fmt in ("fp8", "bf16"):
        sd = MsaStockDecode(
            heads=heads, max_reqs=4, device=DEV, key_format=fmt, init_blocks=2, local_blocks=3, pdl=True
        )
        cache = msa.make_case(2, [seq_len_for(width, 0)], dtype=fmt, query_len=q, heads=heads, pattern="late").k_cache
        graphed = GraphedDecode(sd, query_len=q, table_width=width, k_caches=[on(cache)], layers=2, sizes=(1, 2, 4))
        for step in range(6):
            batch = int(torch.randint(1, 5, (), generator=gen))
            lens = torch.randint(0, width * PAGE, (batch,), generator=gen).to(torch.int32)
            lens = torch.where(lens < q, 0, lens).to(torch.int32)
            table = torch.randint(0, cache.shape[0], (batch, width), generator=gen).to(torch.int32)
            case = msa.make_case(10 + step, [q] * batch, dtype=fmt, query_len=q, heads=heads, pattern="late")
            out = graphed.step(on(table), on(lens), on(case.index_q))
            want = msa.full_decode(case.index_q, cache, table, lens, q, init_blocks=2, local_blocks=3)
            assert torch.equal(out[0].cpu(), want) and torch.equal(out[1].cpu(), want), (fmt, step)
        graphed.check()
