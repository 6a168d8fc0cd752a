"""The shape of the top-16 select over a row of W score columns (fixed per plan), how many
programs share a row when there are few rows (``select_split``), and how many warps run each
program of the CP push (``push_warps``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import triton

from .backend import sm_count

MAX_CHUNK = 1024  # rows up to this many columns take a single select
MAX_SUPERS = 128  # longer rows: the top 16 of at most 128 supergroup maxima first
MAX_GROUP = 8  # columns per group of the last level
MAX_SPLIT = 16  # most programs per row of a split select
MIN_SPLIT = 4  # fewest slices the policy splits a row into: 2 did not pay for the merge
MIN_SLICE = 512  # fewest columns per program the policy splits a row into
SPLIT_PER_SM = 1  # most programs per SM the policy splits a select into (fast/PERF.md)
SPLIT_PROGRAMS = 1024  # most programs of a split select: its scratch is 16 keys each (128 KB)
RELEASE_PROGRAMS = 32  # most programs of a select the scorer launches early (release_select)
RELEASE_COLUMNS = 2048  # widest one-warp push the scorer launches early (release_select)
QUEUED_PER_SM = 4  # fewest programs per SM of a CP push that runs on fewer warps (push_warps)
WARP_SELECT_PER_SM = 2  # the same for a push through warp_select's PTX block (push_warps)
PUSH_GROUP = 4  # columns per group of the CP push's last level (SelectShape.for_width)


@dataclass(frozen=True)
class SelectShape:
    """CHUNK / SUPERS / PER_SUPER / GROUP constexprs of ``jit_helpers.top16`` (all powers of
    two): a row longer than CHUNK is SUPERS supergroups of PER_SUPER groups of GROUP columns."""

    chunk: int
    supers: int
    per_super: int
    group: int

    @classmethod
    def for_width(cls, width: int, max_chunk: int = MAX_CHUNK, group: int = MAX_GROUP) -> "SelectShape":
        """The shape for rows of ``width`` columns: one chunk up to ``max_chunk``, else
        supergroups of (up to) 8 groups of (up to) ``group`` columns, at most MAX_SUPERS
        supergroups while the groups fill 8 per supergroup.

        Each level selects 16 of at least 16 (tl.topk needs k <= n). Groups of 8 (the stock
        select): 8192 columns are 128 supergroups of 8 groups of 8, every select over 128
        keys. Groups of 4 (PUSH_GROUP, the CP push): 4096 columns are 128 x 8 x 4, 2048
        64 x 8 x 4; 8192 (CP 1 only) 128 x 16 x 4, its second select over 256. Measured
        (fast/PERF.md, eighth session; the push alone, 1024 programs, µs): 4096 columns 22.5
        in 128 x 8 x 4 against 23.4 in 64 x 8 x 8 on 4 warps, 18.4 against 22.2 on 2;
        2048 columns on 2 warps 13.0 against 17.9."""
        padded = triton.next_power_of_2(max(width, 16))
        if padded <= max_chunk:
            # Single level always; the three-level branch still needs valid shapes to compile.
            return cls(chunk=padded, supers=16, per_super=1, group=1)
        supers = max(16, min(MAX_SUPERS, padded // (group * MAX_GROUP)))
        rest = padded // supers
        group = min(group, rest)
        return cls(chunk=max_chunk, supers=supers, per_super=rest // group, group=group)


def check_split(split) -> None:
    """Raise ValueError unless split is None (the policy) or a power of two up to MAX_SPLIT."""
    if split is not None and (type(split) is not int or not 1 <= split <= MAX_SPLIT or split & (split - 1)):
        raise ValueError(f"split: {split!r} (a power of two, 1..{MAX_SPLIT}, or None)")


def select_split(programs: int, width: int, sms: int) -> int:
    """Programs per row for a top-16 over ``programs`` rows x heads of ``width`` columns on
    ``sms`` SMs: 1 for a row of one chunk (MAX_CHUNK columns: one select, where a split
    adds a count and a merge), else doubled from 1 while the grid stays within
    SPLIT_PER_SM programs per SM and each slice keeps MIN_SLICE columns — and 1 if that
    comes to fewer than MIN_SPLIT slices.

    Measured (fast/PERF.md, fifth session; stock top-16 alone, 2 heads, µs): 1024 columns
    4.7 unsplit against 5.9 in 2 slices; 8192 columns, batch 1: 6.3 in 16 slices against
    10.0 unsplit (the three dependent selects of a long row); batch 8: 8.0 in 8 slices (1
    program per SM) against 9.9; batch 32: 11.0 in 4 slices (2 per SM), 9.8 in 2, 10.0
    unsplit; 4096 columns, batch 32: 8.4 in 2, 7.5 unsplit."""
    padded = triton.next_power_of_2(max(width, 16))
    if padded <= MAX_CHUNK:
        return 1
    split = 1
    while split < MAX_SPLIT and programs * split * 2 <= SPLIT_PER_SM * sms and padded // (2 * split) >= MIN_SLICE:
        split *= 2
    return split if split >= MIN_SPLIT else 1


def release_select(programs: int, warps: int = 4, columns: int = 0) -> bool:
    """Whether the scorer lets a select of ``programs`` programs (rows x heads x split) of
    ``warps`` warps and ``columns`` columns each launch at once under PDL (``score_pages``'
    release) rather than at its end: a small grid, or one-warp programs of at most
    RELEASE_COLUMNS columns (a CP push queued several to an SM anyway, ``push_warps``).
    Early, the launch is hidden, but the programs land several to an SM on the SMs the
    scorer frees first: that costs a grid of latency-bound four-warp selects, and one of
    long one-warp selects, more than it saves.

    Measured (fast/PERF.md, seventh session; layers, µs, release / not): a CP push of 4
    programs (128K, batch 1) 11.4 / 12.2, of 64 (1M, batch 1, 16 slices) 27.2 / 26.9, of 128
    (128K, batch 32) 64.6 / 63.4; a stock select of 2 (8K, batch 1) 5.0 / 5.2, of 32 (1M,
    batch 1) 35.4 / 35.6, of 512 (128K, batch 64, q 4) 212.2 / 210.1. Seventeenth session
    (CP = 1 layers on one GPU, medians of 2-4 alternating rounds, release / not): one-warp
    pushes of 1024 programs (batch 64, q 4) at 128 columns 35.8 / 36.4, 512 113.3 / 113.5,
    1024 213.5 / 214.2, 2048 410.9 / 412.8, but 4096 816.8 / 810.2; of 512 programs (batch
    32, q 4) at 512 columns 62.4 / 63.0, 4096 414.1 / 414.9; four-warp pushes of 256
    programs (batch 64, q 1) at 1024 columns 188.7 / 185.1."""
    return programs <= RELEASE_PROGRAMS or (warps == 1 and columns <= RELEASE_COLUMNS)


def push_warps(programs: int, one_chunk: bool, sms: int, warp_select: bool = False) -> int:
    """Warps per program of the CP push (``cp_kernels.push_kernel``): a row that goes to
    ``warp_select``'s PTX block (``warp_select``: a GPU's row of 512-1024 keys, its
    columns or its groups') runs on one warp from WARP_SELECT_PER_SM programs per SM;
    otherwise 4 while there are fewer than QUEUED_PER_SM programs per SM (each select's
    latency counts), else 1 for a one-chunk select and 2 for a three-level one (throughput
    counts).

    One warp's ``tl.topk`` runs in registers and shuffles, four's through shared memory and
    barriers: one warp is ~2.5x slower alone but ~1.5x the throughput once programs queue
    on every SM; a three-level select, whose first level reduces the whole row, does best
    on two. Measured (fast/PERF.md, eighth session; the push alone, µs, 4 / 2 / 1 warps):
    1024 programs of 512 columns 9.4 / 11.1 / 6.1, of 128 columns 3.8 / 3.4 / 3.1, of 32
    columns 3.2 / 2.6 / 2.7; 128 programs of 512 columns 3.3 / 5.0 / 5.6; 1024 three-level
    selects of 4096 columns (128 x 8 x 4) 22.5 / 18.4 / -, 128 of them 7.0 / 8.1 / -. The
    PTX block on one warp against four warps' tl.topk (eleventh session; the push alone,
    µs, 1 / 4 warps): 512 / 384 / 256 programs of 512 columns 3.8 / 3.8 / 3.7 against
    6.3 / 5.4 / 4.4, of 4096 columns (two levels against three) 8.2 / 7.8 / 7.8 against
    13.6 / 11.0 / 8.8, 512 / 256 of 2048 columns 7.5 / 7.4 against 10.9 / 7.4; 128 of 512
    columns 4.65 against 2.67 (ninth session, a throwaway micro-benchmark). At 256 programs
    on 132 SMs the layers disagreed with the push alone (stages at batch 64, q 1, one warp
    / four: 128K 9.1 / 8.6, 512K 12.9 / 10.9, 1M 12.8 / 14.2, two runs), so it starts at 2."""
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


def plan_split(requested: int | None, programs: int, width: int, device, shape: SelectShape) -> tuple[int, int, SelectShape]:
    """(split, columns per slice, a slice's select shape) for a top-16 over ``programs`` rows
    x heads of ``width`` columns whose whole-row shape is ``shape``: ``requested`` (None:
    ``select_split`` on a GPU, 1 elsewhere) lowered by ``fit_split``. Unsplit, the slice is
    the whole padded row and its shape ``shape``."""
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
