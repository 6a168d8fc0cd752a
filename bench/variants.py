"""The scorers' variants for the benchmark, the SASS reader and the GPU tests: the wgmma
kernel with other tuning (pages per program, blocks in flight, a register cap) or one of
its probes (``probes.py``), the table kernel at other page counts, the superseded prmt
kernel, and the MSA mma kernel with other columns a program, rings and copies or its
ring's probe (``msa_probes.py``). The decodes only ever launch ``fast``'s own plans."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
import triton

from fast import scorer
from fast.backend import pdl_options
from fast.checks import check_int, score_shapes
from fast.kernels import page_ring
from fast.kernels.page_maxima import dynamic_bytes, folds_by_layout, partial_maxima
from fast.kernels.page_ring import MAX_RING
from fast.msa import tensor_map
from fast.msa.kernels import block_ring
from fast.msa.scorer import block_kernel, mma_constants, mma_partials, plan_block_scorer
from fast.route import device_route
from fast.scorer import max_ring, mma_rows, ring_pages, rows_for
from indexer_constants import PAGE_BYTES, SLOTS

from .msa_probes import msa_score_kernel_loads
from .probes import (
    every_id,
    held_ring_pages,
    moves_groups,
    moves_words,
    no_maxima_ring_pages,
    ring_copies_ring_pages,
    ring_loads_ring_pages,
    score_kernel_loads,
    signless_groups,
)
from .ring_variants import piped_ring_pages
from .scorer_prmt import dequant_kernel_prmt, score_kernel_prmt

# The prmt kernel's pages per program and tokens per MMA block.
PRMT_PAGES = 1
PRMT_TOKENS = 64
VARIANT_KERNELS = ("wgmma", "prmt", "table")
# the wgmma kernel's timing probes of its decodes, each as (the hook it takes, the probe),
# and every decode ``variant_launch`` takes: the two routes' and the probes
PROBE_DECODES = {
    "signless": ("GROUP_DECODE", signless_groups),
    "none": ("GROUP_DECODE", moves_groups),
    "e4m3-none": ("GROUP_DECODE_E4M3", moves_words),
}
DECODES = ("exact", "signless", "none", "e4m3", "e4m3-none")
# the wgmma kernel's ring loops the benchmark may put in place of its own (``ring_scorer``),
# and those of them that probe (their scores are not the route's)
RING_SCORERS = {
    "piped": piped_ring_pages,
    "nomax": no_maxima_ring_pages,
    "ring_loads": ring_loads_ring_pages,
    "ring_copies": ring_copies_ring_pages,
    "held": held_ring_pages,
}
RING_PROBES = ("nomax", "ring_loads", "ring_copies", "held")
# the programs each takes: (N, partial maxima, most pages a program, MMA routes)
RING_SCORER_SHAPES = {
    "piped": ((16, 32), (4, 8, 16, 32), 16, ("e4m3",)),
    "nomax": ((32,), (4, 8, 16, 32), 16, ("exact", "e4m3")),
    "ring_loads": ((8, 16, 32), (4, 8, 16, 32), 16, ("exact", "e4m3")),
    "ring_copies": ((8, 16, 32), (4, 8, 16, 32), 16, ("exact", "e4m3")),
    "held": ((16, 32), (4, 8, 16, 32), 16, ("exact", "e4m3")),
}


def decode_mma(decode: str) -> str:
    """The MMA route ``decode`` (one of DECODES) runs on: "e4m3" for the E4M3 route's decode
    and its probe, else "exact"."""
    return "e4m3" if decode.startswith("e4m3") else "exact"


# the wgmma kernel's partial maxima a page and row (``page_maxima.page_max``: 4 to 32 lanes kept)
PARTIALS = (4, 8, 16, 32)


def for_kernel(kernel, options: dict) -> dict:
    """A scorer's launch ``options`` for ``kernel``, a probe launched in its place: the
    constexprs (upper case) it does not take left out, every launch keyword kept."""
    params = {p.name for p in kernel.params}
    return {k: v for k, v in options.items() if not k.isupper() or k in params}


def tune_wgmma(
    options: dict,
    *,
    decode: str = "exact",
    pages_per_program: int | None = None,
    blocks_ahead: int | None = None,
    register_cap: int | None | str = "auto",
    loads_only: bool = False,
    guard: bool = True,
    ring: int | None = None,
    tables: bool | None = None,
    partials: int | None = None,
    ring_scorer: str | None = None,
) -> dict:
    """The wgmma kernel's launch ``options`` (``scorer.wgmma_options``' policy) tuned by
    ``variant_launch``'s wgmma keywords (checked there one by one): a new dict, or
    ValueError where they do not fit this launch's shape (a ring its shared memory has no
    room for, a ring loop its N does not take). No device needed: the bench's tests hold
    ``bench.bounds``' arms to it at the grids it times."""
    o = dict(options)
    mma = decode_mma(decode)
    if pages_per_program:
        o["PPP"], o["PARTS"] = pages_per_program, partial_maxima(o["ROWS"], pages_per_program, mma)
    o["DEPTH"] = blocks_ahead or o["DEPTH"]
    o["PARTS"] = partials or o["PARTS"]
    # loads_only probes the register-fed kernel's memory side, its gather through L1 included
    o["TABLES"] = (0 if loads_only else o["TABLES"]) if tables is None else int(tables)
    if loads_only and o["TABLES"]:
        raise ValueError("tables: the loads_only probe gathers the table through L1 (tables None or False)")
    # what fits beside this launch's own maxima (``max_ring`` prices the policy's)
    most = min(
        max_ring(o["ROWS"], o["PPP"], o["TABLES"], mma),
        ring_room(o["ROWS"], o["PPP"], o["PARTS"], o["TABLES"], mma),
    )
    if loads_only or blocks_ahead:  # the register feed
        o["RING"] = 0
    else:
        o["RING"] = min(ring_pages(o["ROWS"], o["PPP"], mma), most) if ring is None else ring
    if o["RING"] > most:
        raise ValueError(
            f"ring: {ring} pages do not fit beside the kernel's shared memory at N {o['ROWS']}"
            f" with {o['PPP']} pages a program (at most {most})"
        )
    if ring_scorer is not None:
        rows, parts, most_pages, routes = RING_SCORER_SHAPES[ring_scorer]
        fits = o["ROWS"] in rows and o["PARTS"] in parts and o["PPP"] <= most_pages
        if o["RING"] == 0 or mma not in routes or not fits:
            raise ValueError(
                f"ring_scorer: {ring_scorer!r} needs the ring and wgmma on the route {routes}"
                f" (N in {rows}, partials in {parts}, at most {most_pages} pages a program;"
                f" here ring {o['RING']}, N {o['ROWS']}, {o['PARTS']} partials, {o['PPP']} pages, mma {mma!r})"
            )
        o["RING_PAGES"] = RING_SCORERS[ring_scorer]
    if decode in PROBE_DECODES:
        hook, probe = PROBE_DECODES[decode]
        o[hook] = probe
    if not guard:
        o["IN_CACHE"] = every_id
    if register_cap != "auto":
        o.pop("maxnreg", None)
        if register_cap is not None:
            o["maxnreg"] = register_cap
    return o


def variant_launch(
    q_tile: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor,
    lens: torch.Tensor,
    out: torch.Tensor,
    *,
    kernel: str | None = None,
    first_slot: int = 0,
    pages_per_program: int | None = None,
    blocks_ahead: int | None = None,
    register_cap: int | None | str = "auto",
    tokens_per_dot: int | None = None,
    num_warps: int = 4,
    loads_only: bool = False,
    decode: str = "exact",
    guard: bool = True,
    ring: int | None = None,
    tables: bool | None = None,
    partials: int | None = None,
    ring_scorer: str | None = None,
    error: torch.Tensor | None = None,
) -> scorer.ScorerLaunch | None:
    """A scorer launch (``scorer.ScorerLaunch``) on ``score_pages``' operands, tuned:

    kernel: "wgmma", "prmt" (GPUs) or "table". pages_per_program: pages per program (the
    default is each kernel's policy). blocks_ahead: the wgmma kernel's 64-token blocks in
    flight while one is decoded (1 or 2; the register pipeline, ring 0). register_cap: the
    wgmma kernel's registers per thread: "auto" (its policy), None (the compiler's choice)
    or 64..255. tokens_per_dot, num_warps: the prmt kernel's tokens per MMA block (64 or
    128) and warps. loads_only: the wgmma kernel's probe of its memory side — the same
    loads, no decode, no MMA, ``out`` untouched. decode: the wgmma kernel's "exact" decode,
    or one of its probes, ``out`` getting scores that are never a result: "signless" (the
    decode without its sign step, scores of |k|: what a decode 4 ALU instructions cheaper
    per 8 codes would reach) or "none" (no decode: the code words' 16-bit halves as the
    fp16 operand, its loads, ring, MMA and maxima as they are — what a free decode would
    reach) or "e4m3" (the exact decode's E4M3 bytes straight into wgmma k32, q as the E4M3
    it is: no widening, half the MMAs, Hopper's E4M3 accumulation instead of fp32: the
    E4M3-MMA route) or "e4m3-none" (that route with no decode: the code words' 32-bit
    halves as its E4M3 operand — what a free decode would leave it). guard: False drops
    the wgmma kernel's block-id guard (the benchmark's measure of its cost; the decode
    always guards). ring: the wgmma kernel's feed — 0 the register
    pipeline, 1 .. MAX_RING pages through a shared-memory ring (``page_ring.py``), None its
    policy. tables: the wgmma kernel's scale table copied into shared memory (True) or
    gathered from global memory (False), None its policy (loads_only: from global memory).
    partials: the wgmma kernel's partial maxima a page and row in shared memory (4, 8, 16
    or 32; fewer cost a fold a page and free shared memory for programs), None its
    policy (``partial_maxima``). ring_scorer: the wgmma kernel's ring loop replaced by one
    of ``ring_variants``' (RING_SCORERS: "piped" on the E4M3 route's wgmma, N 16 and 32)
    or a probe (``probes``': "nomax", the page maxima's, either route, N 32; "ring_loads",
    the ring's, and "ring_copies", its copies alone, either route, every N it runs; "held",
    the kernel's work on pages that stay in the ring, either route, N 16 and 32), the
    ring kept (its policy's or ``ring``). error: an error record (``fast.errors.new_record``)
    the wgmma and table kernels write a bad id or a ring timeout to. None where there is
    nothing to score.
    """
    device = q_tile.device
    kernel = kernel or ("wgmma" if device.type == "cuda" else "table")
    if kernel not in VARIANT_KERNELS:
        raise ValueError(f"kernel: {kernel!r} (one of {VARIANT_KERNELS})")
    if tokens_per_dot not in (None, 64, 128) or (tokens_per_dot and kernel != "prmt"):
        raise ValueError(
            f"tokens_per_dot: {tokens_per_dot} (the prmt kernel's: 64 or 128, a page is one or two MMA blocks)"
        )
    if blocks_ahead not in (None, 1, 2) or (blocks_ahead and kernel != "wgmma"):
        raise ValueError(f"blocks_ahead: {blocks_ahead} (the wgmma kernel's: 1 or 2)")
    cap_ok = register_cap is None or (isinstance(register_cap, int) and 64 <= register_cap <= 255)
    if register_cap != "auto" and (kernel != "wgmma" or not cap_ok):
        raise ValueError(f"register_cap: {register_cap!r} (the wgmma kernel's: 'auto', None or 64..255)")
    register_fed = loads_only or blocks_ahead
    ring_ok = isinstance(ring, int) and 0 <= ring <= MAX_RING and not (ring and register_fed)
    if ring is not None and (kernel != "wgmma" or not ring_ok):
        raise ValueError(f"ring: {ring!r} (the wgmma kernel's: 0 .. {MAX_RING}; 0 with loads_only or blocks_ahead)")
    if tables is not None and (kernel != "wgmma" or not isinstance(tables, bool)):
        raise ValueError(f"tables: {tables!r} (the wgmma kernel's: True, False or None)")
    if partials is not None and (kernel != "wgmma" or loads_only or partials not in PARTIALS):
        raise ValueError(f"partials: {partials!r} (the wgmma kernel's: one of {PARTIALS}, not with loads_only)")
    if not guard and kernel != "wgmma":
        raise ValueError(f"guard: only the wgmma kernel's can be dropped, not {kernel!r}'s")
    if loads_only and kernel != "wgmma":
        raise ValueError(f"loads_only: the wgmma kernel's probe, not {kernel!r}'s")
    if decode not in DECODES:
        raise ValueError(f"decode: {decode!r} (one of {DECODES})")
    if decode != "exact" and kernel != "wgmma":
        raise ValueError(f"decode: {decode!r} is the wgmma kernel's probe, not {kernel!r}'s")
    if ring_scorer is not None and (kernel != "wgmma" or ring_scorer not in RING_SCORERS or loads_only):
        raise ValueError(f"ring_scorer: {ring_scorer!r} (the wgmma kernel's ring loop: one of {tuple(RING_SCORERS)})")
    if not guard and loads_only:
        raise ValueError("guard: the loads_only probe's kernel keeps the scorer's loads, guard included")
    if decode != "exact" and loads_only:
        raise ValueError(f"decode: {decode!r} probes the decode, which loads_only leaves out")
    if pages_per_program is not None and not (isinstance(pages_per_program, int) and pages_per_program >= 1):
        raise ValueError(f"pages_per_program: {pages_per_program!r} (an int >= 1)")
    if kernel != "table" and device.type != "cuda":
        raise ValueError(f"kernel: {kernel!r} needs a GPU, not {device.type} (the table kernel runs anywhere)")
    if kernel == "prmt":
        return _prmt_launch(
            q_tile, k_cache, block_table, lens, out, first_slot, pages_per_program, tokens_per_dot, num_warps
        )
    mma = decode_mma(decode)
    launch = scorer.plan_scorer(
        q_tile,
        k_cache,
        block_table,
        lens,
        out,
        first_slot=first_slot,
        kernel=kernel,
        error=error,
        mma=mma,
    )
    if launch is None:
        return None
    batch, width = out.shape[0], out.shape[2]
    o = launch.options
    if kernel == "wgmma":
        o = launch.options = tune_wgmma(
            launch.options,
            decode=decode,
            pages_per_program=pages_per_program,
            blocks_ahead=blocks_ahead,
            register_cap=register_cap,
            loads_only=loads_only,
            guard=guard,
            ring=ring,
            tables=tables,
            partials=partials,
            ring_scorer=ring_scorer,
        )
        launch.grid = (batch, triton.cdiv(width, o["PPP"]))
        if loads_only:  # the probe's own kernel: the register feed's loads, nothing else
            launch.kernel, launch.options = score_kernel_loads, for_kernel(score_kernel_loads, o)
    elif pages_per_program:
        o["V"] = pages_per_program
        launch.grid = (batch, triton.cdiv(width, pages_per_program))
    return launch


def ring_room(rows: int, pages: int, parts: int, tables: int, mma: str) -> int:
    """The largest page ring beside the wgmma kernel's dynamic shared memory at N ``rows``
    with ``pages`` a program and ``parts`` partial maxima (``page_maxima.dynamic_bytes``,
    folded as the kernel folds them: ``folds_by_layout``)."""
    return page_ring.max_ring(dynamic_bytes(rows, pages, parts, mma, folds_by_layout(rows, parts)), tables)


def _prmt_launch(q_tile, k_cache, block_table, lens, out, first_slot, pages_per_program, tokens_per_dot, num_warps):
    batch, hs, width = score_shapes(q_tile, block_table, out)
    if batch == 0 or width == 0:
        return None
    ppp = pages_per_program or PRMT_PAGES
    pages = k_cache.view(-1, PAGE_BYTES)
    args = (
        q_tile.view(torch.uint8),
        scorer.first_set(str(q_tile.device)),
        0,
        pages,
        pages.view(torch.int64),
        block_table,
        lens,
        out,
        width,
        block_table.stride(0),
        out.stride(0),
        out.stride(1),
    )
    options = dict(
        HS=hs,
        SLOT0=first_slot,
        PPP=ppp,
        ROWS=rows_for((SLOTS - first_slot) * hs),
        TOK=tokens_per_dot or PRMT_TOKENS,
        num_warps=num_warps,
        **pdl_options(False),
    )
    return scorer.ScorerLaunch(score_kernel_prmt, (batch, triton.cdiv(width, ppp)), args, options)


def score_variant(q_tile, k_cache, block_table, lens, out, **variant) -> torch.Tensor:
    """``variant_launch(...)`` run; returns ``out``."""
    launch = variant_launch(q_tile, k_cache, block_table, lens, out, **variant)
    if launch is not None:
        launch()
    return out


def block_variant_launch(
    q_tile: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor,
    lens: torch.Tensor,
    out: torch.Tensor,
    *,
    kernel: str | None = None,
    ppp: int | None = None,
    stages: int | None = None,
    tensor_copies: bool = True,
    loads_only: bool = False,
    **arguments,
) -> scorer.ScorerLaunch | None:
    """The MSA block scorer's launch (``fast.msa.scorer.plan_block_scorer``; arguments as
    ``score_blocks``'), tuned: kernel "mma" or "dot" (default: the route's); ppp: the mma
    kernel's columns per program (1 .. 16; default its policy's); stages: its ring of
    half-blocks (2 .. 8; one deeper than ``max_stages`` is filled by cp.async copies);
    tensor_copies: False fills a bulk ring by 1D bulk copies instead of tensor copies (what
    a CUDA graph captured before the cache's first call runs); loads_only: the probe of the
    mma kernel's bulk ring alone (``msa_probes``), ``out`` untouched. None where there is
    nothing to score."""
    for name, flag in (("tensor_copies", tensor_copies), ("loads_only", loads_only)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
    launch = plan_block_scorer(q_tile, k_cache, block_table, lens, out, kernel=kernel, **arguments)
    hs = q_tile.shape[2]
    rows = mma_rows((SLOTS - arguments.get("first_slot", 0)) * hs)
    kernel = kernel or block_kernel(device_route(q_tile.device), k_cache.dtype, rows)
    if loads_only and kernel != "mma":
        raise ValueError(f"loads_only: probes the mma kernel's ring, not the {kernel} kernel's")
    for name, value, low, high in (("ppp", ppp, 1, 16), ("stages", stages, 2, block_ring.MAX_STAGES)):
        if value is not None:
            check_int(name, value, low=low, high=high)
            if kernel != "mma":
                raise ValueError(f"{name}: sets the mma kernel's launch, not the {kernel} kernel's")
    if launch is None or kernel != "mma":
        return launch
    o = launch.options
    ppp = ppp or o["PPP"]
    ring = mma_constants(k_cache.dtype, rows, ppp, stages, "e4m3" if o["E4M3_MMA"] else "exact")
    if loads_only and not ring["BULK"]:
        raise ValueError(f"loads_only: probes a bulk ring, and this launch's (N {rows}) is cp.async copies")
    o.pop("maxnreg", None)
    o.update(PPP=ppp, PARTS=mma_partials(rows, ppp), **ring)
    tmap = tensor_map.cached(k_cache) if tensor_copies and ring["TENSOR"] else None
    o["TENSOR"] = tmap is not None
    launch.args = (*launch.args[:-1], 0 if tmap is None else tmap.data_ptr())
    launch.grid = (q_tile.shape[0] * triton.cdiv(out.shape[2], ppp),)
    if loads_only:
        launch.kernel, launch.options = msa_score_kernel_loads, for_kernel(msa_score_kernel_loads, o)
    return launch


def score_block_variant(q_tile, k_cache, block_table, lens, out, **variant) -> torch.Tensor:
    """``block_variant_launch(...)`` run; returns ``out``."""
    launch = block_variant_launch(q_tile, k_cache, block_table, lens, out, **variant)
    if launch is not None:
        launch()
    return out


def dequant_pages_prmt(k_cache: torch.Tensor, pages: torch.Tensor) -> torch.Tensor:
    """The GPU's byte-permute dequantization alone (tests, debugging): fp16 ``[n, 128, 128]``
    of pages ``pages`` (int32 ``[n]``) of ``k_cache`` (uint8 ``[N, 128, 72]``, CUDA)."""
    out = torch.empty(pages.shape[0], 128, 128, dtype=torch.float16, device=k_cache.device)
    if pages.shape[0]:
        pages_u8 = k_cache.view(-1, PAGE_BYTES)
        dequant_kernel_prmt[(pages.shape[0],)](pages_u8, pages_u8.view(torch.int64), pages, out)
    return out


def probe_smoke(decode: str, shapes) -> None:
    """Launch the wgmma kernel's ``decode`` probe once at each (Hs, slots scored) of
    ``shapes`` on a small cache of random pages, and wait for it (a GPU's)."""
    from .timing import CachePool, random_tile

    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    batch, pages = 2, 64
    pool = CachePool(pages, device)
    table = torch.randint(0, pages, (batch, pages), generator=gen, dtype=torch.int32).to(device)
    lens = torch.full((batch,), pages * 128 + 1, dtype=torch.int32, device=device)
    for hs, slots in shapes:
        tile, out = random_tile(batch, hs, gen, device), torch.empty(batch, SLOTS * hs, pages, device=device)
        score_variant(tile, pool.cache, table, lens, out, first_slot=SLOTS - slots, decode=decode)
    torch.cuda.synchronize()


def probe_runs(decode: str, shapes, timeout: int = 600) -> bool:
    """Whether ``probe_smoke(decode, shapes)`` completes in a child process. A probe new to
    the GPU is tried there before the bench times it: a fault in it (an illegal address
    ends the CUDA context) would end the whole bench, its finished sections unwritten."""
    code = f"from bench.variants import probe_smoke; probe_smoke({decode!r}, {tuple(shapes)!r})"
    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0
