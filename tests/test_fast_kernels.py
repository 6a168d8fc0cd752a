"""Each fast kernel against its reference counterpart, in one process (interpreter or GPU)."""

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import example, given, settings
from hypothesis import strategies as st

import reference
from fast.backend import default_device
from fast.cp import IndexerDecodeCP, PeerTimeoutError
from fast.cp_kernels import _push_warp_top16, compact_table_kernel
from fast.jit_helpers import ERR_Q_TIMEOUT, KEY_EXACT, fmaf, merge_runs16, top16
from fast.scorer import score_pages
from fast.select_shape import QUEUED_PER_SM, SelectShape
from fast.stock import StockDecode
from fast.symm import SingleRankSymmetric
from fast.warp_select import warp_asm_options
from fuzz.strategies import DecodeConfig, decode_configs
from reference.cases import EXACT_PATTERNS, every_element_case, make_case, seq_len_for
from indexer_constants import PAGE, SLOTS
from reference.cp import long_requests, plan_rank
from reference.decode import query_tile
from reference.nvfp4 import dequantize_nvfp4
from reference.scores import fp32_order_bound
from reference.selection import exact_keys, own_pages, select, top_keys

DEV = default_device()
POISON = 1e30
EXACT = tuple(EXACT_PATTERNS)


def on(x):
    return x.to(DEV)


@st.composite
def scorer_cases(draw, patterns=EXACT + ("random", "gaussian")):
    hs = draw(st.sampled_from([1, 2, 4, 8]))
    width = draw(st.integers(1, 20))
    lens = draw(st.lists(st.integers(-3, 22 * 128 + 9), min_size=1, max_size=3))
    pattern = draw(st.sampled_from(patterns))
    case = make_case(draw(st.integers(0, 2**31 - 1)), [8] * len(lens), heads=hs, query_len=8, pattern=pattern, table_width=width, num_blocks=9)
    tile = query_tile(case.index_q, len(lens), 8)
    return tile, case.k_cache, case.block_table, torch.tensor(lens, dtype=torch.int32), pattern, draw(st.integers(0, SLOTS - 1))


@given(scorer_cases())
def test_scorer_matches_reference(args):
    """The contract's stored cells and values; with first_slot, the rows of the earlier slots
    stay untouched and the others are still the reference's (the kernel's N shrinks with
    them: on a GPU first_slot 7 at Hs <= 8 runs mma.sync, others wgmma)."""
    tile, k_cache, table, lens, pattern, first_slot = args
    b, _, hs, _ = tile.shape
    want = torch.full((b, 8 * hs, table.shape[1]), POISON)
    reference.score_pages(tile, k_cache, table, lens, want)
    want[:, : first_slot * hs] = POISON
    got = on(torch.full_like(want, POISON))
    score_pages(on(tile), on(k_cache), on(table), on(lens), got, first_slot=first_slot)
    got = got.cpu()
    written = want != POISON
    assert torch.equal(got != POISON, written), "stored a different set of columns"
    if pattern in EXACT:
        assert torch.equal(got, want)  # exact arithmetic: every order gives the same fp32
    else:
        tol = fp32_order_bound(tile, k_cache, table)
        assert bool(((got - want).abs() <= tol)[written].all())


@given(
    cp=st.sampled_from([1, 2, 4, 8]),
    lens=st.lists(st.integers(1, 40 * 128), min_size=1, max_size=4),
    p_table=st.integers(1, 45),
    extra=st.integers(0, 3),
)
def test_compact_table_matches_reference_plan(cp, lens, p_table, extra):
    table = torch.randperm(1000)[: len(lens) * p_table].view(len(lens), p_table).to(torch.int32)
    seq = torch.tensor(lens, dtype=torch.int32)
    p = min(p_table, 8192)
    width = reference.compact_width(p, cp) + extra
    for rank in range(cp):
        cbt, n_local, score_lens = plan_rank(table, seq, p, width, cp, rank)
        outs = [on(torch.full((len(lens), width), -7, dtype=torch.int32))] + [on(torch.full((len(lens),), -7, dtype=torch.int32)) for _ in range(3)]
        compact_table_kernel[(len(lens),)](on(table), on(seq), outs[0], outs[1], outs[2], outs[3], p, p_table, W=width, CP=cp, RANK=rank, BLOCK=16)
        got_cbt, got_lens, got_seq, got_n = (o.cpu() for o in outs)
        assert torch.equal(got_cbt, cbt) and torch.equal(got_lens, score_lens)
        assert torch.equal(got_seq, seq) and torch.equal(got_n.long(), n_local)


@pytest.mark.parametrize("pages", [17, 2048, 4095, 8192])
def test_cp_score_rows_are_aligned_and_padded(pages):
    """The push's 16-byte loads (jit_helpers._quad_max) need every row of the CP scores
    16-byte aligned, and a load from any of its W columns inside the row: 3 floats of
    padding past them (cp.score_row_stride)."""
    state = IndexerDecodeCP(heads=4, max_reqs=3, symm=SingleRankSymmetric(DEV))
    plan = state.plan(on(torch.zeros(3, pages, dtype=torch.int32)), on(torch.full((3,), pages * PAGE, dtype=torch.int32)))
    scores = plan.scores
    assert scores.data_ptr() % 16 == 0 and scores.stride(0) % 4 == 0 and scores.stride(1) % 4 == 0 and scores.stride(2) == 1
    assert scores.stride(1) >= scores.shape[2] + 3 and scores.stride(0) == scores.shape[1] * scores.stride(1)


@triton.jit
def _fmaf_kernel(a_ptr, b_ptr, c_ptr, o_ptr, N: tl.constexpr, EMULATE: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(o_ptr + i, fmaf(tl.load(a_ptr + i), tl.load(b_ptr + i), tl.load(c_ptr + i), EMULATE))


f32 = st.floats(-(2.0**60), 2.0**60, width=32)  # products stay finite


@given(st.lists(st.tuples(f32, f32, f32), min_size=16, max_size=16))
@example([(1.0 + 2.0**-23, 1.0 + 2.0**-23, -1.0)] * 16)
def test_fmaf_rounds_once_on_this_backend(triples):
    a, b, c = (torch.tensor(x, dtype=torch.float32) for x in zip(*triples))
    out = on(torch.empty(16))
    _fmaf_kernel[(1,)](on(a), on(b), on(c), out, N=16, EMULATE=DEV.type != "cuda")
    want = reference.selection.fmaf(a, b, c)
    assert torch.equal(out.cpu().view(torch.int32), want.view(torch.int32)) or torch.equal(out.cpu(), want)


def _stock_case(cfg: DecodeConfig, max_chunk: int, split: int | None = None):
    case = cfg.build()
    layout_heads = case.index_q.shape[1]
    sd = StockDecode(heads=layout_heads, max_reqs=max(1, len(cfg.seq_lens)), device=DEV, split=split)
    sd.plan(on(case.block_table), on(case.seq_lens))
    sd.shape = SelectShape.for_width(sd.width, max_chunk)
    # Columns the scorer does not write keep this: the select loads whole rows before it
    # knows their lengths, and must drop them (in the range it would squeeze every key).
    sd._scores[len(cfg.seq_lens)].fill_(POISON)
    out = on(torch.full((case.index_q.shape[0], layout_heads, 16), -7, dtype=torch.int32))
    sd.forward(on(case.index_q), on(case.k_cache), out, case.query_len)
    return case, sd, out.cpu()


@settings(max_examples=20)
@given(decode_configs(max_pages=60), st.sampled_from([1024, 16]), st.sampled_from([1, 2, 4]))
def test_stock_topk_matches_reference_on_its_own_scores(cfg, max_chunk, split):
    """Selection exactly: the kernel's own scores through the reference's stock selection.
    max_chunk 16 forces the three-level select on rows longer than 16 pages (with split,
    on slices longer than 16); split > 1 splits each row over programs."""
    case, sd, out = _stock_case(cfg, max_chunk, split)
    batch, q, heads = len(cfg.seq_lens), case.query_len, case.index_q.shape[1]
    width = min(case.block_table.shape[1], 8192)
    scores = sd._scores[batch].cpu().view(batch, 8, heads, sd.width)[:, 8 - q :, :, :width]
    rows = scores.reshape(batch * q * heads, width)
    own = own_pages(case.seq_lens, q).repeat_interleave(heads)
    assert torch.equal(out.view(-1, 16), select(rows, own, width, key="stock"))


def test_split_stock_topk_rearms_and_repeats():
    """A split select leaves its slice counts at zero, so the next call (a graph replay)
    selects again — to the same pages as the unsplit select."""
    case = make_case(4, [seq_len_for(60, 5), seq_len_for(3, 0), seq_len_for(45, 1)], query_len=2, heads=2)
    outs = []
    for split in (1, 4):
        sd = StockDecode(heads=2, max_reqs=3, device=DEV, split=split)
        sd.plan(on(case.block_table), on(case.seq_lens))
        for _ in range(2):
            out = on(torch.full((case.index_q.shape[0], 2, 16), -7, dtype=torch.int32))
            sd.forward(on(case.index_q), on(case.k_cache), out, case.query_len)
            outs.append(out.cpu())
            assert int(sd._counts.abs().sum()) == 0
    assert all(torch.equal(o, outs[0]) for o in outs)


@triton.jit
def _merge_runs_kernel(keys_ptr, out_ptr, N: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, 16), merge_runs16(tl.load(keys_ptr + tl.arange(0, N))))


@settings(max_examples=25, deadline=None)
@given(runs=st.sampled_from([2, 4, 8, 16]), top=st.sampled_from([3, 1000, 2**32]), wide=st.booleans(), seed=st.integers(0, 2**31 - 1))
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
    from fast.select_shape import MAX_SPLIT, SPLIT_PROGRAMS, fit_split, select_split

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
            StockDecode(heads=1, max_reqs=1, device=DEV, split=bad)


def test_release_policy():
    """The scorer launches a small select grid early, and a CP push of one-warp programs up
    to 2048 columns; not latency-bound four-warp selects, nor one-warp 4096-column pushes
    (both measured slower released: select_shape.release_select)."""
    from fast.select_shape import release_select

    assert release_select(32) and not release_select(33)  # a stock select: four warps
    assert release_select(1024, warps=1, columns=512) and release_select(1024, warps=1, columns=2048)
    assert not release_select(1024, warps=1, columns=4096)
    assert not release_select(256, warps=4, columns=1024) and not release_select(1024, warps=2, columns=1024)


@settings(max_examples=20)
@given(decode_configs(max_pages=60, patterns=EXACT))
def test_stock_equals_reference_end_to_end_on_exact_inputs(cfg):
    case, _, out = _stock_case(cfg, 1024)
    assert torch.equal(out, reference.stock_decode(*case.args()))


@triton.jit
def _warp_top16_kernel(keys_ptr, ptrs, W: tl.constexpr, ASM: tl.constexpr, CONSTRAINTS: tl.constexpr):
    row = tl.program_id(0)
    keys = tl.load(keys_ptr + row * W + tl.arange(0, W))
    _push_warp_top16(keys, ptrs, 0, row * 16, True, 1, W // 32, ASM, CONSTRAINTS)


@pytest.mark.gpu  # inline PTX: GPUs only
@pytest.mark.parametrize("columns", [512, 1024])
@pytest.mark.parametrize("pattern", ["random", "ties", "low bit", "few valid", "none"])
def test_warp_select_block_stores_the_top16(columns, pattern):
    """The push's warp select on one warp (push_kernel's helper, one owner) stores each
    row's exact top 16 keys as a set: every pass, every fill (no valid key at all, too)."""
    gen = torch.Generator().manual_seed(columns)
    rows = 64
    score = torch.randint(0, 2**32, (rows, columns), generator=gen, dtype=torch.int64)
    if pattern == "ties":
        score = (score % 4) << 20
    elif pattern == "low bit":  # ties above bit 17 of the key: pass B among valid keys
        score = 0x3F800000 | (score % 2)
    pages = torch.argsort(torch.rand(rows, 2 * columns, generator=gen), dim=1)[:, :columns]
    keys = 1 << 48 | score << 16 | (0xFFFF - pages)
    if pattern in ("few valid", "none"):
        valid = torch.rand(rows, columns, generator=gen).argsort(dim=1) < (torch.randint(0, 16, (rows, 1), generator=gen) if pattern == "few valid" else 0)
        keys = torch.where(valid, keys, 0)
    out = on(torch.full((rows, 16), -1, dtype=torch.int64))
    ptrs = on(torch.tensor([out.data_ptr()], dtype=torch.int64))
    opts = warp_asm_options(columns)
    _warp_top16_kernel[(rows,)](on(keys), ptrs, W=columns, ASM=opts["WARP_ASM"], CONSTRAINTS=opts["WARP_CONSTRAINTS"], num_warps=1)
    assert torch.equal(out.cpu().sort(dim=1, descending=True).values, keys.sort(dim=1, descending=True).values[:, :16])


@pytest.mark.gpu  # inline PTX: GPUs only
@settings(max_examples=40, deadline=None)
@given(
    columns=st.sampled_from([512, 1024]),
    valid=st.integers(0, 1024),
    above=st.integers(0, 16),
    tied=st.integers(0, 48),
    low_bit=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_warp_select_block_on_drawn_tie_structures(columns, valid, above, tied, low_bit, seed):
    """The block's two passes meet at the 16th key: rows of ``valid`` keys (the rest no
    page), ``above`` of them with distinct scores over a tie score that ``tied`` more share
    (in their upper 31 key bits only where ``low_bit``: the score's last bit differs), the
    others below it, at random columns and pages — so pass A's threshold lands on, inside
    and past the tied run, and the fill meets every count of valid keys."""
    gen = torch.Generator().manual_seed(seed)
    rows, valid = 32, min(valid, columns)
    above, tied = min(above, valid), min(tied, valid - min(above, valid))
    tie = 1 << 30
    rank = torch.arange(columns).expand(rows, columns)
    high = tie + 2 + 2 * torch.randperm(1 << 20, generator=gen)[:above].sort(descending=True).values  # distinct, over the tie
    low = torch.randint(0, tie, (rows, columns), generator=gen, dtype=torch.int64)  # under it
    score = torch.where(rank < above, torch.cat([high, torch.zeros(columns - above, dtype=torch.int64)])[None, :], low)
    tied_score = tie | (torch.randint(0, 2, (rows, columns), generator=gen) if low_bit else 0)
    score = torch.where((rank >= above) & (rank < above + tied), tied_score, score)
    pages = torch.argsort(torch.rand(rows, 4 * columns, generator=gen), dim=1)[:, :columns]
    keys = torch.where(rank < valid, 1 << 48 | score << 16 | (0xFFFF - pages), 0)
    keys = keys.gather(1, torch.argsort(torch.rand(rows, columns, generator=gen), dim=1))  # at random columns
    out = on(torch.full((rows, 16), -1, dtype=torch.int64))
    ptrs = on(torch.tensor([out.data_ptr()], dtype=torch.int64))
    opts = warp_asm_options(columns)
    _warp_top16_kernel[(rows,)](on(keys), ptrs, W=columns, ASM=opts["WARP_ASM"], CONSTRAINTS=opts["WARP_CONSTRAINTS"], num_warps=1)
    assert torch.equal(out.cpu().sort(dim=1, descending=True).values, keys.sort(dim=1, descending=True).values[:, :16])


def test_push_warps_policy():
    from fast.select_shape import WARP_SELECT_PER_SM, push_warps

    assert push_warps(QUEUED_PER_SM * 132, True, 132) == 1  # a queue of one-chunk selects per SM
    assert push_warps(QUEUED_PER_SM * 132 - 1, True, 132) == 4  # latency-bound: four warps
    assert push_warps(QUEUED_PER_SM * 132, False, 132) == 2  # a queue of three-level selects
    assert push_warps(QUEUED_PER_SM * 132 - 1, False, 132) == 4
    assert push_warps(1, True, 0) == 1  # the interpreter (no SMs): any warps, one chunk -> 1
    # warp_select's PTX block: one warp from WARP_SELECT_PER_SM programs per SM
    assert push_warps(WARP_SELECT_PER_SM * 132, True, 132, warp_select=True) == 1
    assert push_warps(WARP_SELECT_PER_SM * 132 - 1, True, 132, warp_select=True) == 4


@pytest.mark.gpu  # the interpreter runs any warps alike
@pytest.mark.parametrize("pattern", ["exact", "ties"])
@pytest.mark.parametrize(
    "max_chunk, pages, warp_select",
    [(1024, (17, 90), False), (16, (17, 90), False), (1024, (520, 1000), True)],
)  # one-chunk selects on one warp (tl.topk, or warp_select's block at 512+ columns), three-level on two
def test_cp1_queued_push_equals_oracle(pattern, max_chunk, pages, warp_select):
    """Enough rows x heads that the push runs on fewer warps (push_warps): the whole CP
    protocol with one rank still equals the reference, massive ties included."""
    from fast.backend import sm_count
    from fast.select_shape import push_warps

    heads, query_len = 4, 4
    batch = -(-QUEUED_PER_SM * sm_count(str(DEV)) // (heads * query_len))
    one_chunk = max_chunk == 1024  # rows of 17-1000 pages: < 1024 columns, > 16
    assert push_warps(batch * query_len * heads, one_chunk, sm_count(str(DEV))) == (1 if one_chunk else 2)
    gen = torch.Generator().manual_seed(3)
    lens = (torch.randint(pages[0] * PAGE, pages[1] * PAGE, (batch,), generator=gen)).tolist()
    case = make_case(11, lens, query_len=query_len, heads=heads, pattern=pattern)
    state = IndexerDecodeCP(heads=heads, max_reqs=batch, symm=SingleRankSymmetric(DEV), max_chunk=max_chunk)
    layer = state.new_layer()
    plan = state.plan(on(case.block_table), on(case.seq_lens))
    split_plan = state._split(batch * query_len)
    assert (state._push_plan(batch * query_len, split_plan)[1] > 0) == warp_select
    out = on(torch.full((batch * query_len, heads, 16), -7, dtype=torch.int32))
    state.forward(layer, plan, on(case.index_q), on(case.k_cache), out, query_len)
    state.check()
    assert torch.equal(out.cpu(), reference.full_decode(*case.args()))


@pytest.mark.gpu  # the PTX block: GPUs only
@pytest.mark.parametrize("pattern", ["random", "ties", "few groups"])
@pytest.mark.parametrize("columns", [2048, 4096])
def test_queued_wide_push_selects_in_two_levels(pattern, columns):
    """Rows of 2048 and 4096 columns (a CP = 2 rank's at 512K and 1M), on the shallowest
    queue that runs them on one warp (push_warps): the push's two levels on one warp
    (warp_groups_top16: the block over 512 groups' keys, groups of 4 and 8 columns, then
    tl.topk over the best 16 groups' members) store each row's exact top 16 keys, as a
    set, in the owner's slots. The scores go in directly: the reference's scorer over
    such rows would take minutes on the CPU. "ties": scores of four values, so groups tie
    at their maxima and keys at their scores; "few groups": rows whose history holds
    fewer than 16 groups."""
    from fast.backend import sm_count
    from fast.select_shape import WARP_SELECT_PER_SM

    heads, query_len = 4, 4
    batch = -(-WARP_SELECT_PER_SM * sm_count(str(DEV)) // (heads * query_len))
    gen = torch.Generator().manual_seed(columns)
    high = 20 * PAGE if pattern == "few groups" else columns * PAGE
    lens = torch.randint(17 * PAGE, high, (batch,), generator=gen, dtype=torch.int32)
    lens[0] = columns * PAGE  # a row as wide as the plan
    state = IndexerDecodeCP(heads=heads, max_reqs=batch, symm=SingleRankSymmetric(DEV))
    layer = state.new_layer()
    plan = state.plan(on(torch.zeros(batch, columns, dtype=torch.int32)), on(lens))
    split_plan = state._split(batch * query_len)
    assert state._push_plan(batch * query_len, split_plan) == (1, 512)
    scores = torch.randn(plan.scores.shape, generator=gen)
    if pattern == "ties":
        scores = scores.round().clamp(-1, 2)
    plan.scores.copy_(scores)
    state.push(layer, plan, query_len)
    torch.cuda.synchronize()
    got = layer.recv.local.view(2, 1, state.rows_max, heads, 16)[0, 0, : batch * query_len].cpu()
    own = own_pages(lens, query_len)  # [rows]
    j = torch.arange(plan.scores.shape[2])
    rows = scores.view(batch, SLOTS, heads, -1)[:, SLOTS - query_len :].reshape(batch * query_len, heads, -1)
    n_rank = torch.minimum(own, plan.n_local.cpu().repeat_interleave(query_len))[:, None, None]
    want = top_keys(exact_keys(rows, j, j < n_rank).view(-1, j.numel()), 16).view(batch * query_len, heads, 16)
    long = own + 1 > 16
    assert bool(long.any()) and torch.equal(got[long].sort(dim=-1, descending=True).values, want[long])


@settings(max_examples=20)
@given(decode_configs(max_pages=60, patterns=EXACT), st.sampled_from([1024, 16]), st.sampled_from([1, 4]))
def test_cp1_in_process_equals_oracle(cfg, max_chunk, split):
    """The whole CP protocol with one rank (the buffer its own only peer); split 4: each
    row's push selects over 4 programs."""
    case = cfg.build()
    heads = case.index_q.shape[1]
    state = IndexerDecodeCP(heads=heads, max_reqs=max(1, len(cfg.seq_lens)), symm=SingleRankSymmetric(DEV), max_chunk=max_chunk, split=split)
    layer = state.new_layer()
    plan = state.plan(on(case.block_table), on(case.seq_lens))
    plan.scores.fill_(POISON)
    out = on(torch.full((case.index_q.shape[0], heads, 16), -7, dtype=torch.int32))
    state.forward(layer, plan, on(case.index_q), on(case.k_cache), out, case.query_len)
    state.check()
    assert torch.equal(out.cpu(), reference.full_decode(*case.args()))
    # The step left the buffers armed for the next one, and flipped the parity if it used
    # them (a step without a long request uses no buffer).
    assert bool((layer.recv.local == -1).all()) and bool((layer.tile.local == -1).all())
    used = bool(long_requests(case.seq_lens).any())
    assert int(layer.parity) == int(used) and int(layer.current) == 0 and int(state._counts.abs().sum()) == 0


@pytest.mark.parametrize("max_chunk", [1024, 16])
def test_cp_push_selects_the_last_rankable_column(max_chunk):
    """The push's select spans the W - 1 columns a row can rank (W = ceil(P / CP) + 1, the
    last column the lying length's page), not W: at P = 65 that is 65 columns, the last
    one page 64. Its page is made the second best (a copy of the best page's block), so a
    select one column short would drop it."""
    pages = 65
    case = make_case(7, [pages * PAGE + 40], query_len=1, heads=1, pattern="exact", table_width=pages, num_blocks=pages)
    scores = torch.full((1, 8, pages), POISON)
    reference.score_pages(query_tile(case.index_q, 1, 1), case.k_cache, case.block_table, case.seq_lens, scores)
    table = case.block_table.clone()
    table[0, -1] = table[0, int(scores[0, 7].argmax())]
    state = IndexerDecodeCP(heads=1, max_reqs=1, symm=SingleRankSymmetric(DEV), max_chunk=max_chunk)
    layer = state.new_layer()
    plan = state.plan(on(table), on(case.seq_lens))
    out = on(torch.full((1, 1, 16), -7, dtype=torch.int32))
    state.forward(layer, plan, on(case.index_q), on(case.k_cache), out, 1)
    want = reference.full_decode(case.index_q, case.k_cache, table, case.seq_lens, 1)
    assert pages - 1 in want[0, 0, :15].tolist()
    assert torch.equal(out.cpu(), want)


def test_a_step_after_a_timeout_outputs_only_minus_one():
    """With the error flag already set (a spin gave up), every merge program writes its rows
    -1 — short rows, which need no peer, included — and the step still ends: parity
    flipped."""
    case = make_case(3, [seq_len_for(40, 5), seq_len_for(3, 0), seq_len_for(90, 1)], query_len=2, heads=2, pattern="exact")
    state = IndexerDecodeCP(heads=2, max_reqs=3, symm=SingleRankSymmetric(DEV), spin_limit=50)
    layer = state.new_layer()
    plan = state.plan(on(case.block_table), on(case.seq_lens))
    state.error.fill_(ERR_Q_TIMEOUT)
    out = on(torch.full((case.index_q.shape[0], 2, 16), -7, dtype=torch.int32))
    state.forward(layer, plan, on(case.index_q), on(case.k_cache), out, case.query_len)
    assert bool((out == -1).all())
    assert int(layer.parity) == 1
    with pytest.raises(PeerTimeoutError):
        state.check()


@pytest.mark.gpu  # the interpreter's tl.dot is numpy's matmul, whose summation order follows N
@settings(max_examples=20)
@given(
    cp=st.sampled_from([2, 4, 8]),
    heads=st.sampled_from([1, 2, 4, 8]),
    lens=st.lists(st.integers(9, 40 * 128), min_size=1, max_size=3),
    pattern=st.sampled_from(["random", "gaussian", "clustered"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_compact_column_is_bitwise_the_stock_score(cp, heads, lens, pattern, seed):
    """Random inputs (where summation order shows): rank r's compact score column j, scored
    for all H heads at once, is bit for bit the stock score of page j*CP + r scored for one
    head (Hs = 1, as a TP rank does) — the same kernel, the same arithmetic per column."""
    case = make_case(seed, lens, query_len=8, heads=heads, pattern=pattern, num_blocks=64)
    batch, p = len(lens), case.block_table.shape[1]
    tile = query_tile(case.index_q, batch, 8)  # [B, 8, H, 128]
    width = reference.compact_width(p, cp)
    stock = torch.full((heads, batch, 8, p), POISON)
    for h in range(heads):
        got = on(torch.full((batch, 8, p), POISON))
        score_pages(on(tile[:, :, h : h + 1].contiguous()), on(case.k_cache), on(case.block_table), on(case.seq_lens), got)
        stock[h] = got.cpu()
    for rank in range(cp):
        cbt, n_local, _ = plan_rank(case.block_table, case.seq_lens, p, width, cp, rank)
        # The lying length for every request (the plan gives requests with no long row 0:
        # nothing scored); this test is about the scorer's arithmetic per column.
        lie = (n_local * PAGE + SLOTS).to(torch.int32)
        compact = on(torch.full((batch, 8 * heads, width), POISON))
        score_pages(on(tile), on(case.k_cache), on(cbt), on(lie), compact)
        compact = compact.cpu().view(batch, 8, heads, width).permute(2, 0, 1, 3)  # [H, B, 8, W]
        pages = torch.arange(width) * cp + rank
        both = (compact != POISON) & (pages < p) & (stock[..., pages.clamp_max(p - 1)] != POISON)
        assert bool(both.any()) or all(n == 0 for n in n_local.tolist())
        assert torch.equal(compact[both].view(torch.int32), stock[..., pages.clamp_max(p - 1)][both].view(torch.int32))


def test_wgmma_pages_per_program_shrinks_for_small_grids():
    """Long rows get WGMMA_PAGES pages per program (4 at N = 32) where that grid still has
    16 programs an SM; smaller grids get 4, and grids too small to give every SM 4 programs
    of 4 get fewer, down to 1."""
    from fast.scorer_wgmma import WGMMA_PAGES, long_row_pages, pages_per_program

    assert WGMMA_PAGES == 8 and long_row_pages(32) == 4 and long_row_pages(16) == long_row_pages(64) == WGMMA_PAGES
    assert pages_per_program(32, 8192, 132) == WGMMA_PAGES  # 1M, batch 32
    assert pages_per_program(32, 8192, 132, rows=16) == pages_per_program(32, 8192, 132, rows=64) == WGMMA_PAGES
    assert pages_per_program(32, 8192, 132, rows=32) == 4
    assert pages_per_program(32, 1024, 132) == 8  # 4096 programs >= 16 * 132
    assert pages_per_program(1, 8192, 132) == 4  # 1024 programs of 8 < 16 * 132
    assert pages_per_program(8, 1024, 132) == 4
    assert pages_per_program(1, 64, 132) == 1  # 8K context, batch 1
    assert pages_per_program(32, 64, 132) == 2  # 4 would give 512 programs < 4 * 132
    assert pages_per_program(0, 0, 132) == 1


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
def _top16_kernel(score_ptr, n_ptr, out_ptr, stride, CHUNK: tl.constexpr, SUPERS: tl.constexpr, PER_SUPER: tl.constexpr, GROUP: tl.constexpr, SORT: tl.constexpr):
    r = tl.program_id(0)
    best = top16(score_ptr + r * stride, tl.load(n_ptr + r), KEY_EXACT, 1, 0, 0.0, 0.0, False, CHUNK, SUPERS, PER_SUPER, GROUP, SORT)
    tl.store(out_ptr + r * 16 + tl.arange(0, 16), best)


@settings(max_examples=10, deadline=None)
@given(width=st.sampled_from([300, 2048, 8192]), seed=st.integers(0, 2**31 - 1), ties=st.booleans(), group=st.sampled_from([8, 4]))
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
    _top16_kernel[(3,)](on(scores), on(n), got, width, CHUNK=s.chunk, SUPERS=s.supers, PER_SUPER=s.per_super, GROUP=s.group, SORT=DEV.type == "cuda")
    pages = torch.arange(width).expand(3, -1)
    want = top_keys(exact_keys(scores, pages, pages < n[:, None].long()), 16)
    assert torch.equal(got.cpu(), want)


def test_every_scale_and_code_scores_exactly():
    """Each score of this case is one dequantized element: the device's scorer (the wgmma
    kernel on GPUs, fp16 subnormals and saturation included) equals the reference bit for
    bit, and the + and - rows give back the reference's dequantization table."""
    case = every_element_case()
    tile = query_tile(case.index_q, 4, 8)
    want = torch.full((4, 64, 32), POISON)
    reference.score_pages(tile, case.k_cache, case.block_table, case.seq_lens, want)
    got = on(torch.full_like(want, POISON))
    score_pages(on(tile), on(case.k_cache), on(case.block_table), on(case.seq_lens), got)
    assert torch.equal(got.cpu(), want)
    k = (want[:, 0::2] - want[:, 1::2]).permute(2, 0, 1).reshape(32, 128)  # [page, dim] of token 0
    assert torch.equal(k, dequantize_nvfp4(case.k_cache)[:, 0])
