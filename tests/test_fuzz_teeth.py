"""The fuzzers have teeth: each planted bug is found by its target's smoke campaign.

Each mutant runs in its own process (``python -m fuzz.mutants NAME``): a planted kernel bug
is only reliably undone by ending the process that ran it.
"""

import json
import subprocess
import sys

import pytest
import torch

import reference
from fuzz.mutants import MUTANTS, applied
from reference.cases import make_case


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name.replace(" ", "-") for m in MUTANTS])
def test_smoke_campaign_finds_planted_bug(mutant):
    proc = subprocess.run([sys.executable, "-m", "fuzz.mutants", mutant.name], capture_output=True, text=True, timeout=900)
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
