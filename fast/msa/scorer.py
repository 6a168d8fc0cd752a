"""``score_blocks``: the MSA block scorer of docs/DESIGN.md §10.2 on the tensors' device.

Two kernels honor the one contract: the mma kernel (``msa/kernels/scorer_mma.py``, sm_90
only: the keys through a shared-memory ring, each thread's fragment widened in registers;
the Hopper route's, but for BF16 keys at N 64) and the ``tl.dot`` kernel
(``msa/kernels/scorer_dot.py``: the Hopper route's for BF16 keys at N 64, and every other
route's: the portable GPUs' and the interpreter's; ``fast.route``). ``hopper_kernel`` says
which the Hopper route runs.
"""

from __future__ import annotations

import os

import torch
import triton

from indexer_constants import HEAD_DIM, PAGE, SLOTS

from .. import checks
from ..backend import pdl_options, sm_count
from ..checks import check_int, score_shapes
from ..kernels import page_maxima, page_ring
from ..kernels.page_maxima import partial_maxima
from ..route import Route, device_route
from ..scorer import ScorerLaunch, first_set, mma_rows, no_record, pages_per_program
from . import tensor_map
from .kernels import block_ring
from .kernels.scorer_dot import msa_score_kernel
from .kernels.scorer_mma import msa_score_kernel_mma

# The key formats of the MSA decode and their element type (queries and keys alike).
KEY_FORMATS = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
KERNELS = ("mma", "dot")
# The dot kernel, per key dtype: columns per program (the tile's rows are loaded and converted
# once per program) and the column loop's pipeline depth on GPUs; measured choices
# (bench/PERF.md).
COLS_PER_PROGRAM = {torch.bfloat16: 8, torch.float8_e4m3fn: 4}
STAGES = {torch.bfloat16: 3, torch.float8_e4m3fn: 2}
NUM_WARPS = 4


def hopper_kernel(dtype: torch.dtype, rows: int) -> str:
    """The kernel the Hopper route runs at N = ``rows`` (``mma_rows`` of the rows scored): the mma
    kernel for E4M3 keys, and for BF16 up to N 32, where its bulk ring of two slots fits
    (``ring_feed``) and, since a ring of two issues each copy before the wait for the
    half-block ahead of it, measured faster than the dot kernel at every grid
    (bench/PERF.md). BF16 at N 64 (no bulk ring fits beside its q tile) keeps the dot
    kernel."""
    return "mma" if dtype == torch.float8_e4m3fn or rows <= 32 else "dot"


def block_kernel(route: Route, dtype: torch.dtype, rows: int) -> str:
    """The kernel ``score_blocks`` runs by default on ``route`` (``fast.route``) at N =
    ``rows``: ``hopper_kernel``'s on the Hopper route, the dot kernel on every other."""
    return hopper_kernel(dtype, rows) if route.hopper else "dot"


# The mma kernel's ring per key dtype: half-blocks per program, STAGES - 1 in flight as
# a program waits (two in a ring of two: ``scorer_mma._refill``; measured choices:
# bench/PERF.md). It is filled by bulk copies where it fits the static shared memory
# beside the kernel's own buffers (``max_stages``), else by every thread's cp.async copies
# in dynamic memory (``ring_feed``). From N 32 the E4M3 bulk ring
# takes one slot fewer (WIDE_RING_STAGES): a fourth slot beside the larger q tile and maxima
# leaves room for 4 programs an SM, not 5. BF16 takes two slots at every N: a third 16 KB
# slot passes the static shared memory's 48 KB.
RING_STAGES = {torch.bfloat16: 2, torch.float8_e4m3fn: 4}
WIDE_RING_STAGES = {torch.bfloat16: 2, torch.float8_e4m3fn: 3}
# The mma kernel's register cap with E4M3 keys in the bulk ring up to N 16: six programs
# an SM by registers, as many as its shared memory allows at N 8 (ptxas alone takes 88-106:
# five). Elsewhere ptxas's choice: at N 32 shared memory allows five programs either way,
# at N 64 the cap spills, and BF16 measured slower capped at N 32 and no faster at N 8 / 16
# (bench/PERF.md).
BULK_FP8_MAX_REGISTERS = 80


def mma_partials(rows: int, ppp: int) -> int:
    """The mma kernel's partial maxima a block and row (``page_maxima.page_max``) at N =
    ``rows`` with ``ppp`` columns a program: 8 (two shuffle rounds a block) from 4 columns
    on, where the NVFP4 scorer's 32 (no shuffle) takes 4x the shared memory, a program an SM
    at N 16 and 32, and measured no faster at any N (bench/PERF.md); below, the
    shared policy (``partial_maxima``: a few columns keep little shared memory either
    way)."""
    return 8 if ppp >= 4 else partial_maxima(rows, ppp)


def dynamic_bytes(rows: int, ppp: int, mma: str = "exact", fold: bool = False) -> int:
    """The mma kernel's dynamic shared memory at N = ``rows`` with ``ppp`` columns a
    program on the ``mma`` route, its page maxima folded by layout or not (``fold``:
    ``page_maxima.dynamic_bytes`` at its ``mma_partials``); a cp.async ring's slots aside."""
    return page_maxima.dynamic_bytes(rows, ppp, mma_partials(rows, ppp), mma, fold)


def max_stages(dtype: torch.dtype, rows: int, ppp: int, mma: str = "exact", fold: bool = False) -> int:
    """The deepest ring the mma kernel may take at N = ``rows`` with ``ppp`` columns a
    program on the ``mma`` route (``fold``: as ``dynamic_bytes``): within the static shared
    memory beside its dynamic buffers (``block_ring.max_stages``), and no deeper than the
    program's 2 ppp half-blocks need."""
    return min(block_ring.max_stages(dynamic_bytes(rows, ppp, mma, fold), dtype.itemsize), 2 * ppp + 1)


def ring_feed(
    dtype: torch.dtype, rows: int, ppp: int, stages: int | None = None, mma: str = "exact", fold: bool = False
) -> tuple[int, bool]:
    """The mma kernel's ring at N = ``rows`` with ``ppp`` columns per program: (depth,
    bulk), bulk where the depth fits ``max_stages``, else the cp.async ring. The depth:
    ``stages`` (2 .. 8) if given; else the bulk ring's policy (``RING_STAGES``, from N 32
    ``WIDE_RING_STAGES``) where it fits, else ``RING_STAGES`` for the cp.async ring —
    either no deeper than the program's 2 ppp half-blocks need (the kernel's prologue
    issues STAGES - 1 of them). mma: the route, whose q tile the shared memory holds;
    fold: as ``dynamic_bytes``."""
    room = max_stages(dtype, rows, ppp, mma, fold)
    if stages is None:
        stages = (WIDE_RING_STAGES if rows >= 32 else RING_STAGES)[dtype]
        if min(stages, 2 * ppp + 1) > room:
            stages = RING_STAGES[dtype]
    stages = min(stages, 2 * ppp + 1)
    return stages, stages <= room


def shared_programs(dtype: torch.dtype, rows: int, ppp: int, stages: int, bulk: bool, mma: str, fold: bool) -> int:
    """The mma kernel's programs an SM by shared memory (228 KB an sm_90 SM, 1 KB of it
    reserved a program) with a ring of ``stages`` (``bulk``: static, mbarriers included,
    else slots in the dynamic buffer) beside ``dynamic_bytes``."""
    ring = block_ring.ring_bytes(stages, dtype.itemsize) if bulk else stages * block_ring.slot_bytes(dtype.itemsize)
    return 228 * 1024 // (page_ring.BASE_STATIC + ring + dynamic_bytes(rows, ppp, mma, fold) + 1024)


def mma_folds(dtype: torch.dtype, rows: int, ppp: int, stages: int | None = None, mma: str = "exact") -> bool:
    """Whether the mma kernel folds its page maxima by layout (``page_maxima.folds_by_layout``)
    at N = ``rows`` with ``ppp`` columns a program: where the conversion's scratch leaves
    the ring (``ring_feed``, ``stages`` as asked) and the programs an SM its shared memory
    holds as they are without it."""
    if not page_maxima.folds_by_layout(rows, mma_partials(rows, ppp)):
        return False
    feed, folded = ring_feed(dtype, rows, ppp, stages, mma), ring_feed(dtype, rows, ppp, stages, mma, fold=True)
    return feed == folded and (
        shared_programs(dtype, rows, ppp, *feed, mma, False) == shared_programs(dtype, rows, ppp, *feed, mma, True)
    )


def mma_constants(dtype: torch.dtype, rows: int, ppp: int, stages: int | None = None, mma: str = "exact") -> dict:
    """The mma kernel's ring constants (``ring_feed``: STAGES, BULK; TENSOR: a bulk ring is
    filled by tensor copies, ``score_blocks`` turning them off where it has no map), its
    page maxima's fold (FOLD: ``mma_folds``), its MMA (E4M3_MMA: the ``mma`` "e4m3" route)
    and, where capped, its register cap (``maxnreg``) at N = ``rows`` with ``ppp`` columns
    a program."""
    fold = mma_folds(dtype, rows, ppp, stages, mma)
    stages, bulk = ring_feed(dtype, rows, ppp, stages, mma, fold)
    capped = bulk and dtype == torch.float8_e4m3fn and rows <= 16
    ring = {"STAGES": stages, "BULK": bulk, "TENSOR": bulk, "FOLD": fold, "E4M3_MMA": mma == "e4m3"}
    return ring | ({"maxnreg": BULK_FP8_MAX_REGISTERS} if capped else {})


def check_keys(name: str, x, dtype=None) -> None:
    """A contiguous bf16 or e4m3 tensor (of ``dtype`` where given), or TypeError / ValueError."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in KEY_FORMATS.values() or (dtype is not None and x.dtype != dtype):
        want = dtype or "bfloat16 or float8_e4m3fn"
        raise TypeError(f"{name}: expected dtype {want}, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (strides {x.stride()})")


def raw_view(x: torch.Tensor) -> torch.Tensor:
    """What the kernel reads of e4m3 / bf16 elements: their bits, as uint8 / int16 (the NaN
    test is on bits; the kernel reinterprets them as operands)."""
    return x.view(torch.uint8 if x.dtype == torch.float8_e4m3fn else torch.int16)


def score_blocks(
    q_tile: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor,
    lens: torch.Tensor,
    out: torch.Tensor,
    *,
    num_pages: int,
    stride: int = 1,
    offset: int = 0,
    first_slot: int = 0,
    q_sel: torch.Tensor | None = None,
    q_set_stride: int = 0,
    q_sets: int | None = None,
    pdl: bool = False,
    error: torch.Tensor | None = None,
    mma: str = "exact",
) -> torch.Tensor:
    """Write MSA block scores into ``out``, leaving every other column alone. Returns ``out``.

    q_tile: ``[B, 8, Hs, 128]`` in the cache dtype (bf16 or e4m3), contiguous; k_cache:
    ``[N, 128, 128]``; block_table: int32 ``[B, W]``, column j = global block
    ``g = j * stride + offset``; lens: int32 ``[B]``; out: float32 ``[B, 8 * Hs, W]``
    (columns contiguous), row ``slot * Hs + head``; num_pages: P. Column j is computed
    when ``g < min(ceil(len / 128), P)`` and stored in a row when also ``128 g <= pos =
    len - 8 + slot``: the max over the block's tokens at positions ``<= pos`` of ``q . k``,
    fp32-accumulated. A row whose query holds a NaN element (the all-ones "unwritten")
    stores NaN.

    first_slot: 0..7, score only the slots from it on and leave the earlier rows untouched.
    q_sel / q_set_stride / q_sets: read the tile at ``q_tile + q_sel[0] * q_set_stride``
    elements, one of ``q_sets`` sets in q_tile's storage (the CP path's two; q_sel int64
    ``[1]`` on the device, the stride a multiple of 16); an index outside ``[0, q_sets)``
    reads set 0 instead, every stored column gets NaN and ``error`` records it. pdl: launch as a
    programmatic dependent (GPUs). An id outside ``[0, N)`` is never loaded and its stored columns get
    NaN; with ``error`` (an int32 [5] record: ``fast.errors``) such a (request, column, id)
    is recorded: a program's first, and the record's first writer wins. mma: "exact"
    (16-bit operands, fp32 sums), or "e4m3" for E4M3 keys on the Hopper route: Hopper's
    E4M3 MMA on the values as they are (DESIGN §4.1, the reference's scores bit for bit).
    """
    run_block_scorer(
        q_tile,
        k_cache,
        block_table,
        lens,
        out,
        num_pages=num_pages,
        stride=stride,
        offset=offset,
        first_slot=first_slot,
        q_sel=q_sel,
        q_set_stride=q_set_stride,
        q_sets=q_sets,
        pdl=pdl,
        error=error,
        mma=mma,
    )
    return out


def run_block_scorer(*args, **options) -> None:
    """``plan_block_scorer``'s launch, run (nothing where there is nothing to score):
    ``score_blocks``' call, and the tests' where they pick the kernel."""
    launch = plan_block_scorer(*args, **options)
    if launch is not None:
        launch()


def plan_block_scorer(
    q_tile: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor,
    lens: torch.Tensor,
    out: torch.Tensor,
    *,
    num_pages: int,
    stride: int = 1,
    offset: int = 0,
    first_slot: int = 0,
    q_sel: torch.Tensor | None = None,
    q_set_stride: int = 0,
    q_sets: int | None = None,
    pdl: bool = False,
    error: torch.Tensor | None = None,
    mma: str = "exact",
    kernel: str | None = None,
) -> ScorerLaunch | None:
    """``score_blocks``' checks and its launch, not run (None: nothing to score), as
    ``fast.scorer.plan_scorer`` is ``score_pages``'. Arguments as ``score_blocks``', and
    kernel: "mma" (sm_90 only) or "dot" (default: ``block_kernel``'s for the device's route),
    which the tests set (a server calls ``score_blocks``).
    """
    batch, hs, width = score_shapes(q_tile, block_table, out)
    check_keys("k_cache", k_cache)
    check_keys("q_tile", q_tile, k_cache.dtype)
    device = q_tile.device
    if k_cache.dim() != 3 or tuple(k_cache.shape[1:]) != (PAGE, HEAD_DIM) or k_cache.shape[0] < 1:
        raise ValueError(f"k_cache: expected shape [N >= 1, {PAGE}, {HEAD_DIM}], got {list(k_cache.shape)}")
    checks.cache_aligned("k_cache", k_cache)
    check_int("num_pages", num_pages, low=1)
    check_int("stride", stride, low=1)
    check_int("offset", offset, low=0, high=stride - 1)
    check_int("first_slot", first_slot, low=0, high=SLOTS - 1)
    sets = checks.query_sets(q_tile, q_sel, q_set_stride, q_sets, device, "elements")
    for name, x in (("k_cache", k_cache), ("block_table", block_table), ("out", out)):
        if x.device != device:
            raise ValueError(f"{name}: expected device {device} (q_tile's), got {x.device}")
    checks.device_tensor("lens", lens, torch.int32, 1, device)
    if lens.shape[0] != batch:
        raise ValueError(f"lens: expected {batch} lengths (one per request of q_tile), got {lens.shape[0]}")
    if block_table.stride(1) != 1:
        raise ValueError(f"block_table: columns must be contiguous (strides {block_table.stride()})")
    if error is not None:
        checks.error_record(error, device)
    route = device_route(device)
    if pdl and not route.pdl:
        raise ValueError(f"pdl: {route.device} has no PDL (sm_90 and newer)")
    rows = mma_rows((SLOTS - first_slot) * hs)
    mma = checks.mma_route(mma, route, k_cache.dtype)
    kernel = kernel or block_kernel(route, k_cache.dtype, rows)
    if kernel not in KERNELS:
        raise ValueError(f"kernel: {kernel!r} (one of {KERNELS})")
    if mma == "e4m3" and kernel != "mma":
        raise ValueError(f"kernel: {kernel!r} has no E4M3 MMA (mma 'e4m3' runs the mma kernel)")
    if kernel == "mma" and not route.sm90:
        raise ValueError(f"kernel: 'mma' needs an sm_90 GPU, not {route.device} (the dot kernel runs anywhere)")
    if batch == 0 or width == 0:
        return None
    # both kernels take the same operands; the launch shape and its constants differ
    args = (
        raw_view(q_tile),
        first_set(str(device)) if q_sel is None else q_sel,
        q_set_stride,
        raw_view(k_cache),
        block_table,
        lens,
        out,
        no_record(str(device)) if error is None else error,
        width,
        num_pages,
        stride,
        offset,
        k_cache.shape[0],
        block_table.stride(0),
        out.stride(0),
        out.stride(1),
    )
    common = dict(
        HS=hs,
        SLOT0=first_slot,
        IS_FP8=k_cache.dtype == torch.float8_e4m3fn,
        RECORD=error is not None,
        SETS=sets,
        num_warps=NUM_WARPS,
        **pdl_options(pdl),
    )
    if kernel == "mma":
        ppp = pages_per_program(batch, width, sm_count(str(device)), rows, msa=True)
        ring = mma_constants(k_cache.dtype, rows, ppp, None, mma)
        tmap = tensor_map.cached(k_cache) if ring["TENSOR"] else None
        ring["TENSOR"] = tmap is not None  # else the 1D bulk copies (a capture without the map)
        options = dict(ROWS=rows, PPP=ppp, PARTS=mma_partials(rows, ppp), **ring, **common)
        grid = (batch * triton.cdiv(width, ppp),)
        return ScorerLaunch(msa_score_kernel_mma, grid, (*args, 0 if tmap is None else tmap.data_ptr()), options)
    live = (SLOTS - first_slot) * hs
    cols = COLS_PER_PROGRAM[k_cache.dtype]
    options = dict(
        ROWS=max(16, triton.next_power_of_2(live)),
        COLS=cols,
        INTERPRETER=os.environ.get("TRITON_INTERPRET") == "1",
        HW_E4M3=route.hw_e4m3,
        STAGES=STAGES[k_cache.dtype],
        **common,
    )
    return ScorerLaunch(msa_score_kernel, (batch, triton.cdiv(width, cols)), args, options)
