"""The MSA format's own CP kernels (docs/DESIGN.md §10.4): the plan's compact table and the
push; the exchange and the merge are the protocol's (``kernels.cp``). The candidates'
range on a rank: docs/KERNELS.md, "The MSA CP kernels"."""

import triton
import triton.language as tl

from indexer_constants import TOPK

from ...kernels.cp import _push
from ...kernels.device import pdl_release, pdl_wait, peer_ptr
from ...kernels.guards import BOUND_WORDS, request_verdict, row_id_bounds
from ...kernels.rules import is_long_request, is_short_row, own_page, row_query
from ...select.levels import push_row_top16
from .rules import read_blocks
from .stock import msa_output

_TOPK = tl.constexpr(TOPK)
_BOUND_WORDS = tl.constexpr(BOUND_WORDS)


@triton.jit
def _columns_below(g, CP: tl.constexpr, RANK: tl.constexpr):
    """How many of rank RANK's blocks ``j * CP + RANK`` lie below global block ``g``:
    ceil((g - RANK) / CP), 0 where g <= RANK (written without negative division)."""
    return (tl.maximum(g - RANK, 0) + CP - 1) // CP


@triton.jit
def msa_compact_table_kernel(
    bt_ptr,  # int32 [B, P_table]
    seq_lens_ptr,  # int32 [B]
    cbt_ptr,  # int32 [B, W] out: column j -> the id of global block j * CP + RANK (-1 where >= P)
    score_lens_ptr,  # int32 [B] out: the length of a long request, else 0 (nothing scored)
    seq_out_ptr,  # int32 [B] out: the real lengths, in a buffer stable across steps
    n_local_ptr,  # int32 [B] out: this rank's columns among the request's read columns
    bounds_ptr,  # int32 [B, 4] out: guards.row_id_bounds of every column the decode reads
    P,
    stride_bt,
    W: tl.constexpr,
    CP: tl.constexpr,
    RANK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per request. The id bounds span the read columns of every rank, so every
    rank reaches the same verdict on a request (``guards.request_verdict``): a bad one is
    pushed by no rank and waited for by no owner."""
    b = tl.program_id(0)
    seq = tl.load(seq_lens_ptr + b)
    tl.store(seq_out_ptr + b, seq)
    reads = read_blocks(seq, P)
    row_id_bounds(bt_ptr + b.to(tl.int64) * stride_bt, bounds_ptr + b * _BOUND_WORDS, reads, BLOCK)
    tl.store(n_local_ptr + b, _columns_below(reads, CP, RANK))
    tl.store(score_lens_ptr + b, tl.where(is_long_request(seq), seq, 0))
    for start in tl.static_range(0, W, BLOCK):
        j = start + tl.arange(0, BLOCK)
        g = j * CP + RANK
        v = tl.load(bt_ptr + b.to(tl.int64) * stride_bt + g, mask=(j < W) & (g < P), other=-1)
        tl.store(cbt_ptr + b.to(tl.int64) * W + j, v, mask=j < W)


@triton.jit
def msa_push_kernel(
    score_ptr,  # fp32 [B, 8 * H, W] compact scores (row slot * H + head)
    seq_lens_ptr,  # int32 [B]
    n_local_ptr,  # int32 [B]: this rank's read columns (the plan's)
    bounds_ptr,  # int32 [B, 4]: the plan's id bounds
    num_blocks,  # N: the cache's blocks
    recv_ptrs,  # int64 [CP]: every rank's candidates, 2 sets of [CP, rows_max, HR, 16] int64
    current_ptr,  # int64 [1]: the step's buffer set (the exchange's copy of the parity)
    err_ptr,  # int32 [5]: the error record (word 0: the protocol's)
    part_ptr,  # int64 [rows * H * SPLIT, 16]: the slices' top 16 (SPLIT > 1)
    count_ptr,  # int32 [rows * H]: slices done (0 between calls)
    rows_max,
    set_elems,
    init,  # the forced windows
    local,
    stride_sb,
    stride_sr,
    H: tl.constexpr,
    HR: tl.constexpr,
    R: tl.constexpr,
    CP: tl.constexpr,
    RANK: tl.constexpr,
    QLEN: tl.constexpr,
    SPLIT: tl.constexpr,  # programs per row (program_id(2)), each SLICE columns
    SLICE: tl.constexpr,
    SELECT: tl.constexpr,  # the select shape of one slice (the row if SPLIT 1): a policy.SelectShape
    SORT: tl.constexpr,
    PDL: tl.constexpr,
):
    """Per (query, head) of a long row (causal count n > 16) of a request that passes the
    guards: the exact top 16 of this rank's candidates, stored into slot RANK of every
    owner's candidates (descending; 0 where the rank holds fewer than 16). Every long row
    is pushed, even one with no candidate here: its owners wait for every rank's slot.
    With ``16 - init - local = 0`` nothing is ranked (the merge takes no candidate)."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    b, i, slot = row_query(t, QLEN)
    n_local = tl.load(n_local_ptr + b)
    seq = tl.load(seq_lens_ptr + b)
    n = own_page(seq, slot) + 1
    verdict, _, _ = request_verdict(bounds_ptr, b, seq, num_blocks, QLEN)
    owner0 = (h // HR) * R
    owners = peer_ptr(recv_ptrs, owner0 + tl.arange(0, R), tl.int64)  # [R]
    pdl_wait(PDL)
    pdl_release(PDL)
    slots = tl.load(current_ptr) * set_elems + ((RANK * rows_max + t) * HR + h % HR) * _TOPK
    dst = owners[:, None] + slots + tl.arange(0, _TOPK)[None, :]
    healthy = tl.load(err_ptr, volatile=True) == 0
    # The rank's candidate columns [lo, hi): at or past init, below n - local and below the
    # columns the request reads (which stop at P). Columns past hi may be unwritten.
    lo = _columns_below(init, CP, RANK)
    hi = tl.minimum(_columns_below(n - local, CP, RANK), n_local)
    count = tl.where(_TOPK - init - local > 0, tl.maximum(hi - lo, 0), 0)
    if ~is_short_row(n - 1) & (verdict == 0):
        if count > 0:
            row_ptr = score_ptr + b.to(tl.int64) * stride_sb + (slot * H + h) * stride_sr + lo
            cols = s * SLICE + tl.arange(0, SLICE)
            one_chunk: tl.constexpr = SLICE <= SELECT.chunk
            if one_chunk:
                mine = tl.load(row_ptr + cols, mask=cols < count, other=0.0)
            else:
                mine = tl.zeros([SLICE], tl.float32)  # unused: the slice reads its columns in levels
            best, done = push_row_top16(
                row_ptr,
                count,
                s,
                mine,
                cols,
                part_ptr,
                count_ptr,
                t * H + h,
                CP,
                RANK,
                SLICE,
                SPLIT,
                SELECT,
                SORT,
            )
            if done:
                # Keys name block (j - lo) * CP + RANK: shifted back by lo columns.
                _push(tl.where(best > 0, best - lo * CP, 0), dst, healthy)
        elif s == 0:
            _push(tl.zeros([_TOPK], tl.int64), dst, healthy)


@triton.jit
def msa_merged_output(out_ptr, t, best, own, init, local, HR: tl.constexpr):
    """The merge's output of a long row under the MSA rules (``merge_kernel``'s ``OUTPUT``,
    DESIGN §10.4): per head, the init window, the best ``16 - init - local`` of its 16 best
    keys best [HR, 16] (every rank pushed only candidates), the local window, ascending
    (``msa_output``), into out int32 [rows, HR, 16] at row t."""
    k = tl.arange(0, _TOPK)
    hl = tl.arange(0, HR)
    m = _TOPK - init - local  # the candidates a row takes
    for head in tl.static_range(HR):
        row = tl.sum(tl.where(hl[:, None] == head, best, 0), axis=0)  # this head's keys
        tl.store(out_ptr + (t * HR + head) * _TOPK + k, msa_output(row, m, own + 1, init, local))
