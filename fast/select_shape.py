"""The shape of the top-16 select over a row of W score columns (fixed per plan)."""

from __future__ import annotations

from dataclasses import dataclass

import triton

MAX_CHUNK = 1024  # rows up to this many columns take a single select
MAX_SUPERS = 128  # longer rows: the top 16 of at most 128 supergroup maxima first
MAX_GROUP = 8  # columns per group of the last level


@dataclass(frozen=True)
class SelectShape:
    """CHUNK / SUPERS / PER_SUPER / GROUP constexprs of ``jit_helpers.top16`` (all powers of
    two): a row longer than CHUNK is SUPERS supergroups of PER_SUPER groups of GROUP columns."""

    chunk: int
    supers: int
    per_super: int
    group: int

    @classmethod
    def for_width(cls, width: int, max_chunk: int = MAX_CHUNK) -> "SelectShape":
        padded = triton.next_power_of_2(max(width, 16))
        if padded <= max_chunk:
            # Single level always; the three-level branch still needs valid shapes to compile.
            return cls(chunk=padded, supers=16, per_super=1, group=1)
        # Each level selects 16 of at least 16 (tl.topk needs k <= n): 8192 columns are 128
        # supergroups of 8 groups of 8, and every select is over 128 keys.
        supers = max(16, min(MAX_SUPERS, padded // (MAX_GROUP * MAX_GROUP)))
        rest = padded // supers
        group = min(MAX_GROUP, rest)
        return cls(chunk=max_chunk, supers=supers, per_super=rest // group, group=group)
