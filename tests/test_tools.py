"""Developer tools that need no GPU: the sm_90 compile of the scorers and their SASS mix."""

import os
import re
import subprocess
import sys

import pytest
import torch


@pytest.mark.parametrize("kernel", ["wgmma", "prmt"])
def test_sass_tool_compiles_the_scorer_for_sm90(kernel, tmp_path):
    env = dict(os.environ, FAST_COMPILE_ONLY="1")
    env.pop("TRITON_INTERPRET", None)
    dump = tmp_path / "scorer.sass"
    cmd = [sys.executable, "-m", "fast.tools.sass", "--kernel", kernel, "--hs", "4", "--dump", str(dump)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "REG:" in done.stdout and "HGMMA" in done.stdout and "PRMT" in done.stdout
    stores = len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?STS", dump.read_text(), flags=re.M))
    if kernel == "wgmma":
        # the point of the kernel: the dequantized tile stays in registers. Staging it would
        # take 16 STS.128 per thread and page (64 fp16 per 64-token block, two blocks); the
        # stores left are q's tile (once per program) and the page maxima's partials (8 at
        # Hs = 4: 4 STS.128, 4 STS.64)
        assert stores < 16, f"{stores} shared-memory stores: the fp16 tile goes through shared memory again"
        # one page per trip of the main loop: 2 blocks of 64 tokens x 8 wgmma k-steps
        from fast.tools.sass import main_loop_mix

        assert (
            main_loop_mix(dump.read_text())["HGMMA"] == 16
            and "main loop" in done.stdout
            and "a program of 4 pages: ~" in done.stdout
        )
    else:
        assert stores > 16  # tl.dot stages the tile: the difference the test above relies on


def test_decode_kernels_compile_for_sm90():
    """The Triton kernels other than the scorers, compiled by Triton for the GPU (the
    selects in their three forms: three levels, slices of one chunk, a row of one chunk):
    the interpreter that runs them on CPUs executes Python and
    accepts what Triton's compiler rejects (a value bound inside a runtime ``if`` and used
    after it did exactly that once)."""
    env = dict(os.environ, FAST_COMPILE_ONLY="1")
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run(
        [sys.executable, "-m", "fast.tools.sass", "--kernels"], capture_output=True, text=True, env=env, timeout=600
    )
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
        "merge",
        "compact table",
        "q to tile",
        *selects,
        "push warp select columns=512",
        "push two-level warp select columns=2048",
        "push two-level warp select columns=4096",
    ]


def test_register_cap_spills_nothing():
    """The wgmma kernel at N <= 16 is compiled with a register cap (6 programs per SM
    instead of 5: fast/tools/PERF.md); a kernel change that makes the cap spill would silently
    trade that gain for local-memory traffic. Every capped shape the decode launches, as it
    launches them (PDL, the prefetch before the wait): N = 8 (mma.sync: Hs = 1, or q x Hs <=
    8) and N = 16 (wgmma). Compiled in a child without the
    interpreter (Gluon cannot lower the interpreter's functions; in this process only a
    warm Triton cache would hide that)."""
    from fast.kernels.scorer_wgmma import max_registers, mma_rows

    env = dict(os.environ, FAST_COMPILE_ONLY="1")
    env.pop("TRITON_INTERPRET", None)
    for hs, first_slot in ((1, 0), (2, 0), (4, 7), (4, 4)):
        cmd = [sys.executable, "-m", "fast.tools.sass", "--hs", str(hs), "--first-slot", str(first_slot), "--pdl"]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr
        usage = done.stdout.splitlines()[0]
        regs = int(re.search(r"REG:(\d+)", usage).group(1))
        assert regs <= max_registers((8 - first_slot) * hs), usage
        assert "STACK:0 " in usage and "LOCAL:0 " in usage, (
            f"Hs = {hs}, first slot {first_slot}: the register cap spills ({usage})"
        )
        # mma.sync's pages unrolled (no page loop in the listing), wgmma's in a loop: each
        # the faster form (scorer_wgmma's page loop)
        unrolled = "(unrolled: the listing)" in done.stdout
        assert unrolled == (mma_rows((8 - first_slot) * hs) == 8), done.stdout


@pytest.mark.parametrize("hs, first_slot, pages, parts", [(8, 0, 4, 8), (8, 0, 1, 8), (4, 0, 3, 8), (1, 7, 8, 32)])
def test_wgmma_page_maxima_compile_in_every_layout(hs, first_slot, pages, parts):
    """The wgmma kernel's page maxima (``partial_maxima``: 32 or 8 partials a page and row;
    the epilogue's pages padded to a power of 2, one a warp, fewer repeated, more wrapped)
    compile for sm_90 at shapes that pick each layout: N 64 with 4 and 1 pages a program,
    N 32 with 3, N 8 (mma.sync) with 8. A layout Gluon cannot lower fails here, without a
    GPU; the GPU tests (test_gpu_scorer.py) hold every shape to the reference bit for bit."""
    from fast.kernels.scorer_wgmma import mma_rows, partial_maxima

    assert partial_maxima(mma_rows((8 - first_slot) * hs), pages) == parts
    env = dict(os.environ, FAST_COMPILE_ONLY="1")
    env.pop("TRITON_INTERPRET", None)
    cmd = [
        sys.executable,
        "-m",
        "fast.tools.sass",
        "--hs",
        str(hs),
        "--first-slot",
        str(first_slot),
        "--pages",
        str(pages),
        "--pdl",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "LOCAL:0 " in done.stdout.splitlines()[0], done.stdout


def test_bench_header_names_a_dirty_tree(tmp_path, monkeypatch):
    """The report's commit is the tree's HEAD, "+dirty" while tracked files differ from it
    (untracked ones do not count), BENCH_COMMIT where set."""
    from fast.tools.bench import source_commit

    monkeypatch.delenv("BENCH_COMMIT", raising=False)
    assert source_commit(str(tmp_path)) == "unknown"  # not a repository

    def git(*args):
        subprocess.run(
            ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            check=True,
            capture_output=True,
        )

    git("init", "-q")
    (tmp_path / "kernel.py").write_text("a = 1\n")
    git("add", "kernel.py")
    git("commit", "-q", "-m", "one")
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    (tmp_path / "notes.txt").write_text("untracked")
    assert source_commit(str(tmp_path)) == head
    (tmp_path / "kernel.py").write_text("a = 2\n")
    assert source_commit(str(tmp_path)) == head + "+dirty"
    monkeypatch.setenv("BENCH_COMMIT", "given")
    assert source_commit(str(tmp_path)) == "given"


def test_bench_report_prints_every_section():
    """The report renders a (made-up) result of every section without a GPU: a format error
    here would otherwise surface only at the end of a lent machine's benchmark run."""
    import io

    from fast.tools.bench import print_report

    layer = {
        "context": 8192,
        "batch": 1,
        "query_len": 1,
        "stock_us": 9.0,
        "cp_us": 12.0,
        "stock_first_us": 9.5,
        "cp_first_us": 16.0,
        "cp_score_us": 5.0,
        "cp_stages_us": 6.5,
        "stock_score_us": 6.0,
        "stock_top16_us": 3.0,
    }
    report = {
        "machine": {
            "gpu": "GPU",
            "gpus": 2,
            "sms": 132,
            "memory_gib": 140,
            "torch": "t",
            "triton": "3.6",
            "commit": "c",
            "date": "d",
        },
        "ceilings": {"copy_read_plus_write_GBps": 2700.0, "stream_read_GBps": 4500.0},
        "checks": {"scorer": True, "cp": True, "stock": True},
        "scorer": [
            {"context": 8192, "batch": 1, "hs": 1, "slots": 8, "us": 3.0, "GBps": 200.0, "of_read_ceiling": 0.04},
            {
                "context": 131072,
                "batch": 8,
                "hs": 4,
                "slots": 8,
                "us": 40.0,
                "GBps": 1800.0,
                "of_read_ceiling": 0.4,
                "variant": {"kernel": "prmt"},
            },
        ],
        "torch_stock": [{"context": 8192, "batch": 1, "query_len": 1, "us": 70.0}],
        "select": [
            {"pages": 8192, "batch": 1, "heads": 2, "split": 16, "default": True, "pdl": False, "us": 5.0},
            {"pages": 8192, "batch": 1, "heads": 2, "split": 16, "default": True, "pdl": True, "us": 4.0},
            {"pages": 8192, "batch": 1, "heads": 2, "split": 1, "default": False, "pdl": False, "us": 13.0},
        ],
        "push": [
            {
                "columns": 512,
                "batch": 64,
                "query_len": 4,
                "programs": 1024,
                "split": 1,
                "warps": 1,
                "shape": [512, 16, 1, 1],
                "us": 6.1,
                "push_merge_us": 8.6,
                "pdl_us": 5.0,
                "pdl_push_merge_us": 7.0,
            },
            {
                "columns": 4096,
                "batch": 64,
                "query_len": 4,
                "programs": 1024,
                "split": 1,
                "warps": 2,
                "shape": [1024, 128, 8, 4],
                "us": 18.4,
                "push_merge_us": 21.0,
                "pdl_us": 17.0,
                "pdl_push_merge_us": 19.0,
            },
            {
                "columns": 4096,
                "batch": 64,
                "query_len": 4,
                "programs": 1024,
                "split": 1,
                "warps": 1,
                "warp_select": 1024,
                "shape": [1024, 128, 8, 4],
                "us": 12.0,
                "push_merge_us": 15.0,
                "pdl_us": 11.0,
                "pdl_push_merge_us": 13.0,
            },
        ],
        "world": 2,
        "layers": [layer],
        "targets": [
            {"target": "a target", "figures": "1.0x", "met": False},
            {"target": "another", "figures": "not measured", "met": None},
        ],
    }
    out = io.StringIO()
    print_report(report, out)
    text = out.getvalue()
    assert (
        "0.75x" in text
        and "     7.0     6.5 " in text
        and "9.5/16.0" in text
        and "kernel=prmt" in text
        and "batch   1  split 16: 5.0\n" in text
        and "split 16: 4.0  (PDL)\n" in text
    )
    assert "split  1: 13.0  (not the default)" in text
    assert (
        "1024 programs, 1 warps, one chunk: push 6.1 (5.0 PDL), + merge 8.6 (7.0 PDL; merge 2.5 by difference)\n"
        in text
        and "2 warps, 128x8x4: push 18.4 (17.0 PDL), + merge" in text
    )
    assert "1 warps, 1024 groups, warp select: push 12.0" in text
    assert "  [MISSED] a target: 1.0x\n  [not measured] another: not measured\n" in text


def _layer(context, batch, q, stock, cp, cp_score, stages, stock_top16=1.0, stock_score=10.0):
    """A per-layer row of the bench's report (µs)."""
    return {
        "context": context,
        "batch": batch,
        "query_len": q,
        "stock_us": stock,
        "cp_us": cp,
        "cp_score_us": cp_score,
        "cp_stages_us": stages,
        "stock_top16_us": stock_top16,
        "stock_score_us": stock_score,
    }


def test_targets_judge_each_target_on_the_runs_own_figures():
    """fast.targets: each of the issue's targets met, missed or not measured, on the points
    it names only (other batches, contexts and the scorer's variants do not count)."""
    from fast.tools.targets import judge

    def scorer(context, batch, hs, slots, frac, us=1.0, **variant):
        return {
            "context": context,
            "batch": batch,
            "hs": hs,
            "slots": slots,
            "of_read_ceiling": frac,
            "us": us,
            "variant": variant,
        }

    # 1 x 1M counts for the scorer (batch x context >= 8 x 128K); 1 x 128K and a variant do not
    report = {
        "checks": {"scorer": True, "cp": True, "stock": True},
        "scorer": [
            scorer(131072, 8, 1, 8, 0.86),
            scorer(1048576, 64, 1, 8, 0.9),
            scorer(131072, 8, 4, 8, 0.85),
            scorer(131072, 8, 4, 1, 0.87),
            scorer(131072, 1, 1, 8, 0.1),
            scorer(131072, 8, 1, 8, 0.2, kernel="table"),
            scorer(1048576, 1, 1, 8, 0.88, us=30.0),
        ],
        "select": [
            {"pages": 8192, "batch": 1, "default": True, "pdl": False, "us": 5.0},
            {"pages": 8192, "batch": 1, "default": True, "pdl": True, "us": 4.5},
            {"pages": 8192, "batch": 8, "default": True, "pdl": True, "us": 9.0},
        ],
        "layers": [
            _layer(1048576, 32, 1, 700.0, 360.0, 345.0, 12.0),
            _layer(1048576, 32, 4, 700.0, 600.0, 590.0, 14.0),
            _layer(131072, 32, 1, 95.4, 56.7, 49.3, 7.5),
            _layer(2048, 64, 4, 10.0, 6.0, 1.5, 4.5),
            _layer(131072, 64, 4, 183.0, 117.0, 107.0, 6.5),
            _layer(2048, 1, 1, 3.7, 6.6, 1.0, 3.4),
            _layer(1048576, 1, 1, 32.0, 25.0, 17.0, 8.0, stock_top16=3.7, stock_score=27.6),
        ],
    }
    got = {
        t["target"].split(" at ")[-1] if "CP / stock" in t["target"] else t["target"].split(" ")[0]: (
            t["met"],
            t["figures"],
        )
        for t in judge(report)
    }
    assert got["scorer"] == (True, "Hs 1 0.86-0.90, Hs 4 / 8 slots 0.85, Hs 4 / 1 slot 0.87")
    assert got["1M, batch 32, q 1"] == (True, "1.94x (700.0 / 360.0 µs)")
    assert got["128K, batch 32, q 1"] == (False, "1.68x (95.4 / 56.7 µs)")
    assert got["CP"] == (False, "2K 4.5 (4.5), 128K 6.5 (10.0)")
    assert got["rows"] == (True, "worst CP - stock +2.9 µs (2K, batch 1, q 1)")
    assert got["stock"] == (True, "alone 4.5 / 30.0 µs = 15.0%; in the layer 3.7 / 27.6 µs = 13.4%")

    report["scorer"][2]["of_read_ceiling"] = 0.84
    report["layers"][4]["cp_stages_us"] = 6.0
    report["layers"][5]["cp_us"] = 6.8
    report["select"][1]["us"] = 4.6
    verdicts = [t["met"] for t in judge(report)]
    assert verdicts == [False, True, False, True, False, False]
    report["checks"]["cp"] = False  # no speedup counts from a run whose decode failed its check
    assert [t["figures"] for t in judge(report)][1:3] == ["not reported: a decode failed its check in this run"] * 2
    assert [t["met"] for t in judge({"checks": {"scorer": True}})] == [None] * 6


def test_bench_push_case_pushes_and_merges_each_rows_top16_and_the_section_times_it():
    """The bench's push and merge alone do the real work on this backend: after the push
    every long row's 16 candidate slots hold the top 16 keys of its scores (as a set), and
    the merge then writes the reference's selection of the same scores; and the section
    runs (a stand-in timer calls each timed function once)."""
    from fast.backend import default_device
    from fast.tools import bench
    from reference.selection import exact_keys, select, top_keys

    dev, heads, batch, q, columns = default_device(), bench.HEADS, 2, 4, 40
    decode, layer, plan = bench.push_case(dev, torch.Generator().manual_seed(1), columns, batch)
    decode.push(layer, plan, q)
    rows = batch * q  # candidates: [rows_max, heads, 16] (parity 0, CP 1), row b * q + i
    got = (
        layer.recv.local[: batch * 8 * heads * 16]
        .view(batch * 8, heads, 16)[:rows]
        .sort(dim=-1, descending=True)
        .values.cpu()
    )
    scores = (
        plan.scores.cpu().reshape(batch, 8, heads, -1)[:, 8 - q :].reshape(rows * heads, -1)
    )  # query i in slot 8 - q + i
    cols = torch.arange(scores.shape[-1])
    want = top_keys(exact_keys(scores, cols, cols < columns - 1), 16)
    assert torch.equal(got.reshape(-1, 16), want)
    out = decode.merge(layer, plan, q, torch.empty(rows, heads, 16, dtype=torch.int32, device=dev))
    own = torch.full((rows * heads,), columns - 1)  # every query's own page is the table's last
    assert torch.equal(out.cpu().reshape(-1, 16), select(scores, own, columns))
    assert (layer.recv.local == -1).all()  # re-armed

    def once(fn, calls):
        fn(0)
        return 1.0

    timed = bench.push_section(dev, torch.Generator().manual_seed(1), shapes=((columns, batch, q),), timer=once)
    assert [
        (r["programs"], r["split"], r["us"], r["push_merge_us"], r["pdl_us"], r["pdl_push_merge_us"]) for r in timed
    ] == [(rows * heads, 1, 1.0, 1.0, 1.0, 1.0)]


def test_gaussian_cache_pool_holds_quantized_keys():
    """The bench's realistic cache: quantizer output (every byte a page the reference
    dequantizes to finite keys), GAUSSIAN_PAGES distinct pages repeated, and scales that
    cluster (what makes its scale-table gathers cheaper than random bytes')."""
    from fast.tools.timing import GAUSSIAN_PAGES, CachePool
    from reference.nvfp4 import dequantize_nvfp4, split_pages

    pool = CachePool(GAUSSIAN_PAGES + 3, torch.device("cpu"), keys="gaussian")
    assert pool.cache.shape == (GAUSSIAN_PAGES + 3, 128, 72) and pool.cache.dtype == torch.uint8
    assert torch.equal(pool.cache[GAUSSIAN_PAGES:], pool.cache[:3])
    assert bool(torch.isfinite(dequantize_nvfp4(pool.cache[:4])).all())
    scales = split_pages(pool.cache)[1]
    assert scales.unique().numel() <= 40 and bool((scales < 0x7F).all())
