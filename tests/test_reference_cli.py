"""``python -m reference``: the case-file CLI users debug with."""

import subprocess
import sys

import pytest
import torch

from reference import cp_decode, full_decode, stock_decode
from reference.cases import Case, make_case
from reference.cli import main


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run_cli(capsys):
    """Run the CLI in-process (a subprocess per call would cost a torch import each)."""

    def run(*args):
        code = main(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def test_module_entry_point(tmp_path):
    path = tmp_path / "c.pt"
    make_case(1, [200], query_len=1, heads=1).save(path)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "reference",
            "decode",
            "--case",
            str(path),
            "--path",
            "full",
            "--out",
            str(tmp_path / "o.pt"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert torch.load(tmp_path / "o.pt", weights_only=True)["out"].shape == (1, 1, 16)


@pytest.fixture(scope="module")
def case_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "case.pt"
    make_case(21, [5, 3000, 40000], query_len=2, heads=4, pattern="clustered").save(path)
    return path


@pytest.mark.parametrize("path,cp", [("full", 1), ("stock", 1), ("cp", 1), ("cp", 4), ("cp", 8)])
def test_decode_writes_the_api_output(case_file, tmp_path, path, cp, run_cli):
    out = tmp_path / "out.pt"
    res = run_cli("decode", "--case", str(case_file), "--path", path, "--cp", str(cp), "--out", str(out))
    assert res.returncode == 0, res.stderr
    case = Case.load(case_file)
    want = {"full": full_decode, "stock": stock_decode}.get(path) or (lambda *a: cp_decode(*a, cp=cp))
    got = torch.load(out, weights_only=True)["out"]
    assert got.dtype == torch.int32 and torch.equal(got, want(*case.args()))


def test_explain_prints_every_rank(case_file, run_cli):
    res = run_cli("explain", "--case", str(case_file), "--row", "5", "--head", "2", "--cp", "4")
    assert res.returncode == 0, res.stderr
    for r in range(4):
        assert f"rank {r} " in res.stdout
    assert "owner rank 2" in res.stdout and "CP == full" in res.stdout


def test_explain_short_row(case_file, run_cli):
    res = run_cli("explain", "--case", str(case_file), "--row", "0", "--head", "0", "--cp", "2")
    assert res.returncode == 0 and "short row" in res.stdout


def test_bad_input_is_a_clean_error(case_file, tmp_path, run_cli):
    res = run_cli("decode", "--case", str(case_file), "--path", "cp", "--cp", "3", "--out", str(tmp_path / "o.pt"))
    assert res.returncode == 2 and "cp" in res.stderr and "Traceback" not in res.stderr
    res = run_cli("explain", "--case", str(case_file), "--row", "99", "--head", "0")
    assert res.returncode == 2 and "row" in res.stderr


def test_make_case_round_trip(tmp_path, run_cli):
    path = tmp_path / "made.pt"
    res = run_cli(
        "make-case", "--out", str(path), "--seq-lens", "9,700", "--query-len", "3", "--heads", "2", "--pattern", "ties"
    )
    assert res.returncode == 0, res.stderr
    case = Case.load(path)
    assert case.index_q.shape == (6, 2, 128) and case.query_len == 3
    assert case.seq_lens.tolist() == [9, 700]
