"""Test-wide setup: the Triton backend, Hypothesis profiles and the GPU-tier markers."""

import os

import pytest
from hypothesis import HealthCheck, settings

from fast.backend import gpu_count, select_backend

# Before any test module imports a Triton kernel: GPU if present, else the interpreter.
BACKEND = select_backend()

# dev: quick local runs. ci: derandomized and bounded, so CI is reproducible and its time
# is predictable. fuzz: many examples, with a database under the repository (git-ignored).
_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=30, **_COMMON)
settings.register_profile("ci", max_examples=40, derandomize=True, database=None, print_blob=True, **_COMMON)
settings.register_profile("fuzz", max_examples=5000, print_blob=True, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


def pytest_report_header(config):
    return f"backend: {BACKEND} (GPUs: {gpu_count()}); hypothesis profile: {settings().max_examples} examples"


def pytest_collection_modifyitems(config, items):
    gpus = gpu_count()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is visible")
    skip_multi = pytest.mark.skip(reason=f"needs 2+ CUDA GPUs; {gpus} visible")
    for item in items:
        if "gpu" in item.keywords and gpus < 1:
            item.add_marker(skip_gpu)
        if "multigpu" in item.keywords and gpus < 2:
            item.add_marker(skip_multi)
