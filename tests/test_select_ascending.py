"""The MSA stock select's one-chunk path (``fast.msa.kernels.ascending``): the exact best m of a
row as a set with places in column order, against the reference's exact keys."""

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fast.msa.kernels.ascending import best_in_column_order
from reference.selection import exact_keys
from support import DEV, on

# few distinct values, so most rows tie at their threshold; -0 and +0 differ in the key
VALUES = (-float("inf"), -3.0, -1.5, -0.0, 0.0, 2.0**-149, 1.0, 7.0, float("inf"))


@triton.jit
def _best_kernel(score_ptr, chosen_ptr, place_ptr, lo, hi, m, N: tl.constexpr, SORT: tl.constexpr):
    cols = tl.arange(0, N)
    chosen, place = best_in_column_order(tl.load(score_ptr + cols), cols, lo, hi, m, SORT)
    tl.store(chosen_ptr + cols, chosen.to(tl.int32))
    tl.store(place_ptr + cols, tl.where(chosen, place, -1))


def _want(scores: torch.Tensor, lo: int, hi: int, m: int) -> torch.Tensor:
    """The columns of the best m exact keys (score desc, column asc) among columns lo .. hi - 1, ascending."""
    cols = torch.arange(scores.shape[0])
    keys = exact_keys(scores, cols, (cols >= lo) & (cols < hi))
    best = keys.sort(descending=True).indices[: min(m, hi - lo)]
    return best.sort().values


@settings(max_examples=40, deadline=None)
@given(
    width=st.sampled_from([16, 64, 1024]),
    data=st.data(),
    m=st.integers(0, 16),
    sort=st.sampled_from([False, True] if DEV.type == "cuda" else [False]),
)
@example(width=16, data=None, m=16, sort=False)  # every column chosen, all tied
def test_the_best_m_in_column_order_equal_the_exact_keys(width, data, m, sort):
    """Ties at the threshold go to the lowest columns, -0 ranks below +0, columns outside
    [lo, hi) (poisoned with the largest score) are never chosen, fewer than m columns are
    all chosen, and each chosen column's place is its rank among the chosen."""
    if data is None:
        scores, lo, hi = torch.zeros(width), 0, width
    else:
        scores = torch.tensor(data.draw(st.lists(st.sampled_from(VALUES), min_size=width, max_size=width)))
        hi = data.draw(st.integers(0, width))
        lo = data.draw(st.integers(0, min(hi, 17)))
    scores = scores.to(torch.float32)
    scores[:lo] = float("inf")
    scores[hi:] = float("inf")
    chosen, place = on(torch.zeros(width, dtype=torch.int32)), on(torch.zeros(width, dtype=torch.int32))
    _best_kernel[(1,)](on(scores), chosen, place, lo, hi, m, N=width, SORT=sort)
    want = _want(scores, lo, hi, m)
    got = torch.nonzero(chosen.cpu()).flatten()
    assert torch.equal(got, want)
    assert torch.equal(place.cpu()[got], torch.arange(len(got), dtype=torch.int32))


@pytest.mark.skipif(DEV.type != "cuda", reason="tl.topk's branch compiles on a GPU only")
def test_both_threshold_branches_agree_on_a_gpu():
    """The GPU's ``tl.topk`` branch and the interpreter's bit-by-bit one find the same
    threshold on rows with heavy ties (compared through the chosen sets)."""
    gen = torch.Generator().manual_seed(3)
    for m in (1, 5, 16):
        scores = torch.tensor(VALUES)[torch.randint(0, len(VALUES), (1024,), generator=gen)].to(torch.float32)
        outs = []
        for sort in (False, True):
            chosen, place = on(torch.zeros(1024, dtype=torch.int32)), on(torch.zeros(1024, dtype=torch.int32))
            _best_kernel[(1,)](on(scores), chosen, place, 3, 1000, m, N=1024, SORT=sort)
            outs.append((chosen.cpu(), place.cpu()))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
