"""The E4M3-MMA route's model (docs/DESIGN.md §4.1) against scores a Hopper GPU gave, and
the reference's route through both formats' decodes (CPU)."""

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.fp8_mma import model_scores
from reference import cp_decode, full_decode, score_pages, stock_decode
from reference import msa as ref_msa
from reference.cases import EXACT_PATTERNS, make_case
from reference.decode import query_tile
from reference.e4m3_mma import STEP_DIMS, e4m3_mma_bound, e4m3_mma_dot
from reference.msa.cases import make_case as make_msa_case

VECTORS = Path(__file__).parent / "data" / "e4m3_wgmma.pt"
E4M3 = torch.float8_e4m3fn


def _values(raw: torch.Tensor) -> torch.Tensor:
    """float64 values of E4M3 bytes."""
    return raw.view(E4M3).to(torch.float64)


def test_the_model_gives_every_score_a_hopper_gpu_gave():
    """Bit for bit, on 12 patterns (random bytes, normal, wide exponent spreads, single
    steps and half steps, a dominant term, sparse rows): the vectors are scores an H100's
    wgmma E4M3 gave (tests/data/e4m3_wgmma.pt says which machine)."""
    data = torch.load(VECTORS)
    for i, pattern in enumerate(data["patterns"]):
        # measured by bench.fp8_mma's kernel (K in natural order): its model_scores takes its steps
        got = model_scores(_values(data["keys"][i]), _values(data["queries"][i]))
        want = data["scores"][i]
        differ = (got.view(torch.int32) != want.view(torch.int32)).sum().item()
        assert differ == 0, f"{pattern}: {differ} of {want.numel()} scores differ from the GPU's"


def test_each_step_keeps_what_the_hardware_keeps():
    """Hand-worked single steps: alignment to the largest operand exponent sum, terms cut
    toward zero at 2^(e - 13), the sum cut to 14 significant bits toward zero."""
    q = torch.zeros(1, 128, dtype=torch.float64)
    k = torch.zeros(4, 128, dtype=torch.float64)
    d = STEP_DIMS[0].tolist()
    # 64 * 64 + 0.25 * 1 (exponent sums 12 and -2): 0.25 is below 2^(12 - 13), lost
    q[0, d[0]], k[0, d[0]] = 64.0, 64.0
    q[0, d[1]], k[0, d[1]] = 0.25, 1.0
    # 448 * 448 + 448 * 0.0625 (sums 16 and 4): 28 cut to 24 (units of 2^3), then
    # 200728 cut to 14 significant bits (units of 2^4): 200720
    q[0, d[2]], k[1, d[2]] = 448.0, 448.0
    q[0, d[3]], k[1, d[3]] = 0.0625, 448.0
    # a subnormal counts as exponent -6: 2^-9 * 2^-9 aligned at -12 keeps bits down to 2^-25
    q[0, d[4]], k[2, d[4]] = 2.0**-9, 2.0**-9
    # -1 * 0 is -0.0; the sum is +0.0
    q[0, d[5]], k[3, d[5]] = -1.0, 0.0
    got = e4m3_mma_dot(q, k)[:, 0].tolist()
    assert got[0] == 4096.0
    assert got[1] == 200720.0
    assert got[2] == 2.0**-18
    assert got[3] == 0.0 and not torch.signbit(torch.tensor(got[3]))


def test_a_score_needs_only_its_own_row_and_key():
    """The route's premise for CP: a score is the same whatever rows or keys share its
    MMA (batching, rank, N, the row's place)."""
    gen = torch.Generator().manual_seed(3)
    q = (torch.randn(9, 128, generator=gen) * 20).to(E4M3).double()
    k = (torch.randn(40, 128, generator=gen) * 20).to(E4M3).double()
    whole = e4m3_mma_dot(q, k)
    assert torch.equal(e4m3_mma_dot(q[[4, 1]], k[7:30]), whole[7:30][:, [4, 1]])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.sampled_from([2.0**-8, 1.0, 30.0, 400.0]))
def test_the_stated_bound_holds_on_adversarial_inputs(seed, scale):
    """|route - exact| <= ``e4m3_mma_bound`` on cancelling sums with a dominant term and
    subnormal tails; where the operands are normal, the bound is within 2^-5 of the sum
    of the products' magnitudes (what DESIGN §4.1 states)."""
    gen = torch.Generator().manual_seed(seed)
    half = (torch.randn(64, 64, generator=gen) * scale).clamp(-448, 448).to(E4M3).double()
    qh = (torch.randn(4, 64, generator=gen) * scale).clamp(-448, 448).to(E4M3).double()
    nudge = (qh * (1 + 2.0**-3 * torch.randint(0, 2, qh.shape, generator=gen))).clamp(-448, 448).to(E4M3).double()
    k = torch.cat([half, half], 1)
    q = torch.cat([qh, -nudge], 1)
    k[:, 5] = 448.0
    q[0, 5] = 2.0**-9
    exact = k @ q.T
    bound = e4m3_mma_bound(q, k)
    err = (e4m3_mma_dot(q, k).double() - exact).abs()
    assert bool((err <= bound).all())
    if scale >= 1:
        assert bool((bound <= 2.0**-5 * (k.abs() @ q.abs().T)).all())


def _scores(route: str, pattern: str, seed: int = 1) -> torch.Tensor:
    case = make_case(seed, [8 * 128 + 3, 20 * 128 + 7], heads=2, query_len=4, pattern=pattern, table_width=22)
    tile = query_tile(case.index_q, 2, 4)
    out = torch.full((2, 16, 22), torch.nan)
    return score_pages(tile, case.k_cache, case.block_table, case.seq_lens, out, mma=route)


@pytest.mark.parametrize("pattern", EXACT_PATTERNS)
def test_exact_arithmetic_cases_score_alike_on_both_routes(pattern):
    """The exact-arithmetic patterns' sums fit the route's 14 bits at every step, so its
    scores equal the exact route's bit for bit (the pipeline's exact tests hold on it)."""
    torch.testing.assert_close(_scores("e4m3", pattern), _scores("exact", pattern), rtol=0, atol=0, equal_nan=True)


def test_random_pages_differ_between_the_routes_within_the_bound():
    """On random pages the routes differ (the test would catch a route that fell back to
    the exact sums), by less than 2^-6 of the largest score of a row."""
    e4, exact = _scores("e4m3", "random"), _scores("exact", "random")
    both = ~torch.isnan(exact)
    assert bool((e4[both] != exact[both]).any())
    top = exact.nan_to_num(0).abs().amax(-1, keepdim=True).expand_as(exact)
    assert bool(((e4 - exact).abs()[both] <= top[both] * 2.0**-6).all())


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_equals_the_full_decode_of_the_e4m3_route(cp):
    """CP's contract holds per route: the e4m3 route's CP decode equals its full decode bit
    for bit, and its stock decode agrees but where 16-bit keys merge scores."""
    case = make_case(7, [40 * 128 + 5, 3 * 128, 64 * 128 + 1], heads=4, query_len=2, pattern="random", table_width=70)
    full = full_decode(*case.args(), mma="e4m3")
    assert torch.equal(cp_decode(*case.args(), cp=cp, mma="e4m3"), full)
    assert not torch.equal(full, full_decode(*case.args()))  # the routes pick differently here
    assert stock_decode(*case.args(), mma="e4m3").shape == full.shape


@pytest.mark.parametrize("cp", [2, 8])
def test_msa_cp_equals_the_full_decode_of_the_e4m3_route(cp):
    case = make_msa_case(4, [33 * 128 + 9, 70 * 128], heads=2, query_len=3, pattern="random", dtype="fp8")
    windows = case.windows()
    full = ref_msa.full_decode(*case.args(), **windows, mma="e4m3")
    assert torch.equal(ref_msa.cp_decode(*case.args(), **windows, cp=cp, mma="e4m3"), full)


def test_the_route_is_checked_before_anything_runs():
    case = make_case(0, [128], heads=1, query_len=1, pattern="random")
    for bad in ("E4M3", "fp8", None, 1):
        with pytest.raises(ValueError, match="^mma:"):
            full_decode(*case.args(), mma=bad)
        with pytest.raises(ValueError, match="^mma:"):
            cp_decode(*case.args(), cp=2, mma=bad)
    bf16 = make_msa_case(0, [3 * 128], heads=1, query_len=1, pattern="random", dtype="bf16")
    with pytest.raises(ValueError, match="^mma: 'e4m3' scores E4M3 keys"):
        ref_msa.full_decode(*bf16.args(), **bf16.windows(), mma="e4m3")
    with pytest.raises(ValueError, match="^mma: 'e4m3' scores E4M3 keys"):
        ref_msa.cp_decode(*bf16.args(), **bf16.windows(), cp=2, mma="e4m3")
