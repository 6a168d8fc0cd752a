"""What an nvdisasm listing of a kernel holds, read as text: the opcode mix, the longest
loop (the scorers' page or half-block loop) and how far ahead of its first use each global
load is issued; and, from its resource line, how many programs an SM holds. ``sass.py``
compiles the listings; ``sass_parts.py`` attributes them to the scorers' parts."""

from __future__ import annotations

import collections
import re

# An instruction line of nvdisasm's listing: its address, a predicate if any, the opcode
# (group 1: without its modifiers).
_LINE = r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?"
OPCODE = re.compile(_LINE + r"([A-Z][A-Z0-9_]*)")


def instruction_mix(sass: str) -> collections.Counter:
    """Opcode (without modifiers) -> count, over the SASS listing."""
    return collections.Counter(re.findall(OPCODE.pattern, sass, flags=re.M))


def main_loop_span(sass: str, mma: bool = True) -> range:
    """The listing's line numbers (of ``sass.splitlines()``) from the label of its longest
    loop that multiplies (an MMA in it; any loop where not ``mma``) to that loop's backward
    branch; empty if none."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^(\.L_x_\d+):", line))}
    best, size = range(0), 0
    for i, line in enumerate(lines):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i:
            ops = [op.group(1) for op in map(OPCODE.match, lines[labels[m.group(1)] : i + 1]) if op]
            if (not mma or any(op.endswith("MMA") for op in ops)) and len(ops) > size:
                best, size = range(labels[m.group(1)], i + 1), len(ops)
    return best


def main_loop_mix(sass: str, mma: bool = True) -> collections.Counter:
    """Opcode -> count over the longest loop of the listing (label to its backward branch)
    that multiplies (an MMA in it; any loop where not ``mma``): in the wgmma scorer, one page
    per trip — the instructions per page and thread that bench/PERF.md counts. Empty if
    the listing has no such loop (the scorer at N = 8: its pages unrolled)."""
    lines = sass.splitlines()
    return collections.Counter(op.group(1) for i in main_loop_span(sass, mma) if (op := OPCODE.match(lines[i])))


_INSTRUCTION = re.compile(_LINE + r"([A-Z][A-Z0-9_.]*)\s*([^;]*);")  # opcode with modifiers, operands
_REGISTER = re.compile(r"\bR(\d+)(\.64)?\b")


def _registers(operands: str) -> set[int]:
    """The general registers an operand list names (``R8.64`` is R8 and R9)."""
    named = set()
    for number, wide in _REGISTER.findall(operands):
        named.update((int(number), int(number) + 1) if wide else (int(number),))
    return named


def load_use_distances(sass: str) -> list[tuple[str, int]]:
    """(opcode, instructions from the load to the first one reading its result) for every
    global load (``LDG``) of a listing, in the listing's straight-line order — exact for an
    unrolled body (the N 8 kernel), a lower bound across a loop's back edge (such loads, and
    those whose result is overwritten unread, are left out). It shows how far ahead of its
    use ptxas really issues a load the source issues blocks ahead."""
    code = [(m.group(1), m.group(2)) for line in sass.splitlines() if (m := _INSTRUCTION.match(line))]
    found = []
    for i, (op, operands) in enumerate(code):
        if not op.startswith("LDG"):
            continue
        target, _, _ = operands.partition(",")
        first = min(_registers(target), default=None)
        if first is None:
            continue
        width = {"128": 4, "64": 2}.get(op.rsplit(".", 1)[-1], 1)
        loaded = set(range(first, first + width))
        for j in range(i + 1, len(code)):
            later_op, later = code[j]
            head, _, rest = later.partition(",")
            # a store reads its first operand too; anything else writes it
            stores = later_op.startswith(("ST", "RED", "ATOM"))
            if loaded & _registers(later if stores else rest):
                found.append((op, j - i))
                break
            if not stores:
                loaded -= _registers(head)
            if not loaded:
                break
    return found


# An sm_90 SM: 64K 32-bit registers, handed out per warp in units of 256 (8 a thread); 228
# KB of shared memory, 1 KB of it reserved for each resident program; 64 warps.
SM_REGISTERS, SM_SHARED, PROGRAM_RESERVED, SM_WARPS = 65536, 228 * 1024, 1024, 64


def resources(usage: str) -> tuple[int, int, int]:
    """(registers a thread, static shared bytes, dynamic shared bytes) of a kernel's
    resource line (``sass.scorer_sass``': cuobjdump's, then ``DYNAMIC:``)."""
    found = (re.search(rf"(?:^|\s){key}:(\d+)", usage) for key in ("REG", "SHARED", "DYNAMIC"))
    return tuple(int(m.group(1)) for m in found)


def programs_per_sm(registers: int, shared: int, warps: int = 4) -> dict[str, int]:
    """How many programs of ``warps`` warps an sm_90 SM holds at once, by each resource a
    program asks for: ``registers`` a thread and ``shared`` bytes (static + dynamic). The
    least of them is what the SM runs; a policy that leaves shared memory the least where
    registers allow more wastes programs (bench/PERF.md)."""
    return {
        "registers": SM_REGISTERS // (-(-registers // 8) * 8 * 32 * warps),
        "shared memory": SM_SHARED // (shared + PROGRAM_RESERVED),
        "warps": SM_WARPS // warps,
    }
