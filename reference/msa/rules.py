"""The MSA format's own per-row rules (docs/DESIGN.md §10.1), spelled once for the
reference: the blocks a request reads and each query's causal block count. The rules both
formats share are ``reference.rules``' (the kernels' twin: ``fast.msa.kernels.rules``).
"""

import torch

from indexer_constants import PAGE

from ..rules import own_pages

_I64 = torch.int64


def read_blocks(lens: torch.Tensor, width: int) -> torch.Tensor:
    """BF16 / FP8 keys (§10.1): the blocks a request reads, its whole causal range:
    ``min(ceil(len / 128), width)``, 0 for ``len < 1``. lens: int ``[B]``; returns int64."""
    return (-(-lens.to(_I64) // PAGE)).clamp(0, width)


def causal_blocks(seq_lens: torch.Tensor, query_len: int) -> torch.Tensor:
    """Each query's causal block count ``n = (len - q + i) // 128 + 1`` (0 for padding).

    seq_lens: int ``[B]``. Returns int64 ``[B * q]`` in row order ``b * q + i``. A valid
    length is 0 or >= q, so the position ``len - q + i`` is >= 0 or the request pads.
    """
    own = own_pages(seq_lens, query_len)  # the causal cut: the block holding the query
    return torch.where(own >= 0, own + 1, 0)
