"""The CP protocol's kernels (docs/DESIGN.md §6): compact table, q exchange, local top-16 +
push, and the merge, which flips the parity that makes back-to-back steps safe. Buffer
sets, parity, bounded spins and which requests are exchanged: docs/KERNELS.md, "The CP
protocol's kernels"."""

import triton
import triton.language as tl

from indexer_constants import PAGE, SLOTS, TOPK

from ..select.levels import (
    KEY_EXACT,
    RANKED,
    keys_to_pages,
    push_row_top16,
    select16_rows,
    store_warp_slots,
    value_keys,
    warp_groups_top16,
)
from .device import (
    ERR_MERGE_TIMEOUT,
    ERR_Q_TIMEOUT,
    clock_ns,
    deadline_ns,
    has_unwritten,
    pdl_release,
    pdl_wait,
    peer_ptr,
)
from .guards import BOUND_WORDS, record_input, request_verdict, row_id_bounds
from .rules import is_long_request, is_short_row, own_page, read_pages, row_query, short_row

_PAGE = tl.constexpr(PAGE)
_SLOTS = tl.constexpr(SLOTS)
_TOPK = tl.constexpr(TOPK)
_ERR_Q = tl.constexpr(ERR_Q_TIMEOUT)
_ERR_MERGE = tl.constexpr(ERR_MERGE_TIMEOUT)
_BOUND_WORDS = tl.constexpr(BOUND_WORDS)
# The merge's warps: with one, its poll's block holds one copy of each key (merge_kernel).
MERGE_WARPS = 1
_MERGE_WARPS = tl.constexpr(MERGE_WARPS)


@triton.jit
def compact_table_kernel(
    bt_ptr,  # int32 [B, P_table]
    seq_lens_ptr,  # int32 [B]
    cbt_ptr,  # int32 [B, W] out: compact page j -> global page j * CP + RANK
    score_lens_ptr,  # int32 [B] out: n_local * 128 + 8 (0 for a request with no long row)
    seq_out_ptr,  # int32 [B] out: the real lengths, in a buffer stable across steps
    n_local_ptr,  # int32 [B] out: pages this rank scores (the local top-16's bound)
    bounds_ptr,  # int32 [B, 4] out: guards.row_id_bounds of every column the decode reads
    P,
    stride_bt,
    W: tl.constexpr,
    CP: tl.constexpr,
    RANK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The length is a deliberate lie: n_local * 128 + 8 puts all 8 slots one page past the
    chunk, so the scorer stores every owned page for every slot. W - 1 >= n_local keeps that
    invented page addressable. The real causal cut comes back in the push. A request whose
    rows are all short gets length 0: nothing scored, nothing read."""
    b = tl.program_id(0)
    seq = tl.load(seq_lens_ptr + b)
    tl.store(seq_out_ptr + b, seq)
    hist = read_pages(seq, P)
    row_id_bounds(bt_ptr + b.to(tl.int64) * stride_bt, bounds_ptr + b * _BOUND_WORDS, hist, BLOCK)
    n_local = tl.minimum((hist + (CP - 1 - RANK)) // CP, W - 1)
    tl.store(n_local_ptr + b, n_local)
    tl.store(score_lens_ptr + b, tl.where(is_long_request(seq), n_local * _PAGE + _SLOTS, 0))
    for start in tl.static_range(0, W, BLOCK):
        j = start + tl.arange(0, BLOCK)
        src = tl.minimum(j * CP + RANK, P - 1)
        v = tl.load(bt_ptr + b.to(tl.int64) * stride_bt + src, mask=j < W)
        tl.store(cbt_ptr + b.to(tl.int64) * W + j, v, mask=j < W)


@triton.jit
def q_exchange_kernel(
    q_ptr,  # int32 [rows, HR * WORDS]: this rank's heads (the query elements as words)
    seq_lens_ptr,  # int32 [B]
    tile_ptrs,  # int64 [CP]: every rank's tile, 2 sets of [max_reqs, 8, H, WORDS] words
    parity_ptr,  # int64 [1]
    current_ptr,  # int64 [1] out: the parity, for the step's later kernels
    err_ptr,  # int32 [5]: the error record (word 0: the protocol's)
    set_words,
    timeout_ns,
    H: tl.constexpr,
    HR: tl.constexpr,
    R: tl.constexpr,
    HEAD0: tl.constexpr,
    CP: tl.constexpr,
    RANK: tl.constexpr,
    QLEN: tl.constexpr,
    WALL: tl.constexpr,  # the spin's clock: device.clock_ns
    PDL: tl.constexpr,
    WORDS: tl.constexpr = 32,  # int32 words of a head's query row: 32 (E4M3), 64 (bf16)
    HALVES: tl.constexpr = False,  # the unwritten element is 16 bits (bf16), not a byte
):
    """For a long request: store this rank's heads into every rank's tile (slot 8 - QLEN + i),
    then wait until this rank's own tile row holds no unwritten element, the all-ones byte
    (E4M3) or half-word (bf16: ``device.has_unwritten``) (not at all once a spin of
    this rank has given up: the record's protocol word is set); other rows do nothing.
    Every program copies the parity into ``current`` (the set of this step's later kernels)."""
    pdl_wait(PDL)  # for index_q's producer
    pdl_release(PDL)
    t = tl.program_id(0)
    b, _, slot = row_query(t, QLEN)
    seq = tl.load(seq_lens_ptr + b)
    parity = tl.load(parity_ptr)
    tl.store(current_ptr, parity)
    base = parity * set_words + (b * _SLOTS + slot) * (H * WORDS)
    tiles = peer_ptr(tile_ptrs, tl.arange(0, CP), tl.int32)  # every rank's
    hl = tl.arange(0, HR)
    w = (RANK % R) * (WORDS // R) + tl.arange(0, WORDS // R)  # this replica's words
    rows = tl.load(q_ptr + (t * HR + hl[:, None]) * WORDS + w[None, :])  # [HR, WORDS / R]
    local = peer_ptr(tile_ptrs, RANK, tl.int32) + base + tl.arange(0, H * WORDS)
    if is_long_request(seq):
        dst = (
            tiles[:, None, None] + (base + (HEAD0 + hl[:, None]) * WORDS + w[None, :])[None, :, :]
        )  # [CP, HR, WORDS / R]
        tl.store(dst, tl.broadcast_to(rows[None, :, :], [CP, HR, WORDS // R]))
        # a spin of this rank gave up earlier: do not wait again; read as a block, one verdict
        worst = tl.max(tl.load(err_ptr + tl.zeros([H * WORDS], tl.int32), volatile=True), axis=0)
        pending = has_unwritten(tl.load(local, volatile=True), HALVES)
        deadline = tl.where(worst != 0, 0, deadline_ns(timeout_ns, WALL))
        while pending & (clock_ns(WALL) < deadline):
            pending = has_unwritten(tl.load(local, volatile=True), HALVES)
        if pending & (worst == 0):  # the first spin to give up names itself
            tl.store(err_ptr, _ERR_Q)


@triton.jit
def push_kernel(
    score_ptr,  # fp32 [B, 8 * H, W] compact scores (row slot * H + head)
    seq_lens_ptr,  # int32 [B]
    n_local_ptr,  # int32 [B]
    bounds_ptr,  # int32 [B, 4]: the plan's id bounds
    num_blocks,  # N: the cache's blocks
    recv_ptrs,  # int64 [CP]: every rank's candidates, 2 sets of [CP, rows_max, HR, 16] int64
    current_ptr,  # int64 [1]: the step's buffer set (the exchange's copy of the parity)
    err_ptr,  # int32 [5]: the error record (word 0: the protocol's)
    part_ptr,  # int64 [rows * H * SPLIT, 16]: the slices' top 16 (SPLIT > 1), or a row's group keys (warp select)
    count_ptr,  # int32 [rows * H]: slices done (0 between calls)
    rows_max,
    set_elems,
    width,  # W: the scores' columns
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
    # the select shape of one slice (the row if SPLIT 1): a policy.SelectShape (the two
    # levels on one warp: SLICE / group keys, policy.push_group)
    SELECT: tl.constexpr,
    SORT: tl.constexpr,
    PDL: tl.constexpr,
    WARP_SELECT: tl.constexpr = False,  # one warp, a program a row: warp_select's PTX block
    WARP_ASM: tl.constexpr = "",  # selects (a one-chunk row's columns, or a wider row's group
    WARP_CONSTRAINTS: tl.constexpr = "",  # keys: warp_groups_top16); warp_asm_options' block
):
    """Per (query, head) with own + 1 > 16: the exact top 16 of this rank's pages below own,
    stored into slot RANK of every owner's candidates (any order: the merge sorts them).
    Releasing the merge right after its own wait means: when the merge runs, the scorer has
    finished reading the q tile."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    b, i, slot = row_query(t, QLEN)
    row_ptr = score_ptr + b.to(tl.int64) * stride_sb + (slot * H + h) * stride_sr
    # before the wait: what no kernel of the step writes (the lengths, the owners' addresses)
    n_local = tl.load(n_local_ptr + b)
    seq = tl.load(seq_lens_ptr + b)
    own = own_page(seq, slot)
    verdict, _, _ = request_verdict(bounds_ptr, b, seq, num_blocks, QLEN)
    owner0 = (h // HR) * R
    owners = peer_ptr(recv_ptrs, owner0 + tl.arange(0, R), tl.int64)  # [R]
    pdl_wait(PDL)
    pdl_release(PDL)
    # Where the row's 16 keys go, [R, 16]: slot RANK of the step's set, which the exchange
    # wrote before the scorer's wait ended (the push may launch before the exchange ends).
    slots = tl.load(current_ptr) * set_elems + ((RANK * rows_max + t) * HR + h % HR) * _TOPK
    dst = owners[:, None] + slots + tl.arange(0, _TOPK)[None, :]
    # a one-chunk slice loads right after the wait (its unwritten columns drop out of the keys)
    one_chunk: tl.constexpr = SLICE <= SELECT.chunk
    cols = s * SLICE + tl.arange(0, SLICE)
    if one_chunk:
        chunk = tl.load(row_ptr + cols, mask=cols < width, other=0.0)
    else:
        chunk = 0.0  # a longer slice reads its columns level by level (row_top16)
    healthy = tl.load(err_ptr, volatile=True) == 0
    # A request with a bad id or length pushes nothing: every rank's merge writes its rows
    # -1 without waiting (every rank reaches the same verdict).
    if ~is_short_row(own) & (verdict == 0):
        # The causal cut the lying length dropped, bounded by what the scorer stored (a
        # length past the table ranks the P pages it holds and reads no unwritten column).
        n_rank = tl.minimum((own + (CP - 1 - RANK)) // CP, n_local)
        if WARP_SELECT:
            tl.static_assert(SPLIT == 1, "the warp select takes a whole row")
            if one_chunk:
                keys = value_keys(chunk, cols, n_rank, KEY_EXACT, CP, RANK, 0.0, 0.0, False)
                _push_warp_top16(keys, recv_ptrs, owner0, slots, healthy, R, SLICE // 32, WARP_ASM, WARP_CONSTRAINTS)
            else:
                # Two levels: the split's scratch (unused: one program a row) holds the
                # row's 16 group keys between them.
                scratch = part_ptr + (t * H + h) * _TOPK
                GROUP: tl.constexpr = SELECT.group
                best = warp_groups_top16(
                    row_ptr, n_rank, scratch, CP, RANK, SLICE // GROUP, GROUP, WARP_ASM, WARP_CONSTRAINTS, SORT
                )
                _push(best, dst, healthy)
        else:
            best, done = push_row_top16(
                row_ptr,
                n_rank,
                s,
                chunk,
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
                _push(best, dst, healthy)


@triton.jit
def _push(best, dst, healthy):
    """Store a row's 16 keys at each row of ``dst`` ([R, 16] pointers: its owners' slots)
    if ``healthy`` (this process's error flag clear: after an exchange timeout the owners
    time out too rather than merge garbage)."""
    if healthy:
        tl.store(dst, best[None, :])


@triton.jit
def _push_warp_top16(
    keys,
    recv_ptrs,
    owner0,
    slots,
    healthy,
    R: tl.constexpr,
    KEYS: tl.constexpr,
    ASM: tl.constexpr,
    CONSTRAINTS: tl.constexpr,
):
    """``_push`` of the top 16 of a one-warp program's ``keys`` (KEYS per lane) at
    ``slots`` of owners owner0 .. owner0 + R - 1, selected by ``warp_select``'s PTX block
    (ASM, CONSTRAINTS: ``warp_top16_asm(KEYS)`` and its constraints): the selected keys at
    their slots, then its fill key K* at the slots they leave."""
    # Not pure: its shuffles need the whole warp, so the block must stay where it is.
    out, fill = tl.inline_asm_elementwise(
        ASM, CONSTRAINTS, [keys], dtype=(tl.int64, tl.int64), is_pure=False, pack=KEYS
    )
    if healthy:
        for o in tl.static_range(R):
            store_warp_slots(out, fill, peer_ptr(recv_ptrs, owner0 + o, tl.int64) + slots)


@triton.jit
def merged_output(out_ptr, t, best, own, init, local, HR: tl.constexpr):
    """§6's output of a merged long row (``merge_kernel``'s ``OUTPUT`` for NVFP4 keys), every
    head at once: from best, the heads' 16 best exact keys [HR, 16] (descending), their 15
    best pages, then the row's own page in slot 15, into out int32 [rows, HR, 16] at row t
    (§6 has no forced windows: init and local are unused)."""
    k = tl.arange(0, _TOPK)
    hl = tl.arange(0, HR)
    dst = out_ptr + (t * HR + hl[:, None]) * _TOPK + k[None, :]
    tl.store(dst, tl.where(k[None, :] == RANKED, own, keys_to_pages(best)))


@triton.jit
def merge_kernel(
    seq_lens_ptr,  # int32 [B]
    bounds_ptr,  # int32 [B, 4]: the plan's id bounds
    num_blocks,  # N: the cache's blocks
    recv_ptrs,  # int64 [CP]
    tile_ptrs,  # int64 [CP]
    current_ptr,  # int64 [1]: the step's buffer set (the exchange's copy of the parity)
    parity_ptr,  # int64 [1] out: the set of the layer's next long step
    err_ptr,  # int32 [5]: the error record (word 0: the protocol's)
    out_ptr,  # int32 [rows, HR, 16]
    rows_max,
    set_elems,
    set_words,
    timeout_ns,
    init,  # the output's forced windows (OUTPUT's; none in §6's)
    local,
    H: tl.constexpr,
    HR: tl.constexpr,
    CP: tl.constexpr,
    RANK: tl.constexpr,
    QLEN: tl.constexpr,
    SORT: tl.constexpr,
    WALL: tl.constexpr,  # the spin's clock: device.clock_ns
    PDL: tl.constexpr,
    WORDS: tl.constexpr = 32,  # int32 words of a head's query row in the tile (as the exchange's)
    OUTPUT: tl.constexpr = merged_output,  # the format's output of a merged row (a jit function)
):
    """Per row: short rows write [0..own, -1...]; long rows poll until none of the HR * CP *
    16 candidates of its heads is -1, write each head's output from its 16 best
    (``OUTPUT``) and reset the candidates to -1; for a long request, re-arm the row's tile
    slot to 0xFF and store the flipped parity (the layer's next long step uses the other
    buffer set)."""
    pdl_release(PDL)
    t = tl.program_id(0)
    b, i, slot = row_query(t, QLEN)
    seq = tl.load(seq_lens_ptr + b)
    own = own_page(seq, slot)
    k = tl.arange(0, _TOPK)
    current = tl.load(current_ptr)
    # the error flag: read as a block and reduced to one verdict, so no warp splits the poll
    flag = tl.load(err_ptr + tl.zeros([HR, CP * _TOPK], tl.int32), volatile=True)
    worst = tl.max(tl.max(flag, axis=1), axis=0)
    failed = worst != 0
    verdict, column, value = request_verdict(bounds_ptr, b, seq, num_blocks, QLEN)
    dead = (seq < QLEN) | (verdict != 0)
    if dead:
        if i == 0:
            record_input(err_ptr, verdict, b, column, value)
        for hl in tl.static_range(HR):
            tl.store(out_ptr + (t * HR + hl) * _TOPK + k, tl.full([_TOPK], -1, tl.int32))
    elif is_short_row(own):
        for hl in tl.static_range(HR):
            tl.store(out_ptr + (t * HR + hl) * _TOPK + k, tl.where(failed, -1, short_row(k, own)))
    else:
        recv = peer_ptr(recv_ptrs, RANK, tl.int64) + current * set_elems
        c = tl.arange(0, CP * _TOPK)  # candidate c: rank c // 16's key c % 16
        hl = tl.arange(0, HR)
        off = (((c[None, :] // _TOPK) * rows_max + t) * HR + hl[:, None]) * _TOPK + c[None, :] % _TOPK  # [HR, CP * 16]
        keys = tl.load(recv + off, volatile=True)
        pending = tl.min(tl.min(keys, axis=1), axis=0) < 0
        # An error already raised on this rank: its peers will time out, do not wait.
        deadline = tl.where(failed, 0, deadline_ns(timeout_ns, WALL))
        while pending & (clock_ns(WALL) < deadline):
            keys = tl.load(recv + off, volatile=True)
            pending = tl.min(tl.min(keys, axis=1), axis=0) < 0
        # one copy of each key a thread (MERGE_WARPS): reloaded after the barrier, every key is seen
        if HR * CP * _TOPK < 32 * _MERGE_WARPS:
            tl.debug_barrier()
            keys = tl.load(recv + off, volatile=True)
        dst = out_ptr + (t * HR + hl[:, None]) * _TOPK + k[None, :]  # [HR, 16]
        if pending & (worst == 0):  # the first spin to give up names itself (as the exchange's)
            tl.store(err_ptr, _ERR_MERGE)
        if pending | failed:
            tl.store(dst, tl.full([HR, _TOPK], -1, tl.int32))
        else:
            best = select16_rows(keys, SORT)
            OUTPUT(out_ptr, t, best, own, init, local, HR)
        tl.store(recv + off, tl.full([HR, CP * _TOPK], -1, tl.int64))
    if is_long_request(seq):  # only long requests were exchanged: the step used its buffer set
        if dead | is_short_row(own):
            pdl_wait(PDL)  # no push for this row: make sure the scorer is done before re-arming
        hw = tl.arange(0, H * WORDS)
        tile = peer_ptr(tile_ptrs, RANK, tl.int32) + current * set_words + (b * _SLOTS + slot) * (H * WORDS)
        tl.store(tile + hw, tl.full([H * WORDS], -1, tl.int32))
        tl.store(parity_ptr, 1 - current)
