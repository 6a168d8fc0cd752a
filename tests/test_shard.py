"""``--shard K/N`` (conftest.py): N runs that together run every selected test exactly once,
each taking a share of every file; a malformed value is a usage error naming the option.
The ``heavy`` tests are collected first."""

import subprocess
import sys

import pytest

_FILE = "tests/test_rules.py"  # many quick cases, a few files' worth of parametrizations


def _collect(*args: str, file: str = _FILE) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", file, *args],
        capture_output=True,
        text=True,
        check=False,
    )


def _ids(done: subprocess.CompletedProcess, file: str = _FILE) -> list[str]:
    assert done.returncode == 0, done.stdout + done.stderr
    return [line for line in done.stdout.splitlines() if line.startswith(file + "::")]


@pytest.mark.heavy
def test_shards_partition_the_selected_tests():
    whole = _ids(_collect())
    # shards of a -k selection (13 of the file's tests): the GPU stages shard a -m selection
    picked = _ids(_collect("-k", "check_int or check_tensor"))
    shards = [_ids(_collect("-k", "check_int or check_tensor", "--shard", f"{k}/3")) for k in range(3)]
    assert 6 <= len(picked) < len(whole)
    assert sorted(sum(shards, [])) == sorted(picked)  # every selected test once, none twice
    assert all(abs(len(s) - len(picked) / 3) < 1 for s in shards)  # interleaved: even shares


def test_a_malformed_shard_names_the_option():
    for value in ("2/2", "-1/2", "a/b"):
        done = _collect(f"--shard={value}")
        assert done.returncode != 0 and f"--shard: {value!r}" in done.stdout + done.stderr, value


def test_heavy_tests_are_collected_first():
    """A file whose ``heavy`` test is defined after others: that test comes first, the rest
    in their order."""
    file = "tests/test_cp_one_rank.py"
    ids = _ids(_collect(file=file), file)
    assert ids[0] == f"{file}::test_cp1_in_process_equals_oracle", ids[:2]
    assert ids[1].startswith(f"{file}::test_compact_table_matches_reference_plan"), ids[:2]
