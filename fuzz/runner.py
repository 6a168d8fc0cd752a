"""Run a campaign: Hypothesis over a target, a progress line, the shrunk failure and a
one-line command that replays it."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field, is_dataclass

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import DirectoryBasedExampleDatabase

from .targets import TARGETS, Context

DB_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".hypothesis", "fuzz")
BATCH = 50  # examples per Hypothesis run when running against the clock


def resolve_backend(backend: str) -> str:
    """ "auto" -> "cuda" where a GPU is visible, else "cpu"; "cuda" without a visible GPU
    is a ValueError naming the backend (else every example would fail on it and be
    reported as a finding). Imports fast: call it after the CLI has settled
    TRITON_INTERPRET."""
    from fast.backend import gpu_count

    if backend == "auto":
        return "cuda" if gpu_count() else "cpu"
    if backend == "cuda" and not gpu_count():
        raise ValueError("backend: 'cuda' needs a CUDA GPU, and none is visible (use 'cpu' or 'auto')")
    return backend


@dataclass
class Result:
    """A campaign's outcome: examples run, time, and the first failure with its example
    and replay command (None: none found)."""

    target: str
    examples: int
    seconds: float
    failure: str | None = None
    example: object = None
    replay: str | None = None
    stats: dict = field(default_factory=dict)

    @property
    def found(self) -> bool:
        """True if the campaign found a failure."""
        return self.failure is not None


def example_json(example) -> str:
    """An example (dataclasses and tuples of them) as compact JSON: what a replay reads."""

    def plain(x):
        if is_dataclass(x):
            return asdict(x)
        if isinstance(x, tuple):
            return [plain(v) for v in x]
        return x

    return json.dumps(plain(example), separators=(",", ":"))


class _Progress:
    def __init__(self, name: str, stream, quiet: bool):
        self.name, self.stream, self.quiet = name, stream, quiet
        self.count, self.start, self.shown = 0, time.monotonic(), 0.0

    def tick(self) -> None:
        self.count += 1
        now = time.monotonic()
        if not self.quiet and now - self.shown >= 1.0:
            self.shown = now
            el = now - self.start
            self.stream.write(f"\r{self.name}: {self.count} examples, {self.count / max(el, 1e-9):.1f}/s, {el:.0f} s ")
            self.stream.flush()


def run_campaign(
    name: str,
    *,
    examples: int | None = None,
    minutes: float | None = None,
    seed: int | None = None,
    backend: str = "auto",
    database: bool = True,
    quiet: bool = False,
    stream=None,
    smoke: bool = False,
    shrink: bool = True,
) -> Result:
    """Run target ``name`` for ``examples`` examples or ``minutes``; ``smoke`` (also the
    default without either) uses the target's smoke budget and strategy. Returns the Result;
    a failure holds the shrunk example and its replay line (``shrink=False``: the first
    failing example as found — what a check that only needs a failure asks for, since
    shrinking under the interpreter runs the kernels again for every step, and a step that
    fails by timing out costs the whole bound)."""
    smoke = smoke or not (examples or minutes)
    stream = stream or sys.stderr
    target = TARGETS[name]
    ctx = Context(resolve_backend(backend), {})
    progress = _Progress(name, stream, quiet)
    deadline = time.monotonic() + minutes * 60 if minutes else None
    budget = examples or (None if minutes else target.smoke)
    failing: list = []
    rng = random.Random(seed)
    db = DirectoryBasedExampleDatabase(DB_DIR) if database else None
    try:
        while True:
            batch = BATCH if budget is None else min(BATCH if deadline else budget, budget - progress.count)
            if batch <= 0 or (deadline and time.monotonic() >= deadline):
                break

            @settings(
                max_examples=batch,
                deadline=None,
                database=db,
                derandomize=False,
                suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target] + ([Phase.shrink] if shrink else []),
                report_multiple_bugs=False,
            )
            @given(target.examples(smoke))
            def prop(example):
                if deadline and time.monotonic() >= deadline:
                    return  # out of time: let the rest of the batch pass unchecked, fast
                progress.tick()
                try:
                    target.check(example, ctx)
                except BaseException:
                    failing[:] = [example]
                    raise

            try:
                hypothesis_seed(rng.getrandbits(64))(prop)()
            except Exception as exc:  # noqa: BLE001 - a campaign reports whatever the check raised
                ex = failing[0] if failing else None
                replay = f"python -m fuzz replay {name} '{example_json(ex)}'" if ex is not None else None
                return Result(
                    name, progress.count, time.monotonic() - progress.start, f"{type(exc).__name__}: {exc}", ex, replay
                )
    finally:
        ctx.close()
        if not quiet:
            stream.write("\n")
    return Result(name, progress.count, time.monotonic() - progress.start)


def _config(raw):
    """A ``DecodeConfig`` from its JSON object; ValueError naming a missing, extra or
    mistyped field."""
    from .strategies import DecodeConfig

    if not isinstance(raw, dict):
        raise ValueError(f"example: expected a JSON object of DecodeConfig fields, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(DecodeConfig)}
    if extra := sorted(set(raw) - set(fields)):
        raise ValueError(f"example: unknown field(s) {extra} (DecodeConfig has {sorted(fields)})")
    if missing := sorted(n for n, f in fields.items() if f.default is dataclasses.MISSING and n not in raw):
        raise ValueError(f"example: missing field(s) {missing}")
    for name, value in raw.items():
        if name == "seq_lens":
            ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            kind = "a list of ints"
        elif name in ("pattern", "key_format", "mma"):
            ok, kind = isinstance(value, str), "a string"
        elif name == "ff_bytes":
            ok, kind = isinstance(value, bool), "true or false"
        else:
            ok, kind = isinstance(value, int) and not isinstance(value, bool), "an int"
        if not ok:
            raise ValueError(f"example: {name} must be {kind}, got {value!r}")
    return _checked(DecodeConfig(**{k: tuple(v) if k == "seq_lens" else v for k, v in raw.items()}))


def _checked(cfg):
    """``cfg`` if its values make an example (the CP size, heads and format a campaign draws
    from; a case that builds and passes the reference's input checks), else ValueError
    naming the field: a replay's bad value is one error line, not a traceback."""
    from indexer_constants import MMA_ROUTES, SUPPORTED_CP, SUPPORTED_HEADS
    from reference.inputs import check_decode_inputs
    from reference.msa.inputs import check_msa_inputs

    from .strategies import KEY_FORMATS

    for name, value, allowed in (
        ("cp", cfg.cp, SUPPORTED_CP),
        ("heads", cfg.heads, SUPPORTED_HEADS),
        ("key_format", cfg.key_format, KEY_FORMATS),
        ("mma", cfg.mma, MMA_ROUTES),
    ):
        if value not in allowed:
            raise ValueError(f"example: {name} must be one of {tuple(allowed)}, got {value!r}")
    if cfg.extra_width < 0:
        raise ValueError(f"example: extra_width must be >= 0, got {cfg.extra_width}")
    if cfg.mma == "e4m3" and cfg.key_format == "bf16":
        raise ValueError("example: mma 'e4m3' scores E4M3 keys, not key_format 'bf16'")
    try:
        case = cfg.build()
        if cfg.key_format == "nvfp4":
            check_decode_inputs(*case.args())
        else:
            check_msa_inputs(*case.args(), **case.windows())
    except (ValueError, TypeError, KeyError, IndexError, RuntimeError) as exc:
        raise ValueError(f"example: {exc}") from None
    return cfg


def parse_example(name: str, example_text: str | None):
    """The example of target ``name`` that a failure printed (its JSON), rebuilt; ValueError
    naming the target, the JSON or the field that is wrong."""
    if name not in TARGETS:
        raise ValueError(f"target: {name!r} is not a fuzz target (one of {', '.join(sorted(TARGETS))})")
    if not example_text:
        raise ValueError("example: missing (give the JSON line a failure printed)")
    try:
        raw = json.loads(example_text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"example: not JSON ({exc.msg} at character {exc.pos})") from None
    if isinstance(raw, list):  # (config, breakage): the inputs target's examples
        if len(raw) != 2 or not isinstance(raw[1], str):
            raise ValueError("example: a list example is [config, breakage name]")
        from .targets import BREAKAGES, DEVICE_BREAKAGES

        known = sorted(BREAKAGES) + sorted(DEVICE_BREAKAGES)

        if raw[1] not in known:
            raise ValueError(f"example: unknown breakage {raw[1]!r} (one of {', '.join(known)})")
        return _for_target(name, _config(raw[0])), raw[1]
    return _for_target(name, _config(raw))


def _for_target(name: str, cfg):
    """``cfg`` if its key format is target ``name``'s (the msa- targets' BF16 / FP8, the
    inputs target's either, the others' NVFP4), else ValueError naming key_format."""
    msa_target = name.startswith("msa-")
    if name != "inputs" and (cfg.key_format != "nvfp4") != msa_target:  # inputs takes both
        want = "bf16 or fp8" if msa_target else "nvfp4"
        raise ValueError(f"example: key_format {cfg.key_format!r} is not target {name}'s ({want})")
    return cfg


def replay(name: str, example_text: str, backend: str = "auto") -> None:
    """Re-run one example (as printed by a failure); raises what the check raises (a bad
    example: ValueError before anything runs)."""
    example = parse_example(name, example_text)
    ctx = Context(resolve_backend(backend), {})
    try:
        TARGETS[name].check(example, ctx)
    finally:
        ctx.close()
