"""Every class of bad input raises the documented exception, naming the argument."""

import pytest
import torch

from reference import cp_decode, full_decode, stock_decode
from reference.cases import make_case

CASE = make_case(0, [300, 2000], query_len=2, heads=4, pattern="exact")
PATHS = {
    "full": full_decode,
    "stock": stock_decode,
    "cp": lambda *a: cp_decode(*a, cp=2),
}


def _with(**changes):
    args = dict(zip(["index_q", "k_cache", "block_table", "seq_lens", "query_len"], CASE.args()))
    args.update(changes)
    return tuple(args.values())


def _nan_q():
    q = CASE.index_q.clone()
    q.view(torch.uint8)[1, 2, 3] = 0xFF
    return q


def _nan_scale():
    k = CASE.k_cache.clone()
    k.view(-1, 9216)[0, 9000] = 0x7F
    return k


def _bad_page():
    t = CASE.block_table.clone()
    t[1, 3] = CASE.k_cache.shape[0]
    return t


BAD = [
    pytest.param(_with(index_q=CASE.index_q.float()), TypeError, "index_q", id="q-dtype"),
    pytest.param(_with(index_q=CASE.index_q[:, :, :64]), ValueError, "index_q", id="q-dim"),
    pytest.param(_with(index_q=CASE.index_q[:, :3]), ValueError, "index_q", id="q-heads-3"),
    pytest.param(_with(index_q=CASE.index_q[:3]), ValueError, "index_q", id="q-rows"),
    pytest.param(_with(index_q=CASE.index_q[0]), ValueError, "index_q", id="q-rank"),
    pytest.param(_with(index_q=_nan_q()), ValueError, "index_q", id="q-nan-byte"),
    pytest.param(_with(index_q=[1, 2]), TypeError, "index_q", id="q-not-tensor"),
    pytest.param(_with(k_cache=CASE.k_cache.view(torch.int8)), TypeError, "k_cache", id="k-dtype"),
    pytest.param(_with(k_cache=CASE.k_cache[:, :, :64]), ValueError, "k_cache", id="k-shape"),
    pytest.param(_with(k_cache=_nan_scale()), ValueError, "k_cache", id="k-nan-scale"),
    pytest.param(_with(block_table=CASE.block_table.long()), TypeError, "block_table", id="bt-dtype"),
    pytest.param(_with(block_table=CASE.block_table[:1]), ValueError, "block_table", id="bt-rows"),
    pytest.param(_with(block_table=CASE.block_table[:, :0]), ValueError, "block_table", id="bt-empty"),
    pytest.param(_with(block_table=_bad_page()), ValueError, "block_table", id="bt-page-range"),
    pytest.param(_with(seq_lens=CASE.seq_lens.long()), TypeError, "seq_lens", id="len-dtype"),
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
        cp_decode(*CASE.args(), cp=cp)


def test_compact_width_too_small():
    with pytest.raises(ValueError, match="width"):
        cp_decode(*CASE.args(), cp=2, width=2)


def test_unread_table_entries_may_hold_anything():
    """Padding past a request's history is never dereferenced, so it is not checked."""
    t = CASE.block_table.clone()
    t[0, 2:] = -1  # request 0: (300 - 1) // 128 = 2 pages of history, pages 0 and 1
    assert torch.equal(full_decode(*_with(block_table=t)), full_decode(*CASE.args()))
