"""Arguments that must agree with each other, at every entry point that takes them: a block
table with more rows than there are requests (or fewer), lengths for another batch, queries
for another batch or query length, an output of another shape. Each alone is a valid tensor;
only the pair disagrees, and every entry point must say so (ValueError naming one of the
two) before any kernel runs — the per-argument table of ``test_bad_inputs.py`` cannot see it.
"""

from __future__ import annotations

import pytest
import torch

import fast
import reference
from fast.symm import SingleRankSymmetric
from indexer_constants import SLOTS
from reference import msa
from reference.cases import make_case
from reference.decode import query_tile
from support import DEV

Q = 2  # query_len of every case here
LENS = [3000, 300]  # two requests


def _nvfp4():
    return make_case(5, LENS, query_len=Q, heads=4, pattern="exact")


def _msa():
    return msa.make_case(5, LENS, dtype="fp8", query_len=Q, heads=4, pattern="late", init_blocks=1, local_blocks=2)


def _grow(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` with ``rows`` rows more (copies of its last), or fewer where negative."""
    if rows < 0:
        return x[:rows].contiguous()
    return torch.cat([x, x[-1:].expand(rows, *x.shape[1:])]).contiguous()


# (name, change): what one argument of a decode's five becomes; each disagrees with another
# argument only (block_table with seq_lens, index_q with seq_lens and query_len).
DECODE_PAIRS = {
    "block_table-more-rows-than-requests": ("block_table", lambda x: _grow(x, 1)),
    "block_table-fewer-rows-than-requests": ("block_table", lambda x: _grow(x, -1)),
    "seq_lens-more-requests-than-table-rows": ("seq_lens", lambda x: _grow(x, 1)),
    "index_q-rows-of-another-batch": ("index_q", lambda x: _grow(x, Q)),
    "index_q-rows-of-another-query_len": ("index_q", lambda x: _grow(x, -1)),
}
FIELDS = ("index_q", "k_cache", "block_table", "seq_lens")


def _changed(case, which: str, change) -> list:
    args = list(case.args())
    i = FIELDS.index(which)
    args[i] = change(args[i])
    return args


def _expect_pair_error(call, names: tuple[str, ...]):
    with pytest.raises(ValueError) as e:
        call()
    assert str(e.value).split(":")[0] in names, str(e.value)


# Which names an error for each pair may carry: either side of the disagreement.
PAIR_NAMES = {
    "block_table": ("block_table", "seq_lens"),
    "seq_lens": ("block_table", "seq_lens"),
    "index_q": ("index_q", "seq_lens", "query_len"),
}


@pytest.mark.parametrize("pair", DECODE_PAIRS, ids=DECODE_PAIRS)
@pytest.mark.parametrize("entry", ["full_decode", "stock_decode", "cp_decode"])
def test_reference_decodes_refuse_disagreeing_pairs(entry, pair):
    which, change = DECODE_PAIRS[pair]
    fn = getattr(reference, entry)
    kw = {"cp": 2} if entry == "cp_decode" else {}
    _expect_pair_error(lambda: fn(*_changed(_nvfp4(), which, change), **kw), PAIR_NAMES[which])


@pytest.mark.parametrize("pair", DECODE_PAIRS, ids=DECODE_PAIRS)
@pytest.mark.parametrize("entry", ["full_decode", "cp_decode"])
def test_reference_msa_decodes_refuse_disagreeing_pairs(entry, pair):
    which, change = DECODE_PAIRS[pair]
    case = _msa()
    fn = getattr(msa, entry)
    kw = {"cp": 2} if entry == "cp_decode" else {}
    _expect_pair_error(lambda: fn(*_changed(case, which, change), **case.windows(), **kw), PAIR_NAMES[which])


def _states(fmt: str):
    """Every fast decode state of a format, on the tests' device, one rank."""
    if fmt == "nvfp4":
        return [
            fast.StockDecode(heads=4, max_reqs=4, device=DEV),
            fast.IndexerDecodeCP(heads=4, max_reqs=4, symm=SingleRankSymmetric(DEV)),
        ]
    windows = dict(key_format="fp8", init_blocks=1, local_blocks=2)
    return [
        fast.MsaStockDecode(heads=4, max_reqs=4, device=DEV, **windows),
        fast.MsaDecodeCP(heads=4, max_reqs=4, symm=SingleRankSymmetric(DEV), **windows),
    ]


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("pair", DECODE_PAIRS, ids=DECODE_PAIRS)
def test_fast_decodes_refuse_disagreeing_pairs(fmt, pair):
    """plan() compares the table with the lengths; forward() the queries and the output
    with the plan's requests and query_len."""
    which, change = DECODE_PAIRS[pair]
    case = _nvfp4() if fmt == "nvfp4" else _msa()
    for state in _states(fmt):
        index_q, k_cache, block_table, seq_lens = (x.to(DEV) for x in _changed(case, which, change)[:4])
        rows = index_q.shape[0]

        def step(state=state, index_q=index_q, k_cache=k_cache, block_table=block_table, seq_lens=seq_lens):
            plan = state.plan(block_table, seq_lens)
            out = torch.empty(rows, 4, 16, dtype=torch.int32, device=DEV)
            state.forward(state.new_layer(), plan, index_q, k_cache, out, Q)

        _expect_pair_error(step, PAIR_NAMES[which])


@pytest.mark.parametrize("pair", DECODE_PAIRS, ids=DECODE_PAIRS)
def test_msa_stock_decode_function_refuses_disagreeing_pairs(pair):
    which, change = DECODE_PAIRS[pair]
    case = _msa()
    index_q, k_cache, block_table, seq_lens = (x.to(DEV) for x in _changed(case, which, change)[:4])
    _expect_pair_error(
        lambda: fast.msa_stock_decode(index_q, k_cache, block_table, seq_lens, query_len=Q, **case.windows()),
        PAIR_NAMES[which],
    )


# The scorers' operands: q_tile's requests against block_table's rows, lens and out.
SCORER_PAIRS = {
    "block_table-more-rows-than-requests": ("block_table", lambda x: _grow(x, 1), ("block_table", "lens")),
    "block_table-fewer-rows-than-requests": ("block_table", lambda x: _grow(x, -1), ("block_table", "lens")),
    "lens-more-than-requests": ("lens", lambda x: _grow(x, 1), ("lens", "block_table")),
    "out-rows-of-another-batch": ("out", lambda x: _grow(x, 1), ("out",)),
    "out-wider-than-the-table": ("out", lambda x: torch.zeros(*x.shape[:2], x.shape[2] + 1), ("out",)),
}


def _scorer_operands(fmt: str) -> dict:
    case = _nvfp4() if fmt == "nvfp4" else _msa()
    tile = query_tile(case.index_q, len(LENS), Q) if fmt == "nvfp4" else msa.decode.query_tile(case.index_q, 2, Q)
    table = case.block_table
    out = torch.zeros(len(LENS), SLOTS * 4, table.shape[1])
    return dict(q_tile=tile, k_cache=case.k_cache, block_table=table, lens=case.seq_lens, out=out)


def _scorers(fmt: str):
    """(name, call(operands)) of every scorer entry point of the format."""
    if fmt == "nvfp4":
        return [("reference", reference.score_pages), ("fast", fast.score_pages)]

    def ref(q_tile, k_cache, block_table, lens, out):
        return msa.score_blocks(q_tile, k_cache, block_table, lens, out, num_pages=block_table.shape[1])

    def fast_(q_tile, k_cache, block_table, lens, out):
        return fast.score_blocks(q_tile, k_cache, block_table, lens, out, num_pages=block_table.shape[1])

    return [("reference", ref), ("fast", fast_)]


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("pair", SCORER_PAIRS, ids=SCORER_PAIRS)
def test_scorers_refuse_disagreeing_pairs(fmt, pair):
    which, change, names = SCORER_PAIRS[pair]
    for side, score in _scorers(fmt):
        ops = _scorer_operands(fmt)
        ops[which] = change(ops[which])
        if side == "fast":
            ops = {k: v.to(DEV) for k, v in ops.items()}
        _expect_pair_error(lambda score=score, ops=ops: score(**ops), names)
