"""The MSA format's reference (docs/DESIGN.md §10): the scorer against a token-by-token
loop, the selection against a sort written out here, CP against the oracle, bad inputs."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from indexer_constants import HEAD_DIM, PAGE, SLOTS, TOPK
from reference import msa
from reference.cases import seq_len_for
from reference.msa.cases import DTYPES, EXACT_PATTERNS
from reference.msa.decode import full_scores, query_tile
from reference.msa.inputs import check_msa_inputs
from reference.msa.rules import causal_blocks

POISON = 1e30


def loop_scores(tile, k_cache, table, lens, num_pages, stride, offset):
    """The scorer contract, one (request, row, column) at a time: float32 [B, 8 * Hs, W],
    POISON where nothing is stored. Exact on exact-arithmetic inputs (float64 dot)."""
    batch, _, hs, _ = tile.shape
    width = table.shape[1]
    out = torch.full((batch, SLOTS * hs, width), POISON)
    for b in range(batch):
        n_blocks = min(-(-int(lens[b]) // PAGE), num_pages)
        for row in range(SLOTS * hs):
            slot, head = divmod(row, hs)
            pos = int(lens[b]) - SLOTS + slot
            q = tile[b, slot, head].double()
            for j in range(width):
                g = j * stride + offset
                if g >= n_blocks or g * PAGE > pos:
                    continue
                keys = k_cache[int(table[b, j])].double()
                visible = min(PAGE, pos - g * PAGE + 1)
                out[b, row, j] = float((keys[:visible] @ q).max()) + 0.0
    return out


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("stride,offset", [(1, 0), (4, 3), (2, 1)])
@pytest.mark.parametrize("token", [0, 111, 112, 127])
def test_scorer_masks_tokens_at_their_global_position(dtype, stride, offset, token):
    """The `late` pattern's last 16 tokens dominate each block: a mask one token off, or a
    mask by compact instead of global position, changes the partial block's score."""
    lens = [seq_len_for(5, token), seq_len_for(2, token), 0]
    case = msa.make_case(3, lens, dtype=dtype, query_len=SLOTS, heads=2, pattern="late", table_width=8)
    tile = query_tile(case.index_q, len(lens), SLOTS)
    cols = torch.arange(-(-8 // stride)) * stride + offset
    table = case.block_table[:, cols.clamp_max(7)]
    got = torch.full((len(lens), SLOTS * 2, table.shape[1]), POISON)
    msa.score_blocks(tile, case.k_cache, table, case.seq_lens, got, num_pages=8, stride=stride, offset=offset)
    want = loop_scores(tile, case.k_cache, table, case.seq_lens, 8, stride, offset)
    assert torch.equal(got, want)


def test_scorer_never_reads_an_id_it_does_not_compute():
    """Columns at or past min(ceil(len / 128), P) are never read: -1 there is no error."""
    case = msa.make_case(1, [seq_len_for(2, 0)], pattern="exact", heads=1, table_width=6)
    table = case.block_table.clone()
    table[0, 3:] = -1  # the request computes blocks 0..2
    out = torch.full((1, SLOTS, 6), POISON)
    msa.score_blocks(query_tile(case.index_q, 1, 1), case.k_cache, table, case.seq_lens, out, num_pages=6)
    assert bool((out[:, :, 3:] == POISON).all())
    table[0, 2] = -1
    with pytest.raises(ValueError, match="block_table: request 0, column 2"):
        msa.score_blocks(query_tile(case.index_q, 1, 1), case.k_cache, table, case.seq_lens, out, num_pages=6)


def sorted_selection(scores, n, num_pages, init, local):
    """Docs §10.3 written out for one row with Python's sort: the forced blocks, then the
    best by (score desc, block asc) among the rest below min(n, P); ascending, -1 padded."""
    if n <= TOPK:
        return list(range(n)) + [-1] * (TOPK - n)
    forced = set(range(init)) | set(range(n - local, n))
    ranked = [g for g in range(min(n, num_pages)) if g not in forced]
    # The total order of fp32 bits: -0.0 below +0.0.
    ranked.sort(key=lambda g: (-float(scores[g]), -(1 if str(float(scores[g]))[0] != "-" else 0), g))
    chosen = sorted(forced | set(ranked[: TOPK - init - local]))
    return chosen + [-1] * (TOPK - len(chosen))


windows = st.integers(0, TOPK).flatmap(lambda init: st.tuples(st.just(init), st.integers(0, TOPK - init)))
lengths = st.lists(
    st.one_of(st.just(0), st.integers(1, 24 * PAGE), st.integers(2000, 2100)),
    min_size=1,
    max_size=3,
)


@st.composite
def msa_cases(draw, narrow: bool = False):
    """An MSA case: lengths (padding, short, around the 16-block edge), q 1..8, H 1/2/4/8,
    forced windows of 0..16 blocks, both dtypes, random or exact keys; ``narrow``: maybe a
    table of 20 columns (a length past the table)."""
    query_len = draw(st.integers(1, SLOTS))
    lens = [0 if n == 0 else max(n, query_len) for n in draw(lengths)]
    init, local = draw(windows)
    return msa.make_case(
        draw(st.integers(0, 2**16)),
        lens,
        dtype=draw(st.sampled_from(sorted(DTYPES))),
        query_len=query_len,
        heads=draw(st.sampled_from([1, 2, 4, 8])),
        pattern=draw(st.sampled_from(("random",) + EXACT_PATTERNS)),
        init_blocks=init,
        local_blocks=local,
        table_width=20 if narrow and draw(st.booleans()) else None,
    )


@settings(deadline=None)
@given(msa_cases(narrow=True))
def test_full_decode_is_the_sorted_selection(case):
    out = msa.full_decode(*case.args(), **case.windows())
    win = (case.init_blocks, case.local_blocks)
    inputs = check_msa_inputs(*case.args(), *win)
    scores = full_scores(inputs)
    n = causal_blocks(inputs.seq_lens, case.query_len)
    for row in range(out.shape[0]):
        for h in range(out.shape[1]):
            want = sorted_selection(scores[row, h], int(n[row]), inputs.num_pages, *win)
            assert out[row, h].tolist() == want, (row, h)


@settings(deadline=None)
@given(msa_cases(), st.sampled_from([1, 2, 4, 8]), st.integers(0, 2))
def test_cp_equals_the_oracle(case, cp, extra):
    """Every rank simulated, with the protocol's flags; any width >= ceil(P / CP)."""
    p = case.block_table.shape[1]
    width = -(-p // cp) + extra
    out = msa.cp_decode(*case.args(), **case.windows(), cp=cp, width=width)
    assert torch.equal(out, msa.full_decode(*case.args(), **case.windows()))


def test_forced_windows_outrank_every_score():
    """Forced blocks are selected even when every other block scores higher, and the
    output is ascending with -1 only at the end."""
    case = msa.make_case(0, [seq_len_for(40, 9)], pattern="exact", heads=1, init_blocks=3, local_blocks=4)
    k = case.k_cache.float()
    first, last = case.block_table[0, :3].long(), case.block_table[0, 37:41].long()
    k[first] = 0.0  # the forced blocks score 0, below every other block's
    k[last] = 0.0
    q = case.index_q.float().abs() + 0.5
    others = torch.ones_like(k)
    others[first] = 0.0
    others[last] = 0.0
    k = torch.where(others > 0, 1.0, k)
    out = msa.full_decode(q.to(case.index_q.dtype), k.to(case.k_cache.dtype), *case.args()[2:], **case.windows())
    row = out[0, 0].tolist()
    assert row[:3] == [0, 1, 2] and row[-4:] == [37, 38, 39, 40]
    assert row == sorted(row) and len(set(row)) == TOPK
    # With all-equal scores elsewhere the lowest blocks win the ties.
    assert row[3:-4] == list(range(3, 12))


def test_a_length_past_the_table_keeps_its_local_window():
    """n > P: the local window (past the table) is still output; only blocks < P rank."""
    case = msa.make_case(2, [seq_len_for(30, 0)], pattern="exact", heads=1, table_width=20, local_blocks=2)
    out = msa.full_decode(*case.args(), **case.windows())[0, 0].tolist()
    assert out[-2:] == [29, 30] and all(0 <= g < 20 for g in out[:-2]) and out[0] == 0


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda c: {"init_blocks": 9, "local_blocks": 8}, "local_blocks: init_blocks \\+ local_blocks"),
        (lambda c: {"init_blocks": -1}, "init_blocks: must be"),
        (lambda c: {"index_q": c.index_q.to(torch.float8_e4m3fn)}, "index_q: expected dtype torch.bfloat16"),
        (lambda c: {"index_q": c.index_q.float()}, "index_q: expected dtype bfloat16 or"),
        (lambda c: {"index_q": torch.full_like(c.index_q, float("nan"))}, "index_q: holds a NaN"),
        (lambda c: {"k_cache": c.k_cache[:, :, :64]}, "k_cache: expected shape"),
        (lambda c: {"seq_lens": torch.tensor([1, 0], dtype=torch.int32)}, "seq_lens: request 0 has length 1"),
        (lambda c: {"block_table": torch.full_like(c.block_table, 99)}, "block_table: entry \\[0, 0\\] = 99"),
        (lambda c: {"query_len": 9}, "query_len: must be in 1..8"),
    ],
)
def test_bad_inputs_name_the_argument(change, match):
    case = msa.make_case(0, [seq_len_for(3, 0), 0], query_len=2, heads=2, pattern="exact")
    args = dict(zip(("index_q", "k_cache", "block_table", "seq_lens", "query_len"), case.args()))
    args.update(case.windows())
    args.update(change(case))
    with pytest.raises((TypeError, ValueError), match=match):
        msa.full_decode(**args)


def test_an_unread_page_may_hold_anything_but_a_read_one_must_be_finite():
    case = msa.make_case(0, [seq_len_for(3, 0)], pattern="exact", heads=1, num_blocks=8)
    k = case.k_cache.clone()
    unread = [b for b in range(8) if b not in case.block_table[0, :4].tolist()][0]
    k[unread] = float("inf")
    msa.full_decode(case.index_q, k, *case.args()[2:], **case.windows())
    k[int(case.block_table[0, 3])] = float("nan")
    with pytest.raises(ValueError, match="k_cache: a page the table reads"):
        msa.full_decode(case.index_q, k, *case.args()[2:], **case.windows())


def test_padding_and_short_rows_follow_from_the_length():
    case = msa.make_case(0, [0, seq_len_for(3, 5), seq_len_for(15, 127)], heads=2, query_len=1)
    out = msa.full_decode(*case.args(), **case.windows())
    assert bool((out[0] == -1).all())
    assert out[1, 0].tolist() == [0, 1, 2, 3] + [-1] * 12
    assert out[2, 1].tolist() == list(range(16))
    assert HEAD_DIM == case.k_cache.shape[2]
