"""``python -m fuzz``: campaigns run, report, and a printed replay line reproduces."""

import json

from fuzz.cli import main
from fuzz.runner import example_json, run_campaign
from fuzz.strategies import DecodeConfig


def test_campaign_runs_and_reports(capsys):
    assert main(["stock", "--examples", "5", "--seed", "0", "--backend", "cpu"]) == 0
    assert "stock: 5 examples" in capsys.readouterr().out


def test_replay_line_round_trips(capsys):
    cfg = DecodeConfig(seed=3, cp=4, heads=2, query_len=3, seq_lens=(2049, 5), table_width=12, pattern="ties", extra_width=1)
    assert json.loads(example_json(cfg))["seq_lens"] == [2049, 5]
    assert main(["replay", "reference", example_json(cfg)]) == 0
    assert main(["replay", "inputs", example_json((cfg, "bt-int64"))]) == 0
    assert "replay passed" in capsys.readouterr().out


def test_time_budget_stops():
    result = run_campaign("reference", minutes=0.05, seed=1, database=False, quiet=True)
    assert not result.found and result.examples > 0 and result.seconds < 60
