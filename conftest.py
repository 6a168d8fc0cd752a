"""Test-wide setup: the GPU each xdist worker uses, the Triton backend, Hypothesis profiles,
the GPU-tier markers and ``--shard`` (a tier split over several runs)."""

import os
import shutil
import subprocess
import sys


def _pin_xdist_worker_to_one_gpu() -> None:
    """Under pytest-xdist on a GPU machine, worker gwN sees only GPU N mod count.

    Runs before torch is imported: CUDA reads CUDA_VISIBLE_DEVICES once, at its first use.
    The count comes from a child process so this process never touches CUDA before the
    mapping (an existing CUDA_VISIBLE_DEVICES list is honored and subdivided).
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or shutil.which("nvidia-smi") is None:
        return
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    count = int(found.stdout.strip() or 0) if found.returncode == 0 else 0
    if count == 0:
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",")[:count] if visible else [str(i) for i in range(count)]
    os.environ["CUDA_VISIBLE_DEVICES"] = ids[int(worker[2:]) % len(ids)]


_pin_xdist_worker_to_one_gpu()

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, Phase, settings  # noqa: E402

from fast.backend import gpu_count, select_backend  # noqa: E402

# Before any test module imports a Triton kernel: GPU if present, else the interpreter.
BACKEND = select_backend()
# xdist workers share the cores: one worker's torch must not spawn a thread per core.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# dev: quick local runs. ci: derandomized and bounded, so CI is reproducible and its time
# is predictable. campaign: ci without shrinking (the mutation campaign needs a failure,
# not its smallest example: shrinking under the interpreter can take minutes). fuzz: many
# examples, with a database under the repository (git-ignored).
_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=30, **_COMMON)
settings.register_profile("ci", max_examples=40, derandomize=True, database=None, print_blob=True, **_COMMON)
settings.register_profile(
    "campaign", max_examples=40, derandomize=True, database=None, phases=(Phase.explicit, Phase.generate), **_COMMON
)
settings.register_profile("fuzz", max_examples=5000, print_blob=True, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


def pytest_report_header(config):
    pinned = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f"; CUDA_VISIBLE_DEVICES={pinned}" if pinned is not None else ""
    return f"backend: {BACKEND} (GPUs: {gpu_count()}{where}); hypothesis profile: {settings().max_examples} examples"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """The GPU tiers' skips where no GPU (or only one, for the multi-GPU tests) is visible,
    the ``heavy`` tests moved to the front (xdist hands out tests in this order: one of them
    started last would end the tier alone), then ``--shard``: run last, so a shard is taken
    of what -m / -k left selected."""
    _skip_missing_gpus(items)
    items.sort(key=lambda item: "heavy" not in item.keywords)  # stable: the rest keep their order
    shard = config.getoption("--shard")
    if shard is not None:
        _keep_shard(config, items, *_shard(shard))


# The Hopper route's kernels (fast/route.py), as a test's "kernel" parameter names them.
HOPPER_KERNELS = ("wgmma", "mma", "prmt")


def _skip_missing_gpus(items):
    """Skip what the GPUs present cannot run: GPU tests without one, multi-GPU tests with one,
    and on a GPU other than sm_90 the tests of the Hopper route's kernels — marked ``hopper``,
    or parametrized with one of them as ``kernel``."""
    gpus = gpu_count()
    sm90 = gpus > 0 and torch.cuda.get_device_capability(0) == (9, 0)
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is visible")
    skip_multi = pytest.mark.skip(reason=f"needs 2+ CUDA GPUs; {gpus} visible")
    skip_hopper = pytest.mark.skip(reason="a Hopper route kernel: needs an sm_90 GPU")
    for item in items:
        if "gpu" in item.keywords and gpus < 1:
            item.add_marker(skip_gpu)
        if "multigpu" in item.keywords and gpus < 2:
            item.add_marker(skip_multi)
        params = getattr(item, "callspec", None)
        kernel = params.params.get("kernel") if params is not None else None
        if gpus > 0 and not sm90 and ("hopper" in item.keywords or kernel in HOPPER_KERNELS):
            item.add_marker(skip_hopper)


def pytest_addoption(parser):
    parser.addoption(
        "--shard",
        default=None,
        metavar="K/N",
        help="run only every N-th selected test from the K-th (0 <= K < N): a tier split over N runs"
        " that together run each selected test once (a lent GPU's calls are time-limited)",
    )


def _shard(value: str) -> tuple[int, int]:
    """``--shard``'s "K/N" as (K, N), or a usage error naming the option."""
    k, _, n = value.partition("/")
    if not (k.isdigit() and n.isdigit() and int(k) < int(n)):
        raise pytest.UsageError(f"--shard: {value!r} (K/N with 0 <= K < N, e.g. 0/2)")
    return int(k), int(n)


def _keep_shard(config, items, k: int, n: int):
    """Keep the tests whose place among ``items`` is K mod N (interleaved, so each shard
    takes a share of every file); the rest are reported deselected."""
    kept = [item for i, item in enumerate(items) if i % n == k]
    dropped = [item for i, item in enumerate(items) if i % n != k]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def pytest_sessionfinish(session):
    """Stop the multi-rank tests' rank processes (``tests/rank_pools.py``), if any started."""
    pools = sys.modules.get("rank_pools")
    if pools is not None:
        pools.close_pools()
