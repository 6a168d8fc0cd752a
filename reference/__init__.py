"""The executable contract of CP decode for the MiniMax-M3 NVFP4 indexer (pure PyTorch).

Public API (stable): ``full_decode`` (the oracle), ``cp_decode`` (every CP rank simulated),
``stock_decode`` (16-bit key selection), ``score_pages`` (the scorer contract),
``quantize_nvfp4`` / ``dequantize_nvfp4`` (the cache format). See docs/DESIGN.md.
"""

from .cp import CPTrace, HeadLayout, RankTrace, compact_width, cp_decode
from .decode import full_decode, stock_decode
from .nvfp4 import dequantize_nvfp4, quantize_nvfp4
from .scores import score_pages

__all__ = [
    "CPTrace",
    "HeadLayout",
    "RankTrace",
    "compact_width",
    "cp_decode",
    "dequantize_nvfp4",
    "full_decode",
    "quantize_nvfp4",
    "score_pages",
    "stock_decode",
]
