"""Per-stage timing of one decode forward, for the demo and the benchmark (never production)."""

from __future__ import annotations

import time

import torch


class StageClock:
    """Adds each stage's time to a dict when one is given; otherwise does nothing.

    On a GPU the stages are bracketed by CUDA events (no sync between stages, so the device
    time of each stage, launch gaps included) and ``done()`` syncs once to read them; on the
    CPU it is wall time.
    """

    def __init__(self, times: dict | None, device: torch.device):
        self.times, self.cuda = times, device.type == "cuda"
        self.marks: list = []
        if times is not None:
            self.marks.append(("start", self._now()))

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def lap(self, stage: str) -> None:
        """Close ``stage``: the time since the previous mark is its (no sync)."""
        if self.times is not None:
            self.marks.append((stage, self._now()))

    def done(self) -> None:
        """Add every closed stage's seconds to the dict (on a GPU after one sync)."""
        if self.times is None:
            return
        if self.cuda:
            self.marks[-1][1].synchronize()
        for (_, a), (stage, b) in zip(self.marks, self.marks[1:]):
            seconds = a.elapsed_time(b) / 1e3 if self.cuda else b - a
            self.times[stage] = self.times.get(stage, 0.0) + seconds
