"""The MSA block scorer (docs/DESIGN.md §10.2) for BF16 and FP8 keys by ``tl.dot``: one
kernel for GPUs and the interpreter. Operands, NaN rows and the interpreter's bf16:
docs/KERNELS.md, "The MSA dot scorer"."""

import triton
import triton.language as tl

from indexer_constants import HEAD_DIM, PAGE, SLOTS

from ...kernels.device import pdl_wait
from ...kernels.e4m3 import e4m3_bytes_to_f16
from ...kernels.guards import BAD_BLOCK, record_input, tile_set
from ...kernels.rules import query_position
from .rules import read_blocks

_PAGE = tl.constexpr(PAGE)
_DIM = tl.constexpr(HEAD_DIM)
_SLOTS = tl.constexpr(SLOTS)
_BAD_BLOCK = tl.constexpr(BAD_BLOCK)
_NONE = tl.constexpr(2**31 - 1)


@triton.jit
def bf16_bits_to_f32(raw):
    """int16 bf16 bit patterns (any shape) to their exact fp32 values."""
    return ((raw.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)


@triton.jit
def is_nan_element(raw, IS_FP8: tl.constexpr):
    """True where raw E4M3 bytes (uint8) or bf16 bits (int16) hold a NaN; the all-ones
    element, an exchange tile's "not written yet", is one."""
    b = raw.to(tl.int32)
    if IS_FP8:
        nan = (b & 0x7F) == 0x7F
    else:
        nan = (b & 0x7FFF) > 0x7F80
    return nan


@triton.jit
def to_operand(raw, IS_FP8: tl.constexpr, INTERPRETER: tl.constexpr, HW_E4M3: tl.constexpr):
    """The MMA operand of raw elements: f16 from E4M3 bytes (with HW_E4M3 the hardware's
    conversion, else integer arithmetic: ``kernels.e4m3``); bf16 from int16 bits, or under
    ``INTERPRETER`` their fp32 widening."""
    # One return after a constexpr if / elif / else: the compiler builds what follows an
    # early return in a constexpr branch as well.
    if IS_FP8:  # exact (NaN bytes aside, which the caller zeroes or masks)
        operand = e4m3_bytes_to_f16(raw, HW_E4M3)
    elif INTERPRETER:
        operand = bf16_bits_to_f32(raw)
    else:
        operand = raw.to(tl.bfloat16, bitcast=True)
    return operand


@triton.jit
def msa_score_kernel(
    q_ptr,  # [.., B, 8, HS, 128] query tile, raw: E4M3 bytes (uint8) or bf16 bits (int16)
    q_sel_ptr,  # int64 [1]: which tile set to read (SETS > 0; see q_set_stride)
    q_set_stride,  # elements between tile sets (0 where there is one)
    k_ptr,  # [N, 128, 128] keys, raw as the tile
    bt_ptr,  # int32 [B, W]: column j holds global block j * stride + offset
    lens_ptr,  # int32 [B]
    out_ptr,  # fp32 [B, 8 * HS, W]
    err_ptr,  # int32 [5]: the error record (RECORD)
    width,
    num_pages,  # P: blocks the full table holds
    stride,
    offset,
    num_blocks,  # N: ids outside [0, N) are never loaded
    stride_bt,
    stride_ob,
    stride_or,
    HS: tl.constexpr,
    SLOT0: tl.constexpr,  # the first slot scored: rows of earlier slots are left alone
    ROWS: tl.constexpr,  # (8 - SLOT0) * HS rounded up to the 16 rows tl.dot needs
    COLS: tl.constexpr,  # columns per program
    IS_FP8: tl.constexpr,
    INTERPRETER: tl.constexpr,  # operands the interpreter's way (above)
    HW_E4M3: tl.constexpr,  # E4M3 keys by the hardware's conversion (sm_89 and newer: fast.route)
    RECORD: tl.constexpr,  # record a bad id in err_ptr's record
    PDL: tl.constexpr,
    STAGES: tl.constexpr,  # software pipeline depth of the column loop (GPUs)
    SETS: tl.constexpr = 0,  # q_sel[0] picks one of SETS tile sets (outside them: NaN); 0: the tile, q_sel unread
):
    """Program (b, c) scores columns ``c * COLS ..`` of request b: computed when the global
    block ``g < min(ceil(len / 128), P)``, stored in a row when also ``128 g <= pos``, as the
    max over the block's tokens at positions ``<= pos``. A row whose query holds a NaN
    element (unwritten) stores NaN. An id outside ``[0, N)`` is never loaded: its column's
    stored rows get NaN, and with RECORD the first such column of the program is recorded."""
    b = tl.program_id(0)
    first = tl.program_id(1) * COLS
    pdl_wait(PDL)
    length = tl.load(lens_ptr + b)
    computed = read_blocks(length, num_pages)
    if first * stride + offset < computed:
        r = SLOT0 * HS + tl.arange(0, ROWS)
        d = tl.arange(0, _DIM)
        t = tl.arange(0, _PAGE)
        live_row = r < _SLOTS * HS
        pos = query_position(length, r // HS)  # [ROWS]: the query position of each row
        q_set, set_code, set_value = tile_set(q_sel_ptr, SETS)
        tile = q_ptr + q_set * q_set_stride + b.to(tl.int64) * (_SLOTS * HS * _DIM)
        q_raw = tl.load(tile + r[None, :] * _DIM + d[:, None], mask=live_row[None, :], other=0)  # [128, ROWS]
        unwritten = tl.max(is_nan_element(q_raw, IS_FP8).to(tl.int32), axis=0) > 0  # [ROWS]
        if SETS > 0:  # a tile set outside the sets: every row NaN, the record names it
            unwritten = unwritten | (set_code != 0)
            if RECORD:
                record_input(err_ptr, set_code, -1, -1, set_value)
        q = to_operand(tl.where(unwritten[None, :], 0, q_raw), IS_FP8, INTERPRETER, HW_E4M3)
        out_row = out_ptr + b.to(tl.int64) * stride_ob + r * stride_or
        bad_column = _NONE
        bad_id = _NONE
        for jj in tl.range(0, COLS, num_stages=STAGES):
            # Masks, not a branch: the loop stays one straight body the compiler can pipeline.
            j = first + jj
            g = j * stride + offset
            col = (j < width) & (g < computed)
            block = tl.load(bt_ptr + b.to(tl.int64) * stride_bt + j, mask=col, other=0)
            ok = col & (block >= 0) & (block < num_blocks)
            page = tl.where(ok, block, 0).to(tl.int64) * (_PAGE * _DIM)
            k_raw = tl.load(k_ptr + page + t[:, None] * _DIM + d[None, :], mask=ok, other=0)
            k = to_operand(k_raw, IS_FP8, INTERPRETER, HW_E4M3)  # [128 tokens, 128]
            if INTERPRETER:
                acc = tl.dot(k, q, input_precision="ieee", out_dtype=tl.float32)  # [128 tokens, ROWS]
            else:
                acc = tl.dot(k, q, out_dtype=tl.float32)
            visible = (g * _PAGE + t[:, None]) <= pos[None, :]
            score = tl.max(tl.where(visible, acc, float("-inf")), axis=0) + 0.0
            score = tl.where(ok & ~unwritten, score, float("nan"))
            tl.store(out_row + j, score, mask=col & live_row & (g * _PAGE <= pos))
            first_bad = col & ~ok & (bad_column == _NONE)
            bad_id = tl.where(first_bad, block, bad_id)
            bad_column = tl.where(first_bad, j, bad_column)
        if RECORD:
            record_input(err_ptr, tl.where(bad_column < _NONE, _BAD_BLOCK, 0), b, bad_column, bad_id)
