"""The CP simulation against the full-context oracle, and the protocol's invariants."""

import pytest
import torch
from hypothesis import example, given

from fuzz.strategies import DecodeConfig, decode_configs
from indexer_constants import PAGE, SLOTS, TOPK
from reference import compact_width, cp_decode, full_decode
from reference.cases import EDGE_PAGES, make_case, seq_len_for


def run_cp(cfg: DecodeConfig, case):
    width = compact_width(min(case.block_table.shape[1], 8192), cfg.cp) + cfg.extra_width
    return cp_decode(*case.args(), cp=cfg.cp, width=width, trace=True)


@given(decode_configs())
# Found while writing the simulation: a length past a narrow table with CP=8 must not read
# the compact columns past n_local (the seed's bound by W - 1 alone would).
@example(
    DecodeConfig(
        seed=1, cp=8, heads=4, query_len=2, seq_lens=(40 * 128 + 5,), table_width=20, pattern="exact", extra_width=7
    )
)
def test_cp_equals_full(cfg):
    case = cfg.build()
    out, _ = run_cp(cfg, case)
    assert torch.equal(out, full_decode(*case.args()))


@given(decode_configs(patterns=("exact", "ties", "clustered", "zeros")))
def test_protocol_invariants(cfg):
    """What each rank scores, stores and pushes, checked against the plan's arithmetic."""
    case = cfg.build()
    out, tr = run_cp(cfg, case)
    p = min(case.block_table.shape[1], 8192)
    hist = ((case.seq_lens.long() - 1) // PAGE).clamp(0, p)
    assert torch.equal(sum(rt.n_local for rt in tr.ranks), hist)  # the ranks partition the history
    for rt in tr.ranks:
        r = rt.rank
        j = torch.arange(tr.width)
        assert torch.equal(rt.compact_table, case.block_table[:, (j * cfg.cp + r).clamp_max(p - 1)])
        # Only requests with a long row (the last query's own page >= 16) are scored.
        scored = (case.seq_lens.long() - 1) // PAGE >= TOPK
        assert torch.equal(rt.score_lens.long(), torch.where(scored, rt.n_local * PAGE + SLOTS, 0))
        # Every slot stores exactly the owned columns; NaN (never written) elsewhere.
        written = ~torch.isnan(rt.scores[:, (SLOTS - cfg.query_len) * cfg.heads :])
        want = ((j[None, :] < rt.n_local[:, None]) & scored[:, None])[:, None, :].expand_as(written)
        assert torch.equal(written, want)
        # Pushed pages are the rank's own and lie below the query's own page and the table.
        pages = torch.where(rt.local_keys > 0, 0xFFFF - (rt.local_keys & 0xFFFF), -1)
        live = pages >= 0
        assert bool((pages[live] % cfg.cp == r).all())
        own = tr.own[:, None, None].expand_as(pages)
        assert bool((pages[live] < torch.minimum(own[live], torch.tensor(p))).all())
    assert bool(((out[:, :, 15] == tr.own[:, None]) | (tr.own[:, None] + 1 <= TOPK)).all())


def _edge_case_ids():
    cases = []
    for pages in EDGE_PAGES:
        for cp, heads, q in [(4, 4, 1), (8, 2, 4), (2, 8, 8)]:
            cases.append(pytest.param(pages, cp, heads, q, id=f"p{pages}-cp{cp}-h{heads}-q{q}"))
    return cases


@pytest.mark.parametrize("pages,cp,heads,query_len", _edge_case_ids())
def test_edge_lengths(pages, cp, heads, query_len):
    """Every edge history length, at and around its page boundary, one request each."""
    lens = [max(query_len, seq_len_for(pages, d)) for d in (-1, 0, 1)]
    case = make_case(pages, lens, query_len=query_len, heads=heads, pattern="exact", num_blocks=512)
    assert torch.equal(cp_decode(*case.args(), cp=cp), full_decode(*case.args()))


@pytest.mark.parametrize("cp", [1, 2, 4, 8])
def test_past_the_table(cp):
    """own >= P: rank the P pages the table holds, own page in slot 15, -1 where none is left."""
    case = make_case(9, [seq_len_for(100, 3), seq_len_for(20, 0)], query_len=2, heads=4, pattern="exact", table_width=9)
    out = cp_decode(*case.args(), cp=cp)
    assert torch.equal(out, full_decode(*case.args()))
    assert bool((out[:, :, 15].T == torch.tensor([100, 100, 19, 20])).all())
    assert bool((out[:, :, 9:15] == -1).all()) and bool((out[:, :, :9] >= 0).all())


def test_table_wider_than_max_pages():
    """A table past MAX_PAGES: P = 8192, later columns are never ranked."""
    case = make_case(10, [seq_len_for(8197, 0)], heads=2, pattern="clustered", num_blocks=1024)
    out = cp_decode(*case.args(), cp=8)
    assert torch.equal(out, full_decode(*case.args()))
    assert int(out[0, :, :15].max()) < 8192 and int(out[0, 0, 15]) == 8197


def test_empty_batch():
    case = make_case(11, [], heads=4, table_width=3)
    for cp in (1, 4):
        assert cp_decode(*case.args(), cp=cp).shape == (0, 4, 16)
    assert full_decode(*case.args()).shape == (0, 4, 16)


def test_wider_compact_width_changes_nothing():
    case = make_case(12, [seq_len_for(300, 9), seq_len_for(17, 0)], query_len=3, heads=4, pattern="ties")
    base = cp_decode(*case.args(), cp=4)
    for extra in (1, 5, 100):
        assert torch.equal(cp_decode(*case.args(), cp=4, width=compact_width(301, 4) + extra), base)


def test_cp1_is_the_identity_layout():
    case = make_case(13, [seq_len_for(50, 2)], query_len=2, heads=4, pattern="random")
    _, tr = cp_decode(*case.args(), cp=1, trace=True)
    (rt,) = tr.ranks
    assert rt.heads == (0, 1, 2, 3)
    assert torch.equal(rt.compact_table[:, :50], case.block_table[:, :50])


@pytest.mark.parametrize("cp,heads", [(8, 1), (8, 2), (4, 1), (2, 8), (1, 8)])
def test_head_layouts(cp, heads):
    case = make_case(14, [seq_len_for(400, 0), seq_len_for(33, 60)], query_len=4, heads=heads, pattern="clustered")
    out, tr = cp_decode(*case.args(), cp=cp, trace=True)
    assert torch.equal(out, full_decode(*case.args()))
    owners = [tr.layout.owners_of(h) for h in range(heads)]
    assert {r for o in owners for r in o} == set(range(cp))  # every rank owns some head
    assert all(len(o) == max(1, cp // heads) for o in owners)
