"""The scorers' instructions by part, against the read ceiling's budget (the budget tables
of bench/PERF.md): each instruction of a listing compiled with line info
(``sass.scorer_sass(..., lines=True)``) takes the part of the kernel function whose source
line issued it, the MMAs theirs by opcode. The NVFP4 wgmma scorer's parts a page
(``source_parts``, ``parts_per_page``), the MSA mma scorer's a half-block
(``msa_source_parts``)."""

from __future__ import annotations

import collections
import functools
import re

from indexer_constants import HEAD_DIM, PAGE_BYTES

from .sass_listing import OPCODE, main_loop_span

# The wgmma scorer's parts (the budget table of bench/PERF.md), by the function whose
# source line issues an instruction (nvdisasm's line info: the innermost line, inlining
# undone), the MMAs by their opcodes. A line of the kernel itself is its setup before the
# page loop, the loop's own control, or the epilogue after it; a line of Triton's library
# (a reduction's combine) is the maximum's.
_FUNCTION_PART = {
    "dequant_fragment": "decode",
    "decode_groups": "decode",
    "decode_groups_e4m3": "decode",
    "_fragment": "decode",
    "_fragment_e4m3": "decode",
    "_byte": "decode",
}
# The page maxima's module (kernels/page_maxima.py), by function: the per-page fold is the
# maximum's, the once-a-program reduction the epilogue's.
_MAXIMA_PART = {
    "page_max": "maximum",
    "partials_of": "maximum",
    "own_tokens_max": "maximum",
    "column_maxima": "epilogue",
    "alloc_maxima": "setup",
}
PARTS = ("loads", "decode", "MMA", "maximum", "setup", "loop", "epilogue", "other")
_MMA_OPS = {"HMMA", "HGMMA", "WARPGROUP"}
# The integer / logic and compare / select opcodes, which the ALU pipe issues at half the
# rate of the schedulers (16 lanes a partition on sm_90), conversions to fp16 included.
ALU_OPS = {"LOP3", "PLOP3", "PRMT", "F2FP", "SHF", "IADD3", "LEA", "ISETP", "SEL", "FMNMX", "FSEL", "FSETP"}
_FILE_LINE = re.compile(r'//## File "([^"]+)", line (\d+)')


def _module_functions(module) -> tuple[list[str], list[tuple[str, range]]]:
    """A module's source lines and its top-level functions as (name, line numbers)."""
    import ast
    import inspect

    source = inspect.getsource(module)
    functions = [
        (node.name, range(node.lineno, node.end_lineno + 1))
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef)
    ]
    return source.splitlines(), functions


@functools.cache
def _maxima_line_parts() -> dict[int, str]:
    """Line number of fast/kernels/page_maxima.py -> its part (parsed once)."""
    from fast.kernels import page_maxima

    _, functions = _module_functions(page_maxima)
    return {i: _MAXIMA_PART.get(name, "other") for name, lines in functions for i in lines}


@functools.cache
def _scorer_line_parts() -> dict[int, str]:
    """Line number of fast/kernels/scorer_wgmma.py -> its part (parsed once)."""
    from fast.kernels import scorer_wgmma

    text, functions = _module_functions(scorer_wgmma)
    parts: dict[int, str] = {}
    for name, lines in functions:
        if name == "score_kernel_wgmma":  # setup | the page loops | the epilogue
            start = next(i for i in lines if text[i - 1].strip().startswith("for i in "))
            # the epilogue from the barrier before the maxima's reduction, the kernel's last
            end = max(i for i in lines if text[i - 1].strip().startswith("gl.thread_barrier()"))
            parts.update((i, "setup" if i < start else "loop" if i < end else "epilogue") for i in lines)
            continue
        loading = False  # inside the statement that loads the block ahead (one or more lines)
        for i in lines:
            code = text[i - 1]
            if name in ("_block", "score_block"):
                loading = loading or "load_nth_block(" in code
                parts[i] = "loads" if loading else "MMA" if "mma" in code else "loop"
                loading = loading and not code.rstrip().endswith(")")
            else:
                parts[i] = _FUNCTION_PART.get(name, "other")
    return parts


def _count_parts(sass: str, part_at, span: range | None = None, alu: bool = False) -> collections.Counter:
    """Part -> instructions of a listing with line info: each instruction takes the part
    ``part_at(path, line, part_before)`` gave its latest source line, the MMAs theirs by
    opcode (ptxas moves their line info onto their neighbours'); span: only the listing's
    lines in it; alu: only those of ``ALU_OPS``."""
    counts: collections.Counter = collections.Counter()
    part = "other"
    for i, line in enumerate(sass.splitlines()):
        if m := _FILE_LINE.search(line):
            part = part_at(m.group(1), int(m.group(2)), part)
        elif (op := OPCODE.match(line)) and (span is None or i in span) and (not alu or op.group(1) in ALU_OPS):
            counts["MMA" if op.group(1) in _MMA_OPS else part] += 1
    return counts


def source_parts(sass: str, span: range | None = None, alu: bool = False) -> collections.Counter:
    """Part (``PARTS``) -> instructions, over a listing with line info (``scorer_sass(...,
    lines=True)``), or over its lines ``span`` only (``main_loop_span``); alu: only those of
    ``ALU_OPS``."""
    by_line, maxima_lines = _scorer_line_parts(), _maxima_line_parts()

    def part_at(path: str, number: int, before: str) -> str:
        if path.endswith("kernels/scorer_wgmma.py"):
            return by_line.get(number, "other")
        if path.endswith("kernels/page_maxima.py"):
            return maxima_lines.get(number, "other")
        if path.endswith("kernels/column_order.py"):
            return "setup"  # q's tile, once per program
        if path.endswith(("fast/kernels/page_ring.py", "fast/kernels/loads.py")):
            return "loads"  # the loads, the ring's copies, waits and reads, the block-id guard
        if "/triton/language/" in path:
            return "maximum"  # a reduction's combine (gl.max)
        if path.endswith("kernels/rules.py"):
            return before  # a per-row rule, inlined where the kernel's line calls it
        return "other"

    return _count_parts(sass, part_at, span, alu)


# Instructions a page and thread may take at the read ceiling: a page every ~540 cycles per
# SM (PERF.md's budget) and 4 schedulers issuing one warp instruction a cycle, over a
# program's 4 warps; of them ALU_OPS at half that rate.
ISSUE_BUDGET = 540
ALU_BUDGET = ISSUE_BUDGET // 2


def parts_per_page(sass: str, pages: int, alu: bool = False) -> dict[str, float]:
    """Part -> instructions (alu: of ``ALU_OPS``) per page and thread of a program of
    ``pages`` pages: the listing once, its page loop (if any) ``pages - 1`` more times, over
    ``pages``."""
    whole, loop = source_parts(sass, alu=alu), source_parts(sass, main_loop_span(sass), alu=alu)
    return {part: (whole[part] + (pages - 1) * loop[part]) / pages for part in PARTS}


# The MSA mma scorer's parts (the MSA budget of bench/PERF.md), by the same line info:
# its ring (the half-blocks' copies, waits and read-back: block_ring.py, page_ring.py and
# the kernel's copy helpers), the conversion of a half-block's raw elements to the MMA's
# operand, the MMAs (by opcode), the token mask (on a request's last blocks only), the
# block maxima, and once a program its setup (the ids, q's tile) and epilogue (the maxima's
# reduction, the stores). Its half-blocks are unrolled: the listing is the whole program.
_MSA_FUNCTION_PART = {
    "column_blocks": "setup",  # the program's block ids, once
    "_fragment": "convert",
    # scorer_dot's helpers, which the mma scorer calls too
    "to_operand": "convert",
    "is_nan_element": "setup",
}
MSA_PARTS = ("ring", "convert", "MMA", "mask", "maximum", "setup", "loop", "epilogue", "other")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


@functools.cache
def _msa_line_parts() -> dict[str, dict[int, str]]:
    """Module file name -> (line number -> part) for the MSA mma scorer's own module and
    the kernel modules it calls (parsed once): column_order, page_maxima, and the dot
    scorer's helpers with the E4M3 conversion under them."""
    from fast.kernels import column_order, e4m3
    from fast.msa.kernels import loads, scorer_dot, scorer_mma

    text, functions = _module_functions(scorer_mma)
    own: dict[int, str] = {}
    for name, lines in functions:
        if name != "msa_score_kernel_mma":
            own.update((i, _MSA_FUNCTION_PART.get(name, "other")) for i in lines)
            continue
        # the scoring loop is the kernel's half-block loop; it ends at the first line
        # indented no deeper than its ``for``
        loops = [i for i in lines if text[i - 1].strip().startswith("for k in gl.static_range(2 * PPP)")]
        start = loops[-1]
        depth = _indent(text[start - 1])
        end = next(i for i in lines if i > start and text[i - 1].strip() and _indent(text[i - 1]) <= depth)
        own.update((i, "setup" if i < start else "loop" if i < end else "epilogue") for i in lines)
        # the mask: its block's id (g) and its branch's body
        for i in range(start, end):
            code = text[i - 1].strip()
            if code.startswith("g = "):
                own[i] = "mask"
            elif code.startswith("if (g + 1)"):
                j = i + 1
                while j < end and (not text[j - 1].strip() or _indent(text[j - 1]) > _indent(text[i - 1])):
                    own[j] = "mask"
                    j += 1
                own[i] = "mask"
    _, order = _module_functions(column_order)
    _, shared = _module_functions(scorer_dot)
    _, conversion = _module_functions(e4m3)
    _, feed = _module_functions(loads)
    return {
        # the copies' helpers are the ring's, but the block ids loaded once
        "msa/kernels/loads.py": {i: _MSA_FUNCTION_PART.get(f, "ring") for f, lines in feed for i in lines},
        "msa/kernels/scorer_mma.py": own,
        # the operand and NaN helpers it shares with the dot scorer, and the E4M3 conversion
        "msa/kernels/scorer_dot.py": {i: _MSA_FUNCTION_PART.get(f, "other") for f, lines in shared for i in lines},
        "kernels/e4m3.py": {i: "convert" for _, lines in conversion for i in lines},
        "kernels/page_maxima.py": _maxima_line_parts(),
        "kernels/column_order.py": {
            i: "convert" if name == "logical_columns" else "setup" for name, lines in order for i in lines
        },
    }


def msa_source_parts(sass: str, alu: bool = False) -> collections.Counter:
    """Part (``MSA_PARTS``) -> instructions of the MSA mma scorer's listing (with line
    info); alu: only those of ``ALU_OPS``. A line of Triton's library (a reduction's
    combine) or of the per-row rules takes the part of the kernel line before it."""
    by_file = _msa_line_parts()

    def part_at(path: str, number: int, before: str) -> str:
        module = next((name for name in by_file if path.endswith(name)), None)
        if module is not None:
            return by_file[module].get(number, "other")
        if path.endswith(("msa/kernels/block_ring.py", "kernels/page_ring.py")):
            return "ring"
        # Triton's library (a reduction's combine) and the per-row rules (kernels/rules.py)
        # are inlined where the kernel's line calls them: that line's part
        return before if "/triton/language/" in path or path.endswith("kernels/rules.py") else "other"

    return _count_parts(sass, part_at, alu=alu)


def msa_half_block_budget(element_bytes: int) -> int:
    """Instructions a thread may issue per 64-token half-block at the read ceiling: the
    NVFP4 page's ISSUE_BUDGET scaled by the half-block's bytes (8 KB E4M3, 16 KB BF16)."""
    return ISSUE_BUDGET * 64 * HEAD_DIM * element_bytes // PAGE_BYTES
