"""GPU tier, one GPU: the CP forward captured in a CUDA graph and replayed with PDL, plans
changing every step (CP = 1: the buffer is its own peer; the multi-GPU tier is the GPU issue's)."""

import pytest
import torch

import reference
from fast.cp import IndexerDecodeCP
from fast.programs import exact_queries, random_step
from fast.symm import SingleRankSymmetric
from fuzz.mutants import Mutant, applied
from reference.cases import make_case

pytestmark = pytest.mark.gpu

BATCH, QLEN, PAGES, HEADS = 8, 4, 300, 4


@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_graph_replay_with_changing_plans(pdl):
    dev = torch.device("cuda", torch.cuda.current_device())
    base = make_case(1, [QLEN] * BATCH, query_len=QLEN, heads=HEADS, pattern="exact", table_width=PAGES, num_blocks=1024)
    gen = torch.Generator().manual_seed(2)
    k_cache = base.k_cache.to(dev)
    q_static = base.index_q.to(dev)
    table, lens = random_step(gen, BATCH, PAGES, k_cache.shape[0], QLEN)
    bt_static, sl_static = table.to(dev), lens.to(dev)
    out = torch.full((BATCH * QLEN, HEADS, 16), -7, dtype=torch.int32, device=dev)
    state = IndexerDecodeCP(heads=HEADS, max_reqs=BATCH, symm=SingleRankSymmetric(dev), pdl=pdl)
    layer = state.new_layer()
    plan = state.plan(bt_static, sl_static)
    state.forward(layer, plan, q_static, k_cache, out, QLEN)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        state.forward(layer, plan, q_static, k_cache, out, QLEN)
    checked = 0
    for step in range(1000):
        table, lens = random_step(gen, BATCH, PAGES, k_cache.shape[0], QLEN)
        q = exact_queries(q_static.shape, gen)
        bt_static.copy_(table)
        sl_static.copy_(lens)
        q_static.copy_(q)
        assert state.plan(bt_static, sl_static) is plan  # same batch size: same buffers
        graph.replay()
        if step % 97 == 0 or step == 999:
            want = reference.full_decode(q, base.k_cache, table, lens, QLEN)
            assert torch.equal(out.cpu(), want), f"step {step}"
            checked += 1
    state.check()
    assert checked >= 10



def test_merge_under_pdl_selects_what_a_plain_launch_does():
    """Replayed in a graph with PDL, the merge polls its candidates while the push still
    stores them; every step it must select exactly what plain launches (a merge that starts
    after the push ended) select. Batch 64: ~200 rows polled per step.

    What it guards: a poll whose verdict read one thread's copy of each key while another
    thread's copy, loaded before the push's store landed, was selected — a head's row of -1,
    found by a stress run of the test above (graph replays at batch 8, four processes per
    GPU: ~1 step in 300). Run eagerly, the host's launch gaps let the push finish before the
    merge starts, and that version of this test did not catch the planted bug (3 of 3 runs);
    whether this graph version does is ``test_merge_race_test_has_teeth``'s question."""
    dev = torch.device("cuda", torch.cuda.current_device())
    batch = 64
    base = make_case(1, [QLEN] * batch, query_len=QLEN, heads=HEADS, pattern="exact", table_width=PAGES, num_blocks=1024)
    gen = torch.Generator().manual_seed(5)
    k_cache = base.k_cache.to(dev)
    q_static = base.index_q.to(dev)
    table, lens = random_step(gen, batch, PAGES, k_cache.shape[0], QLEN)
    bt_static, sl_static = table.to(dev), lens.to(dev)
    pdl, plain = (IndexerDecodeCP(heads=HEADS, max_reqs=batch, symm=SingleRankSymmetric(dev), pdl=p) for p in (True, False))
    layers = [pdl.new_layer(), plain.new_layer()]
    outs = [torch.full((batch * QLEN, HEADS, 16), -7, dtype=torch.int32, device=dev) for _ in layers]
    plan = pdl.plan(bt_static, sl_static)
    pdl.forward(layers[0], plan, q_static, k_cache, outs[0], QLEN)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pdl.forward(layers[0], plan, q_static, k_cache, outs[0], QLEN)
    differing = []
    for step in range(400):
        table, lens = random_step(gen, batch, PAGES, k_cache.shape[0], QLEN)
        bt_static.copy_(table)
        sl_static.copy_(lens)
        q_static.copy_(exact_queries(q_static.shape, gen))
        pdl.plan(bt_static, sl_static)
        graph.replay()
        plain.forward(layers[1], plain.plan(bt_static, sl_static), q_static, k_cache, outs[1], QLEN)
        if not torch.equal(outs[0], outs[1]):
            differing.append(step)
    pdl.check()
    plain.check()
    assert not differing, f"steps {differing[:10]} ({len(differing)} of 400)"
    want = reference.full_decode(q_static.cpu(), base.k_cache, table, lens, QLEN)
    assert torch.equal(outs[1].cpu(), want)  # the oracle itself, on the last step


# The merge selecting the keys its poll loaded, without the barrier and reload after the poll.
_POLL_RACE = Mutant(
    "merge selects its poll's copy of the keys",
    "gpu",
    "fast.cp_kernels",
    "        tl.debug_barrier()\n        keys = tl.load(recv + off, volatile=True)\n        dst = out_ptr",
    "        dst = out_ptr",
)


@pytest.mark.slow
def test_merge_race_test_has_teeth():
    """The PDL-vs-plain test above catches the race it guards, planted back, in at least
    one of 5 runs (a race: each run a chance, not a certainty)."""
    caught = 0
    with applied(_POLL_RACE):
        for _ in range(5):
            try:
                test_merge_under_pdl_selects_what_a_plain_launch_does()
            except AssertionError:
                caught += 1
    assert caught, "the planted poll race passed 5 runs of the PDL-vs-plain test"
