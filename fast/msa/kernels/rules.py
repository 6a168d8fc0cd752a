"""The MSA format's own per-row rule (docs/DESIGN.md §10.1), spelled once for its kernels;
the rules both formats share are ``fast.kernels.rules``' (the reference's twin:
``reference.msa.rules``)."""

import triton
import triton.language as tl

from indexer_constants import PAGE

_PAGE = tl.constexpr(PAGE)


@triton.jit
def read_blocks(length, width):
    """BF16 / FP8 keys (DESIGN §10.1): the blocks a request reads, its whole causal range:
    ``min(ceil(length / 128), width)``, 0 for ``length < 1``."""
    return tl.minimum((tl.maximum(length, 0) + _PAGE - 1) // _PAGE, width)
