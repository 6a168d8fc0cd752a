"""Bad host input to the fast path: a clear exception naming the argument, before any launch."""

import logging

import pytest
import torch

from fast.cp import IndexerDecodeCP, build_cp_decode
from fast.scorer import score_pages
from fast.stock import StockDecode
from fast.symm import SingleRankSymmetric, p2p_problem
from fast.tools.scorer_variants import score_variant
from reference import cp_decode, full_decode, stock_decode
from reference.cases import make_case, seq_len_for
from reference.decode import query_tile
from support import DEV, on

CASE = make_case(0, [seq_len_for(20, 0), seq_len_for(3, 4)], query_len=2, heads=4, pattern="exact")


class FakeSymmetric(SingleRankSymmetric):
    def __init__(self, world):
        super().__init__(DEV)
        self.world = world


def fresh_cp():
    state = IndexerDecodeCP(heads=4, max_reqs=2, symm=SingleRankSymmetric(DEV))
    layer = state.new_layer()
    plan = state.plan(on(CASE.block_table), on(CASE.seq_lens))
    return state, layer, plan


@pytest.mark.parametrize(
    "kwargs,exc,name",
    [
        pytest.param(dict(world=3), ValueError, "cp", id="cp-3"),
        pytest.param(dict(heads=3), ValueError, "heads", id="heads-3"),
        pytest.param(dict(max_reqs=0), ValueError, "max_reqs", id="max-reqs-0"),
        # a step's rows (max_reqs * 8) past the buffers' int32 offsets
        pytest.param(dict(max_reqs=1 << 18), ValueError, "max_reqs", id="max-reqs-past-int32-offsets"),
    ],
)
def test_unsupported_state(kwargs, exc, name):
    world = kwargs.pop("world", 1)
    args = dict(heads=4, max_reqs=2, symm=FakeSymmetric(world)) | kwargs
    with pytest.raises(exc, match=f"^{name}:"):
        IndexerDecodeCP(**args)


@pytest.mark.parametrize(
    "kwargs,exc,name",
    [
        pytest.param(dict(heads=3), ValueError, "heads", id="heads-3"),
        pytest.param(dict(heads=2.0), TypeError, "heads", id="heads-float"),
        pytest.param(dict(max_reqs=0), ValueError, "max_reqs", id="max-reqs-0"),
        pytest.param(dict(split=3), ValueError, "split", id="split-3"),
    ],
)
def test_unsupported_stock_state(kwargs, exc, name):
    with pytest.raises(exc, match=f"^{name}:"):
        StockDecode(**(dict(heads=4, max_reqs=2, device=DEV) | kwargs))


@pytest.mark.parametrize(
    "kwargs,why",
    [
        (dict(world=3), "3 ranks"),
        (dict(heads=3), "3 index heads"),
        (dict(max_query_len=9), "query length 9"),
        (dict(world=1), "single rank"),
        (dict(symm=None), "no symmetric memory"),
        (dict(symm=None, symm_reason=p2p_problem([0, 1], can_access=lambda a, b: False)), "no P2P"),
    ],
)
def test_fallback_to_stock_says_why(caplog, kwargs, why):
    """Each reason the stock fallback can give, logged once with the word "stock"."""
    world = kwargs.pop("world", 2)
    if kwargs.get("symm", True) is None:
        kwargs["world"] = world
    args = dict(heads=4, max_reqs=2, max_query_len=8, symm=FakeSymmetric(world)) | kwargs
    with caplog.at_level(logging.WARNING):
        assert build_cp_decode(**args) is None
    assert why in caplog.text and "stock" in caplog.text


def test_supported_state_builds():
    assert isinstance(build_cp_decode(heads=4, max_reqs=2, max_query_len=8, symm=FakeSymmetric(2)), IndexerDecodeCP)


def test_p2p_problem_names_the_pair():
    assert p2p_problem([0, 1, 0, 1], can_access=lambda a, b: True) is None
    assert p2p_problem([0, 0], can_access=lambda a, b: False) is None  # one GPU: no pair to check
    assert "GPU 1 has no peer access to GPU 2" in p2p_problem([0, 1, 2], can_access=lambda a, b: (a, b) != (1, 2))


def _bad_plan_inputs():
    bt, sl = on(CASE.block_table), on(CASE.seq_lens)
    return [
        pytest.param(bt.long(), sl, TypeError, "block_table", id="bt-dtype"),
        pytest.param(bt[:1], sl, ValueError, "block_table", id="bt-rows"),
        pytest.param(bt[:, ::2], sl, ValueError, "block_table", id="bt-strided"),
        pytest.param(bt, sl.long(), TypeError, "seq_lens", id="len-dtype"),
        pytest.param(torch.cat([bt, bt]), torch.cat([sl, sl]), ValueError, "seq_lens", id="more-requests-than-built"),
        pytest.param(torch.cat([bt, bt], dim=1), sl, ValueError, "block_table", id="table-wider-than-first-plan"),
    ]


@pytest.mark.parametrize("bt,sl,exc,name", _bad_plan_inputs())
@pytest.mark.parametrize("path", ["cp", "stock"])
def test_bad_plan_inputs(path, bt, sl, exc, name):
    if path == "cp":
        state, _, _ = fresh_cp()
    else:
        state = StockDecode(heads=4, max_reqs=2, device=DEV)
        state.plan(on(CASE.block_table), on(CASE.seq_lens))
    with pytest.raises(exc, match=f"^{name}:"):
        state.plan(bt, sl)


def _bad_forward_inputs():
    q, k = on(CASE.index_q), on(CASE.k_cache)
    out = on(torch.full((4, 4, 16), -7, dtype=torch.int32))
    return [
        pytest.param(q.float(), k, out, 2, TypeError, "index_q", id="q-dtype"),
        pytest.param(q[:3], k, out, 2, ValueError, "index_q", id="q-rows"),
        pytest.param(q[:, :2], k, out, 2, ValueError, "index_q", id="q-heads"),
        pytest.param(q.transpose(0, 1).contiguous().transpose(0, 1), k, out, 2, ValueError, "index_q", id="q-strides"),
        pytest.param(q, k.view(torch.int8), out, 2, TypeError, "k_cache", id="k-dtype"),
        pytest.param(q, k[:, :, :64].contiguous(), out, 2, ValueError, "k_cache", id="k-shape"),
        pytest.param(q, k, out.long(), 2, TypeError, "out", id="out-dtype"),
        pytest.param(q, k, out[:, :, :8].contiguous(), 2, ValueError, "out", id="out-shape"),
        pytest.param(q, k, out, 9, ValueError, "query_len", id="query-len-9"),
        pytest.param(q, k, out, 0, ValueError, "query_len", id="query-len-0"),
        pytest.param(q, k, out, True, TypeError, "query_len", id="query-len-bool"),
    ]


@pytest.mark.parametrize("q,k,out,query_len,exc,name", _bad_forward_inputs())
def test_bad_forward_inputs_launch_nothing(q, k, out, query_len, exc, name):
    state, layer, plan = fresh_cp()
    before = (layer.parity.clone(), layer.tile.local.clone(), layer.recv.local.clone())
    with pytest.raises(exc, match=f"^{name}:"):
        state.forward(layer, plan, q, k, out, query_len)
    assert bool((out == -7).all())
    assert all(torch.equal(a, b) for a, b in zip(before, (layer.parity, layer.tile.local, layer.recv.local)))


@pytest.mark.parametrize("q,k,out,query_len,exc,name", _bad_forward_inputs())
def test_bad_stock_forward_inputs(q, k, out, query_len, exc, name):
    state = StockDecode(heads=4, max_reqs=2, device=DEV)
    plan = state.plan(on(CASE.block_table), on(CASE.seq_lens))
    with pytest.raises(exc, match=f"^{name}:"):
        state.forward(state.new_layer(), plan, q, k, out, query_len)
    assert bool((out == -7).all())


_SCORER_OPTIONS = [
    pytest.param(score_pages, dict(kernel="fp8"), "kernel", id="kernel-unknown"),
    pytest.param(score_pages, dict(kernel="prmt"), "kernel", id="prmt-not-in-the-decode"),
    pytest.param(score_pages, dict(first_slot=8), "first_slot", id="first-slot-8"),
    pytest.param(score_pages, dict(first_slot=-1), "first_slot", id="first-slot-negative"),
    pytest.param(score_pages, dict(first_slot=7.0), "first_slot", id="first-slot-float"),
    pytest.param(score_pages, dict(release=True), "release", id="release-without-pdl"),
    pytest.param(score_variant, dict(kernel="fp8"), "kernel", id="variant-kernel-unknown"),
    pytest.param(score_variant, dict(tokens_per_dot=32, kernel="prmt"), "tokens_per_dot", id="tokens-32"),
    pytest.param(score_variant, dict(blocks_ahead=3, kernel="wgmma"), "blocks_ahead", id="ahead-3"),
    pytest.param(score_variant, dict(blocks_ahead=2, kernel="table"), "blocks_ahead", id="ahead-on-table"),
    pytest.param(score_variant, dict(loads_only=True, kernel="table"), "loads_only", id="loads-only-on-table"),
    pytest.param(score_variant, dict(register_cap=300, kernel="wgmma"), "register_cap", id="cap-300"),
    pytest.param(score_variant, dict(register_cap=80, kernel="table"), "register_cap", id="cap-on-table"),
    pytest.param(score_variant, dict(pages_per_program=0), "pages_per_program", id="pages-per-program-0"),
]


@pytest.mark.parametrize("fn,kwargs,name", _SCORER_OPTIONS)
def test_bad_scorer_options_name_the_argument(fn, kwargs, name):
    """The decode's scorer and the benchmark's variants refuse a bad option by name, before
    launching anything (on the CPU, a GPU kernel is refused too)."""
    tile = on(query_tile(CASE.index_q, 2, 2))
    out = on(torch.full((2, 8 * 4, CASE.block_table.shape[1]), 7.0))
    with pytest.raises(ValueError, match=f"^{name}:"):
        fn(tile, on(CASE.k_cache), on(CASE.block_table), on(CASE.seq_lens), out, **kwargs)
    assert bool((out == 7.0).all())  # nothing launched


# The reference: every class of bad input raises the documented exception, naming the argument.
REF_CASE = make_case(0, [300, 2000], query_len=2, heads=4, pattern="exact")
PATHS = {
    "full": full_decode,
    "stock": stock_decode,
    "cp": lambda *a: cp_decode(*a, cp=2),
}


def _with(**changes):
    args = dict(zip(["index_q", "k_cache", "block_table", "seq_lens", "query_len"], REF_CASE.args()))
    args.update(changes)
    return tuple(args.values())


def _nan_q():
    q = REF_CASE.index_q.clone()
    q.view(torch.uint8)[1, 2, 3] = 0xFF
    return q


def _nan_scale():
    k = REF_CASE.k_cache.clone()
    k.view(-1, 9216)[0, 9000] = 0x7F
    return k


def _bad_page():
    t = REF_CASE.block_table.clone()
    t[1, 3] = REF_CASE.k_cache.shape[0]
    return t


BAD = [
    pytest.param(_with(index_q=REF_CASE.index_q.float()), TypeError, "index_q", id="q-dtype"),
    pytest.param(_with(index_q=REF_CASE.index_q[:, :, :64]), ValueError, "index_q", id="q-dim"),
    pytest.param(_with(index_q=REF_CASE.index_q[:, :3]), ValueError, "index_q", id="q-heads-3"),
    pytest.param(_with(index_q=REF_CASE.index_q[:3]), ValueError, "index_q", id="q-rows"),
    pytest.param(_with(index_q=REF_CASE.index_q[0]), ValueError, "index_q", id="q-rank"),
    pytest.param(_with(index_q=_nan_q()), ValueError, "index_q", id="q-nan-byte"),
    pytest.param(_with(index_q=[1, 2]), TypeError, "index_q", id="q-not-tensor"),
    pytest.param(_with(k_cache=REF_CASE.k_cache.view(torch.int8)), TypeError, "k_cache", id="k-dtype"),
    pytest.param(_with(k_cache=REF_CASE.k_cache[:, :, :64]), ValueError, "k_cache", id="k-shape"),
    pytest.param(_with(k_cache=_nan_scale()), ValueError, "k_cache", id="k-nan-scale"),
    pytest.param(_with(block_table=REF_CASE.block_table.long()), TypeError, "block_table", id="bt-dtype"),
    pytest.param(_with(block_table=REF_CASE.block_table[:1]), ValueError, "block_table", id="bt-rows"),
    pytest.param(_with(block_table=REF_CASE.block_table[:, :0]), ValueError, "block_table", id="bt-empty"),
    pytest.param(_with(block_table=_bad_page()), ValueError, "block_table", id="bt-page-range"),
    pytest.param(_with(seq_lens=REF_CASE.seq_lens.long()), TypeError, "seq_lens", id="len-dtype"),
    pytest.param(_with(seq_lens=torch.tensor([1, 2000], dtype=torch.int32)), ValueError, "seq_lens", id="len-below-q"),
    pytest.param(_with(query_len=0), ValueError, "query_len", id="q-len-0"),
    pytest.param(_with(query_len=9), ValueError, "query_len", id="q-len-9"),
    pytest.param(_with(query_len=2.0), TypeError, "query_len", id="q-len-float"),
    pytest.param(_with(query_len=True), TypeError, "query_len", id="q-len-bool"),
]


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("args,exc,name", BAD)
def test_bad_input_raises(path, args, exc, name):
    with pytest.raises(exc, match=name):
        PATHS[path](*args)


@pytest.mark.parametrize("cp", [0, 3, 16, "2", 2.0])
def test_bad_cp(cp):
    with pytest.raises((ValueError, TypeError), match="cp"):
        cp_decode(*REF_CASE.args(), cp=cp)


def test_compact_width_too_small():
    with pytest.raises(ValueError, match="width"):
        cp_decode(*REF_CASE.args(), cp=2, width=2)


def test_unread_table_entries_may_hold_anything():
    """Padding past a request's history is never dereferenced, so it is not checked."""
    t = REF_CASE.block_table.clone()
    t[0, 2:] = -1  # request 0: (300 - 1) // 128 = 2 pages of history, pages 0 and 1
    assert torch.equal(full_decode(*_with(block_table=t)), full_decode(*REF_CASE.args()))
