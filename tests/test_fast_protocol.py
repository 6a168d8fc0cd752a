"""The whole CP protocol over real rank processes (CPU: Gloo + /dev/shm + the interpreter),
against the reference. Runs outside xdist (`make test` gives it its own step): its ranks
spin-wait on each other and want the cores to themselves."""

import time

import pytest
import torch
from hypothesis import given, settings

import reference
from fast.cli import main
from fast.launcher import RankError, RankPool
from fast.programs import assemble, decode_on_rank, run_case
from fuzz.strategies import decode_configs
from reference.cases import EXACT_PATTERNS, make_case, seq_len_for

pytestmark = pytest.mark.multirank

POOLS: dict[int, RankPool] = {}


def pool(cp: int) -> RankPool:
    """One pool per CP size for the whole module (starting ranks costs seconds)."""
    if cp not in POOLS or not POOLS[cp]._procs:
        POOLS[cp] = RankPool(cp)
    return POOLS[cp]


def teardown_module():
    for p in POOLS.values():
        p.close()


def _cp_param(cp):
    marks = [pytest.mark.slow] if cp == 8 else []
    return pytest.param(cp, id=f"cp{cp}", marks=marks)


CPS = [_cp_param(cp) for cp in (1, 2, 4, 8)]


@pytest.mark.parametrize("cp", CPS)
@settings(max_examples=8)
@given(cfg=decode_configs(max_pages=40, patterns=tuple(EXACT_PATTERNS)))
def test_cp_equals_oracle(cp, cfg):
    """Exact-arithmetic inputs: the fast CP output equals reference.full_decode bit for bit.
    Score buffers are poisoned with 1e30, outputs prefilled with -7."""
    case = cfg.build()
    out = run_case(pool(cp), case, "cp", poison=True)
    assert torch.equal(out, reference.full_decode(*case.args()))


@pytest.mark.parametrize("cp", CPS)
@settings(max_examples=5)
@given(cfg=decode_configs(max_pages=40, patterns=tuple(EXACT_PATTERNS)))
def test_stock_equals_reference(cp, cfg):
    case = cfg.build()
    assert torch.equal(run_case(pool(cp), case, "stock"), reference.stock_decode(*case.args()))


@pytest.mark.parametrize(
    "cp,lens",
    [
        pytest.param(2, [seq_len_for(0, 1), seq_len_for(15, 0)], id="cp2-all-short"),
        # 4 interpreter ranks on CI's 2 cores take ~3 minutes for 200 steps: `make test-slow`.
        pytest.param(4, [seq_len_for(3, 0), seq_len_for(14, 9)], id="cp4-all-short", marks=pytest.mark.slow),
        pytest.param(2, [seq_len_for(17, 5), seq_len_for(2, 0)], id="cp2-mixed"),
    ],
)
def test_back_to_back_steps(cp, lens):
    """200 steps of one layer with nothing else synchronizing the ranks. With all rows short
    a rank runs straight into the next step: the two buffer sets must keep it from writing
    into a tile its peer is still scoring, or having its q erased by the peer's re-arm."""
    case = make_case(cp, lens, query_len=1, heads=4, pattern="exact")
    results = pool(cp).run(decode_on_rank, case.to_dict(), "cp", steps=200)
    assert all(r["all_equal"] for r in results)
    assert torch.equal(assemble(results, 4), reference.full_decode(*case.args()))


@pytest.mark.parametrize("cp", [2, 4])
def test_past_the_table_and_max_pages(cp):
    case = make_case(7, [seq_len_for(100, 3), seq_len_for(30, 0)], query_len=3, heads=4, pattern="clustered", table_width=9)
    assert torch.equal(run_case(pool(cp), case, "cp", poison=True), reference.full_decode(*case.args()))
    wide = make_case(8, [seq_len_for(8197, 0)], query_len=1, heads=2, pattern="clustered", num_blocks=256)
    assert torch.equal(run_case(pool(cp), wide, "cp", poison=True), reference.full_decode(*wide.args()))


def test_two_level_select_across_ranks():
    case = make_case(9, [seq_len_for(300, 1), seq_len_for(90, 0)], query_len=4, heads=4, pattern="ties")
    out = run_case(pool(2), case, "cp", max_chunk=16, poison=True)
    assert torch.equal(out, reference.full_decode(*case.args()))


def test_missing_peer_is_reported_not_a_hang():
    """Rank 1 plans but never calls forward: rank 0 must give up within its spin bound and
    raise from check(), not hang."""
    case = make_case(10, [seq_len_for(40, 0)], query_len=1, heads=2, pattern="exact")
    with RankPool(2) as p:
        start = time.monotonic()
        with pytest.raises(RankError, match="PeerTimeoutError"):
            p.run(_missing_peer, case.to_dict(), timeout=120)
        assert time.monotonic() - start < 120


def _missing_peer(ctx, case):
    return decode_on_rank(ctx, case, "cp", spin_limit=300, skip_forward=ctx.rank == 1)


def test_cli_decode_writes_the_assembled_output(tmp_path):
    case = make_case(11, [seq_len_for(30, 2), seq_len_for(5, 0)], query_len=2, heads=4, pattern="zeros")
    case.save(tmp_path / "case.pt")
    for path, want in (("cp", reference.full_decode), ("stock", reference.stock_decode)):
        code = main(["decode", "--case", str(tmp_path / "case.pt"), "--path", path, "--cp", "2", "--backend", "cpu", "--out", str(tmp_path / "out.pt")])
        assert code == 0
        assert torch.equal(torch.load(tmp_path / "out.pt", weights_only=True)["out"], want(*case.args()))
    assert main(["decode", "--case", str(tmp_path / "case.pt"), "--path", "cp", "--cp", "3", "--out", str(tmp_path / "o.pt")]) == 2
