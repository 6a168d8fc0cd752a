"""The MSA CP decode (docs/DESIGN.md §10.4) in one process: every rank's compact plan against
the reference's, the whole protocol at CP = 1 (the buffer its own peer) against the oracle,
bad input, state arguments, and on a GPU its CUDA-graph replay."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fast.errors import BadBlockIdError, BadLengthError
from fast.msa.cp import MsaDecodeCP
from fast.msa.kernels.cp import msa_compact_table_kernel
from fast.select.policy import force_select
from fast.symm import SingleRankSymmetric
from fuzz.strategies import msa_configs
from indexer_constants import PAGE
from reference import msa
from reference.cases import seq_len_for
from reference.msa.cases import EXACT_PATTERNS as MSA_EXACT
from reference.msa.cp import compact_table, msa_width
from support import DEV, POISON, on


def msa_bounds(table: torch.Tensor, seq: torch.Tensor, p: int) -> torch.Tensor:
    """int32 [B, 4]: (min id, its first column, max id, its first column) over the MSA read
    columns j < min(ceil(len / 128), P); (0, -1, 0, -1) where a request reads none."""
    rows = []
    for b in range(seq.shape[0]):
        n = min(-(-int(seq[b]) // PAGE), p) if int(seq[b]) >= 1 else 0
        ids = table[b, :n].tolist()
        rows.append([min(ids), ids.index(min(ids)), max(ids), ids.index(max(ids))] if ids else [0, -1, 0, -1])
    return torch.tensor(rows, dtype=torch.int32)


@given(
    cp=st.sampled_from([1, 2, 4, 8]),
    lens=st.lists(st.integers(-300, 40 * 128), min_size=1, max_size=4),
    p_table=st.integers(1, 45),
    extra=st.integers(0, 3),
)
def test_compact_plan_matches_the_reference(cp, lens, p_table, extra):
    """Every rank's compact table equals ``reference.msa.cp.compact_table`` (-1 past P), the
    scorer's lengths are the real ones of long requests (0 otherwise), n_local counts the
    rank's read columns, and the id bounds span every rank's read columns."""
    batch = len(lens)
    table = torch.randperm(1000)[: batch * p_table].view(batch, p_table).to(torch.int32)
    seq = torch.tensor(lens, dtype=torch.int32)
    p = min(p_table, 8192)
    width = msa_width(p, cp) + extra
    reads = [min(-(-n // PAGE), p) if n >= 1 else 0 for n in lens]
    for rank in range(cp):
        outs = [on(torch.full((batch, width), -7, dtype=torch.int32))] + [
            on(torch.full((batch,), -7, dtype=torch.int32)) for _ in range(3)
        ]
        bounds = on(torch.full((batch, 4), -7, dtype=torch.int32))
        msa_compact_table_kernel[(batch,)](
            on(table), on(seq), *outs, bounds, p, p_table, W=width, CP=cp, RANK=rank, BLOCK=16
        )
        cbt, score_lens, seq_out, n_local = (o.cpu() for o in outs)
        assert torch.equal(cbt, compact_table(table, p, width, cp, rank))
        assert torch.equal(score_lens, torch.where(seq > 16 * PAGE, seq, 0))
        assert torch.equal(seq_out, seq)
        assert n_local.tolist() == [(max(r - rank, 0) + cp - 1) // cp for r in reads]
        assert torch.equal(bounds.cpu(), msa_bounds(table, seq, p))


def one_rank(case, max_chunk=None, split=None) -> tuple[MsaDecodeCP, object, torch.Tensor]:
    """(state, layer, out) after one CP = 1 forward of ``case`` over POISON-filled scores,
    its push's select shape forced where ``max_chunk`` / ``split`` say (``force_select``)."""
    heads = case.index_q.shape[1]
    fmt = "fp8" if case.k_cache.dtype == torch.float8_e4m3fn else "bf16"
    state = MsaDecodeCP(
        heads=heads,
        max_reqs=max(1, case.seq_lens.shape[0]),
        symm=SingleRankSymmetric(DEV),
        key_format=fmt,
        **case.windows(),
    )
    force_select(state, max_chunk=max_chunk, split=split)
    layer = state.new_layer()
    plan = state.plan(on(case.block_table), on(case.seq_lens))
    plan.scores.fill_(POISON)  # a column the scorer leaves alone must never be ranked
    out = on(torch.full((case.index_q.shape[0], heads, 16), -7, dtype=torch.int32))
    state.forward(layer, plan, on(case.index_q), on(case.k_cache), out, case.query_len)
    return state, layer, out.cpu()


@settings(max_examples=12)
@given(msa_configs(max_pages=50, cps=(1,), patterns=MSA_EXACT), st.sampled_from([1024, 16]), st.sampled_from([1, 4]))
def test_cp1_equals_the_oracle_and_rearms(cfg, max_chunk, split):
    """The whole protocol with one rank: the oracle bit for bit (bf16 queries holding 0xFF
    bytes), rows whole or split, one select or three levels; after the step both buffer
    sets are armed again and the parity flipped where a long request used them."""
    case = cfg.build()
    state, layer, out = one_rank(case, max_chunk=max_chunk, split=split)
    state.check()
    assert torch.equal(out, msa.full_decode(*case.args(), **case.windows()))
    assert bool((layer.recv.local == -1).all()) and bool((layer.tile.local == -1).all())
    used = bool((case.seq_lens > 16 * PAGE).any())
    assert int(layer.parity) == int(used) and int(state._counts.abs().sum()) == 0


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("windows", [(0, 0), (1, 1), (3, 13), (16, 0), (0, 16)])
def test_windows_at_the_edges_and_past_the_table(dtype, windows):
    """Lengths at the 16-block edge, past it and past the table (P = 24), the ``late``
    pattern (a token mask one token off changes scores), padding."""
    init, local = windows
    lens = [seq_len_for(16, 0), seq_len_for(16, 1), seq_len_for(23, 127), seq_len_for(40, 5), 0]
    case = msa.make_case(
        3, lens, dtype=dtype, query_len=3, heads=2, pattern="late", init_blocks=init, local_blocks=local, table_width=24
    )
    state, _, out = one_rank(case)
    state.check()
    assert torch.equal(out, msa.full_decode(*case.args(), **case.windows()))


def test_bad_rows_are_minus_one_and_the_first_is_named():
    """A bad id in a column only the local window reads, then (on a fresh state) a length
    below query_len: the request's rows -1, the others exact, check() names the input;
    reset() clears it."""
    case = msa.make_case(5, [seq_len_for(30, 3), seq_len_for(20, 0), seq_len_for(18, 2)], query_len=2, heads=2)
    want = msa.full_decode(*case.args(), **case.windows())
    case.block_table[1, 20] = case.k_cache.shape[0] + 1
    state, _, out = one_rank(case)
    assert bool((out[2:4] == -1).all()) and torch.equal(out[:2], want[:2]) and torch.equal(out[4:], want[4:])
    with pytest.raises(BadBlockIdError) as err:
        state.check()
    assert (err.value.request, err.value.column, err.value.value) == (1, 20, case.k_cache.shape[0] + 1)
    state.reset()
    state.check()
    case.block_table[1, 20] = 0
    case.seq_lens[2] = 1
    state, _, out = one_rank(case)
    assert bool((out[4:] == -1).all()) and torch.equal(out[:4], want[:4])
    with pytest.raises(BadLengthError):
        state.check()


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(key_format="nvfp4"), "key_format: must be one of"),
        (dict(init_blocks=9, local_blocks=8), "local_blocks: init_blocks"),
        (dict(local_blocks=-1), "local_blocks: must be in 0..16"),
        (dict(heads=3), "heads: must be one of"),
    ],
)
def test_bad_state_arguments_name_themselves(change, match):
    kw = dict(heads=2, max_reqs=2, symm=SingleRankSymmetric(DEV), key_format="bf16", init_blocks=1, local_blocks=1)
    with pytest.raises((TypeError, ValueError), match=match):
        MsaDecodeCP(**(kw | change))


@pytest.mark.gpu
def test_graph_replay_of_the_msa_cp_decode():
    """GPU: MsaDecodeCP (CP = 1) under GraphedDecode, two layers, batch sizes padded to
    1/2/4, new tables, lengths and queries every step, planned between replays: the oracle."""
    from fast.graphs import GraphedDecode

    gen = torch.Generator().manual_seed(4)
    width, heads, q = 40, 2, 2
    for fmt in ("fp8", "bf16"):
        state = MsaDecodeCP(
            heads=heads,
            max_reqs=4,
            symm=SingleRankSymmetric(DEV),
            key_format=fmt,
            init_blocks=2,
            local_blocks=3,
            pdl=True,
        )
        cache = msa.make_case(2, [seq_len_for(width, 0)], dtype=fmt, query_len=q, heads=heads, pattern="late").k_cache
        graphed = GraphedDecode(state, query_len=q, table_width=width, k_caches=[on(cache)], layers=2, sizes=(1, 2, 4))
        for step in range(8):
            batch = int(torch.randint(1, 5, (), generator=gen))
            lens = torch.randint(0, width * PAGE + 600, (batch,), generator=gen).to(torch.int32)
            lens = torch.where(lens < q, 0, lens).to(torch.int32)
            table = torch.randint(0, cache.shape[0], (batch, width), generator=gen).to(torch.int32)
            case = msa.make_case(10 + step, [q] * batch, dtype=fmt, query_len=q, heads=heads, pattern="late")
            out = graphed.step(on(table), on(lens), on(case.index_q))
            want = msa.full_decode(case.index_q, cache, table, lens, q, init_blocks=2, local_blocks=3)
            assert torch.equal(out[0].cpu(), want) and torch.equal(out[1].cpu(), want), (fmt, step)
        graphed.check()
