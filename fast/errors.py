"""What a decode's ``check()`` raises, read from the process's device error record
(``fast.kernels.guards``: a protocol word, then the first bad input with its request,
column and value). Reading the record is the one host sync of error handling."""

from __future__ import annotations

import torch

from .kernels.device import ERR_MERGE_TIMEOUT, ERR_PAGE_COPY_TIMEOUT, ERR_Q_TIMEOUT
from .kernels.guards import BAD_BLOCK, BAD_LENGTH, BAD_QUERY_SET, ERR_INPUT, ERR_PROTOCOL, ERR_WORDS

_SPINS = {ERR_Q_TIMEOUT: "the q exchange", ERR_MERGE_TIMEOUT: "the merge"}


class PeerTimeoutError(RuntimeError):
    """A spin gave up: a peer never delivered its queries or candidates within the state's
    time bound. The layers' buffers may hold a stale step: ``reset()`` on every rank.

    stage: the spin that gave up, "the q exchange" or "the merge" (the message names it)."""

    def __init__(self, message: str, stage: str = ""):
        super().__init__(message)
        self.stage = stage


class PageCopyTimeoutError(RuntimeError):
    """A page's bulk copy into the scorer's shared-memory ring did not land within the
    ring's bound (``fast.kernels.page_ring``): the step's scores are not valid. A copy of
    valid memory lands in microseconds; this names a device fault, not slow input."""


class DecodeInputError(ValueError):
    """A step's device-side input was bad: a decode wrote the request's rows as sixteen -1
    (a scorer called alone: its stored columns NaN).

    request: the request's index in the step's batch; column: the block-table column
    (-1 for a length); value: the id or length found there."""

    argument = ""

    def __init__(self, message: str, request: int, column: int, value: int):
        super().__init__(message)
        self.request, self.column, self.value = request, column, value


class BadBlockIdError(DecodeInputError):
    """A block id the decode would read lies outside ``[0, num_blocks)`` of the cache."""

    argument = "block_table"


class BadLengthError(DecodeInputError):
    """A length is negative or in ``1 .. query_len - 1`` (0 is a padding request)."""

    argument = "seq_lens"


class BadQuerySetError(DecodeInputError):
    """A scorer's tile set index ``q_sel[0]`` lies outside ``[0, q_sets)`` (``score_pages``
    or ``score_blocks`` called with q_sel): set 0 was read in its place (no read left the
    tile) and every stored column is NaN. request and column are -1 (the launch's, not a
    request's); value: the index, saturated to int32."""

    argument = "q_sel"


def new_record(device: torch.device) -> torch.Tensor:
    """A clear error record: int32 ``[ERR_WORDS]`` zeros on ``device``."""
    return torch.zeros(ERR_WORDS, dtype=torch.int32, device=device)


def raise_recorded(record: torch.Tensor, *, rank: int = 0, timeout_s: float | None = None) -> None:
    """Raise what the error record holds (int32 [ERR_WORDS]; a host sync), or return:
    PeerTimeoutError for a spin that gave up (PageCopyTimeoutError for the scorer's page
    copy), else BadBlockIdError, BadLengthError or (a scorer's) BadQuerySetError for the
    first bad input seen. The record is left as it is (``reset()`` clears it)."""
    words = record.tolist()
    spin = words[ERR_PROTOCOL]
    if spin == ERR_PAGE_COPY_TIMEOUT:
        raise PageCopyTimeoutError(f"rank {rank}: a page's copy into the scorer's ring never landed; scores invalid")
    if spin:
        bound = f" within {timeout_s:g} s" if timeout_s is not None else ""
        what = _SPINS.get(spin, f"a spin (code {spin})")
        raise PeerTimeoutError(f"rank {rank}: {what} gave up: a peer never arrived{bound}", what)
    code, request, column, value = words[ERR_INPUT : ERR_INPUT + 4]
    if code == BAD_BLOCK:
        raise BadBlockIdError(
            f"block_table: request {request}, column {column} holds block id {value}, outside the cache's"
            f" blocks (rank {rank}); the request's rows were written as -1",
            request,
            column,
            value,
        )
    if code == BAD_LENGTH:
        raise BadLengthError(
            f"seq_lens: request {request} has length {value}: negative or below query_len (0 is padding;"
            f" rank {rank}); the request's rows were written as -1",
            request,
            column,
            value,
        )
    if code == BAD_QUERY_SET:
        raise BadQuerySetError(
            f"q_sel: tile set index {value} lies outside the scorer's q_sets sets (rank {rank}); set 0 was"
            " read in its place and every stored column is NaN",
            request,
            column,
            value,
        )
    if code:
        raise DecodeInputError(f"rank {rank}: unknown input error code {code}", request, column, value)
