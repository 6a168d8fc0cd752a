"""The E4M3-MMA route's dot product (docs/DESIGN.md §4.1): Hopper's wgmma on E4M3 operands,
modelled bit for bit, so the reference scores that route exactly as the GPU does.

What the hardware does (fitted to H100 wgmma m64nNk32 scores of ~1.6 million dot products
on random, spread, cancelling and dominant-term inputs, and checked there bit for bit;
``tests/data/e4m3_wgmma.pt`` keeps a sample that CI checks): a token's 128 products are
taken in 4 steps of 32 (``STEP_DIMS``: which head dimensions, as the scorers order them).
Each step adds its 32 products to the running sum ``c`` (fp32, +0.0 at first):

1. The alignment exponent ``e`` is the largest of the products' *operand exponent sums*
   (an E4M3 value's exponent, subnormals counted at -6, for each nonzero product) and of
   ``floor(log2 |c|)`` (where ``c != 0``).
2. Every product and ``c`` are truncated toward zero to a multiple of ``2^(e - 13)``, and
   the truncated terms are summed exactly.
3. The sum is truncated toward zero to 14 significant bits (13 after the leading one):
   the new ``c``. A zero sum is +0.0.

So a score depends on its own query row and key row alone: never on N, on the row's
place in the tile, on batching, rank or CP size.
"""

from __future__ import annotations

import torch

from indexer_constants import HEAD_DIM

STEPS = 4  # MMA steps a dot product of 128 takes (k32 each)
STEP_K = HEAD_DIM // STEPS
ALIGN_BITS = 13  # bits kept below the alignment exponent (step 2)
SUM_BITS = 14  # significant bits of each step's result (step 3)
# Head dimensions of step s: the scorers' logical column k = 32 s + 16 h + 4 t + e is
# dimension 32 t + 8 s + 4 h + e (fast/kernels/column_order.py at WIDTH 4).
STEP_DIMS = torch.tensor([[32 * t + 8 * s + j for t in range(4) for j in range(8)] for s in range(STEPS)])
_NONE = -(2**20)  # the exponent of "no term" (below any sum of two, in int32)
# Elements of [T, R, 32] worked on at once (32-bit temporaries: ~50 MB).
_CHUNK_ELEMENTS = 1 << 22


def e4m3_exponents(x: torch.Tensor) -> torch.Tensor:
    """The exponent the MMA aligns an E4M3 value by: ``floor(log2 |x|)``, -6 for
    subnormals; ``_NONE`` for 0. x: E4M3 values (any float dtype, shape); returns int32."""
    _, e = torch.frexp(x.to(torch.float32))
    return torch.where(x == 0, _NONE, (e - 1).clamp(min=-6))


def _sum_exponents(c: torch.Tensor) -> torch.Tensor:
    """floor(log2 |c|) of float32 ``c`` (``_NONE`` for 0), int32."""
    _, e = torch.frexp(c)
    return torch.where(c == 0, _NONE, e - 1)


def _step(
    c: torch.Tensor, products: torch.Tensor, exps: torch.Tensor, want_bound: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One MMA step: (new ``c``, the step's error bound where ``want_bound``, else None).
    c: float32 [...]; products: float32 [..., 32] (exact: an E4M3 product has at most 8
    significant bits); exps: int32 [..., 32] operand exponent sums (``_NONE`` where a
    product is 0). Every value below is exact in its type: terms are below 2^16 units,
    their sum below 2^21."""
    e = torch.maximum(exps.amax(-1), _sum_exponents(c))
    empty = e == _NONE  # no nonzero term and c = +0.0: every term is 0, so c stays +0.0
    e = torch.where(empty, 0, e)
    shift = ALIGN_BITS - e
    terms = torch.trunc(torch.ldexp(products, shift[..., None].to(torch.float32))).to(torch.int32)
    total = terms.sum(-1, dtype=torch.int32) + torch.trunc(torch.ldexp(c, shift.to(torch.float32))).to(torch.int32)
    # step 3 on the integer: keep its SUM_BITS leading bits, toward zero
    mag = total.abs()
    _, bits = torch.frexp(mag.to(torch.float32))  # bit length (mag < 2^24: exact)
    drop = (bits - SUM_BITS).clamp(min=0)
    mag = (mag >> drop) << drop
    c = torch.ldexp(torch.where(total < 0, -mag, mag).to(torch.float32), -shift.to(torch.float32)) + 0.0
    if not want_bound:
        return c, None
    # error of this step: each nonzero term (and c) loses < one unit, the rounding < 2^drop
    units = (exps != _NONE).sum(-1) + 1 + (1 << drop)
    return c, torch.where(empty, 0.0, torch.ldexp(units.to(torch.float64), -shift.to(torch.float64)))


def _scores(q_rows: torch.Tensor, keys: torch.Tensor, want_bound: bool) -> torch.Tensor:
    """float64 [T, R]: the route's scores (or, with want_bound, their error bound)."""
    R, T = q_rows.shape[0], keys.shape[0]
    out = torch.empty(T, R, dtype=torch.float64)
    q_rows, keys = q_rows.to(torch.float32), keys.to(torch.float32)  # E4M3 values: exact
    qe = e4m3_exponents(q_rows)
    ke = e4m3_exponents(keys)
    chunk = max(1, _CHUNK_ELEMENTS // (max(R, 1) * STEP_K))
    for t0 in range(0, T, chunk):
        k, kx = keys[t0 : t0 + chunk], ke[t0 : t0 + chunk]
        c = torch.zeros(k.shape[0], R, dtype=torch.float32)
        bound = torch.zeros(k.shape[0], R, dtype=torch.float64)
        for dims in STEP_DIMS:
            p = k[:, None, dims] * q_rows[None, :, dims]  # exact: E4M3 products fit float32
            x = kx[:, None, dims] + qe[None, :, dims]
            x = torch.where(p == 0, _NONE, x)
            c, b = _step(c, p, x, want_bound)
            if want_bound:
                bound += b
        out[t0 : t0 + chunk] = bound if want_bound else c
    return out


def e4m3_mma_dot(q_rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The E4M3-MMA route's dot products of every key with every query row.

    q_rows: float64 ``[R, 128]`` holding E4M3 values; keys: float64 ``[T, 128]`` holding
    E4M3 values (finite). Returns float32 ``[T, R]``, bit for bit what Hopper's wgmma
    E4M3 gives for them (each result has at most 14 significant bits, so float32 holds it).
    """
    return _scores(q_rows, keys, False).to(torch.float32)


def e4m3_mma_bound(q_rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """An upper bound of ``|e4m3_mma_dot - exact dot|``, per score: over the 4 steps, the
    units of ``2^(e - 13)`` each step can lose (one a nonzero term, one for the running
    sum, the final truncation's). Same arguments as ``e4m3_mma_dot``; returns float64
    ``[T, R]``."""
    return _scores(q_rows, keys, True)
