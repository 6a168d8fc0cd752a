"""The one place that decides where Triton kernels run: a CUDA GPU, or the interpreter.

Call ``select_backend()`` before any module that defines a Triton kernel is imported:
Triton reads ``TRITON_INTERPRET`` when a kernel is defined.
"""

from __future__ import annotations

import functools
import os

import torch


def select_backend() -> str:
    """Return ``"cuda"`` when a GPU is present, else set ``TRITON_INTERPRET=1`` and return ``"cpu"``.

    An explicit ``TRITON_INTERPRET=1`` in the environment forces ``"cpu"``;
    ``FAST_COMPILE_ONLY=1`` forces ``"cuda"`` without a GPU, so kernels can be compiled for
    sm_90 and read (``python -m bench.sass``) but not run.
    """
    if os.environ.get("FAST_COMPILE_ONLY") == "1":
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
        return "cpu"
    return "cuda"


def gpu_count() -> int:
    """CUDA GPUs visible to this process (0 under the interpreter)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def p2p_gpus() -> int:
    """The CP size the GPUs support: the largest of 1, 2, 4, 8 such that GPUs 0..n-1 all
    have peer access to each other (0 without GPUs)."""
    count = gpu_count()
    best = min(count, 1)
    for n in (2, 4, 8):
        if n <= count and all(torch.cuda.can_device_access_peer(a, b) for a in range(n) for b in range(n) if a != b):
            best = n
    return best


def default_device() -> torch.device:
    """Where single-process fast tests and tools put tensors: the GPU if one is used."""
    return resolve_device("cuda" if select_backend() == "cuda" else "cpu")


def resolve_device(device) -> torch.device:
    """A device with its index filled in (``cuda`` -> ``cuda:N``, the current one), so it
    compares equal to the device of the tensors placed on it."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


@functools.cache
def sm_count(device: str) -> int:
    """Streaming multiprocessors of a CUDA device (cached: launch-time grid policies)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def pdl_options(pdl: bool) -> dict:
    """Launch keywords for a kernel with a ``PDL`` constexpr: with PDL on, the kernel is
    launched as a programmatic dependent (``launch_pdl``) and its gdc_wait/launch_dependents
    are compiled in. PDL exists on GPUs only; callers turn it off under the interpreter."""
    return {"PDL": True, "launch_pdl": True} if pdl else {"PDL": False}
