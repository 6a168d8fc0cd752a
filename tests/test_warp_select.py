"""The push's warp select (fast/select/warp_ptx.py) on the CPU: its PTX block, run by a small
lockstep simulator of the 32 lanes over the instructions it uses, gives the exact top 16 of
any keys (the interpreter cannot run inline PTX; the GPU tests compare it with tl.topk)."""

import itertools
import random
import re

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

from fast.kernels.cp import _push_warp_top16
from fast.select.policy import (
    MAX_COLUMNS,
    MIN_COLUMNS,
    PUSH_GROUP,
    WIDE_MAX_GROUP,
    WIDE_MAX_KEYS,
    SelectShape,
    push_group,
    warp_select_keys,
)
from fast.select.warp_ptx import batcher_pairs, warp_asm_options, warp_top16_asm
from support import on

M32, M64 = (1 << 32) - 1, (1 << 64) - 1
LANES = 32


def _operand(regs: dict, x: str) -> int:
    if re.fullmatch(r"-?\d+|0x[0-9a-f]+", x):
        return int(x, 0)
    return regs[x]


_ALU = {
    "mov.b64": lambda a: a[0],
    "mov.b32": lambda a: a[0],
    "max.u32": lambda a: max(a[0] & M32, a[1] & M32),
    "min.u32": lambda a: min(a[0] & M32, a[1] & M32),
    "add.u32": lambda a: (a[0] + a[1]) & M32,
    "sub.u32": lambda a: (a[0] - a[1]) & M32,
    "shr.u32": lambda a: (a[0] & M32) >> a[1],
    "and.b32": lambda a: a[0] & a[1] & M32,
    "shr.b64": lambda a: (a[0] & M64) >> a[1],
    "shl.b64": lambda a: (a[0] << a[1]) & M64,
    "or.b64": lambda a: (a[0] | a[1]) & M64,
    "cvt.u32.u64": lambda a: a[0] & M32,
    "cvt.u64.u32": lambda a: a[0] & M32,
    "setp.gt.u32": lambda a: (a[0] & M32) > (a[1] & M32),
    "setp.ge.u32": lambda a: (a[0] & M32) >= (a[1] & M32),
    "setp.eq.u32": lambda a: (a[0] & M32) == (a[1] & M32),
    "and.pred": lambda a: a[0] and a[1],
    "or.pred": lambda a: a[0] or a[1],
    "selp.u32": lambda a: a[0] if a[2] else a[1],
    "selp.b64": lambda a: a[0] if a[2] else a[1],
}


def run_block(asm: str, keys_by_lane: list[list[int]]) -> list[dict]:
    """Every lane's registers after running ``asm`` with operands $2P.. = its P keys.
    Instructions outside the block's vocabulary raise: the simulator must not guess."""
    per_lane = len(keys_by_lane[0])
    regs = [{f"${2 * per_lane + i}": k for i, k in enumerate(keys)} for keys in keys_by_lane]
    body = asm.strip()
    assert body[0] == "{" and body[-1] == "}"
    stmts = [s.strip() for s in body[1:-1].replace("\n", " ").replace(":", ":;").split(";") if s.strip()]
    labels = {s[:-1]: i for i, s in enumerate(stmts) if s.endswith(":")}
    pc = 0
    while pc < len(stmts):
        stmt = stmts[pc]
        pc += 1
        if stmt.startswith(".reg") or stmt.endswith(":"):
            continue
        guard = None
        if stmt.startswith("@"):
            guard, stmt = stmt.split(None, 1)
            guard = guard[1:]
        op, rest = stmt.split(None, 1)
        args = [a.strip() for a in rest.split(",")]
        if op == "bra.uni":  # must be uniform: every lane agrees
            (taken,) = {True} if guard is None else {r[guard] for r in regs}
            if taken:
                pc = labels[args[0]]
            continue
        if op.startswith("shfl.sync."):
            mode, src, off = op.split(".")[2], args[1], int(args[2])
            assert args[3:] == ["0x1f" if mode == "bfly" else "0", "-1"], stmt
            vals = [r[src] for r in regs]
            for lane, r in enumerate(regs):
                if mode == "bfly":
                    r[args[0]] = vals[lane ^ off]
                else:  # up, with the "from a lane in range" predicate
                    dst, ok = args[0].split("|")
                    r[dst], r[ok] = (vals[lane - off], True) if lane >= off else (vals[lane], False)
            continue
        fn = _ALU[op]
        for r in regs:
            if guard is None or r[guard]:
                r[args[0]] = fn([_operand(r, a) for a in args[1:]])
    return regs


def warp_top16(keys: list[int]) -> list[int]:
    """The block's result for a warp holding ``keys`` (lane l: keys l, l + 32, ...),
    assembled as push_kernel stores it: the selected keys at their slots, K* after them."""
    per_lane = len(keys) // LANES
    regs = run_block(warp_top16_asm(per_lane), [keys[lane::LANES] for lane in range(LANES)])
    (fill,) = {r[f"${per_lane + i}"] for r in regs for i in range(per_lane)}
    filled, star = fill >> 56, fill & ((1 << 56) - 1)
    out = [None] * 16
    for r in regs:
        for i in range(per_lane):
            o = r[f"${i}"]
            if o:
                slot = (o >> 56) - 1
                assert slot < filled and out[slot] is None, "two keys for one slot, or a slot past the filled ones"
                out[slot] = o & ((1 << 56) - 1)
    assert all(k is not None for k in out[:filled])
    return out[:filled] + [star] * (16 - filled)


def _key(score_bits: int, page: int) -> int:
    return 1 << 48 | score_bits << 16 | (0xFFFF - page)


def _keys(pattern: str, n: int, rng: random.Random) -> list[int]:
    pages = rng.sample(range(2 * n), n)
    if pattern == "random":
        return [_key(rng.getrandbits(32), p) for p in pages]
    if pattern == "ties":  # four distinct scores: ties at the 16th
        return [_key(rng.randrange(4) << 20, p) for p in pages]
    if pattern == "low bit":  # equal but for the score's lowest bit: ties only below bit 17
        return [_key(0x3F800000 | rng.randrange(2), p) for p in pages]
    if pattern == "few valid":  # fewer than 16 valid keys: the rest no page (0)
        keys = [0] * n
        for i in rng.sample(range(n), rng.randrange(16)):
            keys[i] = _key(rng.getrandbits(32), pages[i])
        return keys
    raise ValueError(pattern)


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from([1, 2, 4, 8, 16, 32]),
    st.sampled_from(["random", "ties", "low bit", "few valid"]),
    st.integers(0, 2**32),
)
def test_block_selects_the_exact_top16(per_lane, pattern, seed):
    keys = _keys(pattern, LANES * per_lane, random.Random(seed))
    assert sorted(warp_top16(keys), reverse=True) == sorted(keys, reverse=True)[:16]


def test_block_has_teeth():
    """A block whose pass B is skipped (ties at T taken whole) selects more than 16 keys:
    the assembly above notices (the test would not pass a wrong block)."""
    keys = _keys("ties", LANES * 16, random.Random(1))
    broken = warp_top16_asm(16).replace("@q bra.uni SLOTS;", "bra.uni SLOTS;")
    regs = run_block(broken, [keys[lane::LANES] for lane in range(LANES)])
    selected = sum(1 for r in regs for i in range(16) if r[f"${i}"])
    assert selected > 16


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_batcher_network_sorts_every_01_input(n):
    """Sorting networks sort everything iff they sort every 0/1 input."""
    pairs = batcher_pairs(n)
    for bits in itertools.product((0, 1), repeat=n):
        v = list(bits)
        for i, j in pairs:
            v[i], v[j] = max(v[i], v[j]), min(v[i], v[j])
        assert v == sorted(bits, reverse=True)


def test_push_gives_the_block_512_to_1024_keys_of_a_whole_row():
    one_chunk = SelectShape.for_width(1000)
    assert (
        warp_select_keys(1, MIN_COLUMNS, one_chunk) == MIN_COLUMNS
        and warp_select_keys(1, MAX_COLUMNS, one_chunk) == MAX_COLUMNS
    )
    assert warp_select_keys(1, 256, one_chunk) == 0  # tl.topk as fast there
    assert warp_select_keys(2, 512, one_chunk) == 0  # a split row merges its slices' keys
    # Wider rows: their groups' keys (the CP push's groups of PUSH_GROUP columns, or
    # WIDE_MAX_KEYS groups of up to WIDE_MAX_GROUP columns).
    w2048, w4096 = SelectShape.for_width(2047, group=PUSH_GROUP), SelectShape.for_width(4095, group=PUSH_GROUP)
    assert warp_select_keys(1, 2048, w2048) == WIDE_MAX_KEYS == 512 and push_group(2048, 512, w2048) == PUSH_GROUP
    assert warp_select_keys(1, 4096, w4096) == 512 and push_group(4096, 512, w4096) == WIDE_MAX_GROUP == 8
    assert (
        push_group(4096, 0, w4096) == PUSH_GROUP and push_group(512, 512, one_chunk) == one_chunk.group
    )  # three levels; one chunk
    assert warp_select_keys(1, 8192, SelectShape.for_width(8191, group=PUSH_GROUP)) == 0  # groups of 16 (CP = 1 only)
    assert warp_select_keys(1, 1024, SelectShape.for_width(1023, max_chunk=512, group=PUSH_GROUP)) == 0  # 256 groups
    with pytest.raises(ValueError, match="keys per lane"):
        warp_top16_asm(64)


# The PTX block on a GPU, against tl.topk (the simulation above runs everywhere).


@triton.jit
def _warp_top16_kernel(keys_ptr, ptrs, W: tl.constexpr, ASM: tl.constexpr, CONSTRAINTS: tl.constexpr):
    row = tl.program_id(0)
    keys = tl.load(keys_ptr + row * W + tl.arange(0, W))
    _push_warp_top16(keys, ptrs, 0, row * 16, True, 1, W // 32, ASM, CONSTRAINTS)


@pytest.mark.gpu  # inline PTX: GPUs only
@pytest.mark.parametrize("columns", [512, 1024])
@pytest.mark.parametrize("pattern", ["random", "ties", "low bit", "few valid", "none"])
def test_warp_select_block_stores_the_top16(columns, pattern):
    """The push's warp select on one warp (push_kernel's helper, one owner) stores each
    row's exact top 16 keys as a set: every pass, every fill (no valid key at all, too)."""
    gen = torch.Generator().manual_seed(columns)
    rows = 64
    score = torch.randint(0, 2**32, (rows, columns), generator=gen, dtype=torch.int64)
    if pattern == "ties":
        score = (score % 4) << 20
    elif pattern == "low bit":  # ties above bit 17 of the key: pass B among valid keys
        score = 0x3F800000 | (score % 2)
    pages = torch.argsort(torch.rand(rows, 2 * columns, generator=gen), dim=1)[:, :columns]
    keys = 1 << 48 | score << 16 | (0xFFFF - pages)
    if pattern in ("few valid", "none"):
        valid = torch.rand(rows, columns, generator=gen).argsort(dim=1) < (
            torch.randint(0, 16, (rows, 1), generator=gen) if pattern == "few valid" else 0
        )
        keys = torch.where(valid, keys, 0)
    out = on(torch.full((rows, 16), -1, dtype=torch.int64))
    ptrs = on(torch.tensor([out.data_ptr()], dtype=torch.int64))
    opts = warp_asm_options(columns)
    _warp_top16_kernel[(rows,)](
        on(keys), ptrs, W=columns, ASM=opts["WARP_ASM"], CONSTRAINTS=opts["WARP_CONSTRAINTS"], num_warps=1
    )
    assert torch.equal(out.cpu().sort(dim=1, descending=True).values, keys.sort(dim=1, descending=True).values[:, :16])


@pytest.mark.gpu  # inline PTX: GPUs only
@settings(max_examples=40, deadline=None)
@given(
    columns=st.sampled_from([512, 1024]),
    valid=st.integers(0, 1024),
    above=st.integers(0, 16),
    tied=st.integers(0, 48),
    low_bit=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_warp_select_block_on_drawn_tie_structures(columns, valid, above, tied, low_bit, seed):
    """The block's two passes meet at the 16th key: rows of ``valid`` keys (the rest no
    page), ``above`` of them with distinct scores over a tie score that ``tied`` more share
    (in their upper 31 key bits only where ``low_bit``: the score's last bit differs), the
    others below it, at random columns and pages — so pass A's threshold lands on, inside
    and past the tied run, and the fill meets every count of valid keys."""
    gen = torch.Generator().manual_seed(seed)
    rows, valid = 32, min(valid, columns)
    above, tied = min(above, valid), min(tied, valid - min(above, valid))
    tie = 1 << 30
    rank = torch.arange(columns).expand(rows, columns)
    high = (
        tie + 2 + 2 * torch.randperm(1 << 20, generator=gen)[:above].sort(descending=True).values
    )  # distinct, over the tie
    low = torch.randint(0, tie, (rows, columns), generator=gen, dtype=torch.int64)  # under it
    score = torch.where(rank < above, torch.cat([high, torch.zeros(columns - above, dtype=torch.int64)])[None, :], low)
    tied_score = tie | (torch.randint(0, 2, (rows, columns), generator=gen) if low_bit else 0)
    score = torch.where((rank >= above) & (rank < above + tied), tied_score, score)
    pages = torch.argsort(torch.rand(rows, 4 * columns, generator=gen), dim=1)[:, :columns]
    keys = torch.where(rank < valid, 1 << 48 | score << 16 | (0xFFFF - pages), 0)
    keys = keys.gather(1, torch.argsort(torch.rand(rows, columns, generator=gen), dim=1))  # at random columns
    out = on(torch.full((rows, 16), -1, dtype=torch.int64))
    ptrs = on(torch.tensor([out.data_ptr()], dtype=torch.int64))
    opts = warp_asm_options(columns)
    _warp_top16_kernel[(rows,)](
        on(keys), ptrs, W=columns, ASM=opts["WARP_ASM"], CONSTRAINTS=opts["WARP_CONSTRAINTS"], num_warps=1
    )
    assert torch.equal(out.cpu().sort(dim=1, descending=True).values, keys.sort(dim=1, descending=True).values[:, :16])
