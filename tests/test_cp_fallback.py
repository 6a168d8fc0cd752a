"""Where CP cannot run: build_cp_decode logs why and returns None (the stock fallback), and
the P2P check names the pair. Bad inputs of every entry point are ``test_bad_inputs.py``."""

import logging

import pytest

from fast.cp import IndexerDecodeCP, build_cp_decode
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
