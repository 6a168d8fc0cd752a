"""``--shard K/N`` (conftest.py): N runs that together run every selected test exactly once,
each taking a share of every file; a malformed value is a usage error naming the option."""

import subprocess
import sys

_FILE = "tests/test_rules.py"  # many quick cases, a few files' worth of parametrizations


def _collect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", _FILE, *args],
        capture_output=True,
        text=True,
        check=False,
    )


def _ids(done: subprocess.CompletedProcess) -> list[str]:
    assert done.returncode == 0, done.stdout + done.stderr
    return [line for line in done.stdout.splitlines() if line.startswith(_FILE + "::")]


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
