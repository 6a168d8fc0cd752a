"""The CP protocol for BF16 / FP8 keys under the MSA rules (docs/DESIGN.md §10.4) over real
rank processes, against ``reference.msa``: forced windows, the ascending output, replicas,
back-to-back steps, bad input and a missing peer. Ranks as in ``test_protocol_ranks.py``
(``rank_pools``); runs outside xdist."""

import pytest
import torch
from hypothesis import given, settings
from rank_pools import BACKEND, GPUS, MAX_PAGES, PDL, cp_param, pool

from fast.tools.cli import main
from fast.tools.programs import assemble, decode_on_rank, run_case
from fuzz.strategies import msa_configs, with_ff_bytes
from rank_programs import (
    bad_input_then_reset_on_rank,
    changing_queries_on_rank,
    step_queries,
    timeout_then_reset_on_rank,
)
from reference import msa
from reference.cases import seq_len_for
from reference.cp import HeadLayout
from reference.msa.cases import EXACT_PATTERNS as MSA_EXACT

pytestmark = pytest.mark.multirank

# Hypothesis over 4 interpreter ranks is slow on CI's 2 cores: CP = 4 stays in CI's tier
# through the fixed cases below.
CPS_FUZZED = [cp_param(cp, slow_on_cpu=(4, 8)) for cp in (1, 2, 4, 8)]


def oracle(case, **changes):
    """``reference.msa.full_decode`` of ``case`` (``changes``: index_q, block_table, seq_lens
    in its place)."""
    args = dict(zip(("index_q", "k_cache", "block_table", "seq_lens", "query_len"), case.args())) | changes
    return msa.full_decode(*args.values(), **case.windows())


@pytest.mark.parametrize("cp", CPS_FUZZED)
@settings(max_examples=8)
@given(cfg=msa_configs(max_pages=MAX_PAGES, big=BACKEND == "cuda", patterns=MSA_EXACT))
def test_msa_cp_equals_oracle(cp, cfg):
    """Every head count, query length, forced window and both dtypes, exact-arithmetic keys
    (and bf16 queries with 0xFF bytes): the assembled CP output equals the oracle bit for
    bit. Score buffers are poisoned with 1e30, outputs prefilled with -7."""
    case = cfg.build()
    out = run_case(pool(cp), case, "cp", poison=True, pdl=PDL)
    assert torch.equal(out, oracle(case))


@pytest.mark.parametrize("cp", [cp_param(2), cp_param(4)])
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_msa_windows_at_the_edges(cp, dtype):
    """Windows (0, 0), (3, 13), (16, 0), (0, 16), (2, 5) on lengths at the 16-block edge, one
    block past it, and past the table (P = 24: the local window is still output, no
    candidate at or past P), the ``late`` pattern (a token mask one token off changes the
    scores), one request of padding."""
    lens = [seq_len_for(16, 0), seq_len_for(16, 1), seq_len_for(23, 127), seq_len_for(40, 5), 0]
    for init, local in [(0, 0), (3, 13), (16, 0), (0, 16), (2, 5)]:
        windows = {"init_blocks": init, "local_blocks": local}
        case = msa.make_case(3, lens, dtype=dtype, query_len=3, heads=2, pattern="late", table_width=24, **windows)
        case = with_ff_bytes(case)
        out = run_case(pool(cp), case, "cp", poison=True, pdl=PDL)
        assert torch.equal(out, oracle(case)), (init, local)


@pytest.mark.parametrize(
    "cp,heads",
    [
        pytest.param(2, 1, id="cp2-h1"),
        pytest.param(4, 2, id="cp4-h2", marks=[pytest.mark.slow] if BACKEND == "cpu" or GPUS < 4 else []),
    ],
)
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_msa_back_to_back_with_replicas_and_new_queries(cp, heads, dtype):
    """Two replicas per head (each stores its half of a bf16 row's 64 words or an fp8 row's
    32), the last rank lagging, back-to-back steps with new queries (bf16 ones with 0xFF
    bytes), all-short steps between long ones: every step equals the oracle."""
    steps = 8
    case = msa.make_case(
        20 + heads, [seq_len_for(19, 3), seq_len_for(17, 0)], dtype=dtype, query_len=2, heads=heads, pattern="exact"
    )
    short = torch.tensor([seq_len_for(2, 5), seq_len_for(9, 0)], dtype=torch.int32)
    lag = {cp - 1: 0.3}
    outs = pool(cp).run(changing_queries_on_rank, case.to_dict(), short, steps=steps, seed=5, lag=lag, pdl=PDL)
    owned = [list(HeadLayout(cp, heads).heads_of(r)) for r in range(cp)]
    for step, q in enumerate(step_queries(case.index_q.shape, steps, 5, case.index_q.dtype)):
        lens = short if (step // 2) % 2 == 0 else case.seq_lens
        got = assemble([{"heads": owned[r], "out": outs[r][step]} for r in range(cp)], heads)
        assert torch.equal(got, oracle(case, index_q=q, seq_lens=lens)), f"step {step}"


def test_msa_split_and_three_level_push():
    """Each row's push split over 4 programs of the three-level select (max_chunk 16), rows
    of 300 and 90 blocks, ties: the same output as the oracle."""
    case = msa.make_case(
        9, [seq_len_for(300, 1), seq_len_for(90, 0), seq_len_for(5, 2)], query_len=4, heads=4, pattern="ties"
    )
    for split in (1, 4):
        out = run_case(pool(2), case, "cp", max_chunk=16, split=split, poison=True)
        assert torch.equal(out, oracle(case)), split


@pytest.mark.parametrize("kind", ["id-past-cache", "len-below-query-len"])
def test_msa_bad_device_input_every_rank_agrees(kind):
    """A bad id (in a column only the local window reads) or length: every rank writes the
    request's rows -1, names the same input, the others are exact, and after reset() the
    next step is exact."""
    case = msa.make_case(12, [seq_len_for(40, 3), seq_len_for(30, 0), seq_len_for(25, 9)], query_len=2, heads=2)
    table, lens = case.block_table.clone(), case.seq_lens.clone()
    want_error = {
        "id-past-cache": ("BadBlockIdError", 1, 30, case.k_cache.shape[0] + 3),
        "len-below-query-len": ("BadLengthError", 1, -1, 1),
    }[kind]
    _, b, column, value = want_error
    if kind.startswith("id"):
        table[b, column] = value
    else:
        lens[b] = value
    results = pool(2).run(bad_input_then_reset_on_rank, case.to_dict(), table, lens)
    assert [r["error"] for r in results] == [want_error, want_error]
    bad = assemble([{"heads": r["heads"], "out": r["bad_out"]} for r in results], 2)
    want = oracle(case)
    rows = slice(b * case.query_len, (b + 1) * case.query_len)
    assert bool((bad[rows] == -1).all())
    keep = torch.ones(bad.shape[0], dtype=torch.bool)
    keep[rows] = False
    assert torch.equal(bad[keep], want[keep])
    assert torch.equal(assemble([{"heads": r["heads"], "out": r["good_out"]} for r in results], 2), want)


def test_msa_missing_peer_is_reported_and_reset_recovers():
    """bf16 (the 16-bit flag): rank 1 skips a step, every rank's check() raises
    PeerTimeoutError; after reset(), 20 back-to-back steps with new queries equal the oracle."""
    case = msa.make_case(10, [seq_len_for(18, 3)], dtype="bf16", query_len=1, heads=2, pattern="exact")
    bound = 1.0 if BACKEND == "cpu" else None
    results = pool(2).run(timeout_then_reset_on_rank, case.to_dict(), timeout_s=bound, steps=20, seed=5)
    exchange = "PeerTimeoutError: the q exchange"
    assert results[0]["raised"] == [exchange, exchange], [r["raised"] for r in results]
    assert results[1]["raised"] == ["PeerTimeoutError: the merge"], [r["raised"] for r in results]
    for i, q in enumerate(step_queries(case.index_q.shape, 20, 5, case.index_q.dtype)):
        got = assemble([{"heads": r["heads"], "out": r["outs"][i]} for r in results], 2)
        assert torch.equal(got, oracle(case, index_q=q)), f"step {i} after reset"


def test_msa_auto_path_builds_the_format_state():
    """``decode_on_rank(path="auto")`` on an MSA case builds the format's CP state through
    ``build_cp_decode(key_format=...)`` and equals the oracle."""
    case = msa.make_case(4, [seq_len_for(20, 1), seq_len_for(3, 0)], dtype="fp8", query_len=2, heads=4, pattern="exact")
    results = pool(2).run(decode_on_rank, case.to_dict(), "auto", pdl=PDL)
    assert {r["path"] for r in results} == {"cp"}
    assert torch.equal(assemble(results, 4), oracle(case))


def test_msa_cli_decode_reads_the_format_from_the_case(tmp_path):
    """``python -m fast decode`` on a saved MSA case: both paths write the oracle's output
    (CPU ranks, the format and windows read from the file)."""
    lens = [seq_len_for(30, 2), seq_len_for(5, 0)]
    case = msa.make_case(11, lens, dtype="bf16", query_len=2, heads=4, pattern="exact")
    case.save(tmp_path / "case.pt")
    for path in ("cp", "stock"):
        args = ["decode", "--case", str(tmp_path / "case.pt"), "--path", path, "--cp", "2", "--backend", "cpu"]
        assert main([*args, "--out", str(tmp_path / "out.pt")]) == 0
        assert torch.equal(torch.load(tmp_path / "out.pt", weights_only=True)["out"], oracle(case)), path
