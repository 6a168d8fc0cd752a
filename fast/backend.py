"""The one place that decides where Triton kernels run: a CUDA GPU, or the interpreter.

Call ``select_backend()`` before any module that defines a Triton kernel is imported:
Triton reads ``TRITON_INTERPRET`` when a kernel is defined.
"""

from __future__ import annotations

import os

import torch


def select_backend() -> str:
    """Return ``"cuda"`` when a GPU is present, else set ``TRITON_INTERPRET=1`` and return ``"cpu"``.

    An explicit ``TRITON_INTERPRET=1`` in the environment forces ``"cpu"``.
    """
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
        return "cpu"
    return "cuda"


def gpu_count() -> int:
    """CUDA GPUs visible to this process (0 under the interpreter)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_device() -> "torch.device":
    """Where single-process fast tests and tools put tensors: the GPU if one is used."""
    return torch.device("cuda" if select_backend() == "cuda" else "cpu")
