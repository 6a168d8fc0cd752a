"""The route: the one place that decides, from a device's compute capability, which kernels
run on it.

- ``hopper`` (sm_90): the Gluon scorers (wgmma for NVFP4 pages, the mma kernel for BF16 /
  FP8 blocks but BF16 at N 64), PDL where the caller asks for it.
- ``portable`` (sm_80, 86, 89, 100, 120: every other CUDA GPU Triton supports): the ``tl.dot``
  scorers (the table scorer for NVFP4 pages, the dot scorer for BF16 / FP8 blocks), which
  need no wgmma, no bulk copies and no hardware E4M3 conversion (sm_80 / 86 have none);
  PDL only where the hardware has it (sm_90 and newer). Everything else — the exchange, the
  push, the merge, the selects, the stock top-16 — is the same Triton code on every route.
- ``interpreter`` (no GPU: ``TRITON_INTERPRET=1``): the portable kernels, run as Python.

Below sm_80 nothing is built: the decodes and scorers raise at construction, naming the
device. ``FAST_ROUTE=portable`` in the environment forces the portable route on an sm_90
GPU as well (to compare the two routes on one machine; the tests' portable tier runs so).
Both routes give the contract's outputs: indices bit-identical, and the scores exact where
fp32 sums are (both scorers accumulate fp32 products of 16-bit operands; only the order
of the sum differs, DESIGN §4).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass

import torch

logger = logging.getLogger("fast")

ROUTE_ENV = "FAST_ROUTE"
# FAST_ROUTE's values: the capability's route ("" or "auto"), or the portable kernels anywhere.
FORCED = ("auto", "portable")
HOPPER = (9, 0)
OLDEST = (8, 0)  # the oldest capability Triton compiles these kernels for (bf16 MMA, cp.async)
PDL_FROM = (9, 0)  # griddepcontrol: Hopper and newer
HW_E4M3_FROM = (8, 9)  # cvt from E4M3: Ada and newer (Triton compiles float8e4nv from sm_89)
# What has run on which GPU (the README's requirements say the same).
SUPPORTED = "sm_90 takes the Hopper kernels; sm_80, 86, 89, 100 and 120 the portable Triton kernels"


@dataclass(frozen=True)
class Route:
    """Which kernels run on one device.

    name: "hopper", "portable" or "interpreter"; device: the device as a person reads it
    ("NVIDIA H200 (sm_90)"); capability: (major, minor), None under the interpreter. The
    rest follows from these.
    """

    name: str
    device: str
    capability: tuple[int, int] | None

    @property
    def pdl(self) -> bool:
        """The device has PDL (sm_90 and newer): a decode asked for PDL gets it only then."""
        return self.capability is not None and self.capability >= PDL_FROM

    @property
    def forced(self) -> bool:
        """The portable route taken by ``FAST_ROUTE`` where the capability's is Hopper's."""
        return self.name == "portable" and self.capability == HOPPER

    @property
    def hopper(self) -> bool:
        """The Gluon scorers run (sm_90, not forced portable)."""
        return self.name == "hopper"

    @property
    def nvfp4_scorer(self) -> str:
        """``score_pages``' kernel: "wgmma" or "table"."""
        return "wgmma" if self.hopper else "table"

    @property
    def sm90(self) -> bool:
        """The hardware can run the Hopper kernels (what a test or the bench may pick by
        name, whatever the route)."""
        return self.capability == HOPPER

    @property
    def e4m3_mma(self) -> bool:
        """The scorers can take the E4M3-MMA route (DESIGN §4.1): Hopper's wgmma on E4M3
        operands, on the Hopper route alone."""
        return self.hopper

    @property
    def hw_e4m3(self) -> bool:
        """The device converts E4M3 in hardware (sm_89 and newer; the interpreter emulates
        it): else the kernels convert in integer arithmetic (``kernels.e4m3``)."""
        return self.capability is None or self.capability >= HW_E4M3_FROM

    def describe(self) -> str:
        """One line for the log: the route, the device and what the route runs there."""
        kernels = "wgmma / mma scorers" if self.hopper else "tl.dot scorers (table, dot)"
        pdl = "PDL available" if self.pdl else "no PDL"
        forced = f" (forced by {ROUTE_ENV}=portable)" if self.forced else ""
        return f"{self.name} route on {self.device}{forced}: {kernels}, {pdl}"


def route_for(capability: tuple[int, int] | None, device: str = "", force: str = "") -> Route:
    """The route of a device of this ``capability`` (None: the interpreter); ``device`` names
    it in the route and in the error; ``force``: ``FAST_ROUTE``'s value. Raises ValueError
    below sm_80 and for an unknown ``force``. Pure: the tests fake every capability."""
    force = force or "auto"
    if force not in FORCED:
        raise ValueError(f"{ROUTE_ENV}: {force!r} (one of {', '.join(FORCED)})")
    if capability is None:
        return Route("interpreter", device or "cpu (Triton interpreter)", None)
    major, minor = capability
    label = f"{device} (sm_{major}{minor})" if device else f"sm_{major}{minor}"
    if capability < OLDEST:
        raise ValueError(
            f"device: {label} is not supported: fast's kernels need sm_80 or newer ({SUPPORTED}); "
            "the reference (python -m reference) runs anywhere"
        )
    if capability == HOPPER and force != "portable":
        return Route("hopper", label, capability)
    return Route("portable", label, capability)


@functools.cache
def _cuda_route(index: int, force: str) -> Route:
    """The route of CUDA device ``index`` (cached: the scorers ask at every launch)."""
    capability = torch.cuda.get_device_capability(index)
    return route_for(capability, torch.cuda.get_device_name(index), force)


def device_route(device: torch.device) -> Route:
    """The route of ``device`` (a resolved ``cuda:N``, or the CPU: the interpreter), with
    ``FAST_ROUTE`` read now. Raises ValueError for a GPU below sm_80."""
    force = os.environ.get(ROUTE_ENV, "")
    if device.type != "cuda":
        return route_for(None, force=force)
    return _cuda_route(device.index if device.index is not None else torch.cuda.current_device(), force)


def log_route(owner: object, route: Route) -> None:
    """Log, at INFO on the "fast" logger, the route a decode state took."""
    logger.info("%s: %s", type(owner).__name__, route.describe())
