"""The mutation campaign the project runs on itself (``python -m fuzz mutants``, ``make
mutants``): each planted bug is applied to its own copy of the tree and the suite's fast
tiers for its subject run against it, then its fuzz target's smoke campaign, within a time
budget. A bug is killed by the first test or campaign that fails; one that survives both is
either a hole in the harness or an equivalent change, which ``EQUIVALENT`` must explain.

The bugs, their tests and CI's pool are in ``fuzz.bugs``; a snippet that no longer applies
is an error before anything runs (``patched``).
"""

from __future__ import annotations

import datetime
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from .bugs import BUGS, CI_POOL, EQUIVALENT, Bug

ROOT = Path(__file__).resolve().parent.parent
IGNORED = shutil.ignore_patterns(".venv", ".git", ".hypothesis", "__pycache__", "results", "_before", "*.pyc")


@dataclass
class Outcome:
    """One planted bug's run: killed or not, by which test or target, in how long."""

    bug: str
    killed: bool
    by: str  # the failing test id, "fuzz <target>", or why nothing ran
    seconds: float


def patched(bug: Bug, root: Path = ROOT) -> str:
    """``bug.file`` of the tree at ``root`` with the bug in it; ValueError if its snippet is
    not there exactly once."""
    source = (root / bug.file).read_text()
    count = source.count(bug.old)
    if count != 1:
        raise ValueError(f"bug {bug.name!r}: its snippet occurs {count} times in {bug.file} (the code moved?)")
    return source.replace(bug.old, bug.new)


def apply(bug: Bug, root: Path) -> None:
    """Patch ``bug`` into the tree at ``root`` (``patched``'s check first)."""
    (root / bug.file).write_text(patched(bug, root))


def _first_failure(output: str) -> str:
    m = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    return m.group(1) if m else "pytest (a crash: no test id)"


def pytest_runs(bug: Bug) -> list[list[str]]:
    """The pytest runs of ``bug.tests``, in their order: consecutive test files (or test
    ids) share one run, an entry with a space is a run of its own (split as a shell would).
    (One run of a test id and its file would run the test once, in the file's order.)"""
    runs: list[list[str]] = []
    grouping = False  # whether runs[-1] is a group of files
    for entry in bug.tests:
        if " " in entry:
            runs.append(shlex.split(entry))
            grouping = False
        elif grouping:
            runs[-1].append(entry)
        else:
            runs.append([entry])
            grouping = True
    return runs


def fuzz_command(bug: Bug) -> list[str]:
    """The command of ``bug``'s fuzz step: its target's smoke campaign, derandomized, and
    unshrunk (a kill needs a failure, not its smallest example)."""
    return [sys.executable, "-m", "fuzz", bug.target, "--smoke", "--seed", "0", "--no-shrink"]


def run_bug(bug: Bug, budget_s: float = 600.0, fuzz: bool = True) -> Outcome:
    """The bug in a copy of the tree: its fast tiers (stop at the first failure), then its
    target's smoke campaign, together within ``budget_s`` (past it: survived, "time")."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="campaign-") as tmp:
        root = Path(tmp) / "tree"
        shutil.copytree(ROOT, root, ignore=IGNORED)
        apply(bug, root)
        # conftest's "campaign" profile: CI's derandomized examples, no shrinking
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", HYPOTHESIS_PROFILE="campaign")
        env.pop("PYTEST_XDIST_WORKER", None)
        pytest = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
        steps = [pytest + run for run in pytest_runs(bug)]
        if fuzz:
            steps.append(fuzz_command(bug))
        for cmd in steps:
            left = budget_s - (time.monotonic() - start)
            if left <= 0:
                return Outcome(bug.name, False, "time budget spent", time.monotonic() - start)
            code, stdout = _run_group(cmd, root, env, left)
            if code is None:
                return Outcome(bug.name, False, "time budget spent", time.monotonic() - start)
            if code == 5:  # pytest collected nothing: the bug's tests moved
                raise ValueError(f"bug {bug.name!r}: no test selected by {' '.join(bug.tests)}")
            if code != 0:
                by = _first_failure(stdout) if "pytest" in cmd[2] else f"fuzz {bug.target}"
                return Outcome(bug.name, True, by, time.monotonic() - start)
    return Outcome(bug.name, False, "-", time.monotonic() - start)


def _gpus() -> int:
    """CUDA GPUs this machine shows the campaign's runs (0: the GPU bugs are listed only)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _run_group(cmd: list[str], cwd: Path, env: dict, timeout_s: float) -> tuple[int | None, str]:
    """(exit status, stdout) of ``cmd`` in a process group of its own, or (None, ...) past
    ``timeout_s`` — then the whole group is killed: a multi-rank test's ranks (the test
    process's children) would otherwise outlive it, spinning, and slow every later bug."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        stdout, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, stdout
    except subprocess.TimeoutExpired:
        return None, ""
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is left
        except ProcessLookupError:
            pass
        proc.wait()


def rotating(count: int, day: datetime.date | None = None) -> list[Bug]:
    """``count`` bugs of ``CI_POOL`` for CI, a different window every day (every one of them
    within len(CI_POOL) / count days)."""
    pool = [b for b in BUGS if b.name in CI_POOL]
    day = day or datetime.date.today()
    first = (day.toordinal() * count) % len(pool)
    return [pool[(first + i) % len(pool)] for i in range(count)]


def campaign(bugs: list[Bug], budget_s: float, fuzz: bool = True, stream=sys.stdout, jobs: int = 1) -> list[Outcome]:
    """Run ``bugs`` (``jobs`` at a time, each in its own copy of the tree) and print the
    table: bug, killed or survived, by what, seconds, a row as each bug ends; then the kill
    rate (equivalent survivors named with their reason). ``jobs`` > 1 is for a machine with
    cores to spare (a GPU machine's campaign of its GPU bugs): bugs run beside each other
    share the cores, so their seconds are longer than alone, never their verdicts."""
    print(f"{'bug':<56} {'verdict':<9} {'seconds':>7}  by", file=stream)
    gpus = _gpus()
    skipped = [b.name for b in bugs if b.gpu and not gpus]
    for name in skipped:  # listed, not run: no kernel here runs its code
        print(f"{name:<56} {'GPU':<9} {0:7.0f}  (not run: no GPU)", file=stream, flush=True)
    runnable = [b for b in bugs if b.name not in skipped]

    def report(o: Outcome) -> Outcome:
        verdict = "killed" if o.killed else ("equivalent" if o.bug in EQUIVALENT else "SURVIVED")
        print(f"{o.bug:<56} {verdict:<9} {o.seconds:7.0f}  {o.by}", file=stream, flush=True)
        return o

    with ThreadPoolExecutor(jobs) as pool:  # each bug's runs are subprocesses: threads only wait
        futures = [pool.submit(run_bug, bug, budget_s, fuzz) for bug in runnable]
        outcomes = [report(f.result()) for f in as_completed(futures)]
    order = {b.name: i for i, b in enumerate(runnable)}
    outcomes.sort(key=lambda o: order[o.bug])
    killed = sum(o.killed for o in outcomes)
    print(f"killed {killed} of {len(outcomes)} ({killed / max(1, len(outcomes)):.0%})", file=stream)
    if skipped:
        print(
            f"  {len(skipped)} GPU bugs listed, not run (no GPU visible): run the campaign on a GPU machine",
            file=stream,
        )
    for o in outcomes:
        if not o.killed and o.bug in EQUIVALENT:
            print(f"  equivalent: {o.bug}: {EQUIVALENT[o.bug]}", file=stream)
    return outcomes
