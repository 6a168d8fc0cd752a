"""The benchmark's pieces that run without a GPU: the report's header and sections, the
targets' verdicts, the push + merge case, the Gaussian cache pool, the MSA sections."""

import argparse
import functools
import operator
import re
import subprocess
import sys
import weakref

import pytest
import torch


def test_bench_header_names_a_dirty_tree(tmp_path, monkeypatch):
    """The report's commit is the tree's HEAD, "+dirty" while tracked files differ from it
    (untracked ones do not count), BENCH_COMMIT where set."""
    from bench.suite import source_commit

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


BAD_GRIDS = {
    "context-off-page": (["--contexts", "131072", "100"], "contexts"),
    "context-zero": (["--contexts", "0"], "contexts"),
    "context-past-table": (["--contexts", str(2 * 1048576)], "contexts"),
    "batch-zero": (["--batches", "8", "0"], "batches"),
    "world-unsupported": (["--world", "3"], "world"),
}


@pytest.mark.parametrize("argv,name", BAD_GRIDS.values(), ids=BAD_GRIDS.keys())
def test_bench_refuses_a_bad_grid_before_measuring(capsys, argv, name):
    """A bad --contexts / --batches / --world is a one-line error naming it, exit 2, on any
    machine, before the ceilings (which take minutes on a GPU) — not a failure deep inside."""
    from bench.__main__ import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {name}:"), err


def test_bench_report_prints_every_section():
    """The report renders a (made-up) result of every section without a GPU: a format error
    here would otherwise surface only at the end of a lent machine's benchmark run."""
    import io

    from bench.suite import print_report

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
        "gpu_state": [{"after": "scorer", "sm_mhz": 1980.0, "max_sm_mhz": 1980.0, "temp_c": 40.0, "power_w": 300.0}],
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
        "chained": [
            {"context": 131072, "batch": 8, "query_len": 4, "path": "cp", "hs": 4, "slots": 4}
            | {"layer_us": 40.0, "others_us": 9.5, "scorer_chained_us": 29.0}
        ],
        "targets": [
            {"target": "a target", "figures": "1.0x", "met": False},
            {"target": "another", "figures": "not measured", "met": None},
            {"target": "a third", "figures": "0.89", "met": True, "noise": True},
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
    assert "  [met, within noise] a third: 0.89\n" in text
    assert "  131072     8    cp   4     4     40.0     9.5    30.5     29.0\n" in text
    assert "(nvidia-smi): scorer 1980 MHz (max 1980), 40 C, 300 W\n" in text


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


def test_scorer_verdicts_hold_each_row_to_its_gathered_read():
    """bench.targets: every scorer goal is a fraction of the same run's gathered read of
    the row's pages, by the MMA's N (a large-grid goal from 32 x 128K, a small-grid one
    below, judged in the chained layer where the bench timed one); the Gaussian-key rows
    count; the no-decode probe and the MSA ring alone weigh each goal; rows below 8 x 128K,
    other variants and rows with no gathered read count for nothing; a worst figure within
    0.02 of its goal is flagged as noise."""
    from bench.targets import judge

    def row(hs, slots, batch, context, frac, gathered, us=1.0, **variant):
        out = dict(hs=hs, slots=slots, batch=batch, context=context, of_read_ceiling=frac, us=us)
        if gathered:
            out["gathered_read"] = gathered
        return out | ({"variant": variant} if variant else {})

    k128, m1 = 131072, 1048576
    report = {
        "checks": {"scorer": True, "cp": True, "stock": True},
        "scorer": [
            row(1, 8, 8, k128, 0.60, 0.80, us=10.0),  # small grid, timed in the chained layer below
            row(1, 8, 32, k128, 0.81, 0.90, us=20.0),
            row(4, 1, 1, m1, 0.60, 0.80),  # 1 x 1M: the small-grid goal
            row(1, 8, 32, k128, 0.855, 0.90, keys="gaussian"),
            row(4, 4, 32, k128, 0.77, 0.90),
            row(4, 4, 32, k128, 0.855, 0.90, decode="none"),
            row(4, 8, 32, k128, 0.45, 0.90),
            row(4, 8, 32, k128, 0.54, 0.90, decode="none"),
            row(4, 8, 8, m1, 0.60, 0.95),
            row(4, 8, 8, m1, 0.80, 0.95, decode="none"),
            # none of these counts: under 8 x 128K, another variant, no gathered read
            row(1, 8, 1, k128, 0.10, 0.80),
            row(1, 8, 32, k128, 0.05, 0.90, route="portable"),
            row(4, 1, 64, m1, 0.10, None),
        ],
        "chained": [
            dict(hs=1, slots=8, batch=8, context=k128, layer_us=20.0, others_us=12.0, scorer_chained_us=9.0),
            dict(hs=4, slots=1, batch=8, context=k128, layer_us=1.0, others_us=1.0, scorer_chained_us=1.0),
        ],
        "msa_scorer": [
            dict(
                format="fp8", hs=1, slots=8, batch=32, context=k128, of_read_ceiling=0.874, gathered_read=0.95, us=30.0
            ),
            dict(format="fp8", hs=4, slots=8, batch=8, context=k128, of_read_ceiling=0.76, gathered_read=0.84, us=9.0),
            dict(
                format="fp8", hs=4, slots=8, batch=8, context=k128, of_read_ceiling=0.80, variant={"loads_only": True}
            ),
            dict(format="fp8", hs=4, slots=8, batch=1, context=k128, of_read_ceiling=0.2, gathered_read=0.5),
        ],
    }
    names = ("N 8", "N 16", "N 32", "fp8", "bf16", "parity N 8", "parity N 16", "parity N 32")
    verdicts = dict(zip(names, judge(report)))
    n8 = verdicts["N 8"]
    assert n8["target"] == (
        "NVFP4 scorer at N 8 >= 0.90 of the gathered read at batch x context >= 32 x 128K, >= 0.85 from 8 x 128K"
        " (in the chained layer where measured)"
    )
    # 0.60 / 0.80 = 0.75 alone; in the layer the scorer adds 20 - 12 = 8 µs against 10 alone: 0.75 x 10 / 8
    assert n8["figures"] == (
        "Hs 4 / 1 slot: 0.75 at 1 x 1M; Hs 1: 0.75 at 8 x 128K (10.0 µs alone; in the chained layer 0.94: it adds"
        " 8.0 µs to 20.0, 9.0 chained to itself), 0.90 at 32 x 128K; Gaussian keys Hs 1: 0.95 at 32 x 128K;"
        " worst Hs 4 / 1 slot at 1 x 1M, 0.75 against 0.85"
    )
    assert (n8["met"], n8.get("noise")) == (False, None)
    # the section's first grid timed again at its end: the figure again beside a row under its goal
    report["scorer"].append(row(1, 8, 8, k128, 0.68, 0.80, again=True))
    again = judge(report)[0]
    assert again["figures"] == n8["figures"] + "; timed again at the section's end Hs 1 0.85 at 8 x 128K"
    assert again["met"] is False  # the verdict stays on the first timing
    report["scorer"].pop()
    # 0.77 / 0.90 = 0.856: met by 0.006, so within noise; the probe's 0.95 at its grid
    n16 = verdicts["N 16"]
    assert n16["figures"] == (
        "Hs 4 / 4 slots: 0.86 at 32 x 128K; worst Hs 4 / 4 slots at 32 x 128K, 0.86 against 0.85;"
        " with no decode at all Hs 4 / 4 slots 0.95 at 32 x 128K (met with the decode as it is)"
    )
    assert (n16["met"], n16.get("noise")) == (True, True)
    # 8 x 1M: a goal of 0.72 x 0.95 = 0.684 of the ceiling; (1/0.684 - 1/0.80) / (1/0.60 - 1/0.80) = 51%
    n32 = verdicts["N 32"]
    assert n32["figures"] == (
        "Hs 4 / 8 slots: 0.50 at 32 x 128K, 0.63 at 8 x 1M; worst Hs 4 / 8 slots at 32 x 128K, 0.50 against 0.72;"
        " with no decode at all Hs 4 / 8 slots 0.60 at 32 x 128K (the rest of the kernel alone misses the goal),"
        " Hs 4 / 8 slots 0.84 at 8 x 1M (the goal leaves the decode 51% of its time)"
    )
    assert n32["met"] is False
    # 0.76 / 0.84 = 0.905 against 0.95; the ring alone 0.80 of the ceiling = 0.95 of the gathered read:
    # (1/0.798 - 1/0.80) / (1/0.76 - 1/0.80) = 5% of the kernel's work
    fp8 = verdicts["fp8"]
    assert fp8["figures"] == (
        "Hs 4 / 8 slots: 0.90 at 8 x 128K; Hs 1: 0.92 at 32 x 128K; worst Hs 4 / 8 slots at 8 x 128K, 0.90 against"
        " 0.95; its ring alone Hs 4 / 8 slots 0.95 at 8 x 128K (the goal leaves the kernel's work 5% of its time)"
    )
    assert fp8["met"] is False
    # a row under the goal that the section timed again: the figure again, the verdict unchanged
    again = dict(report["msa_scorer"][1], of_read_ceiling=0.82, variant={"again": True})
    report["msa_scorer"].append(again)
    assert (
        judge(report)[3]["figures"]
        == fp8["figures"] + "; timed again at the section's end Hs 4 / 8 slots 0.98 at 8 x 128K"
    )
    assert judge(report)[3]["met"] is False
    report["msa_scorer"].pop()
    assert verdicts["bf16"]["met"] is None
    # parity: the FP8 row's 30 µs over the NVFP4 row's 20 at Hs 1, 32 x 128K: 1.50x, met within noise
    parity = verdicts["parity N 8"]
    assert parity["target"].startswith("NVFP4 pages a second >= 1.50x the FP8 scorer's blocks at N 8,")
    assert parity["figures"] == "Hs 1: 1.50x at 32 x 128K; worst Hs 1 at 32 x 128K, 1.50x against 1.50x"
    assert (parity["met"], parity.get("noise")) == (True, True)
    assert verdicts["parity N 32"]["figures"] == "not measured (no grid with both formats' rows)"
    # a small grid whose layer less its other stages is not positive counts as nothing gained
    report["scorer"].append(row(4, 1, 8, k128, 0.60, 0.80))
    assert "in the chained layer 0.00" in next(t["figures"] for t in judge(report) if "N 8" in t["target"])


def test_targets_judge_each_target_on_the_runs_own_figures():
    """bench.targets: the layer, top-16 and guard targets met, missed or not measured, on
    the points each names only."""
    from bench.targets import judge

    def scorer(context, batch, hs, slots, frac, us=1.0, **variant):
        return dict(context=context, batch=batch, hs=hs, slots=slots, of_read_ceiling=frac, us=us, variant=variant)

    report = {
        "checks": {"scorer": True, "cp": True, "stock": True},
        "scorer": [
            scorer(131072, 8, 1, 8, 0.86),
            scorer(131072, 8, 4, 8, 0.72),
            scorer(1048576, 1, 1, 8, 0.88, us=30.0),
            scorer(131072, 8, 1, 8, 0.87, us=0.99, kernel="wgmma", guard=False),
            scorer(131072, 8, 4, 8, 0.88, us=0.97, kernel="wgmma", guard=False),
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

    def judged() -> dict:
        """This report's verdicts but the scorers': short target name -> (met, figures)."""

        def key(target: str) -> str:
            return target.split(" at ")[-1] if "CP / stock" in target else target.split(" ")[0]

        return {key(t["target"]): (t["met"], t["figures"]) for t in judge(report)[8:14]}

    got = judged()
    assert got["1M, batch 32, q 1"] == (True, "1.94x (700.0 / 360.0 µs)")
    assert got["128K, batch 32, q 1"] == (False, "1.68x (95.4 / 56.7 µs)")
    assert got["CP"] == (False, "2K 4.5 (4.5), 128K 6.5 (10.0)")
    assert got["rows"] == (True, "worst CP - stock +2.9 µs (2K, batch 1, q 1)")
    assert got["stock"] == (True, "alone 4.5 / 30.0 µs = 15.0%; in the layer 3.7 / 27.6 µs = 13.4%")
    assert got["the"] == (False, "Hs 1 +1.0%, Hs 4 +3.1%")  # the guard's cost
    # read from the guarded row timed beside the unguarded one where the run has it
    report["scorer"].append(scorer(131072, 8, 1, 8, 0.86, us=1.01, kernel="wgmma", guard=True))
    assert judged()["the"] == (False, "Hs 1 +2.0%, Hs 4 +3.1%")
    report["scorer"].pop()

    report["layers"][4]["cp_stages_us"] = 6.0
    report["layers"][5]["cp_us"] = 6.8
    report["select"][1]["us"] = 4.6
    assert [t["met"] for t in judge(report)[8:14]] == [True, False, True, False, False, False]
    report["checks"]["cp"] = False  # no speedup counts from a run whose decode failed its check
    assert [t["figures"] for t in judge(report)][8:10] == ["not reported: a decode failed its check in this run"] * 2
    # the scorer rows above have no gathered read: no scorer goal judges them
    assert [t["met"] for t in judge(report)[:8]] == [None] * 8
    assert [t["met"] for t in judge({"checks": {"scorer": True}})] == [None] * 19


def test_targets_judge_the_e4m3_route_on_its_own_rows():
    """bench.targets: the E4M3-MMA route's goals read only its rows (variant {"mma":
    "e4m3"}), each against its gathered read, and weigh a goal against the route's own
    no-decode probe (``decode: e4m3-none``), not the exact kernel's; parity pairs the
    route's two formats."""
    from bench.targets import judge

    def row(hs, slots, frac, us, variant=None, **fields):
        r = dict(context=131072, batch=32, hs=hs, slots=slots, of_read_ceiling=frac, us=us, gathered_read=0.95)
        return r | fields | ({"variant": variant} if variant else {})

    e4m3 = {"mma": "e4m3"}
    report = {
        "checks": {"scorer": True},
        "scorer": [
            *(row(1, 8, 0.50, 10.0), row(1, 8, 0.92, 5.0, e4m3), row(4, 8, 0.80, 7.0, e4m3)),
            *(row(4, 8, 0.90, 6.0, {"decode": "e4m3-none"}), row(4, 8, 0.99, 6.0, {"decode": "none"})),
        ],
        "msa_scorer": [row(1, 8, 0.93, 9.0, e4m3, format="fp8"), row(4, 8, 0.94, 9.1, e4m3, format="fp8")],
    }
    got = {t["target"]: t for t in judge(report) if t["target"].startswith("E4M3")}
    n8, n16, n32, msa, parity = got.values()
    assert (n8["met"], n8["figures"]) == (True, "Hs 1: 0.97 at 32 x 128K; worst Hs 1 at 32 x 128K, 0.97 against 0.95")
    assert n16["met"] is None
    assert n32["met"] is False and "0.84 at 32 x 128K" in n32["figures"]
    # 0.88 of a 0.95 gathered read: (1 / 0.836 - 1 / 0.90) / (1 / 0.80 - 1 / 0.90) of the decode's time
    assert n32["figures"].endswith(
        "; with no decode at all Hs 4 / 8 slots 0.95 at 32 x 128K (the goal leaves the decode 61% of its time)"
    ), n32["figures"]
    assert "with no decode" not in n8["figures"]
    assert msa["met"] is True and msa.get("noise") and "0.98" in msa["figures"]
    assert parity["met"] is False and "Hs 1: 1.80x" in parity["figures"]
    assert "Hs 4 / 8 slots: 1.30x" in parity["figures"]


def test_bench_push_case_pushes_and_merges_each_rows_top16_and_the_section_times_it():
    """The bench's push and merge alone do the real work on this backend: after the push
    every long row's 16 candidate slots hold the top 16 keys of its scores (as a set), and
    the merge then writes the reference's selection of the same scores; and the section
    runs (a stand-in timer calls each timed function once)."""
    from bench import suite as bench
    from fast.backend import default_device
    from reference.selection import exact_keys, select, top_keys

    dev, heads, batch, q, columns = default_device(), bench.HEADS, 2, 4, 40
    decode, layer, plan = bench.push_case(dev, torch.Generator().manual_seed(1), columns, batch)
    decode.push(layer, plan, q, num_blocks=1)
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
    out = decode.merge(layer, plan, q, torch.empty(rows, heads, 16, dtype=torch.int32, device=dev), num_blocks=1)
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
    from bench.timing import GAUSSIAN_PAGES, CachePool
    from reference.nvfp4 import dequantize_nvfp4, split_pages

    pool = CachePool(GAUSSIAN_PAGES + 3, torch.device("cpu"), keys="gaussian")
    assert pool.cache.shape == (GAUSSIAN_PAGES + 3, 128, 72) and pool.cache.dtype == torch.uint8
    assert torch.equal(pool.cache[GAUSSIAN_PAGES:], pool.cache[:3])
    assert bool(torch.isfinite(dequantize_nvfp4(pool.cache[:4])).all())
    scales = split_pages(pool.cache)[1]
    assert scales.unique().numel() <= 40 and bool((scales < 0x7F).all())


def test_same_bytes_section_reads_each_rows_bytes_once_and_prints_them(capsys):
    """bench.same_bytes_section: one streamed read per distinct size of the scorer rows
    (NVFP4 pages of 9216 bytes, MSA blocks of 16 / 32 KB), the best of the read's program
    shapes, and one gathered read per distinct (batch, pages, page bytes); each row's
    fractions of the ceiling; the report prints both (the interpreter runs the read
    kernels; a stand-in timer times each size's sets once)."""
    from bench import msa as bench_msa
    from bench import suite as bench
    from bench import timing
    from fast.backend import default_device

    sizes = []

    def timer(fn, n):
        for i in range(n):
            fn(i)
        sizes.append(n)
        return 2.0  # µs, every call

    def row(context, batch, **more):
        return {"context": context, "batch": batch, "hs": 1, "slots": 8, "us": 1.0, "GBps": 1.0} | more

    report = {
        "ceilings": {"stream_read_GBps": 10.0},
        "scorer": [row(256, 2, of_read_ceiling=0.5), row(256, 2, of_read_ceiling=0.4, variant={"hot": True})],
        "msa_scorer": [row(256, 1, format="fp8", of_read_ceiling=0.3), row(128, 1, format="bf16", of_read_ceiling=0.3)],
    }
    bench.same_bytes_section(report, default_device(), timer=timer, flush_bytes=1 << 16)
    # 2 x 2 pages of 9216 bytes; 2 blocks of 16 KB and 1 of 32 KB: one size, two formats
    assert [r["bytes"] for r in report["same_bytes_reads"]] == [32768, 36864]
    # gathered: (batch, pages, page bytes) apart, so the two MSA rows are two reads
    assert [(r["batch"], r["pages"], r["page_bytes"]) for r in report["gathered_reads"]] == [
        (1, 1, 32768),
        (1, 2, 16384),
        (2, 2, 9216),
    ]
    streamed = 2 * len(timing.READ_SHAPES)
    assert len(sizes) == streamed + 3 * len(timing.GATHER_SHAPES)  # every shape of each, its cold sets each
    assert sizes[0] == 2  # 32 KB: two sets past 64 KB of flush
    assert sizes[streamed:] == [2] * 12  # 32, 32 and 36 KB: two sets each past 64 KB
    # GB/s = bytes / 2 µs / 1e3, against a 10 GB/s ceiling
    assert report["scorer"][0]["same_bytes_read"] == pytest.approx(36864 / 2.0 / 1e3 / 10.0)
    assert report["scorer"][0]["gathered_read"] == report["scorer"][0]["same_bytes_read"]  # the same stand-in time
    assert report["scorer"][1]["same_bytes_read"] == report["scorer"][0]["same_bytes_read"]
    assert report["msa_scorer"][0]["same_bytes_read"] == report["msa_scorer"][1]["same_bytes_read"]
    assert timing.read_cell(report["msa_scorer"][0]) == " 1.64"  # 32768 / 2 / 1e3 / 10, 5 wide
    assert timing.read_cell({}) == " " * 5
    assert timing.read_cell({"gathered_read": 0.873}, "gathered_read") == " 0.87"
    bench_msa.print_msa(report, sys.stdout)
    assert " 0.30  1.64  1.64  default\n" in capsys.readouterr().out  # frac, then read and gathered


@pytest.mark.parametrize("units", [1, 2, 4])  # timing.GATHER_SHAPES' pages a program
def test_gathered_read_kernel_reads_each_tables_pages_once(units):
    """timing._gather_kernel (the gathered read's): the programs' xors together equal the
    xor of exactly the pages its table names — every page read once, none else (pages of
    9216 bytes: 256-word chunks; a row width not a multiple of the program's pages)."""
    import triton

    from bench import timing
    from fast.backend import default_device

    dev, batch, width, words = default_device(), 2, 5, 9216 // 4
    gen = torch.Generator().manual_seed(units)
    pool = torch.randint(0, 2**31 - 1, (4 * batch * width * words,), generator=gen, dtype=torch.int32).to(dev)
    table = timing.disjoint_tables(batch, width, 4, gen, dev)[2]
    grid = batch * triton.cdiv(width, units)
    sink = torch.zeros(grid, dtype=torch.int32, device=dev)
    timing._gather_kernel[(grid,)](pool, table, sink, width, WORDS=words, CHUNK=256, UNITS=units)
    pages = pool.view(-1, words)[table.view(-1).long()].cpu()
    want = functools.reduce(operator.xor, pages.view(-1).tolist())
    assert functools.reduce(operator.xor, sink.cpu().tolist()) == want
    assert want != 0  # random words: a kernel that read nothing would fail


def test_gpu_state_reads_nvidia_smi_or_says_nothing(tmp_path, monkeypatch):
    """timing.gpu_state: the SM clock, its maximum, the temperature and the power nvidia-smi
    gives as a bench section ends, the memory's clock and temperature and the clock-event
    mask where given, and only the section's name where nvidia-smi is missing or answers
    something else (CI has none); a driver that refuses the memory fields is asked the first
    four alone; the report's line lists what was read, the idle event left out."""
    from bench import timing

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    assert timing.gpu_state("scorer") == {"after": "scorer"}
    fake = tmp_path / "nvidia-smi"

    def answers(line: str, refuse_memory: bool = False) -> None:
        refuse = 'case "$1" in *clocks.mem*) exit 2;; esac\n' if refuse_memory else ""
        fake.write_text(f"#!/bin/sh\n{refuse}echo '{line}'\n")
        fake.chmod(0o755)

    answers("1755, 1980, 71, 452.31")  # four values for seven fields: asked again, four
    hot = timing.gpu_state("msa scorer")
    assert hot == {"after": "msa scorer", "sm_mhz": 1755.0, "max_sm_mhz": 1980.0, "temp_c": 71.0, "power_w": 452.31}
    answers("1755, 1980, 71, 452.31", refuse_memory=True)
    assert timing.gpu_state("msa scorer") == hot
    answers("1980, 1980, 45, 300.5, 2619, 61, 0x0000000000000041")
    full = timing.gpu_state("chained")
    core = {"after": "chained", "sm_mhz": 1980.0, "max_sm_mhz": 1980.0, "temp_c": 45.0, "power_w": 300.5}
    assert full == core | {"mem_mhz": 2619.0, "mem_temp_c": 61.0, "events": 65.0}
    answers("1980, 1980, 45, 300.5, 2619, [N/A], 0x0000000000000001")
    idle = timing.gpu_state("select")
    assert idle["mem_mhz"] == 2619.0 and "mem_temp_c" not in idle and idle["events"] == 1.0
    answers("[N/A], 1980, 71, 452.31, 2619, 61, 0x0")
    assert timing.gpu_state("select") == {"after": "select"}
    line = timing.gpu_state_line([{"after": "ceilings"}, hot, full, idle])
    assert line == (
        "GPU as each section ended (nvidia-smi): msa scorer 1755 MHz (max 1980), 71 C, 452 W; "
        "chained 1980 MHz (max 1980), 45 C, 300 W, memory 2619 MHz 61 C, clock events 0x41; "
        "select 1980 MHz (max 1980), 45 C, 300 W, memory 2619 MHz"
    )
    assert timing.gpu_state_line([{"after": "ceilings"}]) == ""


@pytest.mark.heavy
def test_msa_sections_run_check_and_print(capsys):
    """The bench's MSA sections do their work on this backend (a stand-in timer calls each
    timed function once), the gate passes, and the report prints both formats' rows."""
    from bench import msa as bench_msa
    from fast.backend import default_device

    dev = default_device()
    calls = []

    def once(fn, n):
        for i in range(n):
            fn(i)
        calls.append(n)
        return 2.0

    gen = torch.Generator().manual_seed(1)
    rows = bench_msa.msa_scorer_section(
        dev, (256,), (2,), 100.0, gen, timer=once, flush_bytes=1 << 16, hot_grid=(1, 384)
    )
    # each format's cold rows, then its hot ones (one set of tables: L2-resident blocks),
    # the dot kernel's (cold: the portable route's, at every grid), then on a GPU the ring's
    # probe for each shape the mma kernel scores, fp8's E4M3-MMA route where the device runs
    # it, and last the first cold grid again
    from fast.msa.scorer import KEY_FORMATS, hopper_kernel
    from fast.route import device_route
    from fast.scorer import mma_rows

    e4m3 = dev.type == "cuda" and device_route(dev).e4m3_mma

    want = []
    for f in ("bf16", "fp8"):
        want += [(f, 2, 256, hs, slots, None) for hs, slots in bench_msa.MSA_SHAPES]
        want += [(f, 1, 384, hs, slots, {"hot": True}) for hs, slots in bench_msa.MSA_SHAPES]
        want += [(f, 2, 256, hs, slots, {"kernel": "dot"}) for hs, slots in bench_msa.MSA_SHAPES]
        want += [
            (f, 1, 384, hs, slots, {"loads_only": True})
            for hs, slots in bench_msa.MSA_SHAPES
            if dev.type == "cuda" and hopper_kernel(KEY_FORMATS[f], mma_rows(hs * slots)) == "mma"
        ]
        want += [(f, 2, 256, hs, slots, {"mma": "e4m3"}) for hs, slots in bench_msa.MSA_SHAPES if f == "fp8" and e4m3]
        want += [(f, 2, 256, hs, slots, {"again": True}) for hs, slots in bench_msa.MSA_SHAPES]
    assert [(r["format"], r["batch"], r["context"], r["hs"], r["slots"], r.get("variant")) for r in rows] == want
    assert calls[4:8] == [1] * 4  # the hot rows: one call a shape
    assert rows[4]["GBps"] == pytest.approx(3 * 32768 / 2.0 / 1e3)  # 1 request x 3 blocks in 2 µs
    bench_msa.print_msa({"msa_scorer": rows}, sys.stdout)
    printed = capsys.readouterr().out
    assert printed.count("  hot=True\n") == 8 and printed.count("  default\n") == 8
    assert printed.count("  kernel=dot\n") == 8 and printed.count("  mma=e4m3\n") == (4 if e4m3 else 0)
    assert printed.count("  loads_only=True\n") == len(want) - 32 - (4 if e4m3 else 0)
    assert printed.count("  again=True\n") == 8
    # 2 requests x 2 blocks of 32 KB / 16 KB in 2 µs, against a 100 GB/s ceiling
    assert rows[0]["GBps"] == pytest.approx(2 * 2 * 32768 / 2.0 / 1e3) and rows[-1]["of_read_ceiling"] > 0
    stages = bench_msa.msa_stock_stages(dev, (256,), (1,), gen, timer=once)
    assert [set(r) >= {"forward_us", "score_us", "select_us"} for r in stages] == [True, True]
    layers = bench_msa.msa_cp_vs_stock(dev, (32 * 128,), (2,), gen, cps=(4,), timer=once, flush_bytes=1 << 16)
    assert [(r["format"], r["cp"], r["speedup"]) for r in layers] == [("bf16", 4, 1.0), ("fp8", 4, 1.0)]
    assert bench_msa.check_msa(dev)
    feeds = bench_msa.msa_feed_section(dev, 100.0, gen, grid=(2, 256), timer=once, flush_bytes=1 << 16)
    if dev.type == "cuda":  # every shape the mma kernel scores, each feed timed (2 µs: equal fractions)
        from fast.msa.scorer import KEY_FORMATS, hopper_kernel
        from fast.scorer import mma_rows

        mma_shapes = [
            (f, hs, slots)
            for f in ("bf16", "fp8")
            for hs, slots in bench_msa.MSA_SHAPES
            if hopper_kernel(KEY_FORMATS[f], mma_rows(hs * slots)) == "mma"
        ]
        assert [(r["format"], r["hs"], r["slots"]) for r in feeds] == mma_shapes
        assert all(r["tensor_copies"] == r["copies_1d"] > 0 for r in feeds)
    else:
        assert feeds == []  # the mma kernel is a GPU kernel
    feeds = feeds or [{"format": "fp8", "context": 256, "batch": 2, "hs": 4, "slots": 8}]
    feeds[0] |= {"tensor_copies": 0.8771, "copies_1d": 0.8652}
    report = {"msa_scorer": rows, "msa_stock": stages, "msa_cp": layers, "msa_feeds": feeds}
    bench_msa.print_msa(report, sys.stdout)
    out = capsys.readouterr().out
    assert "MSA scorer alone" in out and "MSA stock decode" in out and "MSA CP rank vs stock" in out and " fp8 " in out
    assert "ring feeds" in out and "  0.877  0.865" in out


@pytest.mark.gpu
def test_chained_section_times_the_layers_beside_their_scorer_rows():
    """bench.layers.chained_section on a small grid: a CP row at each query length and a
    stock row at q 8, each naming the scorer row it stands beside, with its times (each a
    difference of two graphs' times: finite, of either sign at this size); a grid the run's
    contexts x batches lacks is skipped."""
    import math

    from bench.layers import CHAINED_QUERY_LENS, chained_section

    dev = torch.device("cuda", 0)
    rows = chained_section(dev, (2048,), (2,), heads=4, layers=2, reps=3, grids=((2, 2048), (1, 2048)))
    assert [(r["path"], r["hs"], r["slots"]) for r in rows] == [
        ("cp", 4, 1),
        ("cp", 4, 4),
        ("cp", 4, 8),
        ("stock", 1, 8),
    ]
    assert CHAINED_QUERY_LENS == (1, 4, 8)
    assert all(r["batch"] == 2 and r["context"] == 2048 for r in rows)
    assert all(math.isfinite(r[k]) for r in rows for k in ("layer_us", "others_us", "scorer_chained_us"))


@pytest.mark.gpu
def test_cold_timer_cycles_its_sets_to_the_least_graph():
    """bench.timing.graph_time_us: a warm-up call per set, then a graph of at least
    ``least`` calls cycling them (cold_time_us: COLD_CALLS), the time per captured call."""
    from bench.timing import COLD_CALLS, cold_time_us, graph_time_us

    seen = []
    x = torch.zeros(1, device="cuda")
    us = graph_time_us(lambda i: (seen.append(i), x.add_(1)), 2, reps=3, least=5)
    assert seen == [0, 1, 0, 1, 0, 1, 0]  # two warm-up calls, five captured
    assert us > 0 and x.item() == 2 + 5 * (1 + 3)  # the capture runs nothing; one untimed replay, three timed
    seen.clear()
    cold_time_us(lambda i: (seen.append(i), x.add_(1)), 3)
    assert len(seen) == 3 + COLD_CALLS and seen[3:] == [i % 3 for i in range(COLD_CALLS)]


@pytest.mark.gpu
def test_fp8_mma_probe_holds_the_exact_route_to_its_contract():
    """bench.fp8_mma on the GPU: the fp16 route (the exact route's arithmetic) scores small
    integers exactly in every case — each N, both instructions, a token's row moved within
    its tile — and random values within fp32 rounding of 128 terms; so a row of the probe
    that says the E4M3 MMA differs says it of the E4M3 MMA, not of the harness."""
    import math

    from bench import fp8_mma

    rows = fp8_mma.measure(torch.device("cuda", 0), patterns=("integers", "random"))
    assert len(rows) == 2 * len(fp8_mma.ROUTES) * len(fp8_mma.CASES)
    for r in (r for r in rows if r["route"] == "f16"):
        if r["pattern"] == "integers":
            assert r["exact"] == 1.0 and r["err_log2"] == -math.inf, r
            assert r["rolled"] == 0 and not any(r["same_as"].values()), r
        else:
            assert r["err_log2"] <= -16, r  # 127 fp32 additions: at most 127 x 2^-24 of the magnitudes' sum
    # the E4M3-MMA route's contract (DESIGN §4.1): wgmma's E4M3 scores are the model's, bit for bit
    assert [r["model"] for r in rows if r["model"] is not None] == [1.0] * 2 * 4, rows


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a child that fails: here, for want of a GPU")
def test_a_probe_whose_child_fails_is_left_out():
    """bench.variants.probe_runs: a probe whose child process fails (here it has no GPU to
    launch on) reads False, and the bench leaves that probe's rows out rather than dying in
    them (the GPU tiers check that the E4M3 probe's child succeeds)."""
    from bench.variants import probe_runs

    assert probe_runs("e4m3", ((1, 8),)) is False


@pytest.mark.gpu
@pytest.mark.hopper
def test_the_e4m3_probe_runs_in_its_child():
    """The E4M3-MMA route launches at every scorer shape of the bench (wgmma m64n8k32 at N 8
    included) in a child process: the bench then times its rows."""
    from bench.suite import SCORER_SHAPES
    from bench.variants import probe_runs

    assert probe_runs("e4m3", SCORER_SHAPES) is True


def test_msa_section_frees_each_formats_cache_before_the_next(monkeypatch):
    """msa_scorer_section: when a format's cache is made, no earlier format's cache lives (a
    cache made beside the last one read fp8's first rows slow: bench/PERF.md, "Leads")."""
    from bench import msa as bench_msa
    from fast.backend import default_device

    made = []

    def tracked(blocks, key_format, device):
        assert [ref() for ref in made] == [None] * len(made), f"{key_format}'s cache made beside an earlier one"
        cache = torch.empty(blocks, 8, dtype=torch.uint8)  # the section's stand-in timer never reads it
        made.append(weakref.ref(cache))
        return cache

    monkeypatch.setattr(bench_msa, "random_keys", tracked)
    gen = torch.Generator().manual_seed(1)
    bench_msa.msa_scorer_section(
        default_device(), (256,), (2,), 100.0, gen, timer=lambda fn, n: 2.0, flush_bytes=1 << 16, hot_grid=(1, 384)
    )
    assert len(made) == 2


def test_first_rows_preludes_are_made_of_known_steps():
    """bench.first_rows: every prelude is made of the steps ``run_prelude`` knows; an NVFP4
    one makes the pool once and before any step that scores on it, an "msa-" one drops the
    pool only after making it; "bench" and "msa-bench" are the suite's own start (the read
    ceilings, then the pool; for fp8, the pool handed back and bf16's rows); the CLI refuses
    --here without exactly one prelude before it touches a GPU."""
    from bench import first_rows

    for name, steps in first_rows.PRELUDES.items():
        assert set(steps) <= set(first_rows.STEPS) and steps.count("pool") == 1, name
        pool = steps.index("pool")
        assert all(steps.index(s) > pool for s in ("hs4", "untimed") if s in steps), name
    for name, steps in first_rows.MSA_PRELUDES.items():
        assert name.startswith("msa-") and set(steps) <= set(first_rows.STEPS), name
        assert "free" not in steps or steps.index("pool") < steps.index("free"), name
        assert not {"hs4", "untimed"} & set(steps), name
    assert first_rows.PRELUDES["bench"] == ("ceilings", "pool")
    assert first_rows.MSA_PRELUDES["msa-bench"] == ("ceilings", "pool", "free", "empty", "bf16")
    steps = {s for p in (first_rows.PRELUDES, first_rows.MSA_PRELUDES) for v in p.values() for s in v}
    assert steps == set(first_rows.STEPS)
    for argv in (["--here"], ["--here", "--prelude", "bench", "--prelude", "no-ceilings"]):
        with pytest.raises(SystemExit):
            first_rows.main(argv)


def test_first_rows_msa_line_pairs_each_shapes_first_and_again_row(monkeypatch):
    """``first_rows.msa_row`` on the section's rows (a stand-in section: the rows' fields as
    ``msa_scorer_section`` writes them): the last format's default rows at the first grid
    beside its ``again`` rows, shape by shape; other formats, grids and variants ignored."""
    from bench import first_rows

    def section(device, contexts, batches, read, gen, formats):
        rows = []
        for k, fmt in enumerate(formats):
            for variant, us in ((None, 50.0), ({"hot": True}, 9.0), ({"again": True}, 40.0)):
                for i, (hs, slots) in enumerate(first_rows.MSA_SHAPES):
                    row = {"format": fmt, "context": contexts[0], "batch": batches[0], "hs": hs, "slots": slots}
                    rows.append(row | {"us": us + i + 100 * k} | ({"variant": variant} if variant else {}))
        return rows

    monkeypatch.setattr(first_rows, "msa_scorer_section", section)
    line = first_rows.msa_row(None, None, formats=("bf16", "fp8"))
    shapes = first_rows.MSA_SHAPES
    want = "fp8 " + "  ".join(f"Hs {h}/{s} {150 + i:.1f} again {140 + i:.1f}" for i, (h, s) in enumerate(shapes))
    assert line == want, line


@pytest.mark.gpu
def test_ceilings_hand_their_buffers_back():
    """``timing.ceilings`` leaves none of its two buffers in PyTorch's cache: the suite's
    cache pool, carved from them, read its first timed rows slow (bench.first_rows)."""
    from bench.timing import CEILING_BYTES, ceilings

    device = torch.device("cuda", 0)
    kept = torch.cuda.memory_reserved(device)
    assert ceilings(device)["stream_read_GBps"] > 0
    assert torch.cuda.memory_reserved(device) - kept < CEILING_BYTES, "a ceiling buffer kept in PyTorch's cache"


@pytest.mark.gpu
@pytest.mark.hopper
def test_first_rows_times_the_row_after_each_prelude(capsys):
    """bench.first_rows on the GPU: each prelude's child prints one line, of the NVFP4 row's
    ROW_TIMINGS timings (each a positive number of µs) or of fp8's shapes, first and again."""
    from bench import first_rows

    assert first_rows.main(["--prelude", "bench", "--prelude", "no-ceilings", "--prelude", "msa-fresh"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.endswith("µs")]
    assert [line[0] for line in lines] == ["bench", "no-ceilings", "msa-fresh"], lines
    for line in lines[:2]:
        times = [float(t) for t in line[1:-1]]
        assert len(times) == first_rows.ROW_TIMINGS and min(times) > 0, line
    # fp8's rows: each shape's first and again µs
    assert lines[2][1] == "fp8" and lines[2].count("again") == len(first_rows.MSA_SHAPES), lines[2]


@pytest.mark.parametrize("shape", ["N32", "N16", "N8"])
def test_bounds_arms_are_launches_the_variants_take(shape):
    """bench.bounds: each shape's arms are ``variant_launch`` keywords it accepts at that
    shape (on a CPU every check passes but the last, the GPU's), named once, the route's
    own launch first — an arm it refused would end a scarce GPU call."""
    from bench import bounds
    from bench.suite import scorer_operands
    from bench.timing import CachePool
    from bench.variants import PROBE_DECODES, RING_PROBES, variant_launch

    _, hs, slot = next(s for s in bounds.SHAPES if s[0] == shape)
    pool = CachePool(64, torch.device("cpu"))
    o = scorer_operands(pool, 2, 4, hs, torch.Generator().manual_seed(0))
    names = [name for name, _ in bounds.ARMS[shape]]
    assert names[0] == "policy" and bounds.ARMS[shape][0][1] == {} and len(set(names)) == len(names)
    args = (o["tile"], pool.cache, o["tables"][0], o["lens"], o["out"])
    for _, variant in bounds.ARMS[shape]:
        with pytest.raises(ValueError, match="needs a GPU"):
            variant_launch(*args, kernel="wgmma", first_slot=slot, **variant)
    with pytest.raises(ValueError, match="decode"):  # the check holds: a bad keyword is caught first
        variant_launch(*args, kernel="wgmma", first_slot=slot, decode="nope")
    # the arms whose scores are held equal to their route's own launch (its first arm, the
    # route's plain launch): knobs and structures, not probes
    routes = {name: bounds.scores_result(variant) for name, variant in bounds.ARMS[shape]}
    probes = {
        name
        for name, v in bounds.ARMS[shape]
        if v.get("loads_only") or v.get("decode") in PROBE_DECODES or v.get("ring_scorer") in RING_PROBES
    }
    held = {name for name, route in routes.items() if route}
    assert routes["policy"] == "exact" and not held & probes and held | probes == set(names), (held, probes)
    for route in set(routes.values()) - {None}:
        first = next(v for name, v in bounds.ARMS[shape] if routes[name] == route)
        assert first == ({} if route == "exact" else {"decode": route}), (route, first)


def test_bounds_arms_named_keep_each_routes_first_arm():
    """``--arms``: the arms named, in ARMS' order, beside each route's first arm (the scores
    theirs are held to) — a probe alone keeps the exact route's; no name, every arm."""
    from bench import bounds, msa_bounds

    arms = bounds.ARMS["N32"]
    names = [n for n, _ in bounds.chosen_arms(arms, ["e4m3-none", "ppp8"], bounds.scores_result)]
    assert names == ["policy", "e4m3", "e4m3-none", "ppp8"], names
    names = [n for n, _ in bounds.chosen_arms(arms, ["nomax"], bounds.scores_result)]
    assert names == ["policy", "e4m3", "nomax"], names
    assert bounds.chosen_arms(arms, None, bounds.scores_result) == arms
    fp8 = msa_bounds.format_arms("fp8")
    names = [n for n, _ in bounds.chosen_arms(fp8, ["loads_only"], msa_bounds.scores_route)]
    assert names == ["policy", "loads_only", "e4m3"], names
    with pytest.raises(SystemExit):
        bounds.arm_parser("p", "d", bounds.SHAPES, arms).parse_args(["--arms", "none-such"])


@pytest.mark.parametrize("shape", ["N32", "N16", "N8"])
def test_bounds_arms_fit_the_shapes_they_are_timed_at(shape):
    """bench.bounds: every arm's knobs fit the policy's launch (``scorer.wgmma_options`` on
    an H100's or H200's 132 SMs) at one of the grids it times at least, as ``tune_wgmma``
    checks them on the GPU — an arm left out at every grid would time nothing there."""
    from bench import bounds
    from bench.variants import decode_mma, tune_wgmma
    from fast.scorer import wgmma_options

    _, hs, slot = next(s for s in bounds.SHAPES if s[0] == shape)
    for name, variant in bounds.ARMS[shape]:
        taken = []
        for batch, pages in bounds.GRIDS:
            policy = wgmma_options(hs, slot, batch, pages, 132, decode_mma(variant.get("decode", "exact")))
            try:
                tuned = tune_wgmma(policy, **variant)
            except ValueError:
                continue
            taken.append((batch, pages))
            assert name != "policy" or tuned == policy, tuned
        assert taken, f"{shape} {name}: refused at every grid of {bounds.GRIDS}"


def test_bounds_grid_option_names_the_bad_value():
    """bench.bounds' ``--grids``: BATCHxPAGES within the cache pool, else argparse's error."""
    from bench import bounds
    from bench.suite import POOL_PAGES

    assert bounds.grid("32x1024") == (32, 1024) and bounds.grid("8X1024") == (8, 1024)
    for bad in ("32", "x1024", "0x8", f"1x{POOL_PAGES + 1}", "ax2"):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(repr(bad))):
            bounds.grid(bad)


def test_bounds_resident_folds_every_id_onto_half_the_l2():
    """bench.bounds --resident: the tables' ids taken modulo half the L2's pages (an H100's 50
    MB: 2844 pages of 9216 bytes), every fold a page the pool holds and the rest of the
    table's layout kept; fold 0 leaves the tables as they are; the flag parses, and on a
    machine without an sm_90 GPU the command stops with one clear error."""
    from bench import bounds, timing

    assert bounds.resident_pages(50 * 2**20) == 50 * 2**20 // 2 // 9216 == 2844
    tables = timing.disjoint_tables(4, 1024, 3, torch.Generator().manual_seed(0), "cpu")
    folded = timing.fold_tables(tables, 2844)
    for t, f in zip(tables, folded, strict=True):
        assert f.dtype == t.dtype and f.shape == t.shape and torch.equal(f, t % 2844)
        assert 0 <= int(f.min()) and int(f.max()) < 2844 and len(f.unique()) > 2000  # spread, not one page
    assert timing.fold_tables(tables, 0) is tables
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            bounds.main(["--resident"])


def test_bounds_rows_print_each_arm_and_what_was_left_out():
    """bench.bounds' lines: an arm's µs each round, its GB/s at the best and that over g;
    an arm the grid refused, with why."""
    import io

    from bench import bounds

    out = io.StringIO()
    timings = {"policy": [126.8, 127.0], "ppp4": [124.6, 127.1]}
    bounds.print_rows(32, 1024, "N32", timings, 3000.0, {"ring0": "ring: 3 pages do not fit"}, file=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and "126.8 / 127.0 µs" in lines[0] and "2382 GB/s  0.79 g" in lines[0], lines
    assert lines[1].split()[1] == "ppp4" and "2424 GB/s" in lines[1], lines
    assert lines[2].split()[:2] == ["N32", "ring0"] and lines[2].endswith(
        "left out at this grid: ring: 3 pages do not fit"
    )
    # an arm whose scores were not the route's is named as such, not timed
    out = io.StringIO()
    bounds.print_rows(32, 1024, "N32", {}, 3000.0, {"ppp4": bounds.WRONG_SCORES}, file=out)
    assert out.getvalue().strip().endswith("its scores differ from the route's own launch: not timed"), out.getvalue()


@pytest.mark.parametrize("key_format", ["fp8", "bf16"])
def test_msa_bounds_arms_are_launches_the_block_variants_take(key_format):
    """bench.msa_bounds: each format's arms are ``block_variant_launch`` keywords (on a CPU
    the mma kernel's sm_90 check refuses every one), named once, the decode's own launch
    first; the E4M3 route only with fp8 keys, first of its route; the ring alone the one
    probe (its scores held to nothing), every other arm held to its route's own launch."""
    from bench import msa_bounds
    from bench.variants import block_variant_launch
    from fast.msa.scorer import KEY_FORMATS

    arms = msa_bounds.format_arms(key_format)
    names = [name for name, _ in arms]
    assert names[0] == "policy" and arms[0][1] == {} and len(set(names)) == len(names)
    assert ("e4m3" in names) == (key_format == "fp8")
    routes = {name: msa_bounds.scores_route(v) for name, v in arms}
    assert [name for name, route in routes.items() if route is None] == ["loads_only"], routes
    if key_format == "fp8":
        assert next(name for name, _ in arms if routes[name] == "e4m3") == "e4m3"
    tile = torch.zeros(1, 8, 4, 128).to(KEY_FORMATS[key_format])
    cache = torch.zeros(4, 128, 128).to(KEY_FORMATS[key_format])
    args = (tile, cache, torch.zeros(1, 2, dtype=torch.int32), torch.full((1,), 256, dtype=torch.int32))
    for _, variant in arms:
        with pytest.raises(ValueError, match="sm_90"):
            block_variant_launch(*args, torch.zeros(1, 32, 2), kernel="mma", num_pages=2, **variant)


def test_msa_bounds_fold_blocks_and_print_rates_by_the_block():
    """bench.msa_bounds --resident folds ids onto half the L2 in blocks of the format (an
    H100's 50 MB: 1600 fp8 blocks, 800 bf16), its rows' GB/s count the format's blocks, and
    on a machine without an sm_90 GPU the command stops with one clear error."""
    import io

    from bench import bounds, msa_bounds
    from bench.msa import block_bytes

    assert bounds.resident_pages(50 * 2**20, block_bytes("fp8")) == 1600
    assert bounds.resident_pages(50 * 2**20, block_bytes("bf16")) == 800
    out = io.StringIO()
    bounds.print_rows(32, 1024, "N32", {"policy": [200.0]}, 3000.0, file=out, unit_bytes=block_bytes("fp8"))
    assert "2684 GB/s  0.89 g" in out.getvalue(), out.getvalue()
    assert [s[0] for s in msa_bounds.SHAPES] == ["N32", "N16", "N8", "N8q1"]
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            msa_bounds.main(["--resident", "--formats", "fp8"])


@pytest.mark.gpu
@pytest.mark.hopper
def test_msa_bounds_times_every_arm_its_shape_takes(capsys):
    """bench.msa_bounds on the GPU at a small grid: every format's shapes print a row an arm
    (or why it was left out), no arm's scores differ from its route's, exit status 0."""
    from bench import msa_bounds

    assert msa_bounds.main(["--grids", "2x64", "--rounds", "1", "--resident"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("  N")]
    arms = len(msa_bounds.format_arms("fp8")) + len(msa_bounds.format_arms("bf16"))
    assert len(rows) == len(msa_bounds.SHAPES) * arms, out
    assert "its scores differ" not in out, out
