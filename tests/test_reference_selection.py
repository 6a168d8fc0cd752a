"""Selection (docs/DESIGN.md §5): keys, the output format, the two-level select, the stock key."""

import math
import struct
from fractions import Fraction

import pytest
import torch
from hypothesis import assume, example, given
from hypothesis import strategies as st

from fuzz.strategies import decode_configs
from fuzz.targets import Context, check_stock
from indexer_constants import CODE_BYTES, PAGE_BYTES
from reference import full_decode, stock_decode
from reference.selection import (
    exact_keys,
    f32_to_u32,
    fmaf,
    keys_to_pages,
    keys_to_scores,
    ordered_bits,
    select,
    stock_keys,
    top_keys,
    two_level_top16,
)

f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


def f32_round(x: Fraction) -> float:
    """Round an exact rational to the nearest fp32 (ties to even); inf past the range."""
    if x == 0:
        return 0.0
    a = abs(x)
    e = math.floor(math.log2(a.numerator) - math.log2(a.denominator))
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    e = max(e, -126)  # subnormals keep the 2^-149 quantum
    quantum = Fraction(2) ** (e - 23)
    m = a / quantum
    fl = m.numerator // m.denominator
    rest = m - fl
    r = fl + (1 if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and fl % 2) else 0)
    v = r * quantum
    if v >= Fraction(2) ** 128:
        return math.copysign(math.inf, x)
    return float(v) if x > 0 else -float(v)


def as_f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


@given(f32, f32, f32)
@example(1.0 + 2.0**-23, 1.0 + 2.0**-23, -1.0)  # the product's low bits decide the result
@example(3.0, 1.0 / 3.0, -1.0)
def test_fmaf_rounds_once(a, b, c):
    a, b, c = as_f32(a), as_f32(b), as_f32(c)
    want = f32_round(Fraction(a) * Fraction(b) + Fraction(c))
    got = float(fmaf(torch.tensor([a]), torch.tensor([b]), torch.tensor([c]))[0])
    assert got == want or (got == 0.0 and want == 0.0)


def test_f32_to_u32_semantics():
    x = torch.tensor([-5.0, -0.5, 0.0, 1.99, 65535.5, 4294967296.0, float("inf"), float("nan")])
    assert f32_to_u32(x).tolist() == [0, 0, 0, 1, 65535, 4294967295, 4294967295, 0]


@given(st.lists(f32, min_size=2, max_size=40))
def test_ordered_bits_is_the_float_order_with_signed_zero(values):
    v = torch.tensor(values, dtype=torch.float32)
    o = ordered_bits(v).tolist()
    for i in range(len(values)):
        for j in range(len(values)):
            a, b = float(v[i]), float(v[j])
            if a != b:
                assert (o[i] < o[j]) == (a < b)
            else:
                sa, sb = math.copysign(1, a), math.copysign(1, b)
                assert (o[i] < o[j]) == (sa < sb)  # -0.0 below +0.0
    assert ordered_bits(torch.tensor([-0.0])) < ordered_bits(torch.tensor([0.0]))


def score_sort_key(score: float, page: int):
    """(score desc with -0.0 < +0.0, page asc) as a Python sort key."""
    return (-score, -math.copysign(1, score), page)


@given(st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, 1e-30, -7.0]), min_size=1, max_size=50))
def test_exact_key_orders_score_desc_then_page_asc(scores):
    v = torch.tensor(scores, dtype=torch.float32)
    pages = torch.arange(len(scores))
    keys = exact_keys(v, pages, torch.ones(len(scores), dtype=torch.bool))
    by_key = keys_to_pages(keys.sort(descending=True).values).tolist()
    assert by_key == sorted(range(len(scores)), key=lambda p: score_sort_key(scores[p], p))
    assert keys_to_scores(keys).view(torch.int32).tolist() == v.view(torch.int32).tolist()


@st.composite
def key_rows(draw):
    rows = draw(st.integers(1, 4))
    n = draw(st.integers(1, 700))
    group = draw(st.sampled_from([1, 2, 8, 64]))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    few = draw(st.booleans())  # few distinct scores: ties everywhere
    scores = torch.randint(0, 3 if few else 1 << 20, (rows, n), generator=gen).float()
    valid = torch.rand(rows, n, generator=gen) < draw(st.sampled_from([0.01, 0.5, 1.0]))
    return exact_keys(scores, torch.arange(n), valid), group


@given(key_rows())
def test_two_level_select_is_exact(args):
    keys, group = args
    assert torch.equal(two_level_top16(keys, group), top_keys(keys, 16))


def brute_select(scores, own, num_pages):
    """Python: 15 best pages by (score desc, page asc) below min(own, P), then own."""
    if own + 1 <= 16:
        return [p if p <= own else -1 for p in range(16)]
    cand = sorted(range(min(own, num_pages)), key=lambda p: score_sort_key(scores[p], p))
    ranked = cand[:15]
    return ranked + [-1] * (15 - len(ranked)) + [own]


@given(
    seed=st.integers(0, 2**31 - 1),
    width=st.integers(1, 40),
    own=st.integers(0, 60),
    distinct=st.sampled_from([2, 5, 1000]),
)
def test_select_matches_brute_force(seed, width, own, distinct):
    gen = torch.Generator().manual_seed(seed)
    scores = (torch.randint(0, distinct, (1, width), generator=gen) - distinct // 2).float()
    scores[torch.rand(1, width, generator=gen) < 0.2] = -0.0
    num_pages = int(torch.randint(1, width + 1, (), generator=gen))
    # Columns at or past min(own, P) are never read: poison them.
    poisoned = scores.clone()
    poisoned[0, min(own, num_pages) :] = float("nan")
    got = select(poisoned, torch.tensor([own]), num_pages)[0].tolist()
    assert got == brute_select(scores[0].tolist(), own, num_pages)


def test_output_format_short_rows_and_past_the_table():
    scores = torch.arange(20, dtype=torch.float32)[None, :].repeat(4, 1)
    own = torch.tensor([0, 15, 16, 100])
    out = select(scores, own, num_pages=20)
    assert out[0].tolist() == [0] + [-1] * 15
    assert out[1].tolist() == list(range(16))  # own + 1 == 16: still short
    assert out[2].tolist() == list(range(15, 0, -1)) + [16]  # page 0 (lowest score) drops out
    assert out[3].tolist() == list(range(19, 4, -1)) + [100]  # own past the table: rank the P pages
    narrow = select(scores[:1, :3], torch.tensor([40]), num_pages=3)
    assert narrow[0].tolist() == [2, 1, 0] + [-1] * 12 + [40]  # unfillable ranked slots are -1


# ---- stock: the 16-bit key -------------------------------------------------------------


def brute_stock_q16(values):
    """Python, one rounding per fmaf: q16 of each value of a row."""
    hi, lo = max(values), min(values)
    span = as_f32(hi - lo)
    scale = 0.0 if span == 0 else f32_round(Fraction(65534) / Fraction(span))
    bias = f32_round(Fraction(-lo) * Fraction(scale) + Fraction(3, 2))
    out = []
    for v in values:
        x = f32_round(Fraction(v) * Fraction(scale) + Fraction(bias))
        out.append(min(int(max(x, 0.0)), 65535))
    return out


@given(st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=30))
def test_stock_key_matches_brute_force(values):
    v = torch.tensor([values], dtype=torch.float32)
    # A span below ~2e-34 overflows 65534 / span to inf (CUDA then yields NaN -> q16 0); real
    # scores are multiples of 2^-41 or coarser, so keep to spans with a finite scale.
    span = float(v.max() - v.min())
    assume(span == 0 or 65534 / span < 3.4e38)
    n = len(values)
    keys = stock_keys(v, torch.arange(n), torch.ones(1, n, dtype=torch.bool))[0].tolist()
    q16 = brute_stock_q16([float(x) for x in v[0]])
    assert keys == [(q << 16) | (0xFFFF - p) for p, q in enumerate(q16)]


def test_stock_ties_at_16_bits_go_to_the_lower_page():
    # Two scores 1/65534 of the span apart fall into one 16-bit bucket at the top.
    v = torch.tensor([[0.0, 1.0, 1.0 - 2.0**-20, 0.5] + [0.25] * 16])
    stock = select(v, torch.tensor([40]), 20, key="stock")[0].tolist()
    exact = select(v, torch.tensor([40]), 20, key="exact")[0].tolist()
    assert exact[:3] == [1, 2, 3] and stock[:3] == [1, 2, 3]
    v2 = torch.tensor([[0.0, 1.0 - 2.0**-20, 1.0, 0.5] + [0.25] * 16])
    assert select(v2, torch.tensor([40]), 20, key="exact")[0].tolist()[:2] == [2, 1]
    assert select(v2, torch.tensor([40]), 20, key="stock")[0].tolist()[:2] == [1, 2]


# A row whose stock order depends on the range being taken over exactly its ranked columns.
# own = 16: columns 0..15 are ranked, columns 16.. are not (they hold -100, 100 and 0.75).
# Over the true range [1, 2]: scale 65534, bias fmaf(-1, 65534, 1.5) = -65532.5, so by hand
#   q16(1) = 1 (1.5 truncated), q16(2) = 65535 (65535.5), q16(1.5) = 32768 (32768.5),
#   q16(fp32(1.50001)) = 32769 (32769.156...), q16(1.25) = 16385 (exact).
# Any other range (one that also spans an unranked column, or the 0 an unranked column is
# cleared to) merges 1.5 and 1.50001 into one bucket, and the tie goes to the lower page:
# column 2 before column 3.
RANGE_ROW = [1.0, 2.0, 1.5, 1.50001] + [1.25] * 12 + [-100.0, 100.0, 0.75]
RANGE_Q16 = [1, 65535, 32768, 32769] + [16385] * 12
RANGE_OUT = [1, 3, 2, *range(4, 16), 16]  # 15 ranked by hand, own page in slot 15


def test_stock_keys_by_hand_where_the_range_decides():
    v = torch.tensor([RANGE_ROW], dtype=torch.float32)
    j = torch.arange(v.shape[1])
    valid = (j < 16)[None, :]
    keys = stock_keys(torch.where(valid, v, 0.0), j, valid)[0].tolist()
    assert keys[:16] == [(q << 16) | (0xFFFF - p) for p, q in enumerate(RANGE_Q16)]
    assert keys[16:] == [0, 0, 0]
    assert select(v, torch.tensor([16]), v.shape[1], key="stock")[0].tolist() == RANGE_OUT


@pytest.mark.parametrize("rows", [1, 7])
def test_stock_rejects_unknown_key(rows):
    with pytest.raises(ValueError, match="key"):
        select(torch.zeros(rows, 20), torch.full((rows,), 30), 20, key="fast")


# The stock (16-bit key) rule against the exact oracle: where they may and may not differ.
@given(decode_configs(max_pages=120))
def test_stock_agrees_with_exact_up_to_16_bit_ties(cfg):
    """Rule: short rows and slot 15 are equal; in the ranked slots, the q16 values read in
    order are equal (q16 is monotone in the score, so both lists take every page above the
    boundary bucket and differ only in which pages of the boundary bucket they keep, and
    in order within equal buckets). The rule lives in the fuzz target, which checks it."""
    check_stock(cfg, Context("cpu", {}))


def separated_cache() -> torch.Tensor:
    """71 pages; page i scores exactly E4M3 byte 0x38 + i (1.0 .. 448) against the query e_0.

    Every token's element 0 is code 2 (1.0) under a scale byte of its own, everything else
    +0. Neighbouring values are >= 0.125 apart and the span is < 448, so distinct scores sit
    >= 18 16-bit buckets apart (65534 * 0.125 / 448 > 18).
    """
    n = 0x7E - 0x38 + 1
    pages = torch.zeros(n, PAGE_BYTES, dtype=torch.uint8)
    tokens = torch.arange(128)
    pages[:, tokens * 64] = 2  # element 0 of each token: code 2, low nibble
    pages[:, CODE_BYTES + tokens * 8] = (0x38 + torch.arange(n, dtype=torch.uint8))[:, None]
    pages[:, CODE_BYTES:].view(n, 128, 8)[:, :, 1:] = 0x38  # other groups: any finite scale
    return pages.view(n, 128, 72)


@given(decode_configs(max_pages=120))
def test_stock_equals_exact_when_scores_are_well_separated(cfg):
    """Scores either equal (a repeated page: both keys break the tie by the lower page) or at
    least 18 buckets apart: stock must pick the oracle's pages in the oracle's order."""
    case = cfg.build()
    q = torch.zeros(case.index_q.shape)
    q[:, :, 0] = 1.0
    k_cache = separated_cache()
    table = case.block_table.remainder(k_cache.shape[0])
    args = (q.to(torch.float8_e4m3fn), k_cache, table, case.seq_lens, case.query_len)
    assert torch.equal(full_decode(*args), stock_decode(*args))
