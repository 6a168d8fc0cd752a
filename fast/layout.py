"""Who owns what in CP decode, computed by ``fast`` itself (docs/DESIGN.md §6): the head
layout over the ranks and the width of a rank's compact page table.

``tests/test_rules.py`` holds both against the reference's own versions.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HeadLayout:
    """Heads of ``cp`` ranks over ``heads`` index heads.

    Each rank owns ``heads_per_rank = max(1, H / CP)`` consecutive heads; each head has
    ``replicas = max(1, CP / H)`` owners, consecutive ranks. Rank r owns heads
    ``[(r // replicas) * heads_per_rank, (r // replicas + 1) * heads_per_rank)``.
    """

    cp: int
    heads: int

    @property
    def heads_per_rank(self) -> int:
        """Heads a rank owns: H / CP, at least 1."""
        return self.heads // self.cp if self.heads >= self.cp else 1

    @property
    def replicas(self) -> int:
        """Owners of a head (consecutive ranks): CP / H, at least 1."""
        return self.cp // self.heads if self.cp >= self.heads else 1

    def heads_of(self, rank: int) -> range:
        """The heads rank ``rank`` owns (and merges)."""
        group = rank // self.replicas
        return range(group * self.heads_per_rank, (group + 1) * self.heads_per_rank)


def compact_width(pages: int, cp: int) -> int:
    """Columns W of a rank's compact table for a table of ``pages`` pages: the most pages
    one rank can own, ``ceil(pages / cp)``, plus one for the page its lying length invents
    (the scorer stores every owned page because the length puts all slots one page past)."""
    return (pages + cp - 1) // cp + 1
