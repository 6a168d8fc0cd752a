"""The Triton implementation of CP decode for the MiniMax-M3 sparse-attention indexer (NVFP4
keys; and BF16 / FP8 keys under the MSA rules): what a server imports.
The contract is ``docs/DESIGN.md``; the user tools (CLI, demo, rank launcher) are
``fast.tools`` and are not loaded from here; the performance lab is ``bench/`` beside the
package, outside the wheel.

Importing ``fast`` first settles where kernels run (``fast.backend``): Triton reads
``TRITON_INTERPRET`` when a kernel is defined, so it must be set before a kernel module loads.
"""

from .backend import select_backend

BACKEND = select_backend()

from .build import build_cp_decode  # noqa: E402
from .cp import IndexerDecodeCP  # noqa: E402
from .errors import BadBlockIdError, BadLengthError, BadQuerySetError, DecodeInputError, PeerTimeoutError  # noqa: E402
from .graphs import GraphedDecode  # noqa: E402
from .msa.cp import MsaDecodeCP  # noqa: E402
from .msa.scorer import score_blocks  # noqa: E402
from .msa.stock import MsaStockDecode, msa_stock_decode  # noqa: E402
from .scorer import score_pages  # noqa: E402
from .stock import StockDecode  # noqa: E402
from .symm import ShmSymmetric, SingleRankSymmetric, open_cuda_symmetric  # noqa: E402

__all__ = [
    "BACKEND",  # "cuda" or "cpu" (the Triton interpreter): where this process runs kernels
    "BadBlockIdError",  # raised by check(): a block id outside the cache (request, column, id)
    "BadLengthError",  # raised by check(): a negative length or one below query_len (request, length)
    "BadQuerySetError",  # fast.errors.raise_recorded on a scorer's record: q_sel[0] outside its q_sets
    "DecodeInputError",  # the base of the three above (a ValueError)
    "GraphedDecode",  # decode layers replayed from one CUDA graph per padded batch size
    "IndexerDecodeCP",  # one rank's CP decode state: layers, plans, forward, check(), reset()
    "MsaDecodeCP",  # one rank's CP decode state for BF16 / FP8 keys under the MSA rules (DESIGN §10.4)
    "MsaStockDecode",  # the stock decode for BF16 / FP8 keys under the MSA rules (DESIGN §10)
    "PeerTimeoutError",  # raised by check() when a peer never delivered within the time bound
    "ShmSymmetric",  # symmetric buffers of CPU rank processes (/dev/shm files)
    "SingleRankSymmetric",  # a one-rank "symmetric" allocator (CP = 1, tests, benchmark)
    "StockDecode",  # one rank's stock (non-CP) decode, the fallback
    "build_cp_decode",  # the CP state, or None (with the reason logged) where CP cannot run
    "open_cuda_symmetric",  # collective: torch symmetric memory over the ranks' GPUs, or why not
    "msa_stock_decode",  # one MsaStockDecode step on fresh buffers (a convenience)
    "score_blocks",  # the MSA block scorer (BF16 / FP8 keys, token-level causal mask)
    "score_pages",  # the Q8KV4 page scorer on the tensors' device
    "select_backend",  # "cuda" when a GPU is present, else the interpreter ("cpu")
]
