"""GPU tier, one GPU: the CP forward captured in a CUDA graph and replayed with PDL, plans
changing every step (CP = 1: the buffer is its own peer; the multi-GPU tier is the GPU issue's)."""

import pytest
import torch
import triton
import triton.language as tl

import fast.cp
import reference
from fast.cp import IndexerDecodeCP
from fast.kernels.device import clock_ns, pdl_release
from fast.symm import SingleRankSymmetric
from rank_programs import exact_queries, random_step
from reference.cases import make_case

pytestmark = pytest.mark.gpu

BATCH, QLEN, PAGES, HEADS = 8, 4, 300, 4


class _Graphed:
    """A CP = 1 decode of ``batch`` requests (QLEN, HEADS, PAGES) captured in a CUDA graph
    over static inputs (``q``, ``table``, ``lens`` on the GPU; ``out`` its result)."""

    def __init__(self, batch: int, seed: int, pdl: bool):
        dev = torch.device("cuda", torch.cuda.current_device())
        self.base = make_case(
            1, [QLEN] * batch, query_len=QLEN, heads=HEADS, pattern="exact", table_width=PAGES, num_blocks=1024
        )
        self.gen = torch.Generator().manual_seed(seed)
        self.k_cache = self.base.k_cache.to(dev)
        self.q = self.base.index_q.to(dev)
        table, lens = random_step(self.gen, batch, PAGES, self.k_cache.shape[0], QLEN)
        self.table, self.lens = table.to(dev), lens.to(dev)
        self.out = torch.full((batch * QLEN, HEADS, 16), -7, dtype=torch.int32, device=dev)
        self.state = IndexerDecodeCP(heads=HEADS, max_reqs=batch, symm=SingleRankSymmetric(dev), pdl=pdl)
        # Kept as long as the graph: it holds the buffers (and their address arrays) the
        # captured kernels use. Freed, the allocator hands them out again and the replay
        # follows whatever lands there as peer addresses.
        self.layer = self.state.new_layer()
        self.plan = self.state.plan(self.table, self.lens)
        self.state.forward(self.layer, self.plan, self.q, self.k_cache, self.out, QLEN)  # compile outside capture
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.state.forward(self.layer, self.plan, self.q, self.k_cache, self.out, QLEN)

    def step(self):
        """Draw the next step into the static inputs and plan it (the same buffers); returns
        its CPU (queries, table, lengths) for the reference."""
        table, lens = random_step(self.gen, self.lens.shape[0], PAGES, self.k_cache.shape[0], QLEN)
        q = exact_queries(self.q.shape, self.gen)
        self.table.copy_(table)
        self.lens.copy_(lens)
        self.q.copy_(q)
        assert self.state.plan(self.table, self.lens) is self.plan  # same batch size: same buffers
        return q, table, lens


@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_graph_replay_with_changing_plans(pdl):
    g = _Graphed(BATCH, seed=2, pdl=pdl)
    checked = 0
    for step in range(1000):
        q, table, lens = g.step()
        g.graph.replay()
        if step % 97 == 0 or step == 999:
            want = reference.full_decode(q, g.base.k_cache, table, lens, QLEN)
            assert torch.equal(g.out.cpu(), want), f"step {step}"
            checked += 1
    g.state.check()
    assert checked >= 10


def test_merge_under_pdl_selects_what_a_plain_launch_does():
    """Replayed in a graph with PDL, the merge polls its candidates while the push still
    stores them; every step it must select exactly what plain launches (a merge that starts
    after the push ended) select. Batch 64: ~200 rows polled per step.

    What it guards: a poll whose verdict read one thread's copy of each key while another
    thread's copy, loaded before the push's store landed, was selected — a head's row of -1,
    found by a stress run of the test above (graph replays at batch 8, four processes per
    GPU: ~1 step in 40). Run eagerly, the host's launch gaps let the push finish before the
    merge starts, and that version of this test did not catch the planted bug (3 of 3 runs);
    this graph version did (``test_merge_race_test_has_teeth`` passed on the H200: at 5c17895
    with the barrier and reload removed; with the one-warp merge, run on four warps)."""
    g = _Graphed(64, seed=5, pdl=True)
    plain = IndexerDecodeCP(heads=HEADS, max_reqs=64, symm=SingleRankSymmetric(g.q.device), pdl=False)
    layer = plain.new_layer()
    out = torch.full_like(g.out, -7)
    differing = []
    for step in range(400):
        q, table, lens = g.step()
        g.graph.replay()
        plain.forward(layer, plain.plan(g.table, g.lens), g.q, g.k_cache, out, QLEN)
        if not torch.equal(g.out, out):
            differing.append(step)
    g.state.check()
    plain.check()
    assert not differing, f"steps {differing[:10]} ({len(differing)} of 400)"
    assert torch.equal(out.cpu(), reference.full_decode(q, g.base.k_cache, table, lens, QLEN))  # the oracle, last step


@triton.jit
def _late_copy_kernel(src_ptr, dst_ptr, n, delay_ns, BLOCK: tl.constexpr):
    """dst[:n] = src[:n] (bytes), stored ``delay_ns`` after the kernel let its dependents
    launch: a producer of index_q that releases the decode early, as an engine's PDL-chained
    kernel may (PDL promises its dependents nothing before their own wait)."""
    pdl_release(True)
    end = clock_ns(False) + delay_ns
    while clock_ns(False) < end:
        pass
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def test_exchange_waits_for_an_early_releasing_producer_of_index_q():
    """With PDL the q exchange may start while index_q's producer still runs; it must read
    index_q only after its wait for that producer. The producer here stores each step's
    queries 2 ms after releasing the decode (eager launches: the forward's host work is far
    shorter), so an exchange that read before waiting would score the previous step's
    queries: the test checks every step against the reference, and that the previous step's
    queries would have given another answer (else it could not fail)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    base = make_case(
        1, [QLEN] * BATCH, query_len=QLEN, heads=HEADS, pattern="exact", table_width=PAGES, num_blocks=1024
    )
    k_cache = base.k_cache.to(dev)
    state = IndexerDecodeCP(heads=HEADS, max_reqs=BATCH, symm=SingleRankSymmetric(dev), pdl=True)
    layer = state.new_layer()
    q = torch.zeros_like(base.index_q, device=dev)  # the producer's output: the previous step's until it stores
    src = torch.empty_like(q)
    out = torch.full((BATCH * QLEN, HEADS, 16), -7, dtype=torch.int32, device=dev)
    gen = torch.Generator().manual_seed(11)
    block = 1024
    stale_would_differ = 0
    for step in range(12):
        table, lens = random_step(gen, BATCH, PAGES, k_cache.shape[0], QLEN)
        queries = exact_queries(q.shape, gen)
        previous = q.cpu()
        src.copy_(queries)
        plan = state.plan(table.to(dev), lens.to(dev))
        torch.cuda.synchronize()  # the producer alone in flight: nothing but it delays the exchange
        n = q.numel()
        late_copy = _late_copy_kernel[(triton.cdiv(n, block),)]
        late_copy(src.view(torch.uint8), q.view(torch.uint8), n, 2_000_000, BLOCK=block)
        state.forward(layer, plan, q, k_cache, out, QLEN)
        want = reference.full_decode(queries, base.k_cache, table, lens, QLEN)
        assert torch.equal(out.cpu(), want), f"step {step}"
        stale_would_differ += not torch.equal(reference.full_decode(previous, base.k_cache, table, lens, QLEN), want)
    state.check()
    assert stale_would_differ >= 10


@pytest.mark.slow
def test_merge_race_test_has_teeth(monkeypatch):
    """The PDL-vs-plain test above catches the race it guards, planted back, in at least
    one of 5 runs (a race: each run a chance, not a certainty). The plant: the merge
    launched on four warps with the one-warp code — its poll's block then holds two copies
    of a key, the verdict reads one, and nothing reloads the other before the select. (A
    source mutant of fast.cp would not reach the class this module imported.)"""
    monkeypatch.setattr(fast.cp, "MERGE_WARPS", 4)  # IndexerDecodeCP.forward reads it per call
    caught = 0
    for _ in range(5):
        try:
            test_merge_under_pdl_selects_what_a_plain_launch_does()
        except AssertionError:
            caught += 1
    assert caught, "the planted poll race passed 5 runs of the PDL-vs-plain test"


@pytest.mark.parametrize("path", ["cp", "stock"])
def test_padding_after_a_larger_batch_reads_nothing_of_it(path):
    """A step of b requests padded to the size an earlier step of b + 2 used: the padding
    requests are length 0 (nothing scored, nothing checked), whatever the earlier step left
    in their table rows and lengths. The earlier step's last request holds a bad id: its
    ``check()`` raises, and after ``reset()`` the smaller step's stays silent and equals the
    reference."""
    from fast import BadBlockIdError, GraphedDecode, StockDecode

    dev = torch.device("cuda", torch.cuda.current_device())
    b, width = 3, 40
    big = make_case(5, [30 * 128 + 9] * (b + 2), query_len=2, heads=2, pattern="exact", table_width=width)
    small = make_case(6, [20 * 128 + 3] * b, query_len=2, heads=2, pattern="exact", table_width=width)
    small.k_cache = big.k_cache  # one cache, both steps
    if path == "cp":
        decode = IndexerDecodeCP(heads=2, max_reqs=8, symm=SingleRankSymmetric(dev))
    else:
        decode = StockDecode(heads=2, max_reqs=8, device=dev)
    graphed = GraphedDecode(decode, query_len=2, table_width=width, k_caches=[big.k_cache.to(dev)], sizes=(8,))
    table = big.block_table.clone()
    table[b + 1, 7] = big.k_cache.shape[0] + 5  # a bad id in the earlier step's last request
    graphed.step(table.to(dev), big.seq_lens.to(dev), big.index_q.to(dev))
    with pytest.raises(BadBlockIdError, match=f"request {b + 1}"):
        graphed.check()
    graphed.reset()
    out = graphed.step(small.block_table.to(dev), small.seq_lens.to(dev), small.index_q.to(dev))
    graphed.check()  # the stale row of request b + 1 is padding now: never read
    assert graphed.captured == [8]  # the same padded size's graph, replayed
    oracle = reference.full_decode if path == "cp" else reference.stock_decode
    assert torch.equal(out[0].cpu(), oracle(*small.args()))
