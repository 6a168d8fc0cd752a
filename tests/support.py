"""What the single-process test files share: the device they run on, the poison value for
score columns a kernel must leave untouched, the guards' id bounds written out in Python,
a key cache moved off its 16-byte alignment, and the check of a bounded wait giving up."""

import time

import pytest
import torch

from fast.backend import default_device
from fast.errors import PageCopyTimeoutError, new_record, raise_recorded
from fast.kernels.device import ERR_PAGE_COPY_TIMEOUT
from indexer_constants import PAGE

DEV = default_device()
POISON = 1e30  # a column that keeps it was not written: read back, it would rank first


def on(x):
    """``x`` on the tests' device (the GPU if one is used, else the CPU)."""
    return x.to(DEV)


def misaligned(cache: torch.Tensor) -> torch.Tensor:
    """``cache``'s values in a contiguous view of the same shape whose first byte lies 8
    bytes past a 16-byte boundary (every other check passes it)."""
    room = torch.empty(cache.numel() + 16, dtype=cache.dtype, device=cache.device)
    skip = (-room.data_ptr() % 16 + 8) // cache.element_size()
    view = room[skip : skip + cache.numel()].view(cache.shape)
    view.copy_(cache)
    return view


def assert_wait_gives_up(launch) -> None:
    """``launch(record)`` runs a kernel whose bounded wait never sees its copy (on the GPU):
    it returns after the bound (``page_ring.POLLS`` polls, each suspended by the hardware:
    not at once, not forever), records the timeout in the protocol word, and check() names
    it."""
    record = new_record(torch.device("cuda"))
    start = time.monotonic()
    launch(record)
    torch.cuda.synchronize()
    took = time.monotonic() - start
    assert 0.01 <= took < 10, took
    assert record.tolist()[0] == ERR_PAGE_COPY_TIMEOUT
    with pytest.raises(PageCopyTimeoutError):
        raise_recorded(record)


def id_bounds(table: torch.Tensor, seq: torch.Tensor, p: int) -> torch.Tensor:
    """int32 [B, 4]: (min id, its first column, max id, its first column) over the columns a
    request reads, j < min((len - 1) // 128, P); (0, -1, 0, -1) where it reads none."""
    rows = []
    for b in range(seq.shape[0]):
        n = min(max((int(seq[b]) - 1) // PAGE, 0), p) if int(seq[b]) >= 1 else 0
        ids = table[b, :n].tolist()
        if not ids:
            rows.append([0, -1, 0, -1])
        else:
            rows.append([min(ids), ids.index(min(ids)), max(ids), ids.index(max(ids))])
    return torch.tensor(rows, dtype=torch.int32)


# Lengths whose rows sit on both sides of the short / long edge (a row is short while its
# own page + 1 <= 16): at query_len 2, 16 * 128 + 1 has a short row (own 15) and a long one
# (own 16); 16 * 128 two short ones, 16 * 128 + 2 two long ones.
EDGE_ROW_LENS = [2, 3, 3 * PAGE + 6, 16 * PAGE, 16 * PAGE + 1, 16 * PAGE + 2, 30 * PAGE + 8]
