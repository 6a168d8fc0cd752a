"""GPU tier, one GPU: the CP forward captured in a CUDA graph and replayed with PDL, plans
changing every step (CP = 1: the buffer is its own peer; the multi-GPU tier is the GPU issue's)."""

import pytest
import torch

import fast.cp
import reference
from fast.cp import IndexerDecodeCP
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
