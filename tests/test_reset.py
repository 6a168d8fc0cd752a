"""``reset()`` piece by piece: every buffer and counter a decode state keeps between steps is
either re-armed by ``reset()`` — and a test here leaves exactly that piece dirty and fails
if ``reset()`` does not restore it — or named below as written before it is read. A new
piece of state must be placed in one of the two lists (the completeness test)."""

from __future__ import annotations

import pytest
import torch

import fast
import reference
from fast.symm import SingleRankSymmetric
from reference import msa
from reference.cases import make_case
from support import DEV

Q = 2

# piece -> (where it lives: the state or each layer, the value reset() re-arms it to)
CP_PIECES = {
    "error": ("state", 0),  # the error record: protocol word, then the first bad input
    "_counts": ("state", 0),  # the split select's per-row program counts: zero between calls
    "tile": ("layer", -1),  # both q tile sets: 0xFF bytes, "no query yet"
    "recv": ("layer", -1),  # both candidate sets: -1, "no candidates yet"
    "parity": ("layer", 0),  # which set the next step uses
    "current": ("layer", 0),  # the exchange's copy of the parity
}
STOCK_PIECES = {"error": ("state", 0), "_counts": ("state", 0)}
# Written before they are read, every step: reset() need not touch them.
NOT_STATE = {
    "_parts": "the split select's slice keys: each slice stores its keys before its count says the row is whole"
}


def _case(fmt: str):
    if fmt == "nvfp4":
        return make_case(7, [2500, 3000], query_len=Q, heads=4, pattern="exact")
    return msa.make_case(
        7, [2500, 3000], dtype=fmt, query_len=Q, heads=4, pattern="late", init_blocks=1, local_blocks=2
    )


def _oracle(case):
    if isinstance(case, msa.MsaCase):
        return msa.full_decode(*case.args(), **case.windows())
    return reference.full_decode(*case.args())


def _state(kind: str, fmt: str):
    windows = {} if fmt == "nvfp4" else dict(key_format=fmt, init_blocks=1, local_blocks=2)
    if kind == "cp":
        cls = fast.IndexerDecodeCP if fmt == "nvfp4" else fast.MsaDecodeCP
        return cls(heads=4, max_reqs=2, symm=SingleRankSymmetric(DEV), spin_timeout_s=2.0, **windows)
    cls = fast.StockDecode if fmt == "nvfp4" else fast.MsaStockDecode
    return cls(heads=4, max_reqs=2, device=DEV, **windows)


def _tensors(piece, layer_or_state) -> torch.Tensor:
    x = getattr(layer_or_state, piece)
    return x.local if hasattr(x, "local") else x


def _step(state, layers, case) -> None:
    """One step over every layer, its output held to the oracle, check() clean."""
    on = [x.to(DEV) for x in case.args()[:4]]
    plan = state.plan(on[2], on[3])
    for layer in layers:
        out = torch.full((on[0].shape[0], 4, 16), -7, dtype=torch.int32, device=DEV)
        state.forward(layer, plan, on[0], on[1], out, Q)
        assert torch.equal(out.cpu(), _oracle(case))
    state.check()


CASES = [(kind, fmt) for kind in ("cp", "stock") for fmt in ("nvfp4", "fp8")]


@pytest.mark.parametrize("kind,fmt", CASES)
def test_every_piece_of_state_is_reset_or_written_before_read(kind, fmt):
    state = _state(kind, fmt)
    layer = state.new_layer()
    pieces = CP_PIECES if kind == "cp" else STOCK_PIECES
    kept = {k for k, v in vars(state).items() if torch.is_tensor(v)}
    kept |= {f"layer.{k}" for k, v in vars(layer).items() if torch.is_tensor(v) or hasattr(v, "local")}
    named = {p if where == "state" else f"layer.{p}" for p, (where, _) in pieces.items()} | set(NOT_STATE)
    assert kept == named, f"state {sorted(kept - named)} neither reset nor declared written-before-read"


PIECE_CASES = [(kind, fmt, piece) for kind, fmt in CASES for piece in (CP_PIECES if kind == "cp" else STOCK_PIECES)]


@pytest.mark.parametrize("kind,fmt,piece", PIECE_CASES)
def test_reset_restores_each_piece_left_dirty(kind, fmt, piece):
    """One piece alone: a step, the piece dirtied (as a step cut short by a timeout or a bad
    input leaves it), reset(): the piece is re-armed, and the next step is exact."""
    case = _case(fmt)
    where, armed = (CP_PIECES if kind == "cp" else STOCK_PIECES)[piece]
    state = _state(kind, fmt)
    layers = [state.new_layer(), state.new_layer()]
    _step(state, layers, case)
    owners = [state] if where == "state" else layers
    for owner in owners:
        _tensors(piece, owner).fill_(1)  # 1: a parity, a count, a set word, a record word
    state.reset()
    for owner in owners:
        assert bool((_tensors(piece, owner) == armed).all()), f"reset() left {piece} as it was"
    _step(state, layers, case)
