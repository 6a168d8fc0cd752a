"""``FAST_COMPILE_ONLY=1 python -m bench.sass [--kernel wgmma|prmt|msa-fp8|msa-bf16] [--hs N]
[--first-slot S] [--tokens T] [--pages P]``: compile a GPU scorer (the NVFP4 ones, or the MSA
format's mma kernel as ``score_blocks`` launches it) for sm_90 on any machine (the Triton
wheel carries ptxas and nvdisasm) and print its registers, shared memory, programs an SM and SASS instruction mix, whole
and over its main loop (wgmma: one page per trip) — the first look at a scorer change, at no
device time. ``--parts``: the scorer's instructions by part against the read ceiling's
budget (a page of the wgmma kernel, a half-block of the MSA one). ``--dump FILE`` writes
the whole SASS. ``--kernels``: compile the decode's
other Triton kernels instead (the portable route's scorers, the top-16 selects in each split
mode, the exchange, the merge, ...) — the interpreter runs Python, so a kernel it accepts can
still fail Triton's compiler (a name bound only inside a runtime ``if``, say); with
``--capability 80`` (86, 89, 100, 120) for that GPU, as the portable route launches them.

This module compiles (and holds the command line); ``sass_listing.py`` reads a listing (the
mix, the loop, load-to-use distances) and ``sass_parts.py`` splits it into the scorers'
parts against the budget.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

from fast.kernels.cp import (
    MERGE_WARPS,
    compact_table_kernel,
    merge_kernel,
    merged_output,
    push_kernel,
    q_exchange_kernel,
)
from fast.kernels.guards import table_bounds_kernel
from fast.kernels.scorer_table import score_kernel_table
from fast.kernels.scorer_wgmma import score_kernel_wgmma
from fast.kernels.stock import q_to_tile_kernel, stock_topk_kernel
from fast.msa.kernels.cp import msa_compact_table_kernel, msa_merged_output, msa_push_kernel
from fast.msa.kernels.scorer_dot import msa_score_kernel
from fast.msa.kernels.scorer_mma import msa_score_kernel_mma
from fast.msa.kernels.stock import msa_bounds_kernel, msa_stock_select_kernel
from fast.msa.scorer import mma_constants, mma_partials
from fast.scorer import (
    long_row_pages,
    mma_rows,
    rows_for,
    wgmma_options,
)
from fast.select.policy import PUSH_GROUP, QUEUED_PER_SM, SelectShape, push_group, push_warps, warp_select_keys
from fast.select.warp_ptx import warp_asm_options
from indexer_constants import PAGE, SLOTS

from .msa_probes import msa_score_kernel_loads
from .probes import score_kernel_loads
from .sass_listing import instruction_mix, load_use_distances, main_loop_mix, programs_per_sm, resources
from .sass_parts import (
    ALU_BUDGET,
    ISSUE_BUDGET,
    MSA_PARTS,
    PARTS,
    msa_half_block_budget,
    msa_source_parts,
    parts_per_page,
)
from .scorer_prmt import score_kernel_prmt
from .variants import (
    DECODES,
    PARTIALS,
    PRMT_PAGES,
    PRMT_TOKENS,
    RING_SCORERS,
    decode_mma,
    for_kernel,
    tune_wgmma,
)

# The GPUs a route is defined for (fast.route): sm_90's Hopper route, the others' portable one.
CAPABILITIES = (80, 86, 89, 90, 100, 120)

_SIGNATURE = {
    "q_ptr": "*u8",
    "q_sel_ptr": "*i64",
    "q_set_stride": "i64",
    "k_ptr": "*u8",
    "k64_ptr": "*i64",
    "bt_ptr": "*i32",
    "lens_ptr": "*i32",
    "out_ptr": "*fp32",
    "err_ptr": "*i32",
    "num_blocks": "i32",
    "W": "i32",
    "stride_bt": "i32",
    "stride_ob": "i32",
    "stride_or": "i32",
    "HS": "constexpr",
    "SLOT0": "constexpr",
    "ROWS": "constexpr",
    "PPP": "constexpr",
    "TOK": "constexpr",
    "PDL": "constexpr",
}


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _aligned(signature: dict) -> dict:
    """Every pointer 16-byte aligned, as the launcher specializes them at run time (our
    tensors are): without it the compile would not vectorize what the GPU's does."""
    return {(i,): [["tt.divisibility", 16]] for i, t in enumerate(signature.values()) if t.startswith("*")}


def program_pages(kernel: str, rows: int, mma: str, pages: int | None = None) -> int:
    """A Gluon scorer's pages a program as ``scorer_sass`` compiles it: ``pages``, else the
    policy's on long rows at N = ``rows`` on the ``mma`` route (``long_row_pages``; the
    MSA kernel's for "msa-fp8" / "msa-bf16")."""
    return pages or long_row_pages(rows, mma, msa=kernel.startswith("msa-"))


def scorer_sass(
    kernel: str,
    hs: int,
    tokens: int | None,
    pages: int | None,
    num_warps: int = 4,
    depth: int | None = None,
    first_slot: int = 0,
    pdl: bool = False,
    lines: bool = False,
    ring: int | None = None,
    loads_only: bool = False,
    decode: str = "exact",
    guard: bool = True,
    register_cap: int | str = "auto",
    partials: int | None = None,
    ring_scorer: str | None = None,
    sets: int = 0,
) -> tuple[str, str]:
    """(resource line — cuobjdump's, then ``DYNAMIC:`` bytes of dynamic shared memory — and
    SASS text) of scorer ``kernel`` ("wgmma", "prmt", or the MSA format's
    mma kernel "msa-fp8" / "msa-bf16") compiled for sm_90
    (pages / depth / tokens None: the kernel's defaults; depth: wgmma's blocks ahead; tokens:
    prmt's tokens per MMA block; first_slot: as ``score_pages``' — 7 is a query_len 1 step;
    pdl: as the decodes launch it, with PDL and, wgmma, the prefetch before its wait;
    lines: the listing carries nvdisasm's source lines, for ``source_parts``; ring: wgmma's
    pages in its shared-memory ring, 0 for the register pipeline, or the MSA kernel's
    half-blocks in its ring (``score_blocks``' stages); None the policy's); loads_only: the
    probe of the kernel's loads in its place (``variant_launch``' and
    ``block_variant_launch``'); decode: the wgmma kernel's decode or a probe of it, guard
    False: the wgmma kernel without its block-id guard, register_cap: its registers a
    thread ("auto": the policy's), partials: its partial maxima a page and row (None: the
    policy's), ring_scorer: one of ``ring_variants``' ring loops in place of the kernel's
    own (``variant_launch``'); sets: the Gluon kernels' tile sets (SETS: 2 as the CP
    decodes launch them, 0 as the stock decodes and ``score_pages``)."""
    if kernel != "wgmma" and (register_cap != "auto" or partials is not None or ring_scorer):
        raise ValueError(f"register_cap / partials: the wgmma kernel's, not {kernel!r}'s")
    mma = decode_mma(decode)  # the E4M3-MMA route (or its probe), as the launchers take it
    live = (8 - first_slot) * hs
    common = {"HS": hs, "SLOT0": first_slot, "PDL": pdl}
    sets_kw = {"SETS": sets}  # the Gluon kernels' (their loads probes drop it: for_kernel)
    options: dict = {}
    if kernel.startswith("msa-"):
        rows = mma_rows(live)
        ppp = program_pages(kernel, rows, mma, pages)
        raw = "*u8" if kernel == "msa-fp8" else "*i16"
        names = "q_ptr q_sel_ptr q_set_stride k_ptr bt_ptr lens_ptr out_ptr err_ptr width num_pages stride offset"
        types = [raw, "*i64", "i64", raw, "*i32", "*i32", "*fp32", "*i32"] + ["i32"] * 8
        signature = dict(zip(f"{names} num_blocks stride_bt stride_ob stride_or desc_ptr".split(), types + ["i64"]))
        constexprs = (
            common
            | {
                "ROWS": rows,
                "PPP": ppp,
                "PARTS": mma_partials(rows, ppp),
                "IS_FP8": kernel == "msa-fp8",
                "RECORD": True,
            }
            | sets_kw
        )
        dtype = torch.float8_e4m3fn if kernel == "msa-fp8" else torch.bfloat16
        ring_constants = mma_constants(dtype, rows, ppp, ring, mma)  # as score_blocks launches it
        if "maxnreg" in ring_constants:
            options["maxnreg"] = ring_constants.pop("maxnreg")
        constexprs |= ring_constants
        if loads_only:  # the probe's kernel takes the same operands and ring
            constexprs = for_kernel(msa_score_kernel_loads, constexprs)
        src = _source(msa_score_kernel_loads if loads_only else msa_score_kernel_mma, signature, constexprs)
        num_warps = 4
    elif kernel == "wgmma":
        # the policy at this shape (its program of ``pages``, else long rows'), tuned as
        # ``variant_launch`` tunes it (``tune_wgmma``: the same checks)
        ppp = program_pages(kernel, mma_rows(live), mma, pages)
        tuned = tune_wgmma(
            wgmma_options(hs, first_slot, 1, 1, 1, mma),
            decode=decode,
            pages_per_program=ppp,
            blocks_ahead=depth,
            register_cap=register_cap,
            loads_only=loads_only,
            guard=guard,
            ring=ring,
            partials=partials,
            ring_scorer=ring_scorer,
        )
        if "maxnreg" in tuned:
            options["maxnreg"] = tuned.pop("maxnreg")  # as score_pages launches it, or the variant's
        tuned.pop("num_warps")
        constexprs = common | tuned | sets_kw | {"PREFETCH": pdl, "RELEASE": False, "RECORD": False}
        fn = score_kernel_wgmma
        if loads_only:  # the probe's kernel, fed from registers, the table through L1
            fn = score_kernel_loads
            constexprs = for_kernel(fn, constexprs)
        fields = list(_SIGNATURE.items())
        fields[5:5] = [("tab_ptr", "*i64"), ("tab_stride", "i32")]  # after k64_ptr: the scale tables
        src = _source(fn, {k: v for k, v in fields if k != "TOK"}, constexprs)
        num_warps = 4  # one warpgroup
    else:
        constexprs = common | {"ROWS": rows_for(live), "PPP": pages or PRMT_PAGES, "TOK": tokens or PRMT_TOKENS}
        # a bench variant without the guard's operands
        signature = {k: v for k, v in _SIGNATURE.items() if k not in ("err_ptr", "num_blocks")}
        src = _source(score_kernel_prmt, signature, constexprs)
    kernel = _compile_source(src, num_warps, options)
    # cuobjdump's SHARED is the static shared memory (the page ring's arrays among it);
    # Triton's metadata holds the dynamic size the launch asks for
    usage = f"{_resources(kernel.asm['cubin'])} DYNAMIC:{kernel.metadata.shared}"
    return usage, disassemble(kernel.asm["cubin"], lines)


def disassemble(cubin: bytes, lines: bool = False) -> str:
    """nvdisasm's listing of a cubin (lines: with its source lines)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        flags = ["-c", "--print-line-info"] if lines else ["-c"]
        return subprocess.run([_tool("nvdisasm"), *flags, f.name], capture_output=True, text=True, check=True).stdout


def _resources(cubin: bytes) -> str:
    """cuobjdump's resource line of a one-kernel cubin ("REG:80 STACK:0 SHARED:..")."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run(
            [_tool("cuobjdump"), "--dump-resource-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    return next(line.strip() for line in usage.splitlines() if "REG:" in line)


# msa_stock_select_kernel's arguments as the compiles below spell them
_MSA_SELECT_ARGS = (
    "score_ptr:*fp32 seq_lens_ptr:*i32 bounds_ptr:*i32 num_blocks:i32 err_ptr:*i32 out_ptr:*i32 "
    "part_ptr:*i64 count_ptr:*i32 P:i32 init:i32 local:i32 stride_sb:i32 stride_sr:i32"
)


def msa_select_row_sass(width: int = 1024) -> str:
    """The SASS of the MSA stock select on a row of ``width`` columns in one chunk on one
    program (``ascending.best_in_column_order``'s path), specialized as the launcher does:
    every pointer and the score strides divisible by 16 (the stock score buffer's rows,
    ``stock.stock_row_stride``), the table's width P too where ``width`` is. The row comes
    in 16-byte loads at any width (``tests/test_sass.py`` holds it: loaded one column a
    thread, every step of the select's sorting network was a shuffle)."""
    shape = SelectShape.for_width(width)
    constexprs = {"HS": 1, "QLEN": 1, "SLICE": triton.next_power_of_2(width), "SPLIT": 1} | shape.constexprs()
    constexprs |= {"EMULATE_FMA": False, "SORT": True, "PDL": True}
    divisible = ("stride_sb", "stride_sr") + (("P",) if width % 16 == 0 else ())
    kernel = _compile_triton(msa_stock_select_kernel, _MSA_SELECT_ARGS, constexprs, 4, divisible)
    return disassemble(kernel.asm["cubin"])


def launch_defaults(fn, constexprs: dict) -> dict:
    """``constexprs`` completed with every constexpr parameter of kernel ``fn`` they leave
    out, at its default. Why: a launch takes a parameter's default, but a compile from an
    AST source takes a missing one as None — falsy, so ``GUARD: constexpr = True`` compiled
    the scorer without its block-id guard, unlike every decode."""
    return {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default} | constexprs


def _compile_source(src, warps: int, options: dict | None = None, capability: int = 90):
    """Compile source ``src`` (``_source``) for sm_90 (or ``capability``) on ``warps`` warps,
    here: no GPU needed."""
    target = GPUTarget("cuda", capability, 32)
    return triton.compile(src, target=target, options={"num_warps": warps} | (options or {}))


def _source(fn, signature: dict, constexprs: dict, attrs: dict | None = None):
    """The compile source of kernel ``fn`` (Gluon's or Triton's) as a launch builds it: its
    run-time ``signature``, ``constexprs`` with every one left out at its default
    (``launch_defaults``), and ``attrs`` (default: every pointer 16-byte aligned)."""
    constexprs = launch_defaults(fn, constexprs)
    attrs = _aligned(signature) if attrs is None else attrs
    signature = signature | {k: "constexpr" for k in constexprs}
    kind = GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource
    return kind(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)


def _compile_triton(fn, args: str, constexprs: dict, warps: int, divisible: tuple = (), capability: int = 90):
    """A Triton kernel compiled for sm_90 (or ``capability``) on ``warps`` warps: ``args``
    its run-time arguments ("name:type ..."), ``constexprs`` the rest. ``divisible``:
    integer arguments taken as multiples of 16, every pointer then 16-byte aligned too — as
    the launcher specializes them where they are (without it nothing is taken as aligned)."""
    signature = dict(a.split(":") for a in args.split())
    attrs = {}
    if divisible:
        attrs = _aligned(signature) | {
            (i,): [["tt.divisibility", 16]] for i, name in enumerate(signature) if name in divisible
        }
    return _compile_source(_source(fn, signature, constexprs, attrs), warps, capability=capability)


def compile_kernels(capability: int = 90) -> list[str]:
    """Compile the decode's Triton kernels other than the Hopper route's scorers for sm_90
    (or ``capability``: a portable route's GPU, PDL compiled in from sm_90 on as
    ``fast.route`` allows it), on the warps they are launched with: the portable route's
    scorers (the NVFP4 table scorer, the MSA dot scorer), the stock top-16 and the CP push at one and four programs per
    row (1024 columns: the three-level select unsplit at a chunk of 512, single selects of
    256 split, one select of the row at a chunk of 1024; the unsplit pushes also on the
    warps of a queued grid, ``push_warps``, where one warp of 1024 columns runs the warp
    select, and that select at 512 columns and in two levels at 2048 and 4096), the q
    exchange, the merge, the compact table, the q-to-tile copy and the stock plan's id
    bounds. One "name: REG:.." line
    each; raises on a compile error."""
    cp = {"H": 4, "HR": 2, "CP": 2, "RANK": 1, "QLEN": 2, "PDL": True}
    kernels = [
        (
            "q exchange",
            q_exchange_kernel,
            "q_ptr:*i32 seq_lens_ptr:*i32 tile_ptrs:*i64 parity_ptr:*i64 current_ptr:*i64 err_ptr:*i32 set_words:i32 "
            "timeout_ns:i64",
            cp | {"R": 1, "HEAD0": 2, "WALL": False, "WORDS": 32, "HALVES": False},
        ),
        (
            "q exchange bf16",
            q_exchange_kernel,
            "q_ptr:*i32 seq_lens_ptr:*i32 tile_ptrs:*i64 parity_ptr:*i64 current_ptr:*i64 err_ptr:*i32 set_words:i32 "
            "timeout_ns:i64",
            cp | {"R": 1, "HEAD0": 2, "WALL": False, "WORDS": 64, "HALVES": True},
        ),
        *(
            (
                name,
                merge_kernel,
                "seq_lens_ptr:*i32 bounds_ptr:*i32 num_blocks:i32 recv_ptrs:*i64 tile_ptrs:*i64 current_ptr:*i64 "
                "parity_ptr:*i64 err_ptr:*i32 out_ptr:*i32 rows_max:i32 set_elems:i32 set_words:i32 timeout_ns:i64 "
                "init:i32 local:i32",
                cp | {"SORT": True, "WALL": False} | extra,
            )
            for name, extra in (
                ("merge", {"WORDS": 32, "OUTPUT": merged_output}),
                ("msa merge bf16", {"WORDS": 64, "OUTPUT": msa_merged_output}),
            )
        ),
        (
            "msa compact table",
            msa_compact_table_kernel,
            "bt_ptr:*i32 seq_lens_ptr:*i32 cbt_ptr:*i32 score_lens_ptr:*i32 seq_out_ptr:*i32 n_local_ptr:*i32 "
            "bounds_ptr:*i32 P:i32 stride_bt:i32",
            {"W": 512, "CP": 2, "RANK": 1, "BLOCK": 512},
        ),
        *(
            (
                f"msa push split={split}",
                msa_push_kernel,
                "score_ptr:*fp32 seq_lens_ptr:*i32 n_local_ptr:*i32 bounds_ptr:*i32 num_blocks:i32 recv_ptrs:*i64 "
                "current_ptr:*i64 err_ptr:*i32 part_ptr:*i64 count_ptr:*i32 rows_max:i32 set_elems:i32 init:i32 "
                "local:i32 stride_sb:i32 stride_sr:i32",
                cp | {"R": 1, "SLICE": 2048 // split, "SPLIT": split, "SORT": True} | shape.constexprs(),
            )
            # a 2048-column row in three levels, and split in four slices of one chunk
            for split, shape in ((1, SelectShape.for_width(2048, 512)), (4, SelectShape.for_width(512, 512)))
        ),
        (
            "compact table",
            compact_table_kernel,
            "bt_ptr:*i32 seq_lens_ptr:*i32 cbt_ptr:*i32 score_lens_ptr:*i32 seq_out_ptr:*i32 n_local_ptr:*i32 "
            "bounds_ptr:*i32 P:i32 stride_bt:i32",
            {"W": 513, "CP": 2, "RANK": 1, "BLOCK": 1024},
        ),
        ("q to tile", q_to_tile_kernel, "q_ptr:*i32 tile_ptr:*i32", {"HS": 2, "QLEN": 2, "PDL": True, "WORDS": 32}),
        (
            "q to tile bf16",
            q_to_tile_kernel,
            "q_ptr:*i32 tile_ptr:*i32",
            {"HS": 2, "QLEN": 2, "PDL": True, "WORDS": 64},
        ),
        *(
            (
                f"msa scorer {name}",
                msa_score_kernel,
                f"q_ptr:*{raw} q_sel_ptr:*i64 q_set_stride:i32 k_ptr:*{raw} bt_ptr:*i32 lens_ptr:*i32 out_ptr:*fp32 "
                "err_ptr:*i32 width:i32 num_pages:i32 stride:i32 offset:i32 num_blocks:i32 stride_bt:i32 "
                "stride_ob:i32 stride_or:i32",
                {
                    "HS": 4,
                    "SLOT0": 0,
                    "ROWS": 32,
                    "COLS": 4,
                    "IS_FP8": name == "fp8",
                    "INTERPRETER": False,
                    "HW_E4M3": capability >= 89,  # fast.route.HW_E4M3_FROM
                    "RECORD": True,
                    "PDL": True,
                    "STAGES": 2,
                },
            )
            for name, raw in (("fp8", "u8"), ("bf16", "i16"))
        ),
        *(
            (
                f"msa stock select columns={width} split={split}",
                msa_stock_select_kernel,
                _MSA_SELECT_ARGS,
                {"HS": 2, "QLEN": 2, "SLICE": width // split, "SPLIT": split}
                | shape.constexprs()
                | {"EMULATE_FMA": False, "SORT": True, "PDL": True},
            )
            # a 2048-column row in three levels, split in four slices of one chunk, and a
            # 1024-column row in one chunk on one program (the select in column order)
            for width, split, shape in (
                (2048, 1, SelectShape.for_width(2048, 512)),
                (2048, 4, SelectShape.for_width(512, 512)),
                (1024, 1, SelectShape.for_width(1024)),
            )
        ),
        (
            "msa bounds",
            msa_bounds_kernel,
            "bt_ptr:*i32 seq_lens_ptr:*i32 bounds_ptr:*i32 P:i32 stride_bt:i32",
            {"BLOCK": 1024},
        ),
        (
            "table bounds",
            table_bounds_kernel,
            "bt_ptr:*i32 seq_lens_ptr:*i32 bounds_ptr:*i32 P:i32 stride_bt:i32",
            {"BLOCK": 1024},
        ),
    ]
    push_args = (
        "score_ptr:*fp32 seq_lens_ptr:*i32 n_local_ptr:*i32 bounds_ptr:*i32 num_blocks:i32 recv_ptrs:*i64 "
        "current_ptr:*i64 err_ptr:*i32 "
        "part_ptr:*i64 count_ptr:*i32 rows_max:i32 set_elems:i32 width:i32 stride_sb:i32 stride_sr:i32"
    )
    for split, chunk in ((1, 512), (4, 512), (1, 1024)):
        shape = SelectShape.for_width(1024 // split, chunk)
        select = {"SPLIT": split, "SORT": True} | shape.constexprs()
        push = select | cp | {"R": 1, "SLICE": 1024 // split}
        kernels += [
            (
                f"stock top-16 split={split} chunk={shape.chunk}",
                stock_topk_kernel,
                "score_ptr:*fp32 seq_lens_ptr:*i32 bounds_ptr:*i32 num_blocks:i32 err_ptr:*i32 out_ptr:*i32 "
                "part_ptr:*i64 count_ptr:*i32 P:i32 stride_sb:i32 stride_sr:i32",
                select | {"HS": 2, "QLEN": 2, "WIDTH": 1024, "EMULATE_FMA": False, "PDL": True},
            ),
            (f"push split={split} chunk={shape.chunk}", push_kernel, push_args, push),
        ]
        if split == 1:
            keys = warp_select_keys(split, 1024, shape)
            queued = push_warps(QUEUED_PER_SM, 1024 <= shape.chunk, 1, keys > 0)
            push_queued = push | (warp_asm_options(keys) if keys and queued == 1 else {})
            kernels.append(
                (f"push split=1 chunk={shape.chunk} warps={queued}", push_kernel, push_args, push_queued, queued)
            )
    # The warp select's other uses: 512 columns (16 keys a lane; 32 above), and the two
    # levels of 2048- and 4096-column rows (512 group keys of 4 and 8 columns: a CP = 2
    # rank's row at 512K and 1M).
    for columns in (512, 2048, 4096):
        shape = SelectShape.for_width(columns - 1, group=PUSH_GROUP)  # the push ranks W - 1 columns
        keys = warp_select_keys(1, columns, shape)
        name = f"push {'two-level ' if columns > shape.chunk else ''}warp select columns={columns}"
        select = {"SPLIT": 1, "SORT": True} | shape.constexprs(push_group(columns, keys, shape))
        kernels.append(
            (name, push_kernel, push_args, select | cp | {"R": 1, "SLICE": columns} | warp_asm_options(keys), 1)
        )
    kernels.insert(
        kernels.index(next(k for k in kernels if k[0] == "msa scorer fp8")),
        (
            "table scorer",
            score_kernel_table,
            "q_ptr:*u8 q_sel_ptr:*i64 q_set_stride:i64 k_ptr:*u8 bt_ptr:*i32 lens_ptr:*i32 out_ptr:*fp32 "
            "lut_ptr:*fp16 err_ptr:*i32 num_blocks:i32 W:i32 stride_bt:i32 stride_ob:i32 stride_or:i32",
            {"HS": 4, "SLOT0": 0, "ROWS": 32, "V": 1, "RECORD": True, "PDL": True},
        ),
    )
    pdl = capability >= 90  # griddepcontrol: fast.route.PDL_FROM
    lines = []
    for name, fn, args, constexprs, *warps in kernels:
        warps = warps[0] if warps else MERGE_WARPS if fn is merge_kernel else 4  # as launched
        constexprs = constexprs | ({"PDL": pdl} if "PDL" in constexprs else {})
        kernel = _compile_triton(fn, args, constexprs, warps, capability=capability)
        lines.append(f"{name}: {_resources(kernel.asm['cubin'])}")
    return lines


def compile_here(fn, signature: dict, constexprs: dict, warps: int):
    """Kernel ``fn`` (Gluon's or Triton's) compiled for sm_90 here on ``warps`` warps (no GPU
    needed): ``signature`` its run-time arguments, ``constexprs`` the rest, no pointer taken
    as aligned. Its ``asm`` holds the PTX and the cubin."""
    return _compile_source(_source(fn, signature, constexprs, attrs={}), warps)


def kernel_loop_mix(fn, signature: dict, constexprs: dict, warps: int, mma: bool = True) -> collections.Counter:
    """``main_loop_mix`` of kernel ``fn`` (Gluon's or Triton's) compiled for sm_90 here on
    ``warps`` warps: ``signature`` its run-time arguments, ``constexprs`` the rest, no
    pointer taken as aligned. The rate tools' check that a timed loop is what it times."""
    return main_loop_mix(disassemble(compile_here(fn, signature, constexprs, warps).asm["cubin"]), mma)


def _int_in(low: int, high: int):
    """An argparse type: an int in ``low..high`` (a value out of range would compile a
    kernel no launch makes, or fall back to the default unsaid)."""

    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in {low}..{high}, not {text}")
        return value

    parse.__name__ = "int"  # argparse names the type in its message for a bad literal
    return parse


def main(argv=None) -> int:
    """The module's command line (its docstring says what it prints); returns the exit
    status."""
    parser = argparse.ArgumentParser(prog="python -m bench.sass", description=__doc__)
    parser.add_argument("--kernel", choices=("wgmma", "prmt", "msa-fp8", "msa-bf16"), default="wgmma")
    parser.add_argument("--hs", type=_int_in(1, 8), default=1, help="heads of the tile, 1..8")
    parser.add_argument(
        "--first-slot", type=_int_in(0, SLOTS - 1), default=0, help="the first slot scored (7: a query_len 1 step)"
    )
    parser.add_argument(
        "--tokens", type=_int_in(16, PAGE), help="prmt only: tokens per MMA block (default: the kernel's)"
    )
    parser.add_argument("--pages", type=_int_in(1, 64), help="pages per program (default: the kernel's)")
    parser.add_argument("--warps", type=_int_in(1, 16), default=4, help="prmt only (wgmma: one warpgroup)")
    parser.add_argument("--depth", type=_int_in(1, 8), help="wgmma only: blocks loaded ahead (default: the kernel's)")
    parser.add_argument(
        "--ring",
        type=_int_in(0, 32),
        help="wgmma: pages in its shared-memory ring, 0 for registers; msa: half-blocks in its ring (default: policy)",
    )
    parser.add_argument(
        "--pdl", action="store_true", help="as the decodes launch it: PDL (wgmma: and the prefetch before its wait)"
    )
    parser.add_argument(
        "--decode",
        choices=DECODES,
        default="exact",
        help="wgmma: the decode, or a probe of it (the bench's decode= rows); e4m3: the E4M3-MMA route (msa-fp8 too)",
    )
    parser.add_argument(
        "--register-cap", type=_int_in(64, 255), help="wgmma only: registers a thread (default: the policy's)"
    )
    parser.add_argument(
        "--partials", type=int, choices=PARTIALS, help="wgmma only: partial maxima a page and row (default: policy)"
    )
    parser.add_argument(
        "--ring-scorer",
        choices=tuple(RING_SCORERS),
        help="wgmma only: a ring loop of bench.ring_variants in its own's place",
    )
    parser.add_argument(
        "--sets",
        type=_int_in(0, 8),
        default=0,
        help="wgmma / msa: the tile sets q_sel picks among (2: the CP decodes'; default 0: none, q_sel unread)",
    )
    parser.add_argument("--dump", help="write the SASS here")
    parser.add_argument(
        "--parts",
        action="store_true",
        help="wgmma: instructions a page by part, msa: a half-block, against the budget",
    )
    parser.add_argument("--kernels", action="store_true", help="compile the decode's other Triton kernels instead")
    parser.add_argument(
        "--capability",
        type=int,
        choices=CAPABILITIES,
        default=90,
        help="--kernels only: the GPU to compile for (80 = sm_80, ...; the portable route's where not 90)",
    )
    parser.add_argument(
        "--load-use",
        action="store_true",
        help="how many instructions ahead of its first use each global load is issued",
    )
    args = parser.parse_args(argv)
    wgmma_only = (
        ("--register-cap", args.register_cap),
        ("--partials", args.partials),
        ("--ring-scorer", args.ring_scorer),
    )
    for flag, value in wgmma_only:
        if value is not None and args.kernel != "wgmma":
            parser.error(f"argument {flag}: the wgmma kernel's, not {args.kernel}'s")
    if args.kernels:
        print("\n".join(compile_kernels(args.capability)))
        return 0
    usage, sass = scorer_sass(
        args.kernel,
        args.hs,
        args.tokens,
        args.pages,
        args.warps,
        args.depth,
        args.first_slot,
        args.pdl,
        args.parts,
        args.ring,
        decode=args.decode,
        register_cap="auto" if args.register_cap is None else args.register_cap,
        partials=args.partials,
        ring_scorer=args.ring_scorer,
        sets=args.sets,
    )
    knobs = "" if args.decode == "exact" else f" decode={args.decode}"
    knobs += "" if args.register_cap is None else f" register_cap={args.register_cap}"
    knobs += "" if args.partials is None else f" partials={args.partials}"
    knobs += "" if args.ring_scorer is None else f" ring_scorer={args.ring_scorer}"
    print(
        f"{args.kernel} scorer Hs={args.hs} first slot {args.first_slot}{' PDL' if args.pdl else ''}{knobs} "
        f"tokens={args.tokens or 'default'} pages={args.pages or 'default'}: {usage}"
    )
    registers, static, dynamic = resources(usage)
    held = programs_per_sm(registers, static + dynamic, args.warps if args.kernel == "prmt" else 4)
    print(
        f"programs an SM (sm_90): {min(held.values())} ("
        + ", ".join(f"{n} by {what}" for what, n in held.items())
        + ")"
    )
    for op, n in instruction_mix(sass).most_common(20):
        print(f"{n:6d} {op}")
    loop = main_loop_mix(sass)
    if loop:
        print(f"main loop (wgmma: one page per trip): {sum(loop.values())} instructions per thread")
        print("  " + ", ".join(f"{op} {n}" for op, n in loop.most_common(14)))
    rows = mma_rows((8 - args.first_slot) * args.hs)
    pages = program_pages(args.kernel, rows, decode_mma(args.decode), args.pages)  # both Gluon kernels'
    if args.kernel == "wgmma":  # what an issue-bound program pays: the listing, its loop once per page
        total = sum(instruction_mix(sass).values()) + (pages - 1) * sum(loop.values())
        print(
            f"a program of {pages} pages{'' if loop else ' (unrolled: the listing)'}: ~{total} instructions per thread"
        )
        if args.parts:
            every, alu = parts_per_page(sass, pages), parts_per_page(sass, pages, alu=True)
            print(f"per page and thread, a program of {pages} pages: all instructions, and the ALU pipe's")
            for part in PARTS:
                print(f"  {part:<9} {every[part]:6.0f} {alu[part]:6.0f}")
            total, total_alu = sum(every.values()), sum(alu.values())
            print(
                f"  {'total':<9} {total:6.0f} {total_alu:6.0f}  = {total / ISSUE_BUDGET:.2f} of the issue budget"
                f" ({ISSUE_BUDGET}), {total_alu / ALU_BUDGET:.2f} of the ALU's ({ALU_BUDGET}) at the read ceiling"
            )
    if args.kernel.startswith("msa-") and args.parts:
        halves = 2 * pages
        every, alu = msa_source_parts(sass), msa_source_parts(sass, alu=True)
        budget = msa_half_block_budget(1 if args.kernel == "msa-fp8" else 2)
        print(f"per half-block and thread, a program of {halves} half-blocks: all instructions, and the ALU pipe's")
        for part in MSA_PARTS:
            note = "  (every half-block's branch; taken on a request's last blocks only)" if part == "mask" else ""
            print(f"  {part:<9} {every[part] / halves:6.1f} {alu[part] / halves:6.1f}{note}")
        total = (sum(every.values()) - every["mask"]) / halves
        total_alu = (sum(alu.values()) - alu["mask"]) / halves
        print(
            f"  {'total':<9} {total:6.1f} {total_alu:6.1f}  = {total / budget:.2f} of the issue budget ({budget}),"
            f" {total_alu / (budget // 2):.2f} of the ALU's ({budget // 2}) at the read ceiling, the mask aside"
        )
    if args.load_use:
        by_op = collections.defaultdict(list)
        for op, distance in load_use_distances(sass):
            by_op[op].append(distance)
        unrolled = args.kernel == "wgmma" and not loop
        block = (
            f"; a 64-token block is ~{sum(instruction_mix(sass).values()) // (2 * pages)} of them" if unrolled else ""
        )
        print(f"global loads, instructions from each to its first use (straight-line order{block}):")
        for op, seen in sorted(by_op.items()):
            seen.sort()
            print(f"  {op:<18} {len(seen):4d} loads: min {seen[0]}, median {seen[len(seen) // 2]}, max {seen[-1]}")
    if args.dump:
        with open(args.dump, "w") as f:
            f.write(sass)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
