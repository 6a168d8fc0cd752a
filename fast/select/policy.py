"""The top-16 select's launch policy, every choice in one place: the levels' shape
(``SelectShape``), programs a row (``plan_split``), a CP push's warps (``push_warps``) and
rows for the PTX block (``warp_select_keys``), early release under PDL
(``release_select``); measured choices (``bench/PERF.md``)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import triton

from ..backend import sm_count

MAX_CHUNK = 1024  # rows up to this many columns take a single select
MAX_SUPERS = 128  # longer rows: the top 16 of at most 128 supergroup maxima first
MAX_GROUP = 8  # columns per group of the last level
MAX_SPLIT = 16  # most programs per row of a split select
MIN_SPLIT = 4  # fewest slices the policy splits a row into: fewer do not pay for the merge
MIN_SLICE = 512  # fewest columns per program the policy splits a row into
SPLIT_PER_SM = 1  # most programs per SM the policy splits a select into
SPLIT_PROGRAMS = 1024  # most programs of a split select: its scratch is 16 keys each (128 KB)
RELEASE_PROGRAMS = 8  # most programs of a select the scorer launches early (release_select)
RELEASE_COLUMNS = 2048  # widest one-warp push the scorer launches early (release_select)
QUEUED_PER_SM = 4  # fewest programs per SM of a CP push that runs on fewer warps (push_warps)
WARP_SELECT_PER_SM = 2  # the same for a push through the PTX block (push_warps)
PUSH_GROUP = 4  # columns per group of the CP push's last level (SelectShape.for_width)
MIN_COLUMNS = 512  # fewest keys the PTX block takes: below it one warp's tl.topk is as fast
MAX_COLUMNS = 1024  # most: 32 keys a lane, the block's registers still fit one warp
WIDE_MAX_KEYS = 512  # group keys of a row wider than a chunk in two levels on one warp
WIDE_MAX_GROUP = 8  # widest group of those two levels (warp_groups_top16 loads it as one tree)


class SelectShape(NamedTuple):
    """The levels of ``levels.top16`` over a row (all powers of two): a row longer than
    ``chunk`` columns is ``supers`` supergroups of ``per_super`` groups of ``group`` columns.
    The select kernels take it whole, as the one constexpr SELECT."""

    chunk: int
    supers: int
    per_super: int
    group: int

    @classmethod
    def for_width(cls, width: int, max_chunk: int = MAX_CHUNK, group: int = MAX_GROUP) -> SelectShape:
        """The shape for rows of ``width`` columns: one chunk up to ``max_chunk``, else
        supergroups of (up to) 8 groups of (up to) ``group`` columns, at most MAX_SUPERS
        supergroups while the groups fill 8 per supergroup."""
        padded = triton.next_power_of_2(max(width, 16))
        if padded <= max_chunk:
            # Single level always; the three-level branch still needs valid shapes to compile.
            return cls(chunk=padded, supers=16, per_super=1, group=1)
        supers = max(16, min(MAX_SUPERS, padded // (group * MAX_GROUP)))
        rest = padded // supers
        group = min(group, rest)
        return cls(chunk=max_chunk, supers=supers, per_super=rest // group, group=group)

    def constexprs(self, group: int | None = None) -> dict:
        """The shape as a select kernel's launch takes it (``SELECT``); group: the last
        level's, where the launch narrows it (``push_group``)."""
        return dict(SELECT=self._replace(group=group) if group else self)


def check_split(split) -> None:
    """Raise ValueError unless split is None (the policy) or a power of two up to MAX_SPLIT."""
    if split is not None and (type(split) is not int or not 1 <= split <= MAX_SPLIT or split & (split - 1)):
        raise ValueError(f"split: {split!r} (a power of two, 1..{MAX_SPLIT}, or None)")


def select_split(programs: int, width: int, sms: int) -> int:
    """Programs per row for a top-16 over ``programs`` rows x heads of ``width`` columns on
    ``sms`` SMs: 1 for a row of one chunk, else doubled while the grid stays within
    SPLIT_PER_SM programs per SM and each slice keeps MIN_SLICE columns (1 below MIN_SPLIT)."""
    padded = triton.next_power_of_2(max(width, 16))
    if padded <= MAX_CHUNK:
        return 1
    split = 1
    while split < MAX_SPLIT and programs * split * 2 <= SPLIT_PER_SM * sms and padded // (2 * split) >= MIN_SLICE:
        split *= 2
    return split if split >= MIN_SPLIT else 1


def release_select(programs: int, warps: int = 4, columns: int = 0) -> bool:
    """Whether the scorer lets a select of ``programs`` programs of ``warps`` warps and
    ``columns`` columns launch at once under PDL: at most RELEASE_PROGRAMS programs, or
    one-warp programs of at most RELEASE_COLUMNS columns."""
    return programs <= RELEASE_PROGRAMS or (warps == 1 and columns <= RELEASE_COLUMNS)


def push_warps(programs: int, one_chunk: bool, sms: int, warp_select: bool = False) -> int:
    """Warps per CP push program: 1 for the PTX block's rows (``warp_select_keys``) from
    WARP_SELECT_PER_SM programs per SM; else 4 below QUEUED_PER_SM programs per SM, then 1
    for a one-chunk select and 2 for a three-level one."""
    if warp_select and programs >= WARP_SELECT_PER_SM * sms:
        return 1
    if programs < QUEUED_PER_SM * sms:
        return 4
    return 1 if one_chunk else 2


def fit_split(split: int, programs: int, width: int) -> int:
    """``split`` halved until the grid fits the scratch (SPLIT_PROGRAMS) and every slice
    holds at least 16 columns (a select takes 16 of at least 16)."""
    padded = triton.next_power_of_2(max(width, 16))
    while split > 1 and (programs * split > SPLIT_PROGRAMS or padded // split < 16):
        split //= 2
    return split


def plan_split(
    requested: int | None, programs: int, width: int, device, shape: SelectShape
) -> tuple[int, int, SelectShape]:
    """(split, columns per slice, a slice's ``SelectShape``) for ``programs`` rows of
    ``width`` columns (whole-row ``shape``): ``requested`` or ``select_split``, fitted."""
    if requested is None:
        requested = select_split(programs, width, sm_count(str(device))) if device.type == "cuda" else 1
    split = fit_split(requested, programs, width)
    columns = triton.next_power_of_2(max(width, 16)) // split
    return split, columns, shape if split == 1 else _slice_shape(columns, shape.chunk)


@functools.cache
def _slice_shape(columns: int, max_chunk: int) -> SelectShape:
    """A slice's shape, slices no wider than the whole row's chunk allows (cached: chosen at
    every launch)."""
    return SelectShape.for_width(columns, max_chunk)


def warp_select_keys(split: int, columns: int, shape) -> int:
    """Keys a push program's row gives the PTX block (a GPU's one-warp program), or 0 where
    the push keeps ``tl.topk``: a row of one program and MIN_COLUMNS .. MAX_COLUMNS keys —
    its columns if it is one chunk (``shape``), else its groups' stand-in keys
    (``levels.warp_groups_top16``: one per ``shape.group`` columns, or WIDE_MAX_KEYS)."""
    if columns <= shape.chunk:
        keys = columns
    else:
        keys = min(columns // shape.group, WIDE_MAX_KEYS)
        if columns // keys > WIDE_MAX_GROUP:
            return 0
    return keys if split == 1 and MIN_COLUMNS <= keys <= MAX_COLUMNS else 0


def push_group(columns: int, keys: int, shape) -> int:
    """The push's GROUP for rows of ``columns`` columns whose select is ``shape`` and whose
    block takes ``keys`` keys (``warp_select_keys``; 0: none): columns / keys for a row
    wider than a chunk on one warp (4 at 2048 columns, 8 at 4096), else its shape's."""
    return columns // keys if keys and columns > shape.chunk else shape.group


def force_select(decode, *, split: int | None = None, max_chunk: int | None = None):
    """Fix ``decode``'s select shape before its first plan, and return it (the tests' and
    the bench's): ``split`` programs per row (a power of two up to MAX_SPLIT; None keeps the
    policy), for a CP decode ``max_chunk`` columns a select ranks at once (16 .. MAX_CHUNK)."""
    check_split(split)
    if decode.width:
        raise ValueError("decode: its select is fixed by its first plan; force_select before plan()")
    if max_chunk is not None:
        if not hasattr(decode, "max_chunk"):
            raise ValueError(f"max_chunk: {type(decode).__name__} ranks a row in chunks of its policy's")
        if type(max_chunk) is not int or not 16 <= max_chunk <= MAX_CHUNK or max_chunk & (max_chunk - 1):
            raise ValueError(f"max_chunk: {max_chunk!r} (a power of two, 16..{MAX_CHUNK})")
        decode.max_chunk = max_chunk
    decode.split = split
    return decode
