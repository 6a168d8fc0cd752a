"""A warp's exact top 16 of int64 keys in one inline-PTX block: the CP push's select on one
warp over 512-1024 keys, where ``tl.topk``'s bitonic network would be the push's bulk. Its
two passes and output: docs/KERNELS.md, "The one-warp top-16" (checked lane by lane on the
CPU and against ``tl.topk`` on GPUs: tests/test_warp_select.py)."""

from __future__ import annotations


def batcher_pairs(n: int) -> list[tuple[int, int]]:
    """The comparators (i, j), i < j, of Batcher's odd-even merge sort of n values (a power
    of two): applying max to i and min to j for each, in order, sorts descending."""
    pairs = []
    p = 1
    while p < n:
        k = p
        while k >= 1:
            for j in range(k % p, n - k, 2 * k):
                for i in range(min(k, n - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return pairs


def _swap(lines: list, x: str, y: str) -> None:
    """Compare-exchange: x the larger, y the smaller (u32)."""
    lines.append(f"max.u32 t, {x}, {y}; min.u32 {y}, {x}, {y}; mov.b32 {x}, t;")


def _half_cleaners(lines: list, regs: list) -> None:
    """Sort a bitonic run of registers descending."""
    d = len(regs) // 2
    while d >= 1:
        for i in range(len(regs)):
            if i & d == 0:
                _swap(lines, regs[i], regs[i + d])
        d //= 2


def _warp_largest16(lines: list, keys: int, a: str, b: str) -> None:
    """Registers a0 .. a{keys - 1} of every lane -> a0 .. a15: the warp's 16 largest,
    descending, the same in every lane (b0 .. b15: the partner's list)."""
    for i, j in batcher_pairs(keys):
        _swap(lines, f"{a}{i}", f"{a}{j}")
    n = min(keys, 16)
    for off in (1, 2, 4, 8, 16):
        for i in range(n):
            lines.append(f"shfl.sync.bfly.b32 {b}{i}, {a}{i}, {off}, 0x1f, -1;")
        if 2 * n <= 16:  # both lists whole: mine, then the partner's reversed
            for i in range(n):
                lines.append(f"mov.b32 {a}{n + i}, {b}{n - 1 - i};")
            n *= 2
        else:  # the larger of mine and the partner's reversed: the top 16, bitonic
            for i in range(16):
                lines.append(f"max.u32 {a}{i}, {a}{i}, {b}{15 - i};")
        _half_cleaners(lines, [f"{a}{i}" for i in range(n)])


def _warp_sum(lines: list, dst: str, src: str) -> None:
    lines.append(f"mov.b32 {dst}, {src};")
    for off in (1, 2, 4, 8, 16):
        lines.append(f"shfl.sync.bfly.b32 y, {dst}, {off}, 0x1f, -1; add.u32 {dst}, {dst}, y;")


def _tie_key(lines: list, i: int) -> None:
    """q <- hi == T, y <- v of key i (its low 17 bits + 1)."""
    lines.append(f"setp.eq.u32 q, h{i}, T; cvt.u32.u64 y, k{i}; and.b32 y, y, 0x1ffff; add.u32 y, y, 1;")


def warp_top16_asm(keys: int) -> str:
    """The PTX block for ``keys`` keys per lane (a power of two, 1 .. 32): operands $0 ..
    $keys-1 the o outputs, $keys .. $2keys-1 the f outputs, $2keys .. the int64 keys."""
    if keys not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"keys per lane: {keys} (a power of two, 1..32)")
    regs = max(keys, 32)
    k = range(keys)
    lines = [
        "{",
        f".reg .b64 k<{keys}>, w, kf;",
        f".reg .b32 h<{keys}>, c<{regs}>, d<16>, t, y, cnt, G, E, T, T2, need, s;",
        f".reg .pred p<{keys}>, q, r;",
    ]
    for i in k:
        lines.append(f"mov.b64 k{i}, ${2 * keys + i}; shr.b64 w, k{i}, 17; cvt.u32.u64 h{i}, w; mov.b32 c{i}, h{i};")
    # Pass A.
    _warp_largest16(lines, keys, "c", "d")
    lines.append("mov.b32 T, c15; mov.b32 cnt, 0;")
    for i in k:  # #{hi > T} in the low half-word, #{hi >= T} in the high one
        lines.append(
            f"setp.gt.u32 q, h{i}, T; selp.u32 y, 1, 0, q; add.u32 cnt, cnt, y; setp.ge.u32 p{i}, h{i}, T; selp.u32 "
            f"y, 0x10000, 0, p{i}; add.u32 cnt, cnt, y;"
        )
    _warp_sum(lines, "G", "cnt")
    lines.append("shr.u32 E, G, 16; and.b32 G, G, 0xffff; mov.b64 kf, 0; mov.b32 s, 16; setp.eq.u32 q, E, 16;")
    lines.append("@q bra.uni SLOTS;")  # every lane has the same E: a uniform branch
    # Pass B.
    lines.append("sub.u32 need, 16, G;")
    for i in k:
        _tie_key(lines, i)
        lines.append(f"selp.u32 c{i}, y, 0, q;")
    _warp_largest16(lines, keys, "c", "d")
    lines.append("mov.b32 T2, 0;")
    for j in range(16):
        lines.append(f"setp.eq.u32 q, need, {j + 1}; selp.u32 T2, c{j}, T2, q;")
    lines.append("mov.b32 cnt, 0;")
    for i in k:
        _tie_key(lines, i)
        lines.append(
            f"setp.gt.u32 r, y, T2; and.pred q, q, r; setp.gt.u32 r, h{i}, T; or.pred p{i}, q, r; selp.u32 y, 1, 0, "
            f"p{i}; add.u32 cnt, cnt, y;"
        )
    _warp_sum(lines, "s", "cnt")
    lines.append("cvt.u64.u32 kf, T; shl.b64 kf, kf, 17; sub.u32 y, T2, 1; cvt.u64.u32 w, y; or.b64 kf, kf, w;")
    # The selected keys' slots: the lane's count, an exclusive prefix sum over lanes.
    lines.append("SLOTS:")
    lines.append("mov.b32 cnt, 0;")
    for i in k:
        lines.append(f"selp.u32 y, 1, 0, p{i}; add.u32 cnt, cnt, y;")
    lines.append("mov.b32 t, cnt;")
    for off in (1, 2, 4, 8, 16):
        lines.append(f"shfl.sync.up.b32 y|q, t, {off}, 0, -1; @q add.u32 t, t, y;")
    lines.append("sub.u32 t, t, cnt; add.u32 t, t, 1;")  # slot + 1 of the lane's first
    lines.append("cvt.u64.u32 w, s; shl.b64 w, w, 56; or.b64 kf, kf, w;")
    for i in k:
        lines.append(
            f"cvt.u64.u32 w, t; shl.b64 w, w, 56; or.b64 w, w, k{i}; selp.b64 ${i}, w, 0, p{i}; "
            f"selp.u32 y, 1, 0, p{i}; add.u32 t, t, y; mov.b64 ${keys + i}, kf;"
        )
    lines.append("}")
    return "\n".join(lines)


def warp_top16_constraints(keys: int) -> str:
    """The block's operand constraints: 2 x ``keys`` int64 outputs, ``keys`` int64 inputs."""
    return ",".join(["=l"] * (2 * keys) + ["l"] * keys)


def warp_asm_options(keys: int) -> dict:
    """push_kernel's WARP_SELECT / WARP_ASM / WARP_CONSTRAINTS for a one-warp select of
    ``keys`` keys (``warp_select_keys``)."""
    per_lane = keys // 32
    return {
        "WARP_SELECT": True,
        "WARP_ASM": warp_top16_asm(per_lane),
        "WARP_CONSTRAINTS": warp_top16_constraints(per_lane),
    }
