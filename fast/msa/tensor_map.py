"""Tensor maps (``CUtensorMap``) of MSA key caches for the mma scorer's tensor copies
(``msa/kernels/block_ring.py``): the cache ``[N, 128, 128]`` seen as ``N * 128`` rows of 128
elements, a box of 64 rows by 128 bytes, the 128-byte swizzle. The map is the driver's
(``cuTensorMapEncodeTiled``, through ctypes: torch exposes none, and Triton's own builder
is internal to its launcher).

Why a map in global memory, built once per cache: a tensor copy reads its map through a
generic address, and a kernel parameter would need Gluon's own descriptor type (whose copies
its shared-memory analysis fences). The map is a pure function of the cache's address, row
count and dtype, so a map built for one tensor serves any tensor with the same three —
which is what makes the cache below safe when a cache is freed and another lands at its
address. Building one copies 128 bytes from the host, which a CUDA graph's capture cannot
do: ``cached`` returns None then, and the scorer falls back to 1D bulk copies.
"""

from __future__ import annotations

import ctypes

import torch

from indexer_constants import HEAD_DIM, PAGE

from .kernels.block_ring import BOX_ROW_BYTES, BOX_ROWS

MAP_BYTES = 128  # sizeof(CUtensorMap)
MAX_BLOCKS = 1 << 24  # the kernel's row coordinate (block * 128 + 64) is an int32
# CUtensorMapDataType / Swizzle / L2promotion / FloatOOBfill / Interleave values (cuda.h)
_DATA_TYPE = {torch.float8_e4m3fn: 0, torch.bfloat16: 1}  # UINT8, UINT16: the bits as they lie
_SWIZZLE_128B = 3
# L2 promotion to 128 bytes, a box row: promoted to 256 bytes the copies landed later and
# the scorer ran slower than with 1D bulk copies, where 128 bytes or none gained alike
# (bench/PERF.md).
L2_PROMOTION = 2
_NO_FILL = 0
_NO_INTERLEAVE = 0

_maps: dict[tuple, torch.Tensor] = {}
_encode = None


def _encoder():
    """``cuTensorMapEncodeTiled`` from the driver library, loaded once."""
    global _encode
    if _encode is None:
        fn = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
        u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p]
        fn.argtypes += [ctypes.c_int] * 4
        fn.restype = ctypes.c_int
        _encode = fn
    return _encode


def encode(k_cache: torch.Tensor) -> bytes:
    """The 128 bytes of the tensor map of ``k_cache`` (a contiguous ``[N, 128, 128]`` e4m3
    or bf16 CUDA tensor, 16-byte aligned). RuntimeError if the driver refuses it."""
    itemsize = k_cache.element_size()
    rows = k_cache.shape[0] * PAGE
    dims = (ctypes.c_uint64 * 2)(HEAD_DIM, rows)  # innermost first
    strides = (ctypes.c_uint64 * 1)(HEAD_DIM * itemsize)  # bytes between rows
    box = (ctypes.c_uint32 * 2)(BOX_ROW_BYTES // itemsize, BOX_ROWS)
    steps = (ctypes.c_uint32 * 2)(1, 1)
    raw = ctypes.create_string_buffer(MAP_BYTES + 64)
    at = (ctypes.addressof(raw) + 63) // 64 * 64  # CUtensorMap is 64-byte aligned
    code = _encoder()(
        at,
        _DATA_TYPE[k_cache.dtype],
        2,
        k_cache.data_ptr(),
        dims,
        strides,
        box,
        steps,
        _NO_INTERLEAVE,
        _SWIZZLE_128B,
        L2_PROMOTION,
        _NO_FILL,
    )
    if code != 0:
        raise RuntimeError(f"k_cache: cuTensorMapEncodeTiled refused the cache's map (CUresult {code})")
    return ctypes.string_at(at, MAP_BYTES)


def key(k_cache: torch.Tensor) -> tuple:
    """What a cache's map depends on: (device, address, blocks, dtype)."""
    return (k_cache.device.index, k_cache.data_ptr(), k_cache.shape[0], k_cache.dtype)


def cached(k_cache: torch.Tensor) -> torch.Tensor | None:
    """uint8 [128] on ``k_cache``'s GPU: its tensor map (``encode``), built on first use and
    kept by its ``key`` for the process's life; None while a CUDA graph is being captured
    and no map of that key exists yet, or past MAX_BLOCKS blocks.

    Never evicted: a captured graph holds the map's address, and a freed map's memory could
    be handed to another tensor while the graph still replays it (a map is 128 bytes, one
    per cache a process ever scores)."""
    if k_cache.shape[0] > MAX_BLOCKS:
        return None
    at = key(k_cache)
    found = _maps.get(at)
    if found is None and not torch.cuda.is_current_stream_capturing():
        found = torch.frombuffer(bytearray(encode(k_cache)), dtype=torch.uint8).to(k_cache.device)
        _maps[at] = found
    return found
