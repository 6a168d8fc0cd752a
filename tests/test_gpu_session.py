"""``.ci/gpu-session.sh``, the batch of GPU checks a lent machine runs, read on any machine:
every stage runs with the programs it calls stubbed (each records its arguments), and each
recorded command is held to what it names — pytest's files, options and -k / -m
expressions, the modules and options of ``python -m``, the Makefile's targets, the Python
of ``-c``. A stage spends scarce device time; one whose command is malformed (a quote that
splits a -k expression into file names, a moved test file) must fail here, not there.
"""

import argparse
import ast
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "gpu-session.sh"
# The programs a stage may call; each is stubbed to record its argv.
STUBBED = ("python3", "make", "ncu", "compute-sanitizer", "nvidia-smi")
# pytest options that take a value (as the stages spell them); any other option is a flag.
PYTEST_VALUED = {"-k", "-m", "-n", "-p"}
PYTEST_FLAGS = {"-q", "-v", "-s", "-x", "-rf"}
PYTEST_JOINED = ("--durations=", "--shard")


def _stages() -> list[str]:
    """The stage names of the script's case arms (``a|b)`` gives both)."""
    arms = re.findall(r"^\s+([a-z0-9|-]+)\)\s", SCRIPT.read_text(), flags=re.M)
    return [name for arm in arms for name in arm.split("|")]


def _recorded(stage: str, tmp_path: Path) -> list[list[str]]:
    """The argv of every stubbed program the stage ran, in order."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir()
    for name in STUBBED:
        stub = bin_dir / name
        stub.write_text(
            f"#!{sys.executable}\nimport json, os, sys\n"
            f'with open(os.environ["STUB_LOG"], "a") as f:\n'
            f'    f.write(json.dumps([{name!r}, *sys.argv[1:]]) + "\\n")\n'
        )
        stub.chmod(0o755)
    env = os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"), "STUB_LOG": str(log)}
    done = subprocess.run(["bash", str(SCRIPT), stage], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "unknown stage" not in done.stdout, done.stdout + done.stderr
    assert log.exists(), f"{stage}: ran none of {STUBBED}"
    return [json.loads(line) for line in log.read_text().splitlines()]


def _pytest_args(stage: str, args: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """A pytest command line as (its test paths, each valued option's values), held to:
    every positional argument is a test file that exists (a node id's file part), every
    option one the stages use, each valued option followed by a value (not an option)."""
    paths, valued, i = [], {}, 0
    while i < len(args):
        arg = args[i]
        if arg in PYTEST_VALUED:
            value = args[i + 1] if i + 1 < len(args) else ""
            assert value and not value.startswith("-"), f"{stage}: {arg} has no value: {args}"
            valued.setdefault(arg, []).append(value)
            i += 2
            continue
        if arg in PYTEST_FLAGS or arg.startswith(PYTEST_JOINED):
            i += 2 if arg == "--shard" else 1  # "--shard K/N" takes the next word
            continue
        assert not arg.startswith("-"), f"{stage}: pytest option {arg!r} unknown to this test: add it"
        assert (ROOT / arg.split("::")[0]).is_file(), f"{stage}: pytest argument {arg!r} is no test file ({args})"
        paths.append(arg)
        i += 1
    return paths, valued


def _check_pytest(stage: str, args: list[str]) -> None:
    """``_pytest_args``' checks, and every -k / -m a boolean expression pytest can parse."""
    _, valued = _pytest_args(stage, args)
    for option in ("-k", "-m"):
        for expression in valued.get(option, []):
            # pytest's own grammar: names joined by and / or / not and parentheses
            words = re.findall(r"[()]|[^\s()]+", expression)
            assert words and all(re.fullmatch(r"[\w\[\]\-.:]+|[()]", w) for w in words), (stage, option, words)
            python = " ".join(w if w in ("and", "or", "not", "(", ")") else "x" for w in words)
            ast.parse(python, mode="eval")  # a dangling `or` is a SyntaxError


def _check_python(stage: str, args: list[str]) -> None:
    """``python3 -m MODULE ...``: the module exists (pytest's arguments checked as such);
    ``python3 -c CODE``: the code parses."""
    if args[0] == "-c":
        for node in ast.walk(ast.parse(args[1])):  # what it imports from the project exists
            if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] in ("fast", "fuzz", "reference"):
                module = importlib.import_module(node.module)
                missing = [a.name for a in node.names if not hasattr(module, a.name)]
                assert not missing, f"{stage}: {node.module} has no {missing}"
        return
    assert args[0] == "-m", f"{stage}: python3 {args}"
    module, rest = args[1], args[2:]
    if module == "pytest":
        _check_pytest(stage, rest)
        return
    parts = module.split(".")
    package = (ROOT.joinpath(*parts) / "__main__.py").is_file()
    assert package or ROOT.joinpath(*parts).with_suffix(".py").is_file(), f"{stage}: no module {module}"
    _parse_only(stage, importlib.import_module(f"{module}.__main__" if package else module).main, rest)


class _Parsed(Exception):
    """Raised by the patched parse_args once the command line has parsed: nothing runs."""


def _parse_only(stage: str, main, args: list[str]) -> None:
    """Run ``main(args)`` only as far as its argparse parser: a stale or misspelled option
    is argparse's exit 2, a good command line stops at once after parsing."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, *a, **k):
        original(self, *a, **k)
        raise _Parsed

    argparse.ArgumentParser.parse_args = parse_then_stop
    try:
        main(args)
    except _Parsed:
        return
    except SystemExit as exc:
        raise AssertionError(f"{stage}: {args} does not parse (exit {exc.code})") from exc
    finally:
        argparse.ArgumentParser.parse_args = original
    raise AssertionError(f"{stage}: {main.__module__}.main({args}) never parsed its command line")


@pytest.mark.parametrize("stage", _stages())
def test_every_stage_names_what_exists(stage, tmp_path):
    calls = _recorded(stage, tmp_path)
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    for program, *args in calls:
        if program in ("ncu", "compute-sanitizer"):  # a profiler's own options, then the program it runs
            assert "python3" in args, f"{stage}: {program} runs no python3: {args}"
            program, args = _unwrapped(program, args)
        if program == "python3":
            _check_python(stage, args)
        elif program == "make":
            assert args and all(a in targets for a in args), f"{stage}: make {args} (targets: {sorted(targets)})"


def _unwrapped(program: str, args: list[str]) -> tuple[str, list[str]]:
    """A profiler's call as the program it runs (its own options dropped)."""
    if program in ("ncu", "compute-sanitizer") and "python3" in args:
        return "python3", args[args.index("python3") + 1 :]
    return program, args


def _k_stages() -> list[str]:
    """The stages whose arm names a -k expression (read from the text: cheap at collection)."""
    arms = re.findall(r"^\s+([a-z0-9|-]+)\)\s(.*)$", SCRIPT.read_text(), flags=re.M)
    return [name for arm, line in arms if " -k " in line for name in arm.split("|")]


@pytest.mark.parametrize("stage", _k_stages())
def test_every_k_name_selects_a_test(stage, tmp_path):
    """Each name of a stage's -k expression matches some test of its files and markers, as
    pytest matches it (a substring of a node's name or of its file's): a test renamed
    since would drop out of the stage without a word."""
    selections = []
    for call in _recorded(stage, tmp_path):
        program, args = _unwrapped(call[0], call[1:])
        if program == "python3" and args[:2] == ["-m", "pytest"] and "-k" in args:
            selections.append(args[2:])
    assert selections, f"{stage}: its arm names -k, yet it ran no pytest with one"
    for args in selections:
        _check_k_names(stage, args)


def _check_k_names(stage: str, args: list[str]) -> None:
    """What ``test_every_k_name_selects_a_test`` holds one pytest call to: its files and -m
    collected (without its -k, xdist or plugin options), then each -k name matched."""
    paths, valued = _pytest_args(stage, args)
    keep = paths + [word for marks in valued.get("-m", []) for word in ("-m", marks)]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *keep],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    ids = [line.lower() for line in done.stdout.splitlines() if "::" in line]
    assert ids, done.stdout[-2000:] + done.stderr[-2000:]
    for name in (n for expression in valued["-k"] for n in re.findall(r"[^\s()]+", expression)):
        if name not in ("and", "or", "not"):
            assert any(name.lower() in node for node in ids), f"{stage}: -k {name!r} selects none of {len(ids)} tests"


def test_the_stage_list_is_read_whole():
    """The arms this test parametrizes over are the script's: a regex that missed some would
    leave them unchecked."""
    stages = _stages()
    assert {"test-units-0", "test-units-1", "refail", "bench", "ncu-stalls"} <= set(stages)
    assert len(stages) == SCRIPT.read_text().count(") stage ") + 1  # one arm holds two names


def test_a_split_expression_is_caught():
    """The check has teeth: a -k expression split by its quotes into file names fails it."""
    split = shlex.split("-q -x tests/test_fuzz.py -k stock_topk or cp1")
    with pytest.raises(AssertionError):
        _check_pytest("planted", split)
    with pytest.raises(SyntaxError):
        _check_pytest("planted", ["-k", "stock_topk or"])


def test_the_session_fails_when_any_stage_fails(tmp_path):
    """The script's exit status is 1 when an early stage fails and the later ones pass (or
    a stage name is unknown), 0 when every stage passes: a lent machine's batch cannot
    report success for its last stage alone."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python3"  # the info stage's last program: fails while FAIL is set
    stub.write_text('#!/bin/sh\n[ -z "$FAIL" ]\n')
    stub.chmod(0o755)
    for name in ("nvidia-smi", "make"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    env = os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out")}

    def run(*stages: str, **extra: str) -> int:
        done = subprocess.run(
            ["bash", str(SCRIPT), *stages], cwd=ROOT, env=env | extra, capture_output=True, text=True, timeout=60
        )
        return done.returncode

    assert run("info", "demo") == 0
    assert run("info", "demo", FAIL="1") == 1  # the first stage failed, the last passed
    assert run("demo", "no-such-stage") == 1
