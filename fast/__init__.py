"""The Triton implementation of CP decode: kernels, symmetric buffers, rank launcher.

Importing any part of ``fast`` first settles the backend (``fast.backend``): Triton reads
``TRITON_INTERPRET`` when a kernel is defined, so it must be set before a kernel module loads.
"""

from .backend import select_backend

BACKEND = select_backend()
