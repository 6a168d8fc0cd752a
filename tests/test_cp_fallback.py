"""Where CP cannot run: build_cp_decode logs why and returns None (the stock fallback), and
the P2P check names the pair. Bad inputs of every entry point are ``test_bad_inputs.py``."""

import logging

import pytest
import torch

from fast.build import build_cp_decode
from fast.cp import IndexerDecodeCP
from fast.msa.cp import MsaDecodeCP
from fast.symm import SingleRankSymmetric, p2p_problem
from reference.cases import make_case, seq_len_for
from support import DEV

CASE = make_case(0, [seq_len_for(20, 0), seq_len_for(3, 4)], query_len=2, heads=4, pattern="exact")


class FakeSymmetric(SingleRankSymmetric):
    def __init__(self, world):
        super().__init__(DEV)
        self.world = world


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


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(key_format="int8"), "key_format: must be one of"),
        (dict(key_format="bf16", init_blocks=1), "local_blocks: key_format 'bf16' needs both"),
        (dict(key_format="fp8", init_blocks=10, local_blocks=7), "local_blocks: init_blocks"),
        (dict(init_blocks=1, local_blocks=1), "init_blocks: the nvfp4 format has no forced windows"),
    ],
)
def test_build_cp_decode_checks_the_format_where_cp_cannot_run(kw, match):
    """The format and its windows are the caller's choice: judged even on one rank."""
    with pytest.raises(ValueError, match=match):
        build_cp_decode(heads=4, max_reqs=2, max_query_len=2, symm=None, world=1, **kw)


def test_build_cp_decode_picks_the_format_state():
    """key_format "fp8" / "bf16" builds MsaDecodeCP with the windows; one rank: None."""
    msa_state = build_cp_decode(
        heads=2, max_reqs=2, max_query_len=2, symm=FakeSymmetric(2), key_format="fp8", init_blocks=1, local_blocks=2
    )
    assert isinstance(msa_state, MsaDecodeCP) and msa_state.query_dtype == torch.float8_e4m3fn
    assert (msa_state.init_blocks, msa_state.local_blocks) == (1, 2)
    one_rank = dict(heads=2, max_reqs=2, max_query_len=2, symm=None, world=1)
    assert build_cp_decode(**one_rank, key_format="bf16", init_blocks=0, local_blocks=0) is None
