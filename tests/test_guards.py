"""Device-side guards in one process (CP = 1 and the stock decode; the scorer alone): a bad
block id or length is never read, its request's rows are sixteen -1, the other requests are
exact, check() names the request, column and value, and reset() clears it. Padding requests
(length 0) are sixteen -1 with no error. ``test_protocol_ranks.py`` holds the multi-rank
agreement; ``test_bad_inputs.py`` the one-line verdicts."""

import pytest
import torch

import reference
from fast.cp import IndexerDecodeCP
from fast.errors import (
    BadBlockIdError,
    BadLengthError,
    BadQuerySetError,
    DecodeInputError,
    PageCopyTimeoutError,
    PeerTimeoutError,
    new_record,
    raise_recorded,
)
from fast.kernels.device import ERR_MERGE_TIMEOUT, ERR_PAGE_COPY_TIMEOUT, ERR_Q_TIMEOUT
from fast.kernels.guards import BAD_QUERY_SET
from fast.scorer import run_scorer
from fast.stock import StockDecode
from fast.symm import SingleRankSymmetric
from reference.cases import make_case, seq_len_for
from reference.decode import query_tile
from support import DEV, on

gpu = pytest.mark.skipif(DEV.type != "cuda", reason="needs a CUDA GPU; none is visible")

CASE = make_case(
    3, [seq_len_for(40, 3), seq_len_for(30, 0), 0, seq_len_for(25, 9)], query_len=2, heads=2, pattern="exact"
)
Q = CASE.query_len


def _decode(path: str, table, lens, k_cache=CASE.k_cache, state=None):
    """One forward of ``path`` ("cp": CP = 1, or "stock") on a new layer; returns (out [rows,
    H, 16], state). The CP layer's buffers must be armed again after it, bad input or not."""
    if state is None:
        state = (
            IndexerDecodeCP(heads=2, max_reqs=4, symm=SingleRankSymmetric(DEV))
            if path == "cp"
            else StockDecode(heads=2, max_reqs=4, device=DEV)
        )
    plan = state.plan(on(table), on(lens))
    if path == "cp":
        plan.scores.fill_(1e30)  # an unwritten column read would rank first
    out = on(torch.full((CASE.index_q.shape[0], 2, 16), -7, dtype=torch.int32))
    layer = state.new_layer()
    state.forward(layer, plan, on(CASE.index_q), on(k_cache), out, Q)
    if path == "cp":  # a bad request leaves no query and no candidate behind
        assert bool((layer.tile.local == -1).all()), "the q tile was not re-armed"
        assert bool((layer.recv.local == -1).all()), "a candidate was left in the receive buffer"
    return out.cpu(), state


def _want(path: str) -> torch.Tensor:
    return (reference.full_decode if path == "cp" else reference.stock_decode)(*CASE.args())


def _rows(b: int) -> slice:
    return slice(b * Q, (b + 1) * Q)


BAD_IDS = {
    # (request, column, id); request 0 reads 40 columns, request 1 reads 30
    "past-cache": (1, 7, CASE.k_cache.shape[0]),
    "huge": (0, 39, 10**6),
    "negative": (0, 0, -7),
    "int-min": (1, 29, -(2**31)),
}


@pytest.mark.parametrize("path", ["cp", "stock"])
@pytest.mark.parametrize("kind", sorted(BAD_IDS))
def test_bad_id_rows_are_minus_one_the_rest_exact(path, kind):
    b, column, value = BAD_IDS[kind]
    table = CASE.block_table.clone()
    table[b, column] = value
    out, state = _decode(path, table, CASE.seq_lens)
    want = _want(path)
    assert bool((out[_rows(b)] == -1).all())
    keep = torch.ones(out.shape[0], dtype=torch.bool)
    keep[_rows(b)] = False
    assert torch.equal(out[keep], want[keep])
    with pytest.raises(BadBlockIdError) as info:
        state.check()
    assert (info.value.request, info.value.column, info.value.value) == (b, column, value)
    with pytest.raises(BadBlockIdError):  # the record stays set until reset
        state.check()
    state.reset()
    state.check()
    again, _ = _decode(path, CASE.block_table, CASE.seq_lens, state=state)
    assert torch.equal(again, want)
    state.check()


@pytest.mark.parametrize("path", ["cp", "stock"])
def test_cache_smaller_than_the_table_refers_to(path):
    """A cache of N pages while the table holds ids up to N + k: those ids are bad."""
    small = int(CASE.block_table[1, :30].max())  # request 1's largest id is now past the cache
    out, state = _decode(path, CASE.block_table, CASE.seq_lens, k_cache=CASE.k_cache[:small].clone())
    with pytest.raises(BadBlockIdError) as info:
        state.check()
    e = info.value
    assert int(CASE.block_table[e.request, e.column]) == e.value >= small
    assert bool((out[_rows(e.request)] == -1).all())


@pytest.mark.parametrize("path", ["cp", "stock"])
@pytest.mark.parametrize("b,length", [(1, -1), (3, -(2**31)), (0, 1)])
def test_bad_length_rows_are_minus_one(path, b, length):
    lens = CASE.seq_lens.clone()
    lens[b] = length
    out, state = _decode(path, CASE.block_table, lens)
    want = _want(path)
    assert bool((out[_rows(b)] == -1).all())
    keep = torch.ones(out.shape[0], dtype=torch.bool)
    keep[_rows(b)] = False
    assert torch.equal(out[keep], want[keep])
    with pytest.raises(BadLengthError) as info:
        state.check()
    assert (info.value.request, info.value.column, info.value.value) == (b, -1, length)


@pytest.mark.parametrize("path", ["cp", "stock"])
def test_padding_is_minus_one_and_no_error(path):
    """Request 2 has length 0: its rows are sixteen -1, nothing is read (its table row is
    garbage), and check() passes; the reference agrees."""
    table = CASE.block_table.clone()
    table[2] = -5
    out, state = _decode(path, table, CASE.seq_lens)
    state.check()
    assert bool((out[_rows(2)] == -1).all())
    assert torch.equal(out, _want(path))
    garbage_row = reference.full_decode(CASE.index_q, CASE.k_cache, table, CASE.seq_lens, Q)[_rows(2)]
    assert torch.equal(garbage_row, out[_rows(2)])


@pytest.mark.parametrize("path", ["cp", "stock"])
def test_unread_table_entries_may_hold_anything(path):
    """Columns past a request's history are never read, so never judged (a server's table
    pads them with anything)."""
    table = CASE.block_table.clone()
    table[3, 25:] = 10**6  # request 3 reads 25 columns
    table[1, 30:] = -1
    out, state = _decode(path, table, CASE.seq_lens)
    state.check()
    assert torch.equal(out, _want(path))
    assert torch.equal(reference.full_decode(CASE.index_q, CASE.k_cache, table, CASE.seq_lens, Q), _want("cp"))


def test_the_first_bad_input_is_kept():
    """Two bad requests: the record keeps one of them, whole (not a mix of the two)."""
    table, lens = CASE.block_table.clone(), CASE.seq_lens.clone()
    table[0, 5] = -3
    lens[3] = -4
    _, state = _decode("stock", table, lens)
    with pytest.raises(DecodeInputError) as info:
        state.check()
    e = info.value
    assert (type(e), e.request, e.column, e.value) in {(BadBlockIdError, 0, 5, -3), (BadLengthError, 3, -1, -4)}


@pytest.mark.parametrize(
    "code, raised, stage",
    [
        (ERR_Q_TIMEOUT, PeerTimeoutError, "the q exchange"),
        (ERR_MERGE_TIMEOUT, PeerTimeoutError, "the merge"),
        (ERR_PAGE_COPY_TIMEOUT, PageCopyTimeoutError, "a page's copy"),
    ],
)
def test_each_protocol_code_names_its_spin(code, raised, stage):
    """The protocol word's codes: a peer's spin (the exchange, the merge) and the scorer's
    ring wait (a page copy that never landed) raise apart — only the first is a peer's —
    and each names the stage that gave up (an engineer debugging a hang starts there)."""
    record = new_record(torch.device("cpu"))
    record[0] = code
    with pytest.raises(raised) as info:
        raise_recorded(record, rank=3)
    assert str(info.value).startswith(f"rank 3: {stage}"), str(info.value)
    assert getattr(info.value, "stage", stage) == stage
    assert not (raised is PageCopyTimeoutError and isinstance(info.value, PeerTimeoutError))


KERNELS = ["table"] + (["wgmma"] if DEV.type == "cuda" else [])


@pytest.mark.parametrize("kernel", KERNELS)
def test_scorer_never_loads_a_bad_id(kernel):
    """score_pages alone: a bad id's stored columns get NaN, every other column the
    reference's score, and the record names (request, column, id)."""
    table = CASE.block_table.clone()
    table[1, 11] = 10**6
    tile = query_tile(CASE.index_q, 4, Q)
    width = table.shape[1]
    good = CASE.block_table.clone()
    want = torch.full((4, 16, width), 3.0)
    reference.score_pages(tile, CASE.k_cache, good, CASE.seq_lens, want)
    got = on(torch.full((4, 16, width), 3.0))
    record = new_record(DEV)
    first = 8 - Q  # the step's slots; the others hold no query (0xFF) and are not scored
    operands = (on(tile), on(CASE.k_cache), on(table), on(CASE.seq_lens), got)
    run_scorer(*operands, kernel=kernel, error=record, first_slot=first)
    got = got.cpu()
    live = torch.arange(16) >= first * 2  # rows slot * 2 + head
    column = got[1, live, 11]
    assert bool(torch.isnan(column).all())
    assert bool((got[:, ~live] == 3.0).all())  # rows before first_slot untouched
    other = torch.ones(width, dtype=torch.bool)
    other[11] = False
    assert torch.equal(got[1][live][:, other], want[1][live][:, other])
    assert torch.equal(got[[0, 2, 3]][:, live], want[[0, 2, 3]][:, live])
    assert record.tolist()[1:] == [1, 1, 11, 10**6]


@gpu
@pytest.mark.parametrize("path", ["cp", "stock"])
def test_guards_under_cuda_graphs(path):
    """Through GraphedDecode: a step with a bad id replays the captured graph, its request's
    rows are -1 and check() raises; after reset() the same graph replays exactly."""
    from fast.graphs import GraphedDecode

    state = (
        IndexerDecodeCP(heads=2, max_reqs=4, symm=SingleRankSymmetric(DEV))
        if path == "cp"
        else StockDecode(heads=2, max_reqs=4, device=DEV)
    )
    width = CASE.block_table.shape[1]
    graphed = GraphedDecode(state, query_len=Q, table_width=width, k_caches=[on(CASE.k_cache)], sizes=(4,))
    want = _want(path)
    good = graphed.step(on(CASE.block_table), on(CASE.seq_lens), on(CASE.index_q))[0].cpu()
    assert torch.equal(good, want)
    graphed.check()
    table = CASE.block_table.clone()
    table[0, 12] = 10**6
    bad = graphed.step(on(table), on(CASE.seq_lens), on(CASE.index_q))[0].cpu()
    assert graphed.captured == [4]
    assert bool((bad[_rows(0)] == -1).all()) and torch.equal(bad[Q:], want[Q:])
    with pytest.raises(BadBlockIdError):
        graphed.check()
    graphed.reset()
    again = graphed.step(on(CASE.block_table), on(CASE.seq_lens), on(CASE.index_q))[0].cpu()
    assert torch.equal(again, want)
    graphed.check()


# The id bounds the contract names (a read id must lie in [0, N)), at their edges: N and -1
# just outside, N - 1 and 0 just inside, and the farthest ints. (id, bad)
EDGE_IDS = {"N": True, "N-1": False, "0": False, "-1": True, "int32-max": True, "int32-min": True}
# Where the id sits: the first request's first column, and the last request's last column it
# reads (request 2 is padding: nothing read).
EDGE_SPOTS = [(0, 0), (3, 23)]


def _edge_id(name: str, n: int) -> int:
    return {"N": n, "N-1": n - 1, "0": 0, "-1": -1, "int32-max": 2**31 - 1, "int32-min": -(2**31)}[name]


def _scorer_calls(fmt: str):
    """(kernel, case, score(tile, cache, table, lens, out, error)) for every scorer of the
    format that runs here: the table / dot kernels everywhere, the Hopper ones on sm_90."""
    from fast.msa.scorer import run_block_scorer
    from fast.route import device_route
    from reference import msa

    hopper = device_route(DEV).sm90
    if fmt == "nvfp4":
        case = CASE
        ref = reference.score_pages
        kernels = ["table"] + (["wgmma"] if hopper else [])

        def fast_call(kernel):
            return lambda *ops, **kw: run_scorer(*ops, kernel=kernel, **kw)

        tile = query_tile(case.index_q, 4, Q)
    else:
        case = msa.make_case(3, list(CASE.seq_lens.tolist()), dtype=fmt, query_len=Q, heads=2, pattern="late")
        width = case.block_table.shape[1]

        def ref(*ops):
            return msa.score_blocks(*ops, num_pages=width)

        kernels = ["dot"] + (["mma"] if hopper else [])

        def fast_call(kernel):
            return lambda *ops, **kw: run_block_scorer(*ops, num_pages=width, kernel=kernel, **kw)

        tile = msa.decode.query_tile(case.index_q, 4, Q)
    return case, tile, ref, [(k, fast_call(k)) for k in kernels]


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "bf16"])
@pytest.mark.parametrize("edge", EDGE_IDS)
def test_scorers_guard_the_id_bounds_at_their_edges(fmt, edge):
    """score_pages / score_blocks called directly (public API: no decode's verdict masks the
    id first), every kernel of the format: an id just outside [0, N) is never loaded, its
    stored column is NaN and the record is exactly (BAD_BLOCK, request, column, id); an id
    just inside is scored as the reference scores it and leaves the record clear."""
    case, tile, ref, calls = _scorer_calls(fmt)
    n = case.k_cache.shape[0]
    width = case.block_table.shape[1]
    rows = tile.shape[1] * tile.shape[2]
    for request, column in EDGE_SPOTS:
        table = case.block_table.clone()
        table[request, column] = _edge_id(edge, n)
        clean = table.clone()
        if EDGE_IDS[edge]:
            clean[request, column] = 0  # what the reference scores in its place (any valid id)
        want = torch.full((4, rows, width), 3.0)
        ref(tile, case.k_cache, clean, case.seq_lens, want)
        for kernel, call in calls:
            got = on(torch.full((4, rows, width), 3.0))
            record = new_record(DEV)
            call(on(tile), on(case.k_cache), on(table), on(case.seq_lens), got, error=record)
            got = got.cpu()
            written = want[request, :, column] != 3.0  # the rows that store this column
            assert bool(written.any()), (request, column)  # the spot is a stored column
            if EDGE_IDS[edge]:
                assert bool(torch.isnan(got[request, written, column]).all()), (kernel, edge, request)
                assert record.tolist() == [0, 1, request, column, _edge_id(edge, n)], (kernel, edge, record)
                got[request, written, column] = want[request, written, column]
            else:
                assert record.tolist() == [0, 0, 0, 0, 0], (kernel, edge, record)
            assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)), (kernel, edge, request)


def _msa_decode(path: str, fmt: str, table, lens):
    """One forward of the BF16 / FP8 format's ``path`` ("cp": CP = 1, or "stock") on CASE's
    lengths; returns (out, state, case)."""
    from fast import MsaDecodeCP, MsaStockDecode
    from reference import msa

    case = msa.make_case(3, CASE.seq_lens.tolist(), dtype=fmt, query_len=Q, heads=2, pattern="late", init_blocks=1)
    windows = dict(key_format=fmt, **case.windows())
    state = (
        MsaDecodeCP(heads=2, max_reqs=4, symm=SingleRankSymmetric(DEV), **windows)
        if path == "cp"
        else MsaStockDecode(heads=2, max_reqs=4, device=DEV, **windows)
    )
    plan = state.plan(on(table if table is not None else case.block_table), on(lens))
    out = on(torch.full((case.index_q.shape[0], 2, 16), -7, dtype=torch.int32))
    state.forward(state.new_layer(), plan, on(case.index_q), on(case.k_cache), out, Q)
    return out.cpu(), state, case


@pytest.mark.parametrize("path", ["cp", "stock"])
@pytest.mark.parametrize("kind", sorted(BAD_IDS))
def test_msa_decodes_record_the_request_column_and_id(path, kind):
    """The BF16 / FP8 decodes' record, every field: the request (not one of its rows: Q = 2),
    the column, the id, and the code (a bad id, not a bad length)."""
    from reference import msa

    b, column, value = BAD_IDS[kind]
    case = msa.make_case(3, CASE.seq_lens.tolist(), dtype="fp8", query_len=Q, heads=2, pattern="late", init_blocks=1)
    table = case.block_table.clone()
    table[b, column] = value
    out, state, _ = _msa_decode(path, "fp8", table, CASE.seq_lens)
    assert bool((out[_rows(b)] == -1).all())
    with pytest.raises(BadBlockIdError) as info:
        state.check()
    assert (info.value.request, info.value.column, info.value.value) == (b, column, value)
    assert state.error.tolist() == [0, 1, b, column, value]


@pytest.mark.parametrize("path", ["cp", "stock"])
@pytest.mark.parametrize("b,length", [(1, -1), (3, -(2**31)), (3, 1)])
def test_msa_decodes_record_a_bad_length(path, b, length):
    lens = CASE.seq_lens.clone()
    lens[b] = length
    out, state, _ = _msa_decode(path, "bf16", None, lens)
    assert bool((out[_rows(b)] == -1).all())
    with pytest.raises(BadLengthError) as info:
        state.check()
    assert (info.value.request, info.value.column, info.value.value) == (b, -1, length)
    assert state.error.tolist() == [0, 2, b, -1, length]


# The tile set index's bounds (q_sel[0] in [0, q_sets), two sets as the CP decodes keep
# them) at their edges: in range, just outside, and the farthest int64s. (index, bad)
EDGE_SETS = {0: False, 1: False, 2: True, -1: True, 2**63 - 1: True, -(2**63): True}


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "bf16"])
@pytest.mark.parametrize("index", EDGE_SETS)
def test_scorers_guard_the_tile_set_index_at_its_edges(fmt, index):
    """score_pages / score_blocks with two tile sets, every kernel of the format: an index
    in range scores its own set exactly as the reference scores that tile; one outside
    reads set 0 instead, every stored column is NaN, nothing else is written, and the record is
    exactly (BAD_QUERY_SET, -1, -1, the index saturated to int32), which raise_recorded
    turns into BadQuerySetError."""
    case, tile, ref, calls = _scorer_calls(fmt)
    width = case.block_table.shape[1]
    rows = tile.shape[1] * tile.shape[2]
    other = tile.flip(2)  # the heads swapped: a set whose scores differ from tile's
    sets = torch.stack([other, tile])
    wants = []
    for t in sets:
        want = torch.full((4, rows, width), 3.0)
        ref(t, case.k_cache, case.block_table, case.seq_lens, want)
        wants.append(want)
    assert not torch.equal(wants[0], wants[1])
    stored = wants[1] != 3.0
    for kernel, call in calls:
        got = on(torch.full((4, rows, width), 3.0))
        record = new_record(DEV)
        q_sel = on(torch.tensor([index], dtype=torch.int64))
        q = on(sets)[0]
        call(
            q,
            on(case.k_cache),
            on(case.block_table),
            on(case.seq_lens),
            got,
            error=record,
            q_sel=q_sel,
            q_set_stride=tile.numel(),
            q_sets=2,
        )
        got = got.cpu()
        if EDGE_SETS[index]:
            saturated = max(min(index, 2**31 - 1), -(2**31))
            assert bool(torch.isnan(got[stored]).all()), (kernel, index)
            assert bool((got[~stored] == 3.0).all()), (kernel, index)
            assert record.tolist() == [0, BAD_QUERY_SET, -1, -1, saturated], (kernel, index, record)
            with pytest.raises(BadQuerySetError) as info:
                raise_recorded(record)
            assert (info.value.argument, info.value.value) == ("q_sel", saturated)
        else:
            assert record.tolist() == [0] * 5, (kernel, index, record)
            assert torch.equal(got.nan_to_num(7.0), wants[index].nan_to_num(7.0)), (kernel, index)
