"""``python -m fuzz``: run a campaign, the smoke or default set, or replay one example."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from .runner import parse_example, replay, resolve_backend, run_campaign
from .strategies import DecodeConfig
from .targets import TARGETS


def _report(result) -> bool:
    rate = result.examples / max(result.seconds, 1e-9)
    if result.found:
        print(f"{result.target}: FAILURE after {result.examples} examples ({result.seconds:.0f} s)")
        print(f"  {result.failure}")
        print(f"  shrunk example: {result.example}")
        print(f"  reproduce: {result.replay}")
        return False
    print(f"{result.target}: {result.examples} examples, {rate:.1f}/s, {result.seconds:.0f} s, no failure")
    return True


def _positive(kind):
    """An argparse type: a number of ``kind`` above zero (a budget of none would mean the
    default, silently)."""

    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its message for a bad literal
    return parse


def all_plans(minutes: float | None = None, examples: int | None = None) -> list[tuple[str, dict]]:
    """``python -m fuzz all``'s campaigns, one a target: each target's ``minutes`` share
    (``Target.minutes``, ~10 minutes in all), scaled so that the shares add up to
    ``minutes`` where given; ``examples`` runs that many of each instead."""
    if examples:
        return [(name, dict(examples=examples)) for name in TARGETS]
    scale = minutes / sum(t.minutes for t in TARGETS.values()) if minutes else 1.0
    return [(name, dict(minutes=t.minutes * scale)) for name, t in TARGETS.items()]


def main(argv=None) -> int:
    """``python -m fuzz``: a target's campaign, the smoke budget, all, a replay or the
    mutants; returns the exit status (nonzero when a campaign found a failure)."""
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__)
    parser.add_argument("target", choices=sorted(TARGETS) + ["smoke", "all", "replay", "mutants"])
    parser.add_argument("example", nargs="?", help="replay: the target name, then the example JSON")
    parser.add_argument(
        "example_json",
        nargs="?",
        help="replay: the example a failure printed, a JSON object of "
        + ", ".join(f.name for f in dataclasses.fields(DecodeConfig))
        + " (those with defaults may be left out; the inputs target: [that object, a breakage name])",
    )
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--examples", type=_positive(int), help="examples a target (all: of every target)")
    budget.add_argument(
        "--minutes", type=_positive(float), help="a target's time (all: in total, shared as the ~10-minute default is)"
    )
    parser.add_argument("--backend", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--smoke", action="store_true", help="a target at its smoke budget (make fuzz-smoke's)")
    parser.add_argument(
        "--no-shrink", action="store_true", help="report the first failing example as found (the mutation campaign's)"
    )
    mutants = parser.add_argument_group("mutants (the mutation campaign: fuzz/campaign.py, fuzz/bugs.py)")
    mutants.add_argument("--only", help="the bugs whose name contains this")
    mutants.add_argument("--rotate", type=_positive(int), help="this many bugs, a different window each day (CI)")
    mutants.add_argument(
        "--budget", type=_positive(float), default=600.0, help="seconds per bug (its tests and its fuzz smoke)"
    )
    mutants.add_argument("--no-fuzz", action="store_true", help="the bugs' tests only, no fuzz smoke")
    mutants.add_argument("--gpu", action="store_true", help="the bugs marked GPU only (on a GPU machine)")
    mutants.add_argument("--jobs", type=_positive(int), default=1, help="bugs run at a time (default 1)")
    mutants.add_argument("--list", action="store_true", help="name the bugs and their files; run nothing")
    args = parser.parse_args(argv)
    if args.backend == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before anything defines a kernel
    if args.target == "replay":
        try:
            parse_example(args.example or "", args.example_json)
            resolve_backend(args.backend)
        except ValueError as exc:  # before any campaign machinery: one line, exit 2
            print(f"error: {exc}", file=sys.stderr)
            return 2
        replay(args.example, args.example_json, args.backend)
        print("replay passed")
        return 0
    if args.target == "mutants":
        return _mutants(args)
    if args.target == "smoke":  # each target's smoke budget: CI's `make fuzz-smoke`
        plans = [(name, dict(smoke=True)) for name in TARGETS]
    elif args.target == "all":  # `make fuzz`: every target for its share of ~10 minutes
        plans = all_plans(args.minutes, args.examples)
    elif args.smoke:
        plans = [(args.target, dict(smoke=True))]
    else:
        plans = [(args.target, dict(examples=args.examples, minutes=args.minutes))]
    try:
        resolve_backend(args.backend)
    except ValueError as exc:  # before any campaign: not a finding of each target's
        print(f"error: {exc}", file=sys.stderr)
        return 2
    ok = True
    for name, budget_kw in plans:
        ok &= _report(run_campaign(name, seed=args.seed, backend=args.backend, shrink=not args.no_shrink, **budget_kw))
    return 0 if ok else 1


def _mutants(args) -> int:
    """``python -m fuzz mutants``: 0 if every bug run was killed or is a named equivalent."""
    from .bugs import BUGS, EQUIVALENT
    from .campaign import campaign, patched, rotating

    bugs = rotating(args.rotate) if args.rotate else [b for b in BUGS if not args.only or args.only in b.name]
    if not bugs:
        print(f"error: only: no bug's name contains {args.only!r}", file=sys.stderr)
        return 2
    bugs = [b for b in bugs if b.gpu or not args.gpu]
    if not bugs:
        print("error: gpu: none of the selected bugs is marked GPU", file=sys.stderr)
        return 2
    if args.list:
        for b in bugs:
            print(f"{b.name:<56} {b.file:<28} {b.target}{'  (GPU)' if b.gpu else ''}")
        return 0
    for b in bugs:  # every patch applies before anything runs (a moved snippet is an error)
        try:
            patched(b)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    outcomes = campaign(bugs, args.budget, fuzz=not args.no_fuzz, jobs=args.jobs)
    return 0 if all(o.killed or o.bug in EQUIVALENT for o in outcomes) else 1
