"""GPU tier: the scorer's inline-PTX dequantization (fast/kernels/dequant_prmt.py) against the
reference on every (scale byte, code) pair, alone and through each GPU scorer, and the GPU
scorers (wgmma fed from registers or through its shared-memory ring, prmt) against the
table scorer; the ring's bounded wait."""

import pytest
import torch
from hypothesis import given, settings
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

import reference
from bench.variants import dequant_pages_prmt, ring_room, score_variant
from fast.errors import new_record
from fast.kernels import page_ring
from fast.kernels.page_maxima import partial_maxima
from fast.scorer import long_row_pages, max_ring, mma_rows, shared_tables
from fuzz.strategies import decode_configs
from indexer_constants import CODE_BYTES, MMA_ROUTES, PAGE, SLOTS
from reference.cases import EXACT_PATTERNS, every_element_case, make_case
from reference.decode import query_tile
from reference.nvfp4 import dequantize_nvfp4, join_pages
from reference.scores import fp32_order_bound
from support import assert_wait_gives_up

pytestmark = [pytest.mark.gpu, pytest.mark.hopper]  # the wgmma and prmt kernels, the dequantization feeds


def every_pair_page() -> torch.Tensor:
    """One page whose 1024 groups carry each scale byte 4 times, each group codes 0..15 in a
    rotated order (so every code sits at every position of a word)."""
    scales = (torch.arange(1024) % 256).to(torch.uint8).view(128, 8)
    codes = (torch.arange(16)[None, :] + torch.arange(1024)[:, None]) % 16  # [group, element]
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).reshape(128, 64)
    return join_pages(packed[None], scales[None])  # [1, 128, 72]


def test_every_scale_and_code_dequantizes_like_the_reference():
    page = every_pair_page()
    want = dequantize_nvfp4(page)[0].to(torch.float16)  # every E4M3 value is exact in fp16
    got = dequant_pages_prmt(page.cuda(), torch.zeros(1, dtype=torch.int32, device="cuda"))[0].cpu()
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), "NaN (scale byte 0x7F / 0xFF) positions differ"
    # values compare equal; zeros may differ in sign (a -0 code times a scale), which no
    # dot product can see: fp32 accumulation from +0.0 maps -0 and +0 to the same sums
    assert torch.equal(got[~nan], want[~nan])


@pytest.mark.parametrize("kernel", ["wgmma", "prmt"])
def test_every_scale_and_code_scores_exactly_on_each_gpu_kernel(kernel):
    """test_scorer' every-element case through each GPU kernel (the default one is
    also checked there): every score one dequantized element, bit for bit the reference's."""
    case = every_element_case()
    tile = query_tile(case.index_q, 4, 8)
    want = torch.full((4, 64, 32), 1e30)
    reference.score_pages(tile, case.k_cache, case.block_table, case.seq_lens, want)
    got = torch.full_like(want, 1e30).cuda()
    score_variant(tile.cuda(), case.k_cache.cuda(), case.block_table.cuda(), case.seq_lens.cuda(), got, kernel=kernel)
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("kernel", ["wgmma", "prmt"])
@pytest.mark.parametrize("ppp,tok,ahead", [(1, 128, 1), (3, 128, 2), (8, 128, 1), (1, 64, 2), (3, 64, 1), (16, 64, 2)])
# Exact-arithmetic patterns only: the table kernel's batched dot compiles to another MMA
# instruction (mma.sync) than the GPU kernels' (wgmma; the Gluon kernel's mma.sync at Hs = 1
# has its own N), and the Gluon kernel sums the dimensions in a permuted order: on random
# inputs they differ in the last bits (seen on the H200). The GPU paths are held to the
# reference's fp32 bound on random inputs in test_scorer.py.
@pytest.mark.parametrize("pattern", ["exact", "clustered", "ties"])
@pytest.mark.parametrize("hs", [1, 2, 4, 8])
def test_gpu_and_table_scorers_are_bitwise_equal(pattern, hs, ppp, tok, ahead, kernel):
    """On exact-arithmetic inputs a GPU kernel and the table path agree bit for bit, whatever
    its pages per program (tails of rows not a multiple of it included), prmt's tokens per
    MMA block and wgmma's blocks loaded ahead; cells the contract leaves alone keep their 1e30."""
    case = make_case(hs, [700 * 128 + 9, 37 * 128], query_len=8, heads=hs, pattern=pattern, num_blocks=800)
    tile = query_tile(case.index_q, 2, 8).cuda()
    outs = []
    for dequant in (kernel, "table"):
        out = torch.full((2, 8 * hs, case.block_table.shape[1]), 1e30, device="cuda")
        shape = {
            "wgmma": {"pages_per_program": ppp, "blocks_ahead": ahead},
            "prmt": {"pages_per_program": ppp, "tokens_per_dot": tok},
            "table": {},
        }[dequant]
        score_variant(
            tile, case.k_cache.cuda(), case.block_table.cuda(), case.seq_lens.cuda(), out, kernel=dequant, **shape
        )
        outs.append(out.cpu())
    assert torch.equal(outs[0].view(torch.int32), outs[1].view(torch.int32))


# The wgmma kernel's page feeds (pages a program, pages in its shared-memory ring, partial
# maxima a page and row): the ring of 2 on the long programs the policy gives it (N 8 at 8
# pages, N 16 at 4), the deepest ring on short programs, the register pipeline on long ones,
# and fewer partial maxima than the policy's (the bench's `partials`) on either feed (at N 32
# 4, 8 and 16 partials fold by layout: page_maxima.folds_by_layout).
PAGE_FEEDS = ((8, 2, None), (4, 2, None), (3, 4, None), (8, 0, None), (4, 2, 8), (8, 0, 4), (8, 2, 16), (4, 2, 16))


# each example compiles its shapes afresh (first slot, N, route): a few examples a run
@settings(max_examples=12, deadline=None)
@given(decode_configs(max_pages=24, patterns=tuple(EXACT_PATTERNS), routes=MMA_ROUTES))
def test_every_page_feed_scores_exact_inputs_as_the_reference(cfg):
    """Fuzzed decodes' exact-arithmetic inputs through each of PAGE_FEEDS whose ring fits
    beside the kernel's shared memory (its partial maxima's too) at the example's N (a
    decode's small grids never take the programs that use the ring), on the example's MMA
    route: bit for bit the reference's."""
    case = cfg.build()
    batch, heads, q = len(cfg.seq_lens), case.index_q.shape[1], cfg.query_len
    tile = query_tile(case.index_q, batch, q)
    want = torch.full((batch, SLOTS * heads, case.block_table.shape[1]), 1e30)
    reference.score_pages(tile, case.k_cache, case.block_table, case.seq_lens, want, mma=cfg.mma)
    want[:, : (SLOTS - q) * heads] = 1e30
    rows = mma_rows(q * heads)
    operands = (tile.cuda(), case.k_cache.cuda(), case.block_table.cuda(), case.seq_lens.cuda())
    for ppp, ring, partials in PAGE_FEEDS:
        parts = partial_maxima(rows, ppp, cfg.mma) if partials is None else partials
        tables = shared_tables(rows)
        if ring > min(max_ring(rows, ppp, tables, cfg.mma), ring_room(rows, ppp, parts, tables, cfg.mma)):
            continue
        got = torch.full_like(want, 1e30).cuda()
        feed = {"pages_per_program": ppp, "ring": ring, "partials": partials}
        score_variant(*operands, got, kernel="wgmma", first_slot=SLOTS - q, decode=cfg.mma, **feed)
        assert torch.equal(got.cpu().view(torch.int32), want.view(torch.int32)), f"{cfg} fed {feed}"


@pytest.mark.parametrize(
    "hs,ppp,ring",
    [
        (1, 1, 1),
        (1, 2, 3),
        (1, 3, 2),
        (1, 5, 4),
        (1, 8, 3),
        (2, 8, 2),
        (2, 3, 2),
        (2, 4, 3),
        (4, 4, 2),
        (4, 3, 1),
        (4, 1, 2),
        (1, 8, 4),  # N 8, 8 pages, a ring of 4 and the scale table: the 48 KB exactly
    ],
)
@pytest.mark.parametrize("pattern", ["exact", "ties"])
def test_ring_fed_and_table_scorers_are_bitwise_equal(pattern, hs, ppp, ring):
    """The wgmma kernel fed through its shared-memory ring (page_ring.py) agrees with the
    table path bit for bit at N 8 (mma.sync), 16 and 32 (wgmma, whose swizzled q tile the
    ring's static arrays must not misalign) and every ring size that fits — more slots than
    pages, pages not a multiple of the ring, rows ending inside a program (pages never
    copied) — with the scale table gathered from shared memory and from L1, and records
    nothing."""
    case = make_case(hs + 20, [700 * 128 + 9, 37 * 128], query_len=8, heads=hs, pattern=pattern, num_blocks=800)
    tile = query_tile(case.index_q, 2, 8).cuda()
    operands = (tile, case.k_cache.cuda(), case.block_table.cuda(), case.seq_lens.cuda())
    outs = []
    record = new_record(torch.device("cuda"))
    ringed = {"kernel": "wgmma", "pages_per_program": ppp, "ring": ring}
    for shape in (ringed, {**ringed, "tables": False}, {"kernel": "table"}):
        out = torch.full((2, 8 * hs, case.block_table.shape[1]), 1e30, device="cuda")
        score_variant(*operands, out, error=record if shape["kernel"] == "wgmma" else None, **shape)
        outs.append(out.cpu())
    for out in outs[:2]:  # the scale table from shared memory (the policy), then from L1
        assert torch.equal(out.view(torch.int32), outs[2].view(torch.int32))
    assert record.tolist() == [0] * len(record)


@gluon.jit
def _wait_for_a_page_never_copied(err_ptr):
    page_ring.declare(err_ptr, 2, 0)  # no scale table: the pointer is not read
    gl.thread_barrier()
    page_ring.report(page_ring.wait(gl.program_id(0) >= 0, 1, 2), err_ptr)


def test_the_rings_wait_gives_up_and_says_so():
    """A wait for a page never copied gives up and says so (``assert_wait_gives_up``)."""
    assert_wait_gives_up(lambda record: _wait_for_a_page_never_copied[(2,)](record, num_warps=4))


@pytest.mark.parametrize("kernel", ["wgmma", "ring", "prmt"])
@pytest.mark.parametrize("hs", [1, 2, 4, 8])
def test_gpu_scorers_score_the_slots_from_first_slot(hs, kernel):
    """first_slot (a decode step's q = 8 - first_slot live slots) shrinks the MMA's N —
    wgmma's mma.sync at q x Hs <= 8, wgmma at 16 / 32 / 64: each shape scores its rows bit
    for bit like the reference (exact arithmetic) and leaves the earlier slots' rows alone."""
    case = make_case(
        hs + 10, [300 * 128 + 9, 37 * 128, 5 * 128 + 3], query_len=8, heads=hs, pattern="exact", num_blocks=400
    )
    tile = query_tile(case.index_q, 3, 8)
    full = torch.full((3, 8 * hs, case.block_table.shape[1]), 1e30)
    reference.score_pages(tile, case.k_cache, case.block_table, case.seq_lens, full)
    for first_slot in (7, 6, 4, 1):
        want = full.clone()
        want[:, : first_slot * hs] = 1e30
        got = torch.full_like(want, 1e30).cuda()
        rows = mma_rows((8 - first_slot) * hs)
        ring = min(2, max_ring(rows, long_row_pages(rows)))  # N 64 takes no ring
        feed = {"kernel": "wgmma", "ring": ring} if kernel == "ring" else {"kernel": kernel}
        score_variant(
            tile.cuda(),
            case.k_cache.cuda(),
            case.block_table.cuda(),
            case.seq_lens.cuda(),
            got,
            first_slot=first_slot,
            **feed,
        )
        assert torch.equal(got.cpu().view(torch.int32), want.view(torch.int32)), f"first slot {first_slot}"


@pytest.mark.parametrize("hs", [1, 4])
def test_the_benchs_scorer_variants_launch_at_their_size(hs):
    """Each variant row of the bench (``SCORER_VARIANTS``: 8 x 128K, Hs 1 and 4 on 8 slots;
    ``N8_VARIANTS`` at Hs 1) launches at that size and scores the page every slot's causal
    range holds: a variant the kernel has no room for is refused before it launches, never
    failed by the driver halfway through a bench (a ring beside N 32's 8-page maxima did that)."""
    from bench.suite import N8_VARIANTS, SCORER_VARIANTS
    from bench.timing import CachePool, random_tile

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(3)
    batch, pages = 8, 131072 // PAGE
    pool = CachePool(64, dev)  # the pages repeat: launching is the point, not the bytes
    table = torch.randint(0, 64, (batch, pages), generator=gen, dtype=torch.int32).to(dev)
    lens = torch.full((batch,), pages * PAGE + 1, dtype=torch.int32, device=dev)
    tile = random_tile(batch, hs, gen, dev)
    for variant in [*SCORER_VARIANTS, *(N8_VARIANTS if hs == 1 else ())]:
        out = torch.full((batch, SLOTS * hs, pages), 7.0, device=dev)
        score_variant(tile, pool.cache, table, lens, out, **variant)
        assert not bool((out[:, :, 0] == 7.0).any()), variant  # every slot scores the first page


@pytest.mark.parametrize("heads, query_len", [(1, 8), (4, 1), (4, 4), (4, 8)])
def test_the_signless_probe_scores_the_keys_magnitudes(heads, query_len):
    """The bench's ``signless`` probe (the decode without its sign step) scores |k|: on a
    cache whose codes are all non-negative it equals the scorer bit for bit, and on the
    same cache with its sign bits back it does not — so its row in the bench times the
    whole kernel less the sign step, nothing else (N 8, 16 and 32)."""
    case = make_case(5, [300 * 128 + 9, 37 * 128], query_len=query_len, heads=heads, pattern="gaussian", num_blocks=400)
    tile = query_tile(case.index_q, 2, query_len).cuda()
    signed = case.k_cache.cuda()
    unsigned = signed.clone()
    unsigned.view(signed.shape[0], -1)[:, :CODE_BYTES] &= 0x77  # every code's sign bit cleared
    table, lens = case.block_table.cuda(), case.seq_lens.cuda()
    first = SLOTS - query_len

    def scores(cache, **probe):
        out = torch.full((2, SLOTS * heads, table.shape[1]), 7.0, device="cuda")
        return score_variant(tile, cache, table, lens, out, first_slot=first, **probe).view(torch.int32)

    assert torch.equal(scores(unsigned, decode="signless"), scores(unsigned))
    assert not torch.equal(scores(signed, decode="signless"), scores(signed))


@pytest.mark.parametrize("heads, query_len", [(1, 8), (4, 1), (4, 4), (4, 8)])
def test_the_e4m3_route_scores_the_keys_through_an_e4m3_mma(heads, query_len):
    """The E4M3-MMA route through the bench's variants (``decode="e4m3"``: the decode's E4M3
    bytes straight into wgmma k32, q as the E4M3 it is) stores the scorer's cells and nothing else, each within
    2^-7 of its page's largest sum of |q_d k_td| of the exact score — far looser than
    Hopper's E4M3 accumulation needs (``python -m bench.fp8_mma`` measures that), far
    tighter than a column or a sign out of place, which moves a score by about the whole
    sum's scale (N 8, 16 and 32)."""
    case = make_case(7, [300 * 128 + 9, 37 * 128], query_len=query_len, heads=heads, pattern="gaussian", num_blocks=400)
    tile = query_tile(case.index_q, 2, query_len)
    table, lens = case.block_table.cuda(), case.seq_lens.cuda()

    def scores(**probe):
        out = torch.full((2, SLOTS * heads, table.shape[1]), 7.0, device="cuda")
        first = SLOTS - query_len
        return score_variant(tile.cuda(), case.k_cache.cuda(), table, lens, out, first_slot=first, **probe).cpu()

    exact, probe = scores(), scores(decode="e4m3")
    stored = exact != 7.0
    assert bool(stored.any()) and torch.equal(probe != 7.0, stored)
    scale = fp32_order_bound(tile, case.k_cache, case.block_table) / (128 * 2.0**-24)  # max_t sum_d |q_d k_td|
    assert bool(((probe - exact).abs() <= 2.0**-7 * scale)[stored].all())


def _assert_probe_multiplies_each_tokens_value(seed, heads, query_len, token_values, route, probe):
    """The no-decode probes' check: on a cache whose every token repeats one value v_t in
    all its code bytes (``token_values(gen)``: v [400 pages, PAGE] and its bytes [400, PAGE,
    k], k dividing a token's code bytes) and whose scale bytes are 0 (the table entry a probe
    XORs in is zero), every dimension of a token is v_t whatever the column order, so the
    ``probe`` decode must store max_t v_t x sum_d q_d exactly (small integers) in the cells
    where the ``route`` decode stores 0, and leave the rest alone."""
    case = make_case(
        seed, [300 * 128 + 9, 37 * 128], query_len=query_len, heads=heads, pattern="gaussian", num_blocks=400
    )
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-4, 5, case.index_q.shape, generator=gen).to(torch.float8_e4m3fn)
    tile = query_tile(q, 2, query_len).cuda()
    values, pattern = token_values(gen)
    cache = torch.zeros_like(case.k_cache)
    codes = cache.view(400, -1)[:, :CODE_BYTES].view(400, PAGE, CODE_BYTES // PAGE)  # a token's code bytes
    codes.copy_(pattern.repeat(1, 1, CODE_BYTES // PAGE // pattern.shape[-1]))
    cache = cache.cuda()
    table, lens = case.block_table.cuda(), case.seq_lens.cuda()

    def scores(decode):
        out = torch.full((2, SLOTS * heads, table.shape[1]), 7.0, device="cuda")
        return score_variant(tile, cache, table, lens, out, first_slot=SLOTS - query_len, decode=decode).cpu()

    base, got = scores(route), scores(probe)
    stored = base != 7.0
    assert bool(stored.any()) and bool((base[stored] == 0).all())
    sums = tile.float().sum(-1).view(2, SLOTS * heads).cpu()  # [request, row]: sum_d q_d
    pages = values.double()[case.block_table.long()]  # [request, column, token]
    best = torch.maximum(pages.amax(-1)[:, None] * sums[:, :, None], pages.amin(-1)[:, None] * sums[:, :, None])
    assert torch.equal(got[stored], best.float()[stored])
    assert bool((got[~stored] == 7.0).all())


@pytest.mark.parametrize("heads, query_len", [(1, 8), (4, 1), (4, 4), (4, 8)])
def test_the_no_decode_probe_multiplies_the_code_words_halves(heads, query_len):
    """The bench's no-decode probe (``decode="none"``) takes the code words' 16-bit halves
    as its fp16 operand and does the scorer's other work: each token one fp16 small integer
    in all its halves, the exact scorer storing 0 (N 8, 16 and 32)."""

    def halves(gen):
        # each page's tokens: distinct small integers, a unique largest and smallest
        values = torch.stack([torch.randperm(128, generator=gen) for _ in range(400)]) - 64  # [page, token]
        bits = values.to(torch.float16).view(torch.int16).to(torch.int32)
        return values, torch.stack([bits & 0xFF, (bits >> 8) & 0xFF], dim=-1).to(torch.uint8)  # [page, token, 2]

    _assert_probe_multiplies_each_tokens_value(6, heads, query_len, halves, "exact", "none")


@pytest.mark.parametrize("heads, query_len", [(1, 8), (4, 1), (4, 4), (4, 8)])
def test_the_e4m3_no_decode_probe_multiplies_the_code_words_bytes(heads, query_len):
    """The bench's no-decode probe of the E4M3 route (``decode="e4m3-none"``) takes the code
    words' bytes as its E4M3 operand and does the route's other work: each token one E4M3
    small integer in all its bytes (exact on the E4M3 MMA too), the route storing 0 (N 8,
    16 and 32)."""

    def e4m3_bytes(gen):
        values = torch.randint(-15, 16, (400, PAGE), generator=gen)  # [page, token]: E4M3 integers
        return values, values.to(torch.float8_e4m3fn).view(torch.uint8)[:, :, None]

    _assert_probe_multiplies_each_tokens_value(8, heads, query_len, e4m3_bytes, "e4m3", "e4m3-none")


def test_the_loads_only_probe_stores_nothing():
    """The bench's probe (``loads_only``) runs the wgmma kernel's loads and leaves ``out`` as
    it was: its numbers are a bound, never scores."""
    case = make_case(3, [300 * 128 + 9, 37 * 128], query_len=8, heads=4, pattern="gaussian", num_blocks=400)
    tile = query_tile(case.index_q, 2, 8).cuda()
    out = torch.full((2, 32, case.block_table.shape[1]), 1e30, device="cuda")
    score_variant(tile, case.k_cache.cuda(), case.block_table.cuda(), case.seq_lens.cuda(), out, loads_only=True)
    assert bool((out == 1e30).all())
