"""The second index-K format: BF16 or FP8 (E4M3) keys selected under the MSA rules
(docs/DESIGN.md §10), in plain PyTorch.

Public API: ``full_decode`` (the oracle, also what the stock path must output),
``cp_decode`` (every CP rank simulated), ``score_blocks`` (the scorer contract),
``make_case`` (synthetic cases for both key dtypes).
"""

from .cases import MsaCase, make_case
from .cp import cp_decode
from .decode import full_decode
from .scores import score_blocks

__all__ = ["MsaCase", "cp_decode", "full_decode", "make_case", "score_blocks"]
