"""The fuzzers have teeth: each planted bug is found by its target's smoke campaign.

Each mutant runs in its own process (``python -m fuzz.mutants NAME``): a planted kernel bug
is only reliably undone by ending the process that ran it.
"""

import dataclasses
import datetime
import json
import subprocess
import sys

import pytest
import torch

import reference
from fuzz.cli import all_plans, main
from fuzz.mutants import MUTANTS, applied
from fuzz.runner import example_json, run_campaign
from fuzz.strategies import DecodeConfig
from fuzz.targets import TARGETS
from reference.cases import make_case


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name.replace(" ", "-") for m in MUTANTS])
def test_smoke_campaign_finds_planted_bug(mutant):
    if mutant.gpu_only and not torch.cuda.is_available():
        pytest.skip("the planted bug is in a kernel only GPUs run")
    proc = subprocess.run(
        [sys.executable, "-m", "fuzz.mutants", mutant.name], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["found"], f"{mutant.target} smoke ({result['examples']} examples) missed: {mutant.name}"
    assert result["replay"].startswith(f"python -m fuzz replay {mutant.target} ")


def test_reference_mutants_are_undone():
    """Pure-Python mutants are undone in-process: after each block the real code is back."""
    case = make_case(1, [300 * 128 + 5, 40 * 128], query_len=2, heads=4, pattern="ties")
    want = reference.full_decode(*case.args())
    for mutant in MUTANTS:
        if mutant.module.startswith("reference"):
            with applied(mutant):
                pass
            assert torch.equal(reference.cp_decode(*case.args(), cp=4), want)


# The fuzz CLI: replay lines and campaigns.
def test_campaign_runs_and_reports(capsys):
    assert main(["stock", "--examples", "5", "--seed", "0", "--backend", "cpu"]) == 0
    assert "stock: 5 examples" in capsys.readouterr().out


def test_the_campaigns_fuzz_command_line_parses_and_passes_on_clean_code(capsys, monkeypatch):
    """The mutation campaign kills a bug when its fuzz command fails, so a flag the CLI
    did not know would count as a kill: the campaign's own arguments (``run_bug``'s, with
    ``--no-shrink``) parse and pass on the clean tree, reaching the campaign unshrunk."""
    import fuzz.campaign as campaign_module
    import fuzz.cli as cli

    seen = {}
    real = cli.run_campaign

    def spy(name, **kw):
        seen.update(kw)
        return real(name, **kw)

    monkeypatch.setattr(cli, "run_campaign", spy)
    bug = next(b for b in campaign_module.BUGS if b.target == "reference")
    cmd = campaign_module.fuzz_command(bug)
    assert cmd[:3] == [sys.executable, "-m", "fuzz"]
    assert main(cmd[3:]) == 0
    assert seen["shrink"] is False and seen["smoke"] is True


def test_replay_line_round_trips(capsys):
    cfg = DecodeConfig(
        seed=3, cp=4, heads=2, query_len=3, seq_lens=(2049, 5), table_width=12, pattern="ties", extra_width=1
    )
    assert json.loads(example_json(cfg))["seq_lens"] == [2049, 5]
    assert main(["replay", "reference", example_json(cfg)]) == 0
    assert main(["replay", "reference", example_json(dataclasses.replace(cfg, mma="e4m3"))]) == 0
    assert main(["replay", "inputs", example_json((cfg, "bt-int64"))]) == 0
    assert "replay passed" in capsys.readouterr().out


def test_all_runs_every_target_for_its_share():
    """``make fuzz`` (``python -m fuzz all``) plans a campaign for every target — it once
    stopped at a KeyError on the first target added without a budget — and ``--minutes``
    is the whole run's time, shared in the targets' proportions."""
    default = dict(all_plans())
    assert list(default) == list(TARGETS)
    assert all(plan["minutes"] == TARGETS[name].minutes > 0 for name, plan in default.items())
    scaled = dict(all_plans(minutes=45))
    assert sum(plan["minutes"] for plan in scaled.values()) == pytest.approx(45)
    ratios = {name: plan["minutes"] / default[name]["minutes"] for name, plan in scaled.items()}
    assert max(ratios.values()) == pytest.approx(min(ratios.values()))
    assert all(plan == {"examples": 3} for _, plan in all_plans(examples=3))


@pytest.mark.parametrize(
    "argv",
    [
        ["all", "--minutes", "0"],
        ["stock", "--examples", "-2"],
        ["mutants", "--rotate", "0"],
        ["mutants", "--budget", "-1"],
        ["mutants", "--jobs", "0"],
    ],
)
def test_budgets_below_one_are_refused(capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "must be above 0" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
@pytest.mark.parametrize("argv", [["kernels", "--examples", "1"], ["replay", "reference", "CFG"]])
def test_cuda_backend_without_a_gpu_is_one_error(capsys, argv):
    """--backend cuda on a machine with no GPU is a usage error before any example, not a
    "FAILURE" with a shrunk example that every target would report."""
    cfg = example_json(DecodeConfig(1, 2, 4, 1, (3000,), 30, "exact"))
    assert main([cfg if a == "CFG" else a for a in argv] + ["--backend", "cuda"]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == "error: backend: 'cuda' needs a CUDA GPU, and none is visible (use 'cpu' or 'auto')"
    assert "FAILURE" not in captured.out


def test_time_budget_stops():
    result = run_campaign("reference", minutes=0.05, seed=1, database=False, quiet=True)
    assert not result.found and result.examples > 0 and result.seconds < 60


BAD_REPLAYS = {
    "unknown-target": (["replay", "nope", "{}"], "target"),
    "no-json": (["replay", "reference"], "example"),
    "not-json": (["replay", "reference", "{seed: 1"], "example"),
    "missing-key": (["replay", "reference", '{"seed": 1}'], "example"),
    "extra-key": (["replay", "reference", "CFG_EXTRA"], "example"),
    "mistyped-key": (["replay", "reference", "CFG_MISTYPED"], "example"),
    "unknown-route": (["replay", "reference", "CFG_ROUTE"], "example"),
    "e4m3-on-bf16": (["replay", "msa-reference", "CFG_BF16_E4M3"], "example"),
    "unknown-breakage": (["replay", "inputs", "CFG_BREAKAGE"], "example"),
}


@pytest.mark.parametrize("argv,name", BAD_REPLAYS.values(), ids=BAD_REPLAYS.keys())
def test_bad_replay_lines_are_one_error_line(capsys, argv, name):
    cfg = json.loads(example_json(DecodeConfig(1, 2, 4, 1, (3000,), 30, "exact")))
    fill = {
        "CFG_EXTRA": json.dumps(cfg | {"colour": 1}),
        "CFG_MISTYPED": json.dumps(cfg | {"heads": "four"}),
        "CFG_ROUTE": json.dumps(cfg | {"mma": "fp8"}),
        "CFG_BF16_E4M3": json.dumps(cfg | {"key_format": "bf16", "mma": "e4m3"}),
        "CFG_BREAKAGE": json.dumps([cfg, "no-such-breakage"]),
    }
    assert main([fill.get(a, a) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {name}:"), err


def test_campaign_bugs_apply_once_and_their_names_are_unique():
    """Every planted bug of ``python -m fuzz mutants`` still finds its snippet exactly once
    (a patch that no longer applies is an error, not a pass), and no two share a name."""
    from pathlib import Path

    from fuzz.bugs import BUGS, CI_POOL, EQUIVALENT
    from fuzz.campaign import patched, pytest_runs, rotating

    assert len(BUGS) >= 30 and len({b.name for b in BUGS}) == len(BUGS)
    for bug in BUGS:
        assert patched(bug) != Path(bug.file).read_text(), bug.name  # applies once, changes the file
    with pytest.raises(ValueError, match="occurs 0 times"):
        patched(BUGS[0].__class__("x", BUGS[0].file, "no such snippet", "", (), "reference"))
    names = {b.name for b in BUGS}
    assert set(CI_POOL) <= names and set(EQUIVALENT) <= names
    # CI's bugs are killed by their first pytest run: a single-process one
    assert all("multirank" not in pytest_runs(b)[0] for b in BUGS if b.name in CI_POOL)
    day = datetime.date(2026, 12, 2)
    windows = [{b.name for b in rotating(2, day + datetime.timedelta(days=d))} for d in range(len(CI_POOL))]
    assert all(len(w) == 2 for w in windows) and set().union(*windows) == set(CI_POOL)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the listing on a machine without a GPU")
def test_campaign_lists_gpu_bugs_it_cannot_run():
    """The mutation campaign's GPU bugs (code only GPUs run: the wgmma scorer, PDL order, bulk
    copies) are listed on a CPU machine, marked GPU, run nowhere, and kept out of the rate."""
    import io

    from fuzz.bugs import BUGS
    from fuzz.campaign import campaign

    gpu = [b for b in BUGS if b.gpu]
    assert {"wgmma scorer stores its own page", "q exchange reads index_q before its producer is done"} <= {
        b.name for b in gpu
    }
    out = io.StringIO()
    assert campaign(gpu[:2], budget_s=1, stream=out) == []
    text = out.getvalue()
    assert text.count("(not run: no GPU)") == 2 and "killed 0 of 0" in text and "2 GPU bugs listed" in text


def test_campaign_side_by_side_reports_every_bug_in_the_list_order(monkeypatch):
    """``--jobs`` runs bugs beside each other: each row is printed as its bug ends, the
    returned outcomes keep the list's order, and every bug runs exactly once (a stand-in
    ``run_bug`` that ends the first bug last)."""
    import io
    import time as time_

    import fuzz.campaign as campaign_module
    from fuzz.bugs import BUGS

    bugs = [b for b in BUGS if not b.gpu][:3]
    ran = []

    def fake_run_bug(bug, budget_s, fuzz):
        time_.sleep(0.3 if bug is bugs[0] else 0.0)
        ran.append(bug.name)
        return campaign_module.Outcome(bug.name, bug is not bugs[1], "stand-in", 0.0)

    monkeypatch.setattr(campaign_module, "run_bug", fake_run_bug)
    out = io.StringIO()
    outcomes = campaign_module.campaign(bugs, budget_s=1, stream=out, jobs=3)
    assert [o.bug for o in outcomes] == [b.name for b in bugs]
    assert sorted(ran) == sorted(b.name for b in bugs)
    rows = out.getvalue().splitlines()
    assert rows[-2].startswith(bugs[0].name)  # ended last, printed last
    assert "SURVIVED" in next(r for r in rows if r.startswith(bugs[1].name))
    assert rows[-1] == "killed 2 of 3 (67%)"


@pytest.mark.parametrize(
    "argv, error",
    [
        (["mutants", "--only", "no such bug"], "error: only: no bug's name contains 'no such bug'"),
        (["mutants", "--only", "tie order by rank", "--gpu"], "error: gpu: none of the selected bugs is marked GPU"),
    ],
)
def test_an_empty_selection_of_bugs_names_the_filter_that_emptied_it(capsys, argv, error):
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == error


@pytest.mark.parametrize("command", [["smoke"], ["all", "--examples", "1"]])
def test_a_multi_target_command_fails_when_any_target_fails(monkeypatch, capsys, command):
    """``python -m fuzz smoke`` / ``all`` exit 1 when any target finds a failure — the first
    one here, every later one passing — not only when the last does; 0 when none does."""
    import fuzz.cli as cli
    from fuzz.runner import Result

    first = next(iter(TARGETS))
    ran = []

    def fake(name, **kw):
        ran.append(name)
        failure = "planted" if fail and name == first else None
        return Result(name, 1, 0.1, failure, example="{}", replay="python -m fuzz replay ...")

    monkeypatch.setattr(cli, "run_campaign", fake)
    fail = True
    assert cli.main(command) == 1
    assert ran == list(TARGETS), ran  # every target still ran
    assert f"{first}: FAILURE" in capsys.readouterr().out
    fail, ran = False, []
    assert cli.main(command) == 0
    assert "FAILURE" not in capsys.readouterr().out


def test_the_mutation_campaign_fails_when_an_early_bug_survives(monkeypatch):
    """``python -m fuzz mutants`` exits 1 when any bug survives, the first of several too."""
    import fuzz.campaign as campaign_module
    import fuzz.cli as cli
    from fuzz.bugs import BUGS, EQUIVALENT
    from fuzz.campaign import Outcome

    bugs = [b for b in BUGS if not b.gpu and b.name not in EQUIVALENT][:3]

    def fake(chosen, budget_s, fuzz=True, jobs=1):
        return [Outcome(b.name, i > 0, "a test" if i else "nothing", 0.1) for i, b in enumerate(chosen)]

    monkeypatch.setattr(campaign_module, "campaign", fake)
    names = [b.name for b in bugs]
    monkeypatch.setattr(campaign_module, "rotating", lambda n: bugs)
    assert cli.main(["mutants", "--rotate", "3", "--budget", "1"]) == 1, names


def test_the_reference_campaigns_draw_both_mma_routes():
    """The reference targets' campaigns draw the E4M3-MMA route (nvfp4 and fp8 keys) beside
    the exact one; their CI smoke keeps to the exact route (its cost), and bf16 never has it."""
    from hypothesis import find, settings
    from hypothesis.errors import NoSuchExample

    quick = settings(max_examples=200, database=None)
    for name in ("reference", "msa-reference"):
        campaign = TARGETS[name].examples(False)
        found = find(campaign, lambda c: c.mma == "e4m3", settings=quick)
        assert found.key_format in ("nvfp4", "fp8"), found
        with pytest.raises(NoSuchExample):
            find(TARGETS[name].examples(True), lambda c: c.mma == "e4m3", settings=quick)
    with pytest.raises(NoSuchExample):
        find(
            TARGETS["msa-reference"].examples(False),
            lambda c: c.key_format == "bf16" and c.mma == "e4m3",
            settings=quick,
        )
