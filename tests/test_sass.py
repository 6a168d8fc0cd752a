"""The SASS reader (``python -m bench.sass``): every GPU kernel compiles for sm_90 on a
machine without a GPU, the scorer's registers and layouts as the decode launches it."""

import os
import re
import subprocess
import sys

import pytest


def _compile_only(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python args`` in a child that compiles kernels for sm_90 and runs none
    (FAST_COMPILE_ONLY=1), through Triton's compiler, not the interpreter: Gluon cannot
    lower the interpreter's functions, and in this process only a warm cache would hide it."""
    env = dict(os.environ, FAST_COMPILE_ONLY="1")
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_sass_tool_refuses_shapes_no_launch_makes(capsys):
    """Out-of-range shapes are argparse errors naming the option, before any compile (they
    compiled a kernel no decode launches — slot 9 scored -1 rows — or took the default unsaid)."""
    from bench.sass import main

    for argv, name in ((["--hs", "0"], "--hs"), (["--first-slot", "8"], "--first-slot"), (["--pages", "0"], "--pages")):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2, (argv, name)
        assert f"argument {name}: must be in" in capsys.readouterr().err
    # the wgmma kernel's tuning, refused for another kernel and out of its range
    for argv, said in (
        (["--kernel", "prmt", "--partials", "8"], "argument --partials: the wgmma kernel's, not prmt's"),
        (["--kernel", "msa-fp8", "--register-cap", "64"], "argument --register-cap: the wgmma kernel's"),
        (["--register-cap", "63"], "argument --register-cap: must be in"),
        (["--partials", "5"], "argument --partials: invalid choice"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and said in capsys.readouterr().err, argv


# the exact route at 8 pages is test_register_cap_spills_nothing's Hs 1 listing: checked there
@pytest.mark.parametrize("decode, pages", [("exact", 4), ("e4m3", 4), ("e4m3", 8)])
def test_n8_holds_the_8_programs_an_sm_its_register_cap_is_for(decode, pages):
    """N 8 at its register cap (``max_registers``: 64), as the decodes launch it (PDL), on
    both routes and at both program sizes the policy picks (4 pages fed from registers, 8
    through the ring): under the cap, nothing spilled, and the 8 programs an SM the cap is
    for held by registers — and by shared memory too but on the exact route's ring, whose
    32 partial maxima hold it to 7 (8 partials measured level there: bench/PERF.md). A
    kernel change that spills or outgrows them trades the programs away silently."""
    from fast.scorer import max_registers

    cap = max_registers(8)
    flags = ["--hs", "1", "--pages", str(pages), "--pdl", "--decode", decode]
    done = _compile_only("-m", "bench.sass", *flags)
    assert done.returncode == 0, done.stderr
    usage, held = done.stdout.splitlines()[:2]
    assert int(re.search(r"REG:(\d+)", usage).group(1)) <= cap, usage
    assert "STACK:0 " in usage and "LOCAL:0 " in usage, (decode, pages, usage)
    assert held.startswith("programs an SM (sm_90): 8 (8 by registers"), (decode, pages, held)


@pytest.mark.parametrize("kernel", ["wgmma", "prmt"])
def test_sass_tool_compiles_the_scorer_for_sm90(kernel, tmp_path):
    dump = tmp_path / "scorer.sass"
    cmd = ["-m", "bench.sass", "--kernel", kernel, "--hs", "4", "--dump", str(dump), "--parts"]
    cmd += ["--load-use", "--ring", "0"] if kernel == "wgmma" else []  # the register-fed page loop
    done = _compile_only(*cmd)
    assert done.returncode == 0, done.stderr
    assert "REG:" in done.stdout and "HGMMA" in done.stdout and "PRMT" in done.stdout
    widths = re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?STS(\.\w+)?", dump.read_text(), flags=re.M)
    stored = sum({"": 4, ".64": 8, ".128": 16}.get(w, 4) for w in widths)  # bytes a thread, the listing once
    if kernel == "wgmma":
        # the point of the kernel: the dequantized tile stays in registers. Staging it would
        # store 256 bytes per thread and page (64 fp16 per 64-token block, two blocks); the
        # stores left are q's tile (once per program: 64 bytes a thread at N = 32) and the
        # page maxima's partials (32 bytes a thread and program at Hs = 4)
        assert 0 < stored < 256, f"{stored} bytes stored to shared memory a thread: the fp16 tile goes through it again"
        # one page per trip of the main loop: 2 blocks of 64 tokens x 8 wgmma k-steps
        from bench.sass_listing import main_loop_mix
        from fast.scorer import long_row_pages

        assert (
            main_loop_mix(dump.read_text())["HGMMA"] == 16
            and "main loop" in done.stdout
            and f"a program of {long_row_pages(32)} pages: ~" in done.stdout
        )
        # the budget by part (the listing's source lines): every part named, the page's
        # instructions all attributed to one (none left over), the decode the largest
        parts = dict(re.findall(r"^  (\w+) +(\d+) +\d+$", done.stdout, flags=re.M))
        total = re.search(r"^  total +(\d+) +(\d+)  = [\d.]+ of the issue budget", done.stdout, flags=re.M)
        assert set(parts) == {"loads", "decode", "MMA", "maximum", "setup", "loop", "epilogue", "other"}, done.stdout
        counts = {k: int(v) for k, v in parts.items()}
        assert total and abs(sum(counts.values()) - int(total.group(1))) <= len(counts)  # (each rounded)
        assert max(counts, key=counts.get) == "decode" and counts["MMA"] > 0 and counts["other"] == 0
        # every global load of the page loop has a first use: the code words' 16-byte loads
        # and the scale bytes' one-byte ones each show up with their distances
        uses = dict(re.findall(r"^  (LDG\S*) +(\d+) loads: min \d+", done.stdout, flags=re.M))
        assert int(uses.get("LDG.E.128", 0)) > 0 and int(uses.get("LDG.E.U8", 0)) > 0, done.stdout
    else:
        assert stored >= 256  # tl.dot stages the tile: the difference the test above relies on


def test_decode_kernels_compile_for_sm90():
    """The Triton kernels other than the NVFP4 scorers (the MSA ones included: the
    interpreter once ran a constexpr branch's early return that the compiler does not),
    compiled by Triton for the GPU (the
    selects in their three forms: three levels, slices of one chunk, a row of one chunk):
    the interpreter that runs them on CPUs executes Python and
    accepts what Triton's compiler rejects (a value bound inside a runtime ``if`` and used
    after it did exactly that once)."""
    done = _compile_only("-m", "bench.sass", "--kernels")
    assert done.returncode == 0, done.stderr
    names = [line.split(":")[0] for line in done.stdout.splitlines()]
    queued = {
        (1, 512): ["push split=1 chunk=512 warps=2"],
        (4, 256): [],
        (1, 1024): ["push split=1 chunk=1024 warps=1"],
    }  # push_warps of a queued grid
    selects = [
        name
        for (split, chunk), more in queued.items()
        for name in (f"stock top-16 split={split} chunk={chunk}", f"push split={split} chunk={chunk}", *more)
    ]
    assert names == [
        "q exchange",
        "q exchange bf16",
        "merge",
        "msa merge bf16",
        "msa compact table",
        "msa push split=1",
        "msa push split=4",
        "compact table",
        "q to tile",
        "q to tile bf16",
        "table scorer",
        "msa scorer fp8",
        "msa scorer bf16",
        "msa stock select columns=2048 split=1",
        "msa stock select columns=2048 split=4",
        "msa stock select columns=1024 split=1",
        "msa bounds",
        "table bounds",
        *selects,
        "push warp select columns=512",
        "push two-level warp select columns=2048",
        "push two-level warp select columns=4096",
    ]


@pytest.mark.parametrize(
    "capability",
    [
        80,
        pytest.param(86, marks=pytest.mark.slow),
        pytest.param(89, marks=pytest.mark.slow),
        pytest.param(100, marks=pytest.mark.slow),
        120,
    ],
)
def test_portable_route_kernels_compile_for_every_other_gpu(capability):
    """Every kernel the portable route launches (fast.route: the table and dot scorers, and
    the rest, which every route shares) compiles for the GPUs it is defined for, as the
    route launches them (PDL only from sm_90): sm_80 has no E4M3 conversion and no PDL, and
    sm_120 is the newest. The tier runs the two ends; make test-slow the generations between."""
    done = _compile_only("-m", "bench.sass", "--kernels", "--capability", str(capability))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 29 and all("REG:" in line for line in lines), done.stdout
    assert {"table scorer", "msa scorer fp8", "msa scorer bf16"} <= {line.split(":")[0] for line in lines}


def test_sass_tool_compiles_the_scorer_with_its_block_id_guard():
    """A compile from an AST source takes a constexpr it is not given as None (falsy), where
    a launch takes the parameter's default: the tool once compiled the scorer without its
    block-id guard (then a flag, default on), so every SASS figure it gave left the guard
    out. The listing must hold instructions of the guard's compare (``loads.in_cache``, the
    kernel's IN_CACHE by default)."""
    code = (
        "import inspect, re\n"
        "from fast.kernels import loads\n"
        "from bench.sass import scorer_sass\n"
        "source, first = inspect.getsourcelines(loads.in_cache.fn)\n"
        "_, listing = scorer_sass('wgmma', 1, None, 4, ring=0, lines=True)\n"
        "issued = {int(n) for n in re.findall(r'fast/kernels/loads.py\", line (\\d+)', listing)}\n"
        "print('guard compiled' if issued & set(range(first, first + len(source))) else 'no guard')\n"
    )
    done = _compile_only("-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "guard compiled", done.stdout


@pytest.mark.parametrize("width", [1024, 1000])
def test_msa_select_loads_a_whole_row_16_bytes_at_a_time(width):
    """The MSA stock select's rows of one chunk (``ascending.best_in_column_order``) are
    loaded from the row's start, rows a multiple of 16 columns apart, up to the table width's
    next multiple of 16: the launcher's specialization then gives 16-byte loads and a layout
    with runs of columns a thread at any width. Loaded from the first candidate column, or
    masked at a width Triton cannot prove a multiple of 16, each thread held one column a run
    and every step of the sorting network was a shuffle (bench/PERF.md has the cost).
    1024 columns on 128 threads: two 16-byte loads a thread."""
    code = f"from bench.sass import msa_select_row_sass; print(msa_select_row_sass({width}))"
    done = _compile_only("-c", code)
    assert done.returncode == 0, done.stderr
    wide = re.findall(r"LDG\.E\.128 ", done.stdout)
    assert len(wide) == 2, [line for line in done.stdout.splitlines() if "LDG" in line]


def test_register_cap_spills_nothing():
    """The wgmma kernel at N <= 16 is compiled with a register cap (6 programs per SM
    instead of 5: bench/PERF.md); a kernel change that makes the cap spill would silently
    trade that gain for local-memory traffic. Every capped shape the decode launches, as it
    launches them (PDL, the prefetch before the wait): N = 8 (mma.sync: Hs = 1, or q x Hs <=
    8) and N = 16 (wgmma), compiled in a child (``_compile_only``)."""
    from fast.scorer import long_row_pages, max_registers, mma_rows, ring_pages

    for hs, first_slot in ((1, 0), (2, 0), (4, 7), (4, 4)):
        done = _compile_only("-m", "bench.sass", "--hs", str(hs), "--first-slot", str(first_slot), "--pdl")
        assert done.returncode == 0, done.stderr
        usage, held = done.stdout.splitlines()[:2]
        regs = int(re.search(r"REG:(\d+)", usage).group(1))
        assert regs <= max_registers((8 - first_slot) * hs), usage
        assert "STACK:0 " in usage and "LOCAL:0 " in usage, (
            f"Hs = {hs}, first slot {first_slot}: the register cap spills ({usage})"
        )
        if hs == 1:  # N 8's exact route through its 8-page ring: the programs its cap is for
            # (test_n8_holds_...): 8 by registers, 7 by the ring's 32 partial maxima
            assert held.startswith("programs an SM (sm_90): 7 (8 by registers"), held
        # mma.sync's pages unrolled (no page loop in the listing), wgmma's in a loop unless
        # the ring feeds it: each the faster form (scorer_wgmma's page loop)
        rows = mma_rows((8 - first_slot) * hs)
        unrolled = "(unrolled: the listing)" in done.stdout
        assert unrolled == (rows == 8 or ring_pages(rows, long_row_pages(rows)) > 0), done.stdout


@pytest.mark.parametrize("hs, first_slot, ring", [(1, 0, 2), (4, 4, 2), (4, 0, 2)])
def test_the_page_ring_costs_one_barrier_a_page(hs, first_slot, ring, tmp_path):
    """The ring fed wgmma kernel (``page_ring.py``) at N 8 / 16 / 32, as the decode launches
    it: one bulk copy a page and no global code loads; at most one CTA barrier a page beyond
    the kernel's three (Gluon's shared-memory analysis, had it seen the ring, would put
    about five around each copy); its register cap spills nothing; its shared memory is
    what ``max_ring`` counts; a landed page's wait takes no branch."""
    from fast.kernels import page_ring
    from fast.scorer import long_row_pages, max_registers, mma_rows, shared_bytes, shared_tables

    dump = tmp_path / "ring.sass"
    flags = ["--hs", str(hs), "--first-slot", str(first_slot), "--pdl", "--ring", str(ring), "--dump", str(dump)]
    done = _compile_only("-m", "bench.sass", *flags)
    assert done.returncode == 0, done.stderr
    usage = done.stdout.splitlines()[0]
    assert "STACK:0 " in usage and "LOCAL:0 " in usage, usage
    cap = max_registers((8 - first_slot) * hs)
    assert cap is None or int(re.search(r"REG:(\d+)", usage).group(1)) <= cap, usage
    sass = dump.read_text()
    rows = mma_rows((8 - first_slot) * hs)
    pages = long_row_pages(rows)
    tables = shared_tables(rows)  # one copy and one wait more
    assert sass.count("UBLKCP") == pages + tables
    # the ring's arrays beside the kernel's dynamic buffers, as max_ring counts them
    static, dynamic = (int(re.search(rf"{k}:(\d+)", usage).group(1)) for k in (" SHARED", "DYNAMIC"))
    assert dynamic == shared_bytes(rows, pages), usage
    _assert_dynamic_buffers_1k_aligned(static, usage)
    assert static == page_ring.BASE_STATIC + page_ring.ring_bytes(ring, tables), usage
    assert static + dynamic <= page_ring.SHARED_LIMIT, usage
    assert sass.count("LDG.E.128") <= 2  # q's rows only: no page's code words from global memory
    assert sass.count("BAR.SYNC") <= pages + 3, sass.count("BAR.SYNC")
    _assert_landed_copies_take_no_branch(sass)
    assert sass.count("TRYWAIT") == pages + tables  # one poll a wait, the retry inside its loop


def _assert_dynamic_buffers_1k_aligned(static: int, usage: str) -> None:
    """The dynamic buffers (q's tile among them) start where the static arrays end, so the
    static size must keep them 1 KB aligned: wgmma reads q's tile through the 128-byte
    swizzle of its absolute address bits, which repeats every 1 KB, while Triton stores it
    by the pattern relative to the tile's base. Off by a multiple of 16 bytes (a new
    ``.shared`` array of mbarriers, say) the MMA reads q's elements permuted within each row:
    wrong scores, on a GPU only (the thirty-ninth session's warp-specialized harness)."""
    assert static % 1024 == 0, usage


def _assert_landed_copies_take_no_branch(sass: str) -> None:
    """A landed copy's wait takes no branch: between a poll and the first shared read after
    it every branch is a poll loop's retry (taken only on a failed poll), one a poll (two
    waits may come together). A bound with a slow path of its own puts a branch taken at
    every wait here."""
    listing = [line.split("*/", 1)[1].strip() for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", line)]
    for at, line in enumerate(listing):
        if "TRYWAIT" in line:
            read = next(k for k in range(at, len(listing)) if listing[k].startswith("LDS"))
            branches = [b for b in listing[at:read] if "BRA" in b]
            polls = sum("TRYWAIT" in b for b in listing[at:read])
            assert len(branches) == polls and all(b.startswith("@!P") for b in branches), branches


@pytest.mark.parametrize("hs, first_slot, pages", [(4, 0, 8), (4, 0, 3), (1, 0, 3), (4, 4, 1), (8, 0, 4)])
def test_the_wgmma_kernels_shared_memory_is_what_max_ring_counts(hs, first_slot, pages, tmp_path):
    """``shared_bytes`` (what ``max_ring`` leaves the kernel's own buffers) is the dynamic
    shared memory the compiled kernel asks for, at N 8 (q's tile reused), 16, 32 and 64 and
    page counts that pad — an undercount lets a ring through that fails at launch; fed from
    registers, the kernel's static shared memory is the scale table's copy where
    ``shared_tables`` says (one bulk copy, one wait), nothing of a ring."""
    from fast.kernels import page_ring
    from fast.scorer import mma_rows, shared_bytes, shared_tables

    dump = tmp_path / "fed.sass"
    flags = ["--hs", str(hs), "--first-slot", str(first_slot), "--pages", str(pages), "--pdl", "--ring", "0"]
    done = _compile_only("-m", "bench.sass", *flags, "--dump", str(dump))
    assert done.returncode == 0, done.stderr
    usage = done.stdout.splitlines()[0]
    rows = mma_rows((8 - first_slot) * hs)
    assert f"DYNAMIC:{shared_bytes(rows, pages)}" in usage, usage
    tables = shared_tables(rows)
    _assert_dynamic_buffers_1k_aligned(int(re.search(r" SHARED:(\d+)", usage).group(1)), usage)
    assert f" SHARED:{page_ring.BASE_STATIC + page_ring.ring_bytes(0, tables)} " in usage, usage
    sass = dump.read_text()
    assert (sass.count("UBLKCP"), sass.count("TRYWAIT")) == (tables, tables)


@pytest.mark.parametrize("hs, first_slot, pages, parts", [(8, 0, 4, 8), (8, 0, 1, 8), (4, 0, 3, 8), (1, 7, 8, 32)])
def test_wgmma_page_maxima_compile_in_every_layout(hs, first_slot, pages, parts):
    """The wgmma kernel's page maxima (``partial_maxima``: 32 or 8 partials a page and row;
    the epilogue's pages padded to a power of 2, one a warp, fewer repeated, more wrapped)
    compile for sm_90 at shapes that pick each layout: N 64 with 4 and 1 pages a program,
    N 32 with 3, N 8 (mma.sync) with 8. A layout Gluon cannot lower fails here, without a
    GPU; the GPU tests (test_gpu_scorer.py) hold every shape to the reference bit for bit."""
    from fast.kernels.page_maxima import partial_maxima
    from fast.scorer import mma_rows

    assert partial_maxima(mma_rows((8 - first_slot) * hs), pages) == parts
    flags = ["--hs", str(hs), "--first-slot", str(first_slot), "--pages", str(pages), "--pdl"]
    done = _compile_only("-m", "bench.sass", *flags)
    assert done.returncode == 0, done.stderr
    assert "LOCAL:0 " in done.stdout.splitlines()[0], done.stdout


def _decode_mix(
    hs: int, first_slot: int, decode: str, ops: tuple[str, ...], ring: int | None = None, base: str = "exact"
) -> tuple[list[int], list[int]]:
    """The counts of ``ops`` in the wgmma scorer's SASS (compiled for sm_90, launched as
    the decodes launch it with the ``base`` decode, or with ``ring``) with the ``base``
    decode and with ``decode``, both at the base's pages a program (the E4M3 route's own
    at N 32 are fewer)."""
    code = (
        "from bench.sass import scorer_sass\n"
        "from bench.sass_listing import instruction_mix\n"
        "from bench.variants import decode_mma\n"
        "from fast.scorer import long_row_pages, mma_rows\n"
        f"pages = long_row_pages(mma_rows((8 - {first_slot}) * {hs}), decode_mma({base!r}))\n"
        f"for decode in ({base!r}, {decode!r}):\n"
        f"    _, text = scorer_sass('wgmma', {hs}, None, pages, first_slot={first_slot}, pdl=True, ring={ring!r},"
        " decode=decode)\n"
        "    mix = instruction_mix(text)\n"
        f"    print(*(mix[op] for op in {ops!r}))\n"
    )
    done = _compile_only("-c", code)
    assert done.returncode == 0, done.stderr
    exact, probe = (list(map(int, line.split())) for line in done.stdout.split("\n")[:2])
    return exact, probe


@pytest.mark.parametrize("hs, first_slot", [(1, 0), (4, 4), (4, 0)])
def test_the_signless_probe_drops_the_sign_step_and_nothing_else(hs, first_slot):
    """The bench's ``signless`` probe prices a decode cheaper by the sign step (two
    sign-replicate ``prmt`` and two ``lop3`` per 8 codes): compiled at N 8, 16 and 32 it must
    lose exactly those — half the ``PRMT``, as many ``LOP3`` — and keep every conversion,
    MMA and load, or its row in the bench measures something else."""
    ops = ("PRMT", "LOP3", "F2FP", "HMMA", "HGMMA", "LDG", "LDS")
    (prmt, lop3, *rest), (prmt_s, lop3_s, *rest_s) = _decode_mix(hs, first_slot, "signless", ops)
    assert prmt > 0 and prmt_s * 2 == prmt, (prmt, prmt_s)
    assert lop3 - lop3_s == prmt // 2, (lop3, lop3_s, prmt)
    assert rest_s == rest, (rest, rest_s)


@pytest.mark.parametrize("hs, first_slot", [(1, 0), (4, 4), (4, 0)])
def test_the_no_decode_probe_drops_the_decode_and_keeps_the_rest(hs, first_slot):
    """The bench's no-decode probe (``decode="none"``) prices the scorer with a free decode:
    compiled at N 8, 16 and 32 it must have no ``PRMT``, keep only the conversions outside
    the decode (the exact kernel's ``F2FP`` less one per ``PRMT``: the decode issues 4 of
    each per 8 codes), and issue every MMA, global and shared load and bulk copy the exact
    kernel does (its one ``lop3`` a group keeps the scale bytes and table entries live), or
    its row in the bench would time a kernel that reads less."""
    ops = ("PRMT", "F2FP", "HMMA", "HGMMA", "LDG", "LDS", "UBLKCP")
    (prmt, f2fp, *rest), (prmt_n, f2fp_n, *rest_n) = _decode_mix(hs, first_slot, "none", ops)
    assert prmt > 0 and prmt_n == 0, (prmt, prmt_n)
    assert f2fp_n == f2fp - prmt, (f2fp, f2fp_n, prmt)
    assert rest_n == rest, (rest, rest_n)


@pytest.mark.parametrize("hs, first_slot", [(1, 0), (4, 4), (4, 0)])
def test_the_e4m3_no_decode_probe_drops_the_decode_and_keeps_the_rest(hs, first_slot):
    """The bench's no-decode probe of the E4M3 route (``decode="e4m3-none"``) prices that
    route with a free decode: compiled at N 8, 16 and 32 as the route launches it, it must
    have none of the decode's ``PRMT`` (the fragment's byte extraction folds away on any
    words, as on the decode's) and issue every E4M3 MMA, global and shared load and bulk
    copy the route does."""
    ops = ("PRMT", "F2FP", "QGMMA", "LDG", "LDS", "UBLKCP")
    (prmt, f2fp, *rest), (prmt_n, f2fp_n, *rest_n) = _decode_mix(hs, first_slot, "e4m3-none", ops, base="e4m3")
    assert prmt > 0 and prmt_n == 0, (prmt, prmt_n)
    assert f2fp == f2fp_n == 0, (f2fp, f2fp_n)
    assert rest_n == rest and rest[0] > 0, (rest, rest_n)


@pytest.mark.parametrize("hs, first_slot, ring", [(1, 0, None), (4, 4, None), (4, 0, 0)])
def test_the_e4m3_route_drops_the_widening_and_halves_the_mma(hs, first_slot, ring):
    """The E4M3-MMA route (``decode="e4m3"``, DESIGN §4.1): compiled at N 8, 16 and 32 (on
    the exact kernel's feed: N 32's policy feeds the route through the ring) it must keep
    the exact decode's lookup and sign steps (as many ``PRMT``: the E4M3 bytes' extraction
    into the fragment folds away), lose every ``F2FP`` (the widening, q's too), issue wgmma
    k32 (``QGMMA``, half the exact kernel's k16 MMAs — at N 8 too: sm_90 has no E4M3
    ``mma.sync`` of its own) and load what the exact kernel loads."""
    ops = ("PRMT", "F2FP", "HMMA", "HGMMA", "QGMMA", "LDG", "LDS", "UBLKCP")
    exact, e4m3 = _decode_mix(hs, first_slot, "e4m3", ops, ring)
    (prmt, f2fp, hmma, hgmma, qgmma, *loads), (prmt_e, f2fp_e, hmma_e, hgmma_e, qgmma_e, *loads_e) = exact, e4m3
    assert prmt > 0 and prmt_e == prmt, (prmt, prmt_e)
    assert f2fp > 0 and f2fp_e == 0, (f2fp, f2fp_e)
    assert qgmma == hmma_e == hgmma_e == 0 and 2 * qgmma_e == hmma + hgmma > 0, (exact, e4m3)
    assert loads_e == loads, (loads, loads_e)


def test_sass_tool_prices_the_e4m3_decode_by_part():
    """``python -m bench.sass --decode e4m3 --parts`` prices the E4M3-MMA route per page as
    the exact decode is priced: its decode part lighter by the widening's four ``cvt`` per 8
    codes at least (the budgets that PERF.md quotes)."""

    def decode_part(*flags: str) -> int:
        done = _compile_only("-m", "bench.sass", "--hs", "4", "--pdl", "--parts", *flags)
        assert done.returncode == 0, done.stderr
        return int(re.search(r"^  decode +(\d+) ", done.stdout, flags=re.M).group(1))

    exact, e4m3 = decode_part(), decode_part("--decode", "e4m3")
    assert e4m3 <= exact - 4 * 16, (exact, e4m3)  # 16 groups of 8 codes a page and thread at least


def test_pipe_rate_loops_are_the_instruction_under_test():
    """``python -m bench.pipe_rates`` times loops of one instruction each: compiled for
    sm_90 here, each loop is at least 90% the instruction it names (else the rate it prints
    would be some other instruction's)."""
    done = _compile_only("-m", "bench.pipe_rates", "--compile-only", timeout=300)
    assert done.returncode == 0, done.stderr
    expect = {"fma.f32": "FFMA", "imad": "IMAD", "prmt": "PRMT", "lop3": "LOP3", "cvt.e4m3x2": "F2FP"}
    loops = dict(re.findall(r"^(\S+) +loop: (.*)$", done.stdout, flags=re.M))
    assert set(loops) == set(expect), done.stdout
    for step, op in expect.items():
        mix = {name: int(n) for name, n in (item.split() for item in loops[step].split(", "))}
        assert mix.get(op, 0) >= 0.9 * sum(mix.values()), (step, mix)


def test_mma_rate_loops_are_the_mma_under_test():
    """``python -m bench.mma_rates`` times loops of one MMA shape each: compiled for
    sm_90 here, each loop's MMA instructions are of its kind (``HMMA`` for mma.sync, ``HGMMA``
    for wgmma) and, with the wgmma's fences, the ``NOP`` ptxas spaces dependent ``HMMA``
    with and (fresh steps) the running maximum's ``FMNMX``, at least 90% of the loop — else
    the rate it prints would be another instruction's."""
    done = _compile_only("-m", "bench.mma_rates", "--compile-only", timeout=600)
    assert done.returncode == 0, done.stderr
    loops = re.findall(r"^(\S+) +N (\d+) +(chain|fresh) loop: (.*)$", done.stdout, flags=re.M)
    assert len(loops) == 9, done.stdout
    for kind, n, steps, listed in loops:
        mix = {name: int(c) for name, c in (item.split() for item in listed.split(", "))}
        mma = "HMMA" if kind == "mma.sync" else "HGMMA"
        assert mix.get(mma, 0) > 0, (kind, n, steps, mix)
        kept = mix.get(mma, 0) + mix.get("WARPGROUP", 0) + mix.get("FMNMX", 0) + mix.get("NOP", 0)
        assert kept >= 0.9 * sum(mix.values()), (kind, n, steps, mix)


def test_fp8_mma_probe_cases_are_the_instructions_they_name():
    """``python -m bench.fp8_mma`` compares MMA instructions: compiled for sm_90 here, each
    case issues the one its name says — E4M3 k32 on the E4M3 routes, fp16 k16 on the fp16
    one, ``mma.sync`` m16n8 or wgmma m64nN with the case's N — else its table would compare
    something else (Triton's ``tl.dot`` widens E4M3 to fp16 for ``mma.sync``). In SASS the
    E4M3 wgmma is ``QGMMA`` alone, and the E4M3 ``mma.sync`` ptxas's expansion into fp16
    ``HMMA`` halves added by ``FADD``, as the probe's docstring says."""
    done = _compile_only("-m", "bench.fp8_mma", "--compile-only", timeout=600)
    assert done.returncode == 0, done.stderr
    cases = re.findall(r"^(\S+) +(mma\.sync|wgmma) +N (\d+) *: (\S+) \| (.*)$", done.stdout, flags=re.M)
    assert len(cases) == 21, done.stdout
    for route, mma, n, ptx, sass in cases:
        operands = "f32.f16.f16" if route == "f16" else "f32.e4m3.e4m3"
        k = 16 if route == "f16" else 32
        if mma == "mma.sync":
            assert ptx == f"mma.sync.aligned.m16n8k{k}.row.col.{operands}.f32", (route, mma, n, ptx)
        else:
            assert ptx == f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.{operands}", (route, mma, n, ptx)
        ops = dict(item.split() for item in sass.split(", "))
        if route == "f16":
            assert ("HMMA" if mma == "mma.sync" else "HGMMA") in ops and "QGMMA" not in ops, (route, mma, n, sass)
        elif mma == "wgmma":
            assert "QGMMA" in ops and "HMMA" not in ops and "F2FP" not in ops, (route, mma, n, sass)
        else:
            assert "HMMA" in ops and "FADD" in ops and "QGMMA" not in ops, (route, mma, n, sass)


@pytest.mark.parametrize("key_format", ["fp8", "bf16"])
@pytest.mark.parametrize("hs, first_slot", [(1, 0), (4, 7), (4, 4), (4, 0), (8, 0)])
def test_msa_mma_scorer_compiles_with_each_key_copied_once(key_format, hs, first_slot, tmp_path):
    """The MSA format's mma scorer compiles for sm_90 at every N a decode launches (8:
    mma.sync; 16, 32, 64: wgmma), as launched (its ring and register cap, the grid's
    largest programs), spills nothing, and moves every key byte once: where ``ring_feed``
    says bulk, one tensor copy a 64-token half-block's box (E4M3 one, BF16 two), one wait
    each (taking no branch once landed), the copies in flight at the first wait, its
    ring's static shared memory and the dynamic
    buffers as ``max_stages`` counts them; else each thread its 32 or 64 bytes of each
    half-block's tokens by 16-byte cp.async copies, nothing more (the GPU tests hold its
    scores to the reference's). Its budget by part (``--parts``) accounts for every
    instruction."""
    dump = tmp_path / "msa.sass"
    cmd = ["-m", "bench.sass", "--kernel", f"msa-{key_format}", "--hs", str(hs)]
    cmd += ["--first-slot", str(first_slot), "--pdl", "--dump", str(dump), "--parts"]
    done = _compile_only(*cmd)
    assert done.returncode == 0, done.stderr
    usage = done.stdout.splitlines()[0]
    assert "STACK:0 " in usage and "LOCAL:0 " in usage, usage
    # the budget by part: every instruction attributed (none "other"); E4M3 widened two
    # elements an instruction (64 a thread and half-block), BF16 taken as it lies
    parts = {k: float(v) for k, v in re.findall(r"^  (\w+) +([\d.]+) +[\d.]+", done.stdout, flags=re.M)}
    assert set(parts) == {"ring", "convert", "MMA", "mask", "maximum", "setup", "loop", "epilogue", "other", "total"}
    assert parts["other"] == 0 and parts["MMA"] >= 8 and parts["mask"] > 0 and parts["ring"] > 0, done.stdout
    assert (parts["convert"] >= 32) if key_format == "fp8" else (parts["convert"] == 0), done.stdout
    kept = sum(v for k, v in parts.items() if k not in ("total", "mask"))
    assert abs(parts["total"] - kept) < 0.5, done.stdout
    import torch

    from bench.sass_listing import instruction_mix
    from fast.kernels import page_ring
    from fast.msa.kernels import block_ring
    from fast.msa.scorer import KEY_FORMATS, dynamic_bytes, mma_constants
    from fast.scorer import long_row_pages, mma_rows

    rows = mma_rows((8 - first_slot) * hs)
    ppp = long_row_pages(rows, msa=True)
    dtype = KEY_FORMATS[key_format]
    launch = mma_constants(dtype, rows, ppp)
    text = dump.read_text()
    mix = instruction_mix(text)
    assert mix["HMMA" if rows == 8 else "HGMMA"] > 0, mix
    static, dynamic = (int(re.search(rf"{k}:(\d+)", usage).group(1)) for k in (" SHARED", "DYNAMIC"))
    if launch["BULK"]:
        assert launch["TENSOR"]  # the 1D copies are the capture's fallback: the GPU tests hold them
        boxes = 2 * ppp * dtype.itemsize  # a tensor copy a box of 128 bytes a row, BF16's rows two boxes
        assert mix["UTMALDG"] == boxes and mix["UBLKCP"] == 0 and mix["LDGSTS"] == 0, mix
        assert text.count("TRYWAIT") == 2 * ppp  # one poll a wait, the retry inside its loop
        _assert_landed_copies_take_no_branch(text)
        assert dynamic == dynamic_bytes(rows, ppp, fold=launch["FOLD"]), usage
        _assert_dynamic_buffers_1k_aligned(static, usage)
        assert static == page_ring.BASE_STATIC + block_ring.ring_bytes(launch["STAGES"], dtype.itemsize), usage
        assert static + dynamic <= page_ring.SHARED_LIMIT, usage
        # halves in flight while a program waits on its first: a ring of two issues the
        # second half's copy before that wait (else one half alone would be in flight),
        # deeper rings their STAGES - 1 of the prologue
        stages = launch["STAGES"]
        in_flight = stages if stages == 2 else stages - 1
        assert text[: text.index("TRYWAIT")].count("UTMALDG") == in_flight * dtype.itemsize, launch
        cap = launch.get("maxnreg")
        assert cap is None or int(re.search(r"REG:(\d+)", usage).group(1)) <= cap, usage
    else:
        copies_a_half = 4 if dtype == torch.float8_e4m3fn else 8  # 64 / 128 bytes a thread, 16 a copy
        assert mix["LDGSTS"] == 2 * ppp * copies_a_half and mix["UBLKCP"] == 0, mix
    # the program's block ids are loaded once, before its first MMA: a table load in the
    # half-block loop would hold the next copy (and, in order, the MMA after it) for a
    # load's latency; the query rows come in 16-byte loads, not element by element
    lines = text.splitlines()
    mmas = [i for i, line in enumerate(lines) if re.search(r"\bH(G)?MMA\.", line)]
    loads = [i for i, line in enumerate(lines) if re.search(r"\bLDG\.", line)]
    assert not [i for i in loads if mmas[0] < i < mmas[-1]], "a global load inside the half-block loop"
    assert not re.search(r"\bLDG\.E\.(U8|S8|U16|S16)\b", text), "the query loaded in pieces"


def _programs_an_sm(usage: dict) -> int:
    """Programs of 4 warps an H100 / H200 SM holds at a kernel's registers and shared
    memory (cuobjdump's REG and SHARED, Triton's DYNAMIC): 64K registers, allotted a warp
    in units of 256 (8 a thread); 228 KB of shared memory, 1 KB of it reserved a program."""
    by_registers = 65536 // (128 * -(-usage["REG"] // 8) * 8)
    return min(by_registers, _programs_by_shared(usage))


def _programs_by_shared(usage: dict) -> int:
    """``_programs_an_sm``'s bound by shared memory alone (at most 16)."""
    return min(228 * 1024 // (usage["SHARED"] + usage["DYNAMIC"] + 1024), 16)


_PROBE = """
import json, sys
from bench.sass import scorer_sass
from bench.sass_listing import instruction_mix
kernel, hs, slot = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = {}
for probe in (False, True):
    usage, text = scorer_sass(kernel, hs, None, None, first_slot=slot, pdl=True, loads_only=probe)
    mix = instruction_mix(text)
    out[probe] = {"usage": usage, "mix": mix, "waits": text.count("TRYWAIT"), "runs": text.count("LDS.128")}
print(json.dumps(out))
"""


@pytest.mark.parametrize(
    "key_format, hs, first_slot",
    [
        ("fp8", 1, 0),
        ("fp8", 4, 7),
        ("fp8", 4, 4),
        ("fp8", 4, 0),
        ("bf16", 1, 0),
        ("bf16", 4, 7),
        ("bf16", 4, 4),
        ("bf16", 4, 0),
    ],
)
def test_msa_ring_probe_reads_what_the_scorer_reads(key_format, hs, first_slot):
    """``block_variant_launch(..., loads_only=True)``, the bench's probe of the mma kernel's bulk
    ring (every shape whose ring is bulk), compiles beside the scorer it probes and keeps
    what bounds the ring: the same tensor copies and waits, every 16-byte read-back (one
    load a run: E4M3 4 a thread and half-block, BF16 8), the same static and dynamic shared
    memory, no spills, no MMA — and as many programs an SM as that shared memory allows.
    That is the scorer's count wherever shared memory bounds the scorer (E4M3, BF16 N 32);
    where the scorer's own registers bound it (BF16 N 8 / 16 run uncapped: 4-5 programs
    against 5-6) the probe holds more, as no cap can make it hold more registers than it
    needs: its rows there read the ring at the shared memory's bound, the scorer's above it."""
    import json

    from fast.scorer import long_row_pages, mma_rows

    done = _compile_only("-c", _PROBE, f"msa-{key_format}", str(hs), str(first_slot))
    assert done.returncode == 0, done.stderr
    scorer, probe = (json.loads(done.stdout.splitlines()[-1])[k] for k in ("false", "true"))
    ppp = long_row_pages(mma_rows((8 - first_slot) * hs), msa=True)
    runs = 4 if key_format == "fp8" else 8
    fields = {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", probe["usage"])}
    want = {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", scorer["usage"])}
    assert fields["STACK"] == fields["LOCAL"] == 0, probe["usage"]
    assert (fields["SHARED"], fields["DYNAMIC"]) == (want["SHARED"], want["DYNAMIC"]), (probe["usage"], scorer["usage"])
    by_shared = _programs_by_shared(want)
    assert _programs_an_sm(fields) == by_shared, (probe["usage"], by_shared)
    if key_format == "fp8" or mma_rows((8 - first_slot) * hs) == 32:
        assert _programs_an_sm(want) == by_shared, scorer["usage"]
    mix = probe["mix"]
    assert mix["UTMALDG"] == scorer["mix"]["UTMALDG"] > 0 and probe["waits"] == scorer["waits"] == 2 * ppp, mix
    assert mix.get("HMMA", 0) == mix.get("HGMMA", 0) == 0, mix
    assert probe["runs"] == scorer["runs"] == 2 * ppp * runs, (probe["runs"], scorer["runs"])  # 16-byte loads


@pytest.mark.parametrize("decode", ["exact", "e4m3"])
def test_n32_maxima_leave_room_for_the_programs_its_registers_allow(decode, tmp_path):
    """``partial_maxima``'s rule at N 32, as the decode launches it on long rows (8 pages
    exact, 4 E4M3; the ring of 2) on either route: with 8 partials the kernel's shared memory holds as many programs an
    SM as its registers do (the tool's own count, ``programs_per_sm``); 32 would hold
    fewer. The dynamic size is what ``shared_bytes`` counts for the route."""
    from bench.sass_listing import programs_per_sm, resources
    from fast.kernels.page_maxima import dynamic_bytes, folds_by_layout, partial_maxima
    from fast.scorer import long_row_pages, ring_pages, shared_bytes

    rows, pages = 32, long_row_pages(32, decode)
    assert ring_pages(rows, pages, decode) == 2
    flags = ["--hs", "4", "--first-slot", "0", "--pdl", "--decode", decode, "--dump", str(tmp_path / "n32.sass")]
    done = _compile_only("-m", "bench.sass", *flags)
    assert done.returncode == 0, done.stderr
    usage, held = done.stdout.splitlines()[:2]
    registers, static, dynamic = resources(usage)
    assert dynamic == shared_bytes(rows, pages, decode), usage
    by = programs_per_sm(registers, static + dynamic)
    assert held == f"programs an SM (sm_90): {min(by.values())} ({', '.join(f'{n} by {k}' for k, n in by.items())})"
    parts = partial_maxima(rows, pages, decode)
    assert dynamic_bytes(rows, pages, parts, decode, folds_by_layout(rows, parts)) == dynamic
    with_32 = programs_per_sm(registers, static + dynamic_bytes(rows, pages, 32, decode, False))["shared memory"]
    assert by["shared memory"] >= by["registers"] > with_32, (usage, by, with_32)


def test_programs_per_sm_counts_each_resource():
    """``programs_per_sm``: registers go out per warp in units of 256 (74 a thread take 80),
    each program's shared memory carries 1 KB the SM reserves, and an SM holds 64 warps."""
    from bench.sass_listing import programs_per_sm, resources

    assert resources("REG:74 STACK:0 SHARED:22528 LOCAL:0 DYNAMIC:20480") == (74, 22528, 20480)
    assert programs_per_sm(74, 22528 + 20480) == {"registers": 6, "shared memory": 5, "warps": 16}
    assert programs_per_sm(64, 0, warps=8) == {"registers": 4, "shared memory": 228, "warps": 8}


@pytest.mark.parametrize("first_slot, cap", [(0, None), (4, 96)])
def test_the_piped_ring_loop_waits_once_a_block(first_slot, cap, tmp_path):
    """bench.ring_variants' piped (``--ring-scorer piped``) on the E4M3 route at N 32 / 16,
    as bench.bounds' arms launch it: unspilled, at 5 programs an SM, one wait a block (each
    block's k32 MMAs left in flight across the next block's decode and the maxima before
    them: ptxas does not serialize them). Under N 16's own cap it would wait after every MMA;
    the exact route is refused by name (its HGMMA would be serialized at N 16, and N 32
    needs 132 registers)."""
    from fast.scorer import long_row_pages

    rows = 32 if first_slot == 0 else 16
    pages = long_row_pages(rows, "e4m3")
    dump = tmp_path / "piped.sass"
    flags = ["--hs", "4", "--first-slot", str(first_slot), "--pdl", "--ring-scorer", "piped"]
    capped = ["--register-cap", str(cap)] if cap else []
    done = _compile_only("-m", "bench.sass", *flags, "--decode", "e4m3", "--dump", str(dump), *capped)
    assert done.returncode == 0, done.stderr
    usage, held = done.stdout.splitlines()[:2]
    assert "STACK:0 " in usage and "LOCAL:0 " in usage and held.startswith("programs an SM (sm_90): 5 "), (usage, held)
    sass = dump.read_text()
    assert sass.count("QGMMA.64x") == 8 * pages  # 4 k32-steps a block, 2 blocks a page
    assert sass.count("WARPGROUP.DEPBAR") == 2 * pages, sass.count("WARPGROUP.DEPBAR")
    if cap:  # why bench.bounds' N 16 arm takes the cap: under the policy's, a wait every MMA
        done = _compile_only("-m", "bench.sass", *flags, "--decode", "e4m3", "--dump", str(dump))
        assert done.returncode == 0, done.stderr
        assert dump.read_text().count("WARPGROUP.DEPBAR") == 8 * pages
    refused = _compile_only("-m", "bench.sass", *flags)
    assert refused.returncode != 0 and "ring_scorer: 'piped'" in refused.stderr, refused.stderr[-400:]


@pytest.mark.parametrize("e4m3", [False, True])
def test_the_maxima_probe_drops_the_page_maxima_alone(e4m3, tmp_path):
    """bench.probes' no_maxima_ring_pages (``--ring-scorer nomax``) at N 32, as bench.bounds'
    arms launch it (the E4M3 route at its cap of 80): unspilled and at the programs an SM the
    route's own kernel runs, its MMAs and page waits as the kernel's, and of the page maxima
    only the one fold and store after the pages (the kernel folds 8 partials a page by one
    conversion through shared memory: two ``STSM`` a page and thread); at N 16 it is
    refused by name (it spills there)."""
    decode = ["--decode", "e4m3"] if e4m3 else []
    flags = ["--hs", "4", "--first-slot", "0", "--pdl", *decode]
    own, probe = tmp_path / "own.sass", tmp_path / "probe.sass"
    capped = ["--register-cap", "80"] if e4m3 else []
    kernel = _compile_only("-m", "bench.sass", *flags, "--dump", str(own))
    done = _compile_only("-m", "bench.sass", *flags, "--ring-scorer", "nomax", *capped, "--dump", str(probe))
    assert kernel.returncode == 0 and done.returncode == 0, kernel.stderr + done.stderr
    usage, held = done.stdout.splitlines()[:2]
    assert "STACK:0 " in usage and "LOCAL:0 " in usage, usage
    own_held = kernel.stdout.splitlines()[1]
    assert _programs(held) == _programs(own_held), (held, own_held)
    a, b = own.read_text(), probe.read_text()
    for op in ("GMMA.64x", "WARPGROUP.DEPBAR", "SYNCS.PHASECHK"):
        assert a.count(op) == b.count(op), op
    pages = a.count("GMMA.64x") // (8 if e4m3 else 16)
    assert a.count("STSM") - b.count("STSM") == 2 * pages - 2, (a.count("STSM"), b.count("STSM"))
    refused = _compile_only("-m", "bench.sass", "--hs", "4", "--first-slot", "4", "--pdl", "--ring-scorer", "nomax")
    assert refused.returncode != 0 and "ring_scorer: 'nomax'" in refused.stderr, refused.stderr[-400:]


@pytest.mark.parametrize("decode", ["exact", "e4m3"])
def test_n32_folds_its_page_maxima_by_one_conversion(decode, tmp_path):
    """``page_maxima.folds_by_layout`` at N 32, as the decode launches it on long rows: each
    page's 8 partials are gathered by one conversion (two ``STSM`` and two ``LDSM`` a page
    and thread, a warp's own) with no shuffle, and the conversion adds no barrier — the
    kernel has as many as N 16's at the same pages and ring, which folds nothing."""
    from fast.scorer import long_row_pages

    pages = long_row_pages(32, decode)
    listings = {}
    for slot in ("0", "4"):  # N 32, N 16
        dump = tmp_path / f"slot{slot}.sass"
        flags = ["--hs", "4", "--first-slot", slot, "--pdl", "--decode", decode, "--pages", str(pages)]
        done = _compile_only("-m", "bench.sass", *flags, "--dump", str(dump))
        assert done.returncode == 0, done.stderr
        listings[slot] = dump.read_text()
    n32, n16 = listings["0"], listings["4"]
    assert "SHFL" not in n32
    assert n32.count("STSM") == 2 * pages, n32.count("STSM")
    assert n32.count("LDSM") >= 2 * pages, n32.count("LDSM")
    assert n32.count("BAR.SYNC") == n16.count("BAR.SYNC"), (n32.count("BAR.SYNC"), n16.count("BAR.SYNC"))


def _programs(held: str) -> int:
    """The programs an SM of ``bench.sass``' second line ("programs an SM (sm_90): 5 (...)")."""
    return int(re.match(r"programs an SM \(sm_90\): (\d+) ", held).group(1))


def _refill_segments(sass: str) -> list[list[str]]:
    """The listing's lines from each page loop's barrier to the copy it lets through (the
    ring's refills, after the first page's wait: the prologue's copies are not refills)."""
    lines = sass.splitlines()
    start = next(i for i, line in enumerate(lines) if "TRYWAIT" in line)
    bars = [i for i, line in enumerate(lines) if "BAR.SYNC" in line and i > start]
    segments = []
    for bar, after in zip(bars, bars[1:] + [len(lines)], strict=True):
        copy = next((i for i in range(bar, after) if "UBLKCP" in lines[i]), None)
        if copy is not None:
            segments.append(lines[bar:copy])
    return segments


def test_the_ring_loads_probe_keeps_the_rings_work_alone(tmp_path):
    """bench.probes' ring_loads (``--ring-scorer ring_loads``) at N 32, as bench.bounds
    launches it (and ring_copies, the same without the reads): unspilled, one program an
    SM more than the kernel's 5 (no q tile; its registers would allow 7), the kernel's page
    waits, barriers, copies and scale-byte reads
    (each page's words folded before the next page's: no register holds a page's words
    past it), and no MMA, decode or page maxima."""
    flags = ["--hs", "4", "--first-slot", "0", "--pdl"]
    own, probe = tmp_path / "own.sass", tmp_path / "probe.sass"
    kernel = _compile_only("-m", "bench.sass", *flags, "--dump", str(own))
    done = _compile_only("-m", "bench.sass", *flags, "--ring-scorer", "ring_loads", "--dump", str(probe))
    assert kernel.returncode == 0 and done.returncode == 0, kernel.stderr + done.stderr
    usage, held = done.stdout.splitlines()[:2]
    assert "STACK:0 " in usage and "LOCAL:0 " in usage and held.startswith("programs an SM (sm_90): 6 "), usage
    assert kernel.stdout.splitlines()[1].startswith("programs an SM (sm_90): 5 ")
    a, b = own.read_text(), probe.read_text()
    for op in ("UBLKCP", "TRYWAIT", "LDS.U8"):
        assert a.count(op) == b.count(op), op
    assert len(_refill_segments(a)) == len(_refill_segments(b)) >= 2  # a barrier before each refill
    for op in ("GMMA", "F2FP"):
        assert op in a and op not in b, op
    assert a.count("STSM") == 16 and b.count("STSM") == 2, (a.count("STSM"), b.count("STSM"))  # the maxima: once
    copies = tmp_path / "copies.sass"  # its reads dropped: the copies, waits and barriers alone
    done = _compile_only("-m", "bench.sass", *flags, "--ring-scorer", "ring_copies", "--dump", str(copies))
    assert done.returncode == 0, done.stderr
    assert _programs(done.stdout.splitlines()[1]) == 6, done.stdout
    c = copies.read_text()
    for op in ("UBLKCP", "TRYWAIT"):
        assert a.count(op) == c.count(op), op
    assert len(_refill_segments(c)) == len(_refill_segments(a))
    assert "LDS.U8" not in c and "LDS.128" not in c and "GMMA" not in c


def test_the_held_probe_drops_the_copies_and_waits_alone(tmp_path):
    """bench.probes' held_ring_pages (``--ring-scorer held``) at N 32 on both routes, as
    bench.bounds launches it (the E4M3 one at its cap of 80): the kernel's programs an SM,
    its reads, decode, MMAs, maxima and CTA barriers, and of its copies and waits only the
    prologue's (the ring's first pages and the scale table)."""
    flags = ["--hs", "4", "--first-slot", "0", "--pdl"]
    for route, cap in (([], []), (["--decode", "e4m3"], ["--register-cap", "80"])):
        own, held = tmp_path / "own.sass", tmp_path / "held.sass"
        kernel = _compile_only("-m", "bench.sass", *flags, *route, "--dump", str(own))
        done = _compile_only("-m", "bench.sass", *flags, *route, *cap, "--ring-scorer", "held", "--dump", str(held))
        assert kernel.returncode == 0 and done.returncode == 0, kernel.stderr + done.stderr
        assert "STACK:0 " in done.stdout and "LOCAL:0 " in done.stdout, done.stdout
        assert _programs(done.stdout.splitlines()[1]) == _programs(kernel.stdout.splitlines()[1]), route
        a, b = own.read_text(), held.read_text()
        for op in ("LDS.U8", "LDS.128", "GMMA", "STSM", "LDSM", "BAR.SYNC"):
            assert a.count(op) == b.count(op), (route, op)
        pages = len(_refill_segments(a)) + 2  # the refills and the ring's first 2 pages
        assert a.count("UBLKCP") == pages + 1 and b.count("UBLKCP") == 3, route  # + the scale table
        assert a.count("TRYWAIT") == pages + 1 and b.count("TRYWAIT") == 3, route


@pytest.mark.parametrize("kernel", ["wgmma", "msa-fp8"])
def test_the_tile_set_index_is_read_only_where_there_are_sets(kernel, tmp_path):
    """The Gluon scorers as the decodes launch them: the stock decode's (no tile sets)
    issues no load of the 8-byte set index — a global round trip the prologue would wait
    on for nothing — and the CP decode's (two sets) issues exactly one; where the kernel
    records (the MSA kernel's listing does), the set's guard adds one record write."""
    counts = []
    for sets in (0, 2):
        dump = tmp_path / f"sets{sets}.sass"
        done = _compile_only(
            "-m", "bench.sass", "--kernel", kernel, "--hs", "4", "--pdl", "--sets", str(sets), "--dump", str(dump)
        )
        assert done.returncode == 0, done.stderr
        text = dump.read_text()
        counts.append((len(re.findall(r"\bLDG\.E\.64\b", text)), len(re.findall(r"\bATOMG\.E\.CAS\b", text))))
    (loads0, cas0), (loads2, cas2) = counts
    assert (loads0, loads2) == (0, 1), counts
    assert cas2 - cas0 == (1 if kernel == "msa-fp8" else 0), counts
