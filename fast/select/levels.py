"""The top-16 select's jit code, every level of it: keys from scores, one select over a
chunk, three levels over a long row, a row split over programs (each slice's best, then one
merge), the two-level select on one warp, and ``row_top16``, the one path the stock selects
and the CP pushes take (but the MSA stock select's rows of one chunk: ``fast.msa.kernels.ascending``).
Shapes come from ``fast.select.policy``.

Every function runs on a GPU and under the interpreter (but ``warp_groups_top16``: inline
PTX); where the interpreter's arithmetic differs (fma), a constexpr switches to an exact
emulation (``fmaf``)."""

import triton
import triton.language as tl

TOPK = tl.constexpr(16)
RANKED = tl.constexpr(15)
KEY_EXACT = tl.constexpr(0)  # 1 << 48 | ordered(score) << 16 | (0xFFFF - page)
KEY_STOCK = tl.constexpr(1)  # q16 << 16 | (0xFFFF - page), uint32: a 32-bit sort is ~2x faster

_LOW56 = tl.constexpr((1 << 56) - 1)  # the PTX block's key field (the slot above it)


@triton.jit
def row_keys(
    row_ptr, j, n, KIND: tl.constexpr, CP: tl.constexpr, RANK: tl.constexpr, scale, bias, EMULATE_FMA: tl.constexpr
):
    """Keys of score columns ``j`` (any shape) of one row; 0 where ``j >= n``.

    Page of column j is ``j * CP + RANK``. KEY_EXACT: int64 ``1 << 48 | ordered << 16 |
    (0xFFFF - page)``; KEY_STOCK: uint32 ``q16 << 16 | (0xFFFF - page)`` with
    ``q16 = min(uint(fmaf(v, scale, bias)), 65535)``. Valid keys are > 0 either way."""
    return value_keys(tl.load(row_ptr + j, mask=j < n, other=0.0), j, n, KIND, CP, RANK, scale, bias, EMULATE_FMA)


@triton.jit
def value_keys(
    score, j, n, KIND: tl.constexpr, CP: tl.constexpr, RANK: tl.constexpr, scale, bias, EMULATE_FMA: tl.constexpr
):
    """``row_keys`` of scores already loaded: ``score`` holds columns ``j`` (same shape); what
    it holds at ``j >= n`` is ignored (it may be any bits: a load issued before n was known)."""
    valid = j < n
    score = tl.where(valid, score, 0.0)  # no NaN from unwritten columns into the key math
    return tl.where(valid, _key(_rank(score, KIND), (j * CP + RANK).to(tl.int64), KIND, scale, bias, EMULATE_FMA), 0)


@triton.jit
def _key(rank, page, KIND: tl.constexpr, scale, bias, EMULATE_FMA: tl.constexpr):
    """The key of a score, given as its ``_rank`` value, and a page: int64 (KEY_EXACT) or
    uint32 (KEY_STOCK)."""
    if KIND == KEY_EXACT:
        ordered = (rank ^ -(2**31)).to(tl.uint32, bitcast=True)  # fp32 bits in total order
        return (1 << 48) | (ordered.to(tl.int64) << 16) | (0xFFFF - page)
    else:
        # clamp before converting: CUDA's cvt saturates, numpy's cast does not
        t = tl.minimum(tl.maximum(fmaf(rank, scale, bias, EMULATE_FMA), 0.0), 65535.0)
        return (t.to(tl.uint32) << 16) | (0xFFFF - page).to(tl.uint32)


@triton.constexpr_function
def key_dtype(KIND):
    """The element type of KIND's keys (int64 KEY_EXACT, uint32 KEY_STOCK)."""
    return tl.int64 if KIND == KEY_EXACT else tl.uint32


@triton.jit
def best16(keys):
    """Each row's 16 largest of a 2-D ``[rows, n]`` block of keys, descending. Valid keys are
    unique, so taking the maximum and clearing it 16 times is exact."""
    k = tl.arange(0, TOPK)
    best = tl.zeros([keys.shape[0], TOPK], dtype=keys.dtype)
    for it in tl.static_range(TOPK):
        m = tl.max(keys, axis=1)
        best = tl.where(k[None, :] == it, m[:, None], best)
        keys = tl.where(keys == m[:, None], 0, keys)
    return best


@triton.jit
def select16_rows(keys, SORT: tl.constexpr):
    """Each row's 16 largest of a 2-D ``[rows, n]`` block of keys (n a power of two >= 16),
    descending: ``tl.topk`` along the rows where SORT (GPUs), else ``best16``."""
    if SORT:
        return tl.topk(keys, TOPK)
    else:
        return best16(keys)


@triton.jit
def select16(keys, SORT: tl.constexpr):
    """The 16 largest of a 1-D power-of-two block of keys, descending: ``tl.topk``'s bitonic
    network where SORT (GPUs), else ``best16`` (the interpreter). Same result: valid keys
    are unique."""
    if SORT:
        return tl.topk(keys, TOPK)
    else:
        return tl.reshape(best16(tl.reshape(keys, [1, keys.shape[0]])), [TOPK])


@triton.jit
def top16(
    row_ptr,
    n,
    KIND: tl.constexpr,
    CP: tl.constexpr,
    RANK: tl.constexpr,
    scale,
    bias,
    EMULATE_FMA: tl.constexpr,
    SELECT: tl.constexpr,
    SORT: tl.constexpr,
):
    """The 16 largest keys of columns ``j < n`` of a row, descending (0 = no page)."""
    CHUNK: tl.constexpr = SELECT.chunk
    SUPERS: tl.constexpr = SELECT.supers
    PER_SUPER: tl.constexpr = SELECT.per_super
    GROUP: tl.constexpr = SELECT.group
    if n <= CHUNK:
        best = select16(row_keys(row_ptr, tl.arange(0, CHUNK), n, KIND, CP, RANK, scale, bias, EMULATE_FMA), SORT)
    else:
        m = tl.arange(0, PER_SUPER)
        g = tl.arange(0, GROUP)
        sup = tl.arange(0, SUPERS)
        cols = (sup[:, None, None] * PER_SUPER + m[None, :, None]) * GROUP + g[None, None, :]
        top = tl.max(tl.max(_rank_values(row_ptr, cols, n, KIND), axis=2), axis=1)
        top_s = select16(_group_keys(top, sup * (PER_SUPER * GROUP), n, KIND, CP, RANK, scale, bias, EMULATE_FMA), SORT)
        # Key 0 (an empty supergroup / group) maps past the row, where every key is 0 again.
        sup = tl.where(top_s > 0, _column(top_s, CP, RANK) // (PER_SUPER * GROUP), SUPERS)
        first = (sup[:, None] * PER_SUPER + m[None, :]) * GROUP  # [16, PER_SUPER]
        top = tl.max(_rank_values(row_ptr, first[:, :, None] + g[None, None, :], n, KIND), axis=2)
        top_g = select16(
            tl.reshape(_group_keys(top, first, n, KIND, CP, RANK, scale, bias, EMULATE_FMA), [TOPK * PER_SUPER]), SORT
        )
        grp = tl.where(top_g > 0, _column(top_g, CP, RANK) // GROUP, SUPERS * PER_SUPER)
        cand = row_keys(row_ptr, grp[:, None] * GROUP + g[None, :], n, KIND, CP, RANK, scale, bias, EMULATE_FMA)
        best = select16(tl.reshape(cand, [TOPK * GROUP]), SORT)
    return best


@triton.jit
def warp_groups_top16(
    row_ptr,
    n,
    scratch,
    CP: tl.constexpr,
    RANK: tl.constexpr,
    GROUPS: tl.constexpr,
    GROUP: tl.constexpr,
    ASM: tl.constexpr,
    CONSTRAINTS: tl.constexpr,
    SORT: tl.constexpr,
):
    """The 16 largest KEY_EXACT keys of columns ``j < n`` of a row of GROUPS x GROUP columns
    (GROUP 4 or 8), descending, on one warp (GPUs), in two levels: the 16 groups of GROUP
    consecutive columns with the largest stand-in keys (``_group_keys``), selected by
    the PTX block of ``warp_ptx`` (ASM, CONSTRAINTS: ``warp_asm_options(GROUPS)``), then the
    best 16 of their members (16 x GROUP keys), the group keys through ``scratch`` (16 int64
    of this program's own). ``row_ptr`` 16-byte aligned, 3 floats readable past any column
    below n (``fast.cp.score_row_stride``)."""
    tl.static_assert(GROUP == 4 or GROUP == 8, "groups of 4 or 8 columns (policy.WIDE_MAX_GROUP)")
    # each group's maximum from 16-byte loads, all in flight together (one L2 request a sector)
    first = tl.arange(0, GROUPS) * GROUP
    top = _quad_max(row_ptr + first, first, n)
    for q in tl.static_range(4, GROUP, 4):
        top = tl.maximum(top, _quad_max(row_ptr + first + q, first + q, n))
    keys = _group_keys(top, first, n, KEY_EXACT, CP, RANK, 0.0, 0.0, False)
    # Not pure: its shuffles need the whole warp, so the block must stay where it is.
    out, fill = tl.inline_asm_elementwise(
        ASM, CONSTRAINTS, [keys], dtype=(tl.int64, tl.int64), is_pure=False, pack=GROUPS // 32
    )
    store_warp_slots(out, fill, scratch)
    tl.debug_barrier()  # one warp: its lanes' stores before any lane's load
    top_g = tl.load(scratch + tl.arange(0, TOPK))
    # Key 0 (fewer than 16 groups start below n) maps past the row, where every key is 0.
    grp = tl.where(top_g > 0, _column(top_g, CP, RANK) // GROUP, GROUPS)
    cand = row_keys(
        row_ptr, grp[:, None] * GROUP + tl.arange(0, GROUP)[None, :], n, KEY_EXACT, CP, RANK, 0.0, 0.0, False
    )
    return select16(tl.reshape(cand, [TOPK * GROUP]), SORT)


# four fp32 words at a 16-byte aligned address where $5 != 0, else zeros: one vector load
_LOAD_QUAD = tl.constexpr("""{
.reg .pred p;
setp.ne.b32 p, $5, 0;
mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; mov.b32 $3, 0;
@p ld.global.v4.b32 {$0, $1, $2, $3}, [$4];
}""")


@triton.jit
def _quad_max(ptrs, j, n):
    """The largest ``_rank_values`` (KEY_EXACT) of columns j .. j + 3 at ``ptrs`` (16-byte
    aligned; any shape), least where j + k >= n (any bits there; nothing read from n on)."""
    # Not pure: a pure asm could be hoisted above the wait for the scores' producer.
    w = tl.inline_asm_elementwise(
        _LOAD_QUAD, "=r,=r,=r,=r,l,r", [ptrs, (j < n).to(tl.int32)], dtype=(tl.int32,) * 4, is_pure=False, pack=1
    )
    a = tl.maximum(tl.where(j < n, ordered_bits(w[0]), -(2**31)), tl.where(j + 1 < n, ordered_bits(w[1]), -(2**31)))
    b = tl.maximum(tl.where(j + 2 < n, ordered_bits(w[2]), -(2**31)), tl.where(j + 3 < n, ordered_bits(w[3]), -(2**31)))
    return tl.maximum(a, b)


@triton.jit
def store_warp_slots(out, fill, row):
    """Store the PTX block's result at ``row`` (16 int64): each selected key (``out``: key |
    (slot + 1) << 56, else 0) at its slot, the fill key K* (``fill``) from ``filled`` on."""
    slot = (out >> 56).to(tl.int32) - 1
    fill = tl.max(fill, axis=0)
    k = tl.arange(0, TOPK)
    tl.store(row + slot, out & _LOW56, mask=slot >= 0)
    tl.store(row + k, tl.zeros([TOPK], tl.int64) + (fill & _LOW56), mask=k >= (fill >> 56).to(tl.int32))


@triton.jit
def row_top16(
    row_ptr,
    n,
    s,
    loaded,
    cols,
    parts,
    count_ptr,
    KIND: tl.constexpr,
    CP: tl.constexpr,
    RANK: tl.constexpr,
    scale,
    bias,
    EMULATE_FMA: tl.constexpr,
    SLICE: tl.constexpr,
    SPLIT: tl.constexpr,
    SELECT: tl.constexpr,
    SORT: tl.constexpr,
):
    """The 16 largest keys of a row's columns ``j < n``, descending, by the one select path:
    (best, done), ``done`` true in the program that holds the row's result."""
    one_chunk: tl.constexpr = SLICE <= SELECT.chunk
    if one_chunk:
        best = select16(value_keys(loaded, cols, n, KIND, CP, RANK, scale, bias, EMULATE_FMA), SORT)
    else:
        best = tl.zeros([TOPK], key_dtype(KIND))
    done = s == s  # a true scalar: SPLIT 1 holds its result in every program
    if SPLIT == 1:
        if not one_chunk:
            best = top16(row_ptr, n, KIND, CP, RANK, scale, bias, EMULATE_FMA, SELECT, SORT)
    else:
        if one_chunk:
            done = publish_slice(parts, count_ptr, s, best, SPLIT)
        else:
            done = slice_top16(
                row_ptr,
                n,
                s,
                parts,
                count_ptr,
                KIND,
                CP,
                RANK,
                scale,
                bias,
                EMULATE_FMA,
                SLICE,
                SPLIT,
                SELECT,
                SORT,
            )
        if done:
            best = merged16(parts, count_ptr, SPLIT, SORT)
    return best, done


@triton.jit
def push_row_top16(
    row_ptr,
    n,
    s,
    loaded,
    cols,
    part_ptr,
    count_ptr,
    row,
    CP: tl.constexpr,
    RANK: tl.constexpr,
    SLICE: tl.constexpr,
    SPLIT: tl.constexpr,
    SELECT: tl.constexpr,
    SORT: tl.constexpr,
):
    """``row_top16`` as both formats' CP pushes rank a row: KEY_EXACT keys of page ``j * CP +
    RANK``, in the scratch and count of ``row`` (the push's (row, head) program index)."""
    return row_top16(
        row_ptr,
        n,
        s,
        loaded,
        cols,
        part_ptr + row * (SPLIT * TOPK),
        count_ptr + row,
        KEY_EXACT,
        CP,
        RANK,
        0.0,
        0.0,
        False,
        SLICE,
        SPLIT,
        SELECT,
        SORT,
    )


@triton.jit
def slice_top16(
    row_ptr,
    n,
    s,
    parts,
    count_ptr,
    KIND: tl.constexpr,
    CP: tl.constexpr,
    RANK: tl.constexpr,
    scale,
    bias,
    EMULATE_FMA: tl.constexpr,
    SLICE: tl.constexpr,
    SPLIT: tl.constexpr,
    SELECT: tl.constexpr,
    SORT: tl.constexpr,
):
    """Slice ``s`` of a row split over SPLIT programs: the top 16 of its columns [s * SLICE,
    (s + 1) * SLICE) below n into ``parts[s * 16 ..]``, counted in at ``count_ptr``;
    whether it was the row's last slice (``merged16`` then takes them all)."""
    first = s * SLICE
    # A slice past the row's columns (its width is rounded up to a power of two): no page.
    mine = tl.zeros([TOPK], key_dtype(KIND))
    if first < n:
        mine = top16(
            row_ptr + first,
            tl.minimum(n - first, SLICE),
            KIND,
            CP,
            RANK,
            scale,
            bias,
            EMULATE_FMA,
            SELECT,
            SORT,
        )
        mine = tl.where(mine > 0, mine - first * CP, 0).to(mine.dtype)
    return publish_slice(parts, count_ptr, s, mine, SPLIT)


@triton.jit
def publish_slice(parts, count_ptr, s, mine, SPLIT: tl.constexpr):
    """Slice ``s``'s top 16 (descending) into ``parts[s * 16 ..]``, reversed in even slices
    (``merge_runs16``'s runs), counted in at ``count_ptr``; whether it was the last slice."""
    k = tl.arange(0, TOPK)
    tl.store(parts + s * TOPK + tl.where(s % 2 == 0, TOPK - 1 - k, k), mine)
    # every thread's store before the acq_rel count: the last slice sees every other's keys
    tl.debug_barrier()
    return tl.atomic_add(count_ptr, 1, sem="acq_rel") == SPLIT - 1


@triton.jit
def merged16(parts, count_ptr, SPLIT: tl.constexpr, SORT: tl.constexpr):
    """The row's best 16 of its SPLIT slices' (exact: keys are unique), for the last slice of
    ``slice_top16``, which re-arms the count for the next call."""
    keys = tl.load(parts + tl.arange(0, SPLIT * TOPK), volatile=True)
    if SORT:
        best = merge_runs16(keys)
    else:
        best = select16(keys, SORT)
    tl.store(count_ptr, 0)
    return best


@triton.constexpr_function
def _bits(n):
    """log2 of a power of two, at compile time."""
    return n.bit_length() - 1


@triton.constexpr_function
def _along(dims, axis):
    """The shape [1, .., 2, .., 1] of ``dims`` axes, 2 at ``axis``."""
    return [2 if a == axis else 1 for a in range(dims)]


@triton.jit
def _xor(a, b):
    """``tl.reduce``'s combine for ``_exchange``."""
    return a ^ b


@triton.jit
def _exchange(h, axis: tl.constexpr, descending):
    """One compare-exchange of a bitonic network on a hypercube-shaped block (every axis of
    size 2; element i's bit b on axis ``len(shape) - 1 - b``): along ``axis`` each pair
    keeps its smaller first, or its larger first where ``descending`` (broadcast) holds."""
    partner = h ^ tl.reduce(h, axis, _xor, keep_dims=True)
    first = tl.reshape(tl.arange(0, 2), _along(len(h.shape), axis)) == 0
    return tl.where(first != descending, tl.minimum(h, partner), tl.maximum(h, partner))


@triton.jit
def merge_runs16(keys):
    """The 16 largest of ``keys`` ([R * 16], R a power of two >= 2), descending, where run r
    (keys 16 r .. 16 r + 15) is sorted ascending for even r and descending for odd r
    (``publish_slice``'s layout): bitonic top-k without its first phase."""
    DIMS: tl.constexpr = _bits(keys.shape[0])
    # One run would come back as stored (ascending), not merged: merged16 has SPLIT >= 2.
    tl.static_assert(DIMS > 4, "merge_runs16 merges two runs of 16 or more")
    h = tl.reshape(keys, [2] * DIMS)
    for level in tl.static_range(DIMS - 4):
        # h has DIMS - level axes here, bit b of the index on axis DIMS - level - 1 - b
        h = tl.max(h, axis=DIMS - level - 5)  # runs 2m and 2m + 1 (index bit 4) folded
        if DIMS - level - 1 > 4:  # more levels: run m of the result descending where m is odd
            descending = tl.reshape(tl.arange(0, 2), _along(DIMS - level - 1, DIMS - level - 6)) == 1
        else:
            descending = True
        for b in tl.static_range(3, -1, -1):  # bits 3 .. 0 of the merged runs
            h = _exchange(h, DIMS - level - 2 - b, descending)
    return tl.reshape(h, [TOPK])


@triton.jit
def _rank_values(row_ptr, j, n, KIND: tl.constexpr):
    """Per score column j (any shape), a value in its key's score order, the least where
    j >= n: KEY_EXACT the ordered bits as int32 (-0 below +0), KEY_STOCK the fp32 score."""
    valid = j < n
    rank = _rank(tl.load(row_ptr + j, mask=valid, other=0.0), KIND)
    if KIND == KEY_EXACT:
        return tl.where(valid, rank, -(2**31))
    else:
        return tl.where(valid, rank, float("-inf"))


@triton.jit
def _rank(score, KIND: tl.constexpr):
    """``_rank_values`` of loaded fp32 scores, every one taken as valid."""
    if KIND == KEY_EXACT:
        return ordered_bits(score.to(tl.int32, bitcast=True))
    else:
        return score


@triton.jit
def ordered_bits(bits):
    """fp32 bits (int32) -> int32 whose signed order is the floats' total order, -0 below +0."""
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _group_keys(
    top, first, n, KIND: tl.constexpr, CP: tl.constexpr, RANK: tl.constexpr, scale, bias, EMULATE_FMA: tl.constexpr
):
    """Stand-in keys of groups of consecutive columns: the score part from ``top`` (the max
    ``_rank_values`` of the group), the page part from its first column ``first``; 0 where
    the group starts past n. They order the groups exactly as their largest true keys do."""
    valid = first < n
    # An empty group's top is the least rank value (-inf for KEY_STOCK): 0 keeps it out of fmaf.
    return tl.where(
        valid, _key(tl.where(valid, top, 0), (first * CP + RANK).to(tl.int64), KIND, scale, bias, EMULATE_FMA), 0
    )


@triton.jit
def _column(keys, CP: tl.constexpr, RANK: tl.constexpr):
    """Score column of each valid key (its page is column * CP + RANK), int32."""
    return (((0xFFFF - (keys & 0xFFFF)) - RANK) // CP).to(tl.int32)


@triton.jit
def keys_to_pages(keys):
    """Page id of each key (low 16 bits hold 0xFFFF - page); -1 for key 0."""
    return tl.where(keys > 0, (0xFFFF - (keys & 0xFFFF)).to(tl.int32), -1)


@triton.jit
def fmaf(a, b, c, EMULATE: tl.constexpr):
    """fp32 ``a * b + c`` with one rounding (emulated where the interpreter's rounds twice)."""
    if EMULATE:
        p = a.to(tl.float64) * b.to(tl.float64)
        c64 = c.to(tl.float64)
        s = p + c64
        bv = s - p
        err = (p - (s - bv)) + (c64 - bv)
        bits = s.to(tl.int64, bitcast=True)
        away_from_zero = (err > 0) == (s > 0)
        fix = (err != 0) & ((bits & 1) == 0)
        bits = tl.where(fix, bits + tl.where(away_from_zero, 1, -1), bits)
        return bits.to(tl.float64, bitcast=True).to(tl.float32)
    else:
        return tl.fma(a, b, c)
