"""``python -m reference explain`` for an NVFP4 case: one (row, head), rank by rank (the
MSA format's twin: ``reference.msa.explain``)."""

from __future__ import annotations

import sys

import torch

from indexer_constants import MAX_PAGES, RANKED, TOPK

from .arguments import check_row_head
from .cases import Case
from .cp import cp_decode, rank_cut
from .decode import full_decode
from .rules import long_rows
from .selection import describe_keys


def explain(case: Case, row: int, head: int, cp: int, file=None) -> bool:
    """Print what one (row, head) saw on every simulated rank; return True if CP == full."""
    file = file or sys.stdout
    check_row_head(case.index_q, row, head)
    rows, heads = case.index_q.shape[:2]
    out, trace = cp_decode(*case.args(), cp=cp, trace=True)
    full = full_decode(*case.args())
    q = case.query_len
    b, i = divmod(row, q)
    own = int(trace.own[row])
    p = min(case.block_table.shape[1], MAX_PAGES)
    print(
        f"case {case.name}: {rows} rows x {heads} heads, query_len {q}, P = {p} pages, CP = {cp}, W = {trace.width}",
        file=file,
    )
    print(f"row {row} = request {b} query {i}: seq_len {int(case.seq_lens[b])}, own page {own}", file=file)
    if not bool(long_rows(torch.tensor(own))):
        print(f"short row (own + 1 <= {TOPK}): no scoring, output [0..{own}, -1...]", file=file)
    else:
        print(f"long row: ranks pages j < min(own, P) = {min(own, p)}, own page in slot {RANKED}", file=file)
        for rt in trace.ranks:
            n_local = int(rt.n_local[b])
            n_rank = int(rank_cut(trace.own[row], rt.n_local[b], cp, rt.rank))
            print(
                f"  rank {rt.rank} (owns heads {list(rt.heads)}): scores pages {rt.rank}, {rt.rank + cp}, ... ; "
                f"scored {n_local} (score length {int(rt.score_lens[b])}), {n_rank} below own",
                file=file,
            )
            print(f"    local top-16: {describe_keys(rt.local_keys[row, head])}", file=file)
    owners = trace.layout.owners_of(head)
    for o in owners:
        rt = trace.ranks[o]
        k = head - trace.layout.heads_of(o).start
        if bool(long_rows(torch.tensor(own))):
            merged = torch.sort(rt.received[:, row, k].reshape(-1), descending=True).values[:RANKED]
            print(f"  owner rank {o}: best {RANKED} of {cp * TOPK} candidates: {describe_keys(merged)}", file=file)
        print(f"  owner rank {o} output: {rt.merged[row, k].tolist()}", file=file)
    ok = torch.equal(out[row, head], full[row, head])
    print(f"full_decode:          {full[row, head].tolist()}", file=file)
    print("CP == full" if ok else "CP != full: MISMATCH", file=file)
    return ok
