"""The fuzzers have teeth: each planted bug is found by its target's smoke campaign."""

import pytest
import torch

import reference
from fuzz.mutants import MUTANTS, applied
from fuzz.runner import run_campaign
from fuzz.targets import TARGETS
from reference.cases import make_case


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name.replace(" ", "-") for m in MUTANTS])
def test_smoke_campaign_finds_planted_bug(mutant):
    with applied(mutant):
        result = run_campaign(mutant.target, examples=TARGETS[mutant.target].smoke, seed=0, database=False, quiet=True)
    assert result.found, f"{mutant.target} smoke ({result.examples} examples) missed: {mutant.name}"
    assert result.replay and result.replay.startswith(f"python -m fuzz replay {mutant.target} ")


def test_mutants_are_undone():
    """After a mutant's block the real code is back (the rest of the suite relies on it)."""
    case = make_case(1, [300 * 128 + 5, 40 * 128], query_len=2, heads=4, pattern="ties")
    want = reference.full_decode(*case.args())
    for mutant in MUTANTS[:4]:
        with applied(mutant):
            pass
        assert torch.equal(reference.cp_decode(*case.args(), cp=4), want)
