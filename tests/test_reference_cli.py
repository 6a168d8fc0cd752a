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


@pytest.mark.parametrize("path,cp", [("full", None), ("stock", None), ("cp", 1), ("cp", 4), ("cp", 8)])
def test_decode_writes_the_api_output(case_file, tmp_path, path, cp, run_cli):
    out = tmp_path / "out.pt"
    ranks = [] if cp is None else ["--cp", str(cp)]
    res = run_cli("decode", "--case", str(case_file), "--path", path, *ranks, "--out", str(out))
    assert res.returncode == 0, res.stderr
    # one summary line: the path, the ranks, the rows and heads, the output file and its shape
    (line,) = res.stdout.splitlines()
    ranks = f", CP {cp}" if cp else ""
    assert line.startswith(f"reference decode: path {path}{ranks}, 6 rows x 4 heads (nvfp4 keys, query_len 2) -> ")
    assert f"{out} {{'out': int32 [6x4x16]}} in " in line
    case = Case.load(case_file)
    want = {"full": full_decode, "stock": stock_decode}.get(path) or (lambda *a: cp_decode(*a, cp=cp))
    got = torch.load(out, weights_only=True)["out"]
    assert got.dtype == torch.int32 and torch.equal(got, want(*case.args()))


def test_decode_cp_path_needs_its_ranks_named(case_file, tmp_path, run_cli):
    """--path cp without --cp was one simulated rank, unsaid: now one error line naming --cp."""
    res = run_cli("decode", "--case", str(case_file), "--path", "cp", "--out", str(tmp_path / "o.pt"))
    assert res.returncode == 2 and res.stderr.strip() == (
        "error: cp: --path cp needs --cp N, the ranks simulated (one of 1, 2, 4, 8)"
    )
    assert not (tmp_path / "o.pt").exists()


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
    res = run_cli("explain", "--case", str(case_file), "--row", "99", "--head", "0", "--cp", "4")
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


# One row per bad command line: {case} is a valid case file, {garbage} a file that is not a
# case, {none} a missing file, {out} an output path in an existing folder, {far} one in a
# folder that does not exist. Each row names the argument its error must start with.
BAD_COMMAND_LINES = {
    "missing-case": ("decode --case {none} --path full --out {out}", "case"),
    "garbage-case": ("decode --case {garbage} --path full --out {out}", "case"),
    "cp-with-full": ("decode --case {case} --path full --cp 2 --out {out}", "cp"),
    "cp-3": ("decode --case {case} --path cp --cp 3 --out {out}", "cp"),
    "out-folder": ("decode --case {case} --path cp --cp 2 --out {far}", "out"),
    "explain-row": ("explain --case {case} --row 999 --head 0 --cp 4", "row"),
    "explain-head": ("explain --case {case} --row 0 --head 9 --cp 4", "head"),
    "explain-missing-case": ("explain --case {none} --row 0 --head 0 --cp 4", "case"),
    "make-query-len-9": ("make-case --out {out} --seq-lens 300 --query-len 9", "query-len"),
    "make-heads-3": ("make-case --out {out} --seq-lens 300 --heads 3", "heads"),
    "make-table-width": ("make-case --out {out} --seq-lens 300 --table-width -3", "table-width"),
    "make-seq-lens": ("make-case --out {out} --seq-lens 300,x", "seq-lens"),
    "make-len-below-query-len": ("make-case --out {out} --seq-lens 1 --query-len 2", "seq_lens"),
    "make-out-folder": ("make-case --out {far} --seq-lens 300", "out"),
}


@pytest.mark.parametrize("line,name", BAD_COMMAND_LINES.values(), ids=BAD_COMMAND_LINES.keys())
def test_bad_command_lines_are_one_error_line(case_file, tmp_path, run_cli, line, name):
    """Exit 2, one line on stderr that starts with the argument's name, nothing written."""
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file")
    paths = dict(
        case=case_file, garbage=garbage, none=tmp_path / "none.pt", out=tmp_path / "o.pt", far=tmp_path / "no" / "o.pt"
    )
    res = run_cli(*line.format(**paths).split())
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {name}:"), res.stderr
    assert not (tmp_path / "o.pt").exists()


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_an_msa_case_round_trips_through_make_case_decode_and_explain(run_cli, tmp_path, fmt):
    """An MSA case file keeps its windows; decode and explain pick its format from the file."""
    from reference import msa

    path, out = tmp_path / "case.pt", tmp_path / "out.pt"
    made = run_cli(
        "make-case",
        "--out",
        str(path),
        "--seq-lens",
        "5000,300,0",
        "--query-len",
        "2",
        "--format",
        fmt,
        "--init-blocks",
        "2",
        "--local-blocks",
        "3",
        "--pattern",
        "exact",
    )
    assert made.returncode == 0, made.stderr
    case = msa.MsaCase.load(path)
    assert (case.init_blocks, case.local_blocks, case.k_cache.dtype) == (2, 3, msa.cases.DTYPES[fmt])
    assert run_cli("decode", "--case", str(path), "--path", "cp", "--cp", "4", "--out", str(out)).returncode == 0
    assert torch.equal(torch.load(out)["out"], msa.full_decode(*case.args(), **case.windows()))
    shown = run_cli("explain", "--case", str(path), "--row", "1", "--head", "2", "--cp", "4")
    assert shown.returncode == 0 and "forced [0, 1, 37, 38, 39]" in shown.stdout and "CP == full" in shown.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--init-blocks", "1"], "init-blocks: forced windows belong to the bf16 / fp8 formats"),
        (["--format", "fp8", "--pattern", "clustered"], "pattern: the fp8 format takes one of"),
        (["--format", "bf16", "--init-blocks", "9", "--local-blocks", "8"], "local_blocks: init_blocks"),
    ],
)
def test_make_case_refuses_a_format_it_cannot_build(run_cli, tmp_path, args, message):
    r = run_cli("make-case", "--out", str(tmp_path / "c.pt"), "--seq-lens", "3000", *args)
    assert r.returncode == 2 and message in r.stderr and not (tmp_path / "c.pt").exists()
