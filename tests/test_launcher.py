"""The rank launcher: a rank that dies is reported at once, with its exit status and what it
printed; a backend that cannot run is refused before any process starts; the CLI checks
its case in the parent."""

import subprocess
import sys
import time

import pytest
import torch

from fast.backend import gpu_count
from fast.tools.launcher import RankError, RankPool, exit_status
from rank_programs import die_on_rank
from reference.cases import make_case


@pytest.mark.multirank
@pytest.mark.parametrize("how,status", [("exit", "exit code 3"), ("segv", "killed by SIGSEGV")], ids=["exit", "segv"])
def test_a_dead_rank_is_reported_at_once(how, status):
    with RankPool(2, "cpu") as pool:
        start = time.monotonic()
        with pytest.raises(RankError) as err:
            pool.run(die_on_rank, 1, how, timeout=300)
        waited = time.monotonic() - start
    message = str(err.value)
    assert "rank 1 died" in message and status in message, message
    assert "rank 1 about to die" in message  # what it printed
    assert waited < 20, f"reported after {waited:.1f} s"  # not the 300 s timeout


@pytest.mark.multirank
def test_a_rank_that_raises_sends_its_traceback():
    """A rank's exception comes back with its traceback (not as a death: the rank lives)."""
    with RankPool(2, "cpu") as pool:
        with pytest.raises(RankError) as err:
            pool.run(_divide_by_rank_minus_one)
    assert "--- rank 1 ---" in str(err.value) and "ZeroDivisionError" in str(err.value)
    assert "died" not in str(err.value)


def _divide_by_rank_minus_one(ctx):
    return 1 / (ctx.rank - 1)


@pytest.mark.skipif(gpu_count() > 0, reason="checks the refusal on a machine without a GPU")
def test_a_cuda_pool_without_a_gpu_is_refused_before_starting():
    start = time.monotonic()
    with pytest.raises(ValueError, match="^backend: 'cuda' needs a CUDA GPU"):
        RankPool(2, "cuda")
    assert time.monotonic() - start < 1


@pytest.mark.parametrize("world,backend,name", [(0, "cpu", "world"), (2, "tpu", "backend")], ids=["world-0", "tpu"])
def test_bad_pool_arguments_are_refused(world, backend, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        RankPool(world, backend)


def test_exit_status_in_words():
    assert (
        exit_status(0) == "exit code 0"
        and exit_status(-9) == "killed by SIGKILL"
        and exit_status(None) == "still running"
    )


def _fast_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "fast", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("kind", ["missing", "garbage", "invalid"])
def test_decode_refuses_a_bad_case_before_any_rank_starts(tmp_path, kind):
    path = tmp_path / "case.pt"
    if kind == "garbage":
        path.write_bytes(b"not a torch file")
    elif kind == "invalid":
        case = make_case(0, [3000], query_len=2, heads=4, pattern="exact")
        d = case.to_dict() | {"seq_lens": torch.tensor([1], dtype=torch.int32)}  # < query_len
        torch.save(d, path)
    done = _fast_cli(
        "decode", "--case", str(path), "--path", "cp", "--cp", "2", "--backend", "cpu", "--out", str(tmp_path / "o.pt")
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    expected = {"missing": "case: no such file", "garbage": "is not a saved case", "invalid": "seq_lens:"}[kind]
    assert expected in lines[0]


def test_decode_refuses_an_output_folder_that_does_not_exist(tmp_path):
    path = tmp_path / "case.pt"
    make_case(0, [3000], query_len=2, heads=4, pattern="exact").save(path)
    far = str(tmp_path / "no" / "o.pt")
    done = _fast_cli("decode", "--case", str(path), "--path", "cp", "--cp", "2", "--backend", "cpu", "--out", far)
    assert done.returncode == 2 and done.stderr.startswith("error: out:"), done.stderr


@pytest.mark.skipif(gpu_count() > 0, reason="checks the refusal on a machine without a GPU")
def test_demo_on_cuda_without_a_gpu_fails_at_once():
    start = time.monotonic()
    done = _fast_cli("demo", "--backend", "cuda")
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr, done.stderr
    assert time.monotonic() - start < 60  # the interpreter's import, not a rank's start timeout
