"""The shape of the top-16 select over a row of W score columns (fixed per plan)."""

from __future__ import annotations

from dataclasses import dataclass

import triton

MAX_CHUNK = 1024  # rows up to this many columns take a single select
NUM_GROUPS = 128  # longer rows: the top 16 of 128 group maxima, then of 16 groups


@dataclass(frozen=True)
class SelectShape:
    """CHUNK / NUM_GROUPS / GROUP constexprs of ``jit_helpers.top16`` (all powers of two)."""

    chunk: int
    num_groups: int
    group: int

    @classmethod
    def for_width(cls, width: int, max_chunk: int = MAX_CHUNK) -> "SelectShape":
        padded = triton.next_power_of_2(max(width, 16))
        if padded <= max_chunk:
            # Single level always; the two-level branch still needs valid shapes to compile.
            return cls(chunk=padded, num_groups=16, group=1)
        # At least 16 groups: the first level selects 16 of them (tl.topk needs k <= n).
        groups = min(NUM_GROUPS, max(16, padded // 16))
        return cls(chunk=max_chunk, num_groups=groups, group=padded // groups)
