"""GPU tier, one GPU: the CP forward captured in a CUDA graph and replayed with PDL, plans
changing every step (CP = 1: the buffer is its own peer; the multi-GPU tier is the GPU issue's)."""

import pytest
import torch

import reference
from fast.cp import IndexerDecodeCP
from fast.programs import exact_queries, random_step
from fast.symm import SingleRankSymmetric
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
