"""Throwaway (not committed): the MSA scorer section at 8 / 32 x 128K with the bench's graphs
(as many calls as disjoint sets: 1-2 here) against graphs of >= 16 calls cycling the sets."""
import torch

from bench.msa import msa_scorer_section
from bench.timing import ceilings, graph_time_us

dev = torch.device("cuda", 0)
read = ceilings(dev)["stream_read_GBps"]


def cycled(fn, calls):
    return graph_time_us(lambda i: fn(i % calls), max(calls, 16))


for rnd in range(2):
    for name, timer in (("bench", graph_time_us), ("16 calls", cycled)):
        rows = msa_scorer_section(dev, (131072,), (8, 32), read, torch.Generator().manual_seed(rnd), timer=timer)
        line = [
            f"{r['format']} {r['hs']}/{r['slots']} b{r['batch']} {r['us']:.1f}" for r in rows if not r.get("variant")
        ]
        print(rnd, name, " | ".join(line), flush=True)
