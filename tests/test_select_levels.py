"""The top-16 select's levels and policy: fma, the run merge, three levels, shapes, splits, warps, releases."""

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import example, given, settings
from hypothesis import strategies as st

import reference
from fast.select.levels import KEY_EXACT, fmaf, merge_runs16, top16
from fast.select.policy import QUEUED_PER_SM, SelectShape, force_select
from fast.stock import StockDecode
from reference.cases import EXACT_PATTERNS
from reference.selection import exact_keys, top_keys
from support import DEV, on

EXACT = tuple(EXACT_PATTERNS)
f32 = st.floats(-(2.0**60), 2.0**60, width=32)  # products stay finite


@triton.jit
def _fmaf_kernel(a_ptr, b_ptr, c_ptr, o_ptr, N: tl.constexpr, EMULATE: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(o_ptr + i, fmaf(tl.load(a_ptr + i), tl.load(b_ptr + i), tl.load(c_ptr + i), EMULATE))


@given(st.lists(st.tuples(f32, f32, f32), min_size=16, max_size=16))
@example([(1.0 + 2.0**-23, 1.0 + 2.0**-23, -1.0)] * 16)
def test_fmaf_rounds_once_on_this_backend(triples):
    a, b, c = (torch.tensor(x, dtype=torch.float32) for x in zip(*triples))
    out = on(torch.empty(16))
    _fmaf_kernel[(1,)](on(a), on(b), on(c), out, N=16, EMULATE=DEV.type != "cuda")
    want = reference.selection.fmaf(a, b, c)
    assert torch.equal(out.cpu().view(torch.int32), want.view(torch.int32)) or torch.equal(out.cpu(), want)


@triton.jit
def _merge_runs_kernel(keys_ptr, out_ptr, N: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, 16), merge_runs16(tl.load(keys_ptr + tl.arange(0, N))))


@settings(max_examples=25, deadline=None)
@given(
    runs=st.sampled_from([2, 4, 8, 16]),
    top=st.sampled_from([3, 1000, 2**32]),
    wide=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_merge_runs16_takes_the_16_largest_of_alternating_runs(runs, top, wide, seed):
    """The split select's merge (``merge_runs16``, GPUs): runs as ``publish_slice`` stores
    them (ascending in even slices, descending in odd ones), duplicates and zeros included
    (top 3: mostly ties), uint32 stock keys (the top bit set too) and int64 exact keys: the
    16 largest, descending."""
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randint(0, top, (runs, 16), generator=gen, dtype=torch.int64).sort(dim=1).values
    keys[1::2] = keys[1::2].flip(1)
    if wide:
        keys = keys + (1 << 48)
    want = keys.flatten().sort(descending=True).values[:16]
    dtype = torch.int64 if wide else torch.uint32
    out = on(torch.zeros(16, dtype=dtype))
    _merge_runs_kernel[(1,)](on(keys.flatten().to(dtype)), out, N=runs * 16)
    assert torch.equal(out.cpu().to(torch.int64), want)


def test_select_split_policy_and_validation():
    from fast.select.policy import MAX_SPLIT, SPLIT_PROGRAMS, fit_split, select_split

    assert select_split(2, 8192, 132) == MAX_SPLIT  # batch 1, 2 heads: slices of 512
    assert select_split(2, 2048, 132) == 4  # slices keep 512 columns
    assert select_split(2, 1024, 132) == 1  # one chunk: one select, no merge
    assert select_split(16, 8192, 132) == 8  # batch 8: 128 programs, 1 per SM
    assert select_split(64, 8192, 132) == 1  # 2 slices would not pay for the merge
    assert select_split(2, 4096, 132) == 8
    assert select_split(256, 8192, 132) == 1  # 256 rows fill the SMs already
    assert select_split(2, 300, 132) == 1
    assert fit_split(16, 2, 60) == 4  # 64 padded columns: slices of 16
    assert fit_split(16, SPLIT_PROGRAMS // 4, 8192) == 4  # the scratch holds SPLIT_PROGRAMS
    for bad in (0, 3, 32, 2.0, True):
        with pytest.raises(ValueError, match="split"):
            force_select(StockDecode(heads=1, max_reqs=1, device=DEV), split=bad)


def test_release_policy():
    """The scorer launches a small select grid early, and a CP push of one-warp programs up
    to 2048 columns; not latency-bound four-warp selects, nor one-warp 4096-column pushes
    (both measured slower released: select.policy.release_select)."""
    from fast.select.policy import release_select

    assert release_select(8) and not release_select(9)  # a stock select or a CP push: four warps
    assert not release_select(32, warps=4, columns=1024)  # a CP push of 8 rows x 4 heads
    assert release_select(1024, warps=1, columns=512) and release_select(1024, warps=1, columns=2048)
    assert not release_select(1024, warps=1, columns=4096)
    assert not release_select(256, warps=4, columns=1024) and not release_select(1024, warps=2, columns=1024)


def test_push_warps_policy():
    from fast.select.policy import WARP_SELECT_PER_SM, push_warps

    assert push_warps(QUEUED_PER_SM * 132, True, 132) == 1  # a queue of one-chunk selects per SM
    assert push_warps(QUEUED_PER_SM * 132 - 1, True, 132) == 4  # latency-bound: four warps
    assert push_warps(QUEUED_PER_SM * 132, False, 132) == 2  # a queue of three-level selects
    assert push_warps(QUEUED_PER_SM * 132 - 1, False, 132) == 4
    assert push_warps(1, True, 0) == 1  # the interpreter (no SMs): any warps, one chunk -> 1
    # warp_select's PTX block: one warp from WARP_SELECT_PER_SM programs per SM
    assert push_warps(WARP_SELECT_PER_SM * 132, True, 132, warp_select=True) == 1
    assert push_warps(WARP_SELECT_PER_SM * 132 - 1, True, 132, warp_select=True) == 4


@pytest.mark.parametrize("max_chunk", [16, 1024])
@pytest.mark.parametrize("group", [8, 4])  # the stock select's, the CP push's (PUSH_GROUP)
def test_select_shape_covers_the_row_and_every_level_selects_16_of_at_least_16(max_chunk, group):
    for width in [1, 15, 16, 17, 100, 1024, 1025, 2048, 4097, 8192]:
        s = SelectShape.for_width(width, max_chunk, group)
        padded = triton.next_power_of_2(max(width, 16))
        if padded <= max_chunk:
            assert s.chunk == padded
        else:
            assert s.supers * s.per_super * s.group == padded and s.group <= group
            assert min(s.supers, 16 * s.per_super, 16 * s.group) >= 16
            # groups of 4 over 8192 columns (CP 1 only): a second select over 256
            most = 256 if group == 4 and padded == 8192 else 128
            assert s.supers <= 128 and 16 * s.per_super <= most and 16 * s.group <= 128
    assert SelectShape.for_width(4096, 1024, 4) == SelectShape(1024, 128, 8, 4)


@triton.jit
def _top16_kernel(
    score_ptr,
    n_ptr,
    out_ptr,
    stride,
    SELECT: tl.constexpr,
    SORT: tl.constexpr,
):
    r = tl.program_id(0)
    best = top16(
        score_ptr + r * stride,
        tl.load(n_ptr + r),
        KEY_EXACT,
        1,
        0,
        0.0,
        0.0,
        False,
        SELECT,
        SORT,
    )
    tl.store(out_ptr + r * 16 + tl.arange(0, 16), best)


@settings(max_examples=10, deadline=None)
@given(
    width=st.sampled_from([300, 2048, 8192]),
    seed=st.integers(0, 2**31 - 1),
    ties=st.booleans(),
    group=st.sampled_from([8, 4]),
)
def test_three_level_top16_is_the_exact_top16(width, seed, ties, group):
    """Long rows (every level with more than one group per supergroup), in the stock
    select's shapes and the CP push's (groups of 4): the select's 16 keys are the 16
    largest exact keys, ties between equal scores broken by page like everywhere."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(3, width, generator=gen)
    if ties:
        scores = scores.round()  # many equal scores: the page decides
    n = torch.tensor([width, width - 17, 20], dtype=torch.int32)
    s = SelectShape.for_width(width, group=group)
    got = on(torch.zeros(3, 16, dtype=torch.int64))
    _top16_kernel[(3,)](
        on(scores),
        on(n),
        got,
        width,
        **s.constexprs(),
        SORT=DEV.type == "cuda",
    )
    pages = torch.arange(width).expand(3, -1)
    want = top_keys(exact_keys(scores, pages, pages < n[:, None].long()), 16)
    assert torch.equal(got.cpu(), want)
