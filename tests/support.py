"""What the single-process test files share: the device they run on and the poison value
for score columns a kernel must leave untouched."""

from fast.backend import default_device

DEV = default_device()
POISON = 1e30  # a column that keeps it was not written: read back, it would rank first


def on(x):
    """``x`` on the tests' device (the GPU if one is used, else the CPU)."""
    return x.to(DEV)
