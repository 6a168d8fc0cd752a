"""``python -m reference explain`` for an MSA case: one (row, head), rank by rank."""

from __future__ import annotations

import sys

import torch

from indexer_constants import MAX_PAGES, TOPK

from ..arguments import check_row_head
from ..selection import describe_keys
from .cases import MsaCase
from .cp import cp_decode
from .decode import full_decode


def explain(case: MsaCase, row: int, head: int, cp: int, file=None) -> bool:
    """Print what one (row, head) saw on every simulated rank; return True if CP == full.

    row: 0 .. B * q - 1; head: 0 .. H - 1; cp: 1, 2, 4 or 8."""
    file = file or sys.stdout
    check_row_head(case.index_q, row, head)
    rows, heads = case.index_q.shape[:2]
    out, trace = cp_decode(*case.args(), **case.windows(), cp=cp, trace=True)
    full = full_decode(*case.args(), **case.windows())
    q, init, local = case.query_len, case.init_blocks, case.local_blocks
    b, i = divmod(row, q)
    n = int(trace.n[row])
    p = min(case.block_table.shape[1], MAX_PAGES)
    print(
        f"case {case.name}: {case.index_q.dtype} keys, {rows} rows x {heads} heads, query_len {q}, P = {p}, "
        f"CP = {cp}, W = {trace.width}, forced windows {init} + {local}",
        file=file,
    )
    length = int(case.seq_lens[b])
    print(
        f"row {row} = request {b} query {i}: seq_len {length}, position {length - q + i}, {n} causal blocks", file=file
    )
    if n <= TOPK:
        print(f"short row (n <= {TOPK}): nothing scored, output [0..{n - 1}]", file=file)
    else:
        forced = list(range(init)) + list(range(n - local, n))
        print(f"long row: forced {forced}; ranks {TOPK - init - local} of blocks < {min(n, p)}", file=file)
        for rt in trace.ranks:
            print(f"  rank {rt.rank} (owns heads {list(rt.heads)}): blocks {rt.rank}, {rt.rank + cp}, ...", file=file)
            print(f"    local top-16: {describe_keys(rt.local_keys[row, head])}", file=file)
    for o in trace.layout.owners_of(head):
        rt = trace.ranks[o]
        k = head - trace.layout.heads_of(o).start
        print(f"  owner rank {o} output: {rt.merged[row, k].tolist()}", file=file)
    ok = torch.equal(out[row, head], full[row, head])
    print(f"full_decode:          {full[row, head].tolist()}", file=file)
    print("CP == full" if ok else "CP != full: MISMATCH", file=file)
    return ok
