"""Every bad input of every entry point, one row each: the exception's type and a message
that starts with the argument's name (``argument: ...``), so a row pins the check it means
and not a later one that happens to mention the same word.

Entry points: the reference API (``full_decode``, ``stock_decode``, ``cp_decode``,
``score_pages``, ``quantize_nvfp4``, ``dequantize_nvfp4``), the fast host API
(``IndexerDecodeCP``, ``build_cp_decode``, ``StockDecode``, ``GraphedDecode``, ``plan``,
``forward``, ``score_pages``), the device-side values ``check()`` reports, and the three
command lines with ``fuzz replay`` (exit 2, one ``error: argument:`` line, no traceback).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import reference
from bench.variants import score_variant
from fast.build import build_cp_decode
from fast.cp import IndexerDecodeCP
from fast.errors import BadBlockIdError, BadLengthError, new_record
from fast.graphs import GraphedDecode
from fast.scorer import run_scorer, score_pages
from fast.select.policy import force_select
from fast.stock import StockDecode
from fast.symm import SingleRankSymmetric
from fuzz.runner import example_json
from fuzz.strategies import DecodeConfig
from reference.cases import make_case, seq_len_for
from reference.decode import query_tile
from support import DEV, misaligned, on

CASE = make_case(0, [seq_len_for(20, 0), seq_len_for(3, 4)], query_len=2, heads=4, pattern="exact")
ORDER = ("index_q", "k_cache", "block_table", "seq_lens", "query_len")


@dataclass(frozen=True)
class Row:
    """One bad input: ``call()`` must raise ``exc`` whose message starts with ``argument:``."""

    id: str
    call: Callable
    exc: type
    argument: str


def _args(**changes) -> dict:
    args = dict(zip(ORDER, CASE.args()))
    return args | changes


def _changed(name: str, fn) -> dict:
    """The case's arguments with one of them replaced by ``fn(a clone of it)``."""
    args = _args()
    return args | {name: fn(args[name].clone())}


def _set(x: torch.Tensor, index, value) -> torch.Tensor:
    x[index] = value
    return x


# Decode inputs, each broken in one way: (id, arguments, exception, argument).
DECODE_INPUTS = [
    ("q-dtype", _args(index_q=CASE.index_q.float()), TypeError, "index_q"),
    ("q-not-tensor", _args(index_q=[1, 2]), TypeError, "index_q"),
    ("q-rank", _args(index_q=CASE.index_q[0]), ValueError, "index_q"),
    ("q-dim", _args(index_q=CASE.index_q[:, :, :64]), ValueError, "index_q"),
    ("q-heads-3", _args(index_q=CASE.index_q[:, :3]), ValueError, "index_q"),
    ("q-rows", _args(index_q=CASE.index_q[:3]), ValueError, "index_q"),
    ("k-dtype", _args(k_cache=CASE.k_cache.view(torch.int8)), TypeError, "k_cache"),
    ("k-shape", _args(k_cache=CASE.k_cache[:, :, :64]), ValueError, "k_cache"),
    ("k-empty", _args(k_cache=CASE.k_cache[:0]), ValueError, "k_cache"),
    ("bt-dtype", _args(block_table=CASE.block_table.long()), TypeError, "block_table"),
    ("bt-rank", _args(block_table=CASE.block_table[0]), ValueError, "block_table"),
    ("bt-rows", _args(block_table=CASE.block_table[:1]), ValueError, "block_table"),
    ("bt-empty", _args(block_table=CASE.block_table[:, :0]), ValueError, "block_table"),
    ("len-dtype", _args(seq_lens=CASE.seq_lens.long()), TypeError, "seq_lens"),
    ("len-rank", _args(seq_lens=CASE.seq_lens[None]), ValueError, "seq_lens"),
    ("query-len-0", _args(query_len=0), ValueError, "query_len"),
    ("query-len-9", _args(query_len=9), ValueError, "query_len"),
    ("query-len-float", _args(query_len=2.0), TypeError, "query_len"),
    ("query-len-bool", _args(query_len=True), TypeError, "query_len"),
]
# Values only the device sees (the reference raises; the fast path's check() does).
DEVICE_VALUES = [
    ("id-past-cache", _changed("block_table", lambda t: _set(t, (0, 3), CASE.k_cache.shape[0])), "block_table"),
    ("id-negative", _changed("block_table", lambda t: _set(t, (1, 0), -7)), "block_table"),
    ("id-huge", _changed("block_table", lambda t: _set(t, (0, 19), 10**6)), "block_table"),
    ("cache-smaller-than-table", _args(k_cache=CASE.k_cache[:5].clone()), "block_table"),
    ("len-negative", _changed("seq_lens", lambda s: _set(s, 1, -3)), "seq_lens"),
    ("len-below-query-len", _changed("seq_lens", lambda s: _set(s, 0, 1)), "seq_lens"),
]
# Values the reference sees and the fast path does not read (a sync per step would cost).
REFERENCE_ONLY = [
    ("q-nan-byte", _changed("index_q", lambda q: _set(q.view(torch.uint8), (1, 2, 3), 0xFF).view(q.dtype)), "index_q"),
    ("k-nan-scale", _changed("k_cache", lambda k: _set(k.view(-1, 9216), (0, 9000), 0x7F).view(k.shape)), "k_cache"),
]


def _reference_rows() -> list[Row]:
    paths = {
        "full": reference.full_decode,
        "stock": reference.stock_decode,
        "cp": lambda *a: reference.cp_decode(*a, cp=2),
    }
    rows = []
    for path, fn in paths.items():
        bad = [(i, a, e, n) for i, a, e, n in DECODE_INPUTS]
        bad += [(i, a, ValueError, n) for i, a, n in DEVICE_VALUES + REFERENCE_ONLY]
        for id_, args, exc, name in bad:
            rows.append(Row(f"reference-{path}-{id_}", lambda fn=fn, a=args: fn(*(a[k] for k in ORDER)), exc, name))
    rows += [
        Row("reference-cp-cp-3", lambda: reference.cp_decode(*CASE.args(), cp=3), ValueError, "cp"),
        Row("reference-cp-cp-str", lambda: reference.cp_decode(*CASE.args(), cp="2"), TypeError, "cp"),
        Row("reference-cp-width-small", lambda: reference.cp_decode(*CASE.args(), cp=2, width=2), ValueError, "width"),
    ]
    return rows


def _ref_score(**changes):
    a = (
        dict(
            q_tile=query_tile(CASE.index_q, 2, 2),
            k_cache=CASE.k_cache,
            block_table=CASE.block_table,
            lens=CASE.seq_lens,
            out=torch.full((2, 32, CASE.block_table.shape[1]), 7.0),
        )
        | changes
    )
    return lambda: reference.score_pages(**a)


REFERENCE_SCORER = [
    Row("ref-score-q-float32", _ref_score(q_tile=query_tile(CASE.index_q, 2, 2).float()), TypeError, "q_tile"),
    Row("ref-score-q-3d", _ref_score(q_tile=query_tile(CASE.index_q, 2, 2)[0]), ValueError, "q_tile"),
    Row("ref-score-k-int8", _ref_score(k_cache=CASE.k_cache.view(torch.int8)), TypeError, "k_cache"),
    Row("ref-score-k-transposed", _ref_score(k_cache=CASE.k_cache.transpose(0, 1)), ValueError, "k_cache"),
    Row("ref-score-bt-1d", _ref_score(block_table=CASE.block_table[0]), ValueError, "block_table"),
    Row("ref-score-bt-int64", _ref_score(block_table=CASE.block_table.long()), TypeError, "block_table"),
    Row("ref-score-lens-short", _ref_score(lens=CASE.seq_lens[:1]), ValueError, "lens"),
    Row("ref-score-lens-int64", _ref_score(lens=CASE.seq_lens.long()), TypeError, "lens"),
    Row("ref-score-out-shape", _ref_score(out=torch.zeros(2, 32, 3)), ValueError, "out"),
    Row("ref-score-out-fp16", _ref_score(out=torch.zeros(2, 32, 21, dtype=torch.half)), TypeError, "out"),
    Row(
        "ref-score-id-past-cache",
        _ref_score(block_table=_set(CASE.block_table.clone(), (0, 1), 10**6)),
        ValueError,
        "block_table",
    ),
]
REFERENCE_FORMAT = [
    Row("quantize-list", lambda: reference.quantize_nvfp4([1.0]), TypeError, "keys"),
    Row("quantize-int8", lambda: reference.quantize_nvfp4(torch.zeros(1, 128, 128).to(torch.int8)), TypeError, "keys"),
    Row("quantize-shape", lambda: reference.quantize_nvfp4(torch.zeros(1, 128, 64)), ValueError, "keys"),
    Row("quantize-inf", lambda: reference.quantize_nvfp4(torch.full((1, 128, 128), torch.inf)), ValueError, "keys"),
    Row("dequantize-int8", lambda: reference.dequantize_nvfp4(CASE.k_cache.view(torch.int8)), TypeError, "pages"),
    Row("dequantize-shape", lambda: reference.dequantize_nvfp4(CASE.k_cache[:, :, :64]), ValueError, "pages"),
    Row(
        "dequantize-transposed",
        lambda: reference.dequantize_nvfp4(CASE.k_cache[:2].transpose(0, 1).contiguous().transpose(0, 1)),
        ValueError,
        "pages",
    ),
    Row("dequantize-list", lambda: reference.dequantize_nvfp4([0]), TypeError, "pages"),
]


class _World(SingleRankSymmetric):
    """A one-process allocator that claims ``world`` ranks (for the state's own checks)."""

    def __init__(self, world):
        super().__init__(DEV)
        self.world = world


def _cp(**kw):
    return IndexerDecodeCP(**(dict(heads=4, max_reqs=2, symm=SingleRankSymmetric(DEV)) | kw))


def _stock(**kw):
    return StockDecode(**(dict(heads=4, max_reqs=2, device=DEV) | kw))


def _planned_cp():
    state = _cp()
    state.plan(on(CASE.block_table), on(CASE.seq_lens))
    return state


STATES = [
    Row("cp-world-3", lambda: _cp(symm=_World(3)), ValueError, "cp"),
    Row("cp-symm-none", lambda: _cp(symm=None), TypeError, "symm"),
    Row("cp-heads-3", lambda: _cp(heads=3), ValueError, "heads"),
    Row("cp-heads-float", lambda: _cp(heads=4.0), TypeError, "heads"),
    Row("cp-max-reqs-0", lambda: _cp(max_reqs=0), ValueError, "max_reqs"),
    Row("cp-max-reqs-past-int32-offsets", lambda: _cp(max_reqs=1 << 18), ValueError, "max_reqs"),
    Row("cp-split-3", lambda: force_select(_cp(), split=3), ValueError, "split"),
    Row("cp-max-chunk-24", lambda: force_select(_cp(), max_chunk=24), ValueError, "max_chunk"),
    Row("cp-max-chunk-8", lambda: force_select(_cp(), max_chunk=8), ValueError, "max_chunk"),
    Row("cp-select-after-plan", lambda: force_select(_planned_cp(), split=2), ValueError, "decode"),
    Row("cp-timeout-0", lambda: _cp(spin_timeout_s=0), ValueError, "spin_timeout_s"),
    Row("cp-timeout-str", lambda: _cp(spin_timeout_s="2"), ValueError, "spin_timeout_s"),
    Row("cp-timeout-day", lambda: _cp(spin_timeout_s=86400), ValueError, "spin_timeout_s"),
    Row(
        "build-max-reqs-0",
        lambda: build_cp_decode(heads=4, max_reqs=0, max_query_len=2, symm=_World(2)),
        ValueError,
        "max_reqs",
    ),
    Row("stock-heads-3", lambda: _stock(heads=3), ValueError, "heads"),
    Row("stock-heads-float", lambda: _stock(heads=2.0), TypeError, "heads"),
    Row("stock-max-reqs-0", lambda: _stock(max_reqs=0), ValueError, "max_reqs"),
    Row("stock-split-3", lambda: force_select(_stock(), split=3), ValueError, "split"),
    Row("stock-max-chunk", lambda: force_select(_stock(), max_chunk=16), ValueError, "max_chunk"),
    Row("stock-device-unknown", lambda: _stock(device="tpu"), ValueError, "device"),
    Row(
        "graphs-on-cpu",
        lambda: GraphedDecode(_stock(device="cpu"), query_len=2, table_width=21, k_caches=[CASE.k_cache]),
        ValueError,
        "decode",
    ),
    Row(
        "graphs-not-a-decode",
        lambda: GraphedDecode(object(), query_len=2, table_width=21, k_caches=[CASE.k_cache]),
        TypeError,
        "decode",
    ),
]


def _graphed(**kw):
    a = dict(query_len=2, table_width=CASE.block_table.shape[1], k_caches=[on(CASE.k_cache)], sizes=(2,)) | kw
    return GraphedDecode(_stock(), **a)


def _narrow_table():
    return on(CASE.block_table)[:, :5].contiguous()


def _graphed_step(**kw):
    def call():
        a = dict(block_table=on(CASE.block_table), seq_lens=on(CASE.seq_lens), index_q=on(CASE.index_q)) | kw
        _graphed().step(a["block_table"], a["seq_lens"], a["index_q"])

    return call


if DEV.type == "cuda":  # GraphedDecode replays CUDA graphs: its rows need a GPU
    STATES += [
        Row("graphs-query-len-9", lambda: _graphed(query_len=9), ValueError, "query_len"),
        Row("graphs-table-width-0", lambda: _graphed(table_width=0), ValueError, "table_width"),
        Row("graphs-layers-0", lambda: _graphed(layers=0), ValueError, "layers"),
        Row("graphs-no-caches", lambda: _graphed(k_caches=[]), ValueError, "k_caches"),
        Row("graphs-size-past-max-reqs", lambda: _graphed(sizes=(2, 4)), ValueError, "sizes"),
        Row("graphs-step-table-width", _graphed_step(block_table=_narrow_table()), ValueError, "block_table"),
        Row("graphs-step-len-int64", _graphed_step(seq_lens=on(CASE.seq_lens).long()), TypeError, "seq_lens"),
        Row("graphs-step-q-rows", _graphed_step(index_q=on(CASE.index_q)[:3]), ValueError, "index_q"),
        Row(
            "graphs-step-past-sizes",
            _graphed_step(
                block_table=on(torch.cat([CASE.block_table] * 2)),
                seq_lens=on(torch.cat([CASE.seq_lens] * 2)),
                index_q=on(torch.cat([CASE.index_q] * 2)),
            ),
            ValueError,
            "seq_lens",
        ),
    ]


def _plan_row(id_, path, table, lens, exc, name):
    def call():
        state = _cp() if path == "cp" else _stock()
        state.plan(on(CASE.block_table), on(CASE.seq_lens))  # the first plan fixes the width
        state.plan(table(), lens())

    return Row(f"{path}-plan-{id_}", call, exc, name)


def _plans() -> list[Row]:
    bt, sl = lambda: on(CASE.block_table), lambda: on(CASE.seq_lens)
    rows = []
    for path in ("cp", "stock"):
        rows += [
            _plan_row("bt-dtype", path, lambda: bt().long(), sl, TypeError, "block_table"),
            _plan_row("bt-rows", path, lambda: bt()[:1], sl, ValueError, "block_table"),
            _plan_row("bt-strided", path, lambda: bt()[:, ::2], sl, ValueError, "block_table"),
            _plan_row("bt-empty", path, lambda: bt()[:, :0], sl, ValueError, "block_table"),
            _plan_row("bt-not-tensor", path, lambda: [[0]], sl, TypeError, "block_table"),
            _plan_row("len-dtype", path, bt, lambda: sl().long(), TypeError, "seq_lens"),
            _plan_row(
                "more-requests-than-built",
                path,
                lambda: torch.cat([bt(), bt()]),
                lambda: torch.cat([sl(), sl()]),
                ValueError,
                "seq_lens",
            ),
            _plan_row("wider-than-first-plan", path, lambda: torch.cat([bt(), bt()], 1), sl, ValueError, "block_table"),
        ]
        if DEV.type == "cuda":
            rows.append(_plan_row("bt-on-cpu", path, lambda: CASE.block_table, sl, ValueError, "block_table"))
    return rows


def _forward_row(id_, path, exc, name, *, q=None, k=None, out=None, query_len=2, layer=None, plan=None):
    def call():
        state = _cp() if path == "cp" else _stock()
        own_plan = state.plan(on(CASE.block_table), on(CASE.seq_lens))
        args = (
            state.new_layer() if layer is None else layer(),
            own_plan if plan is None else plan(),
            on(CASE.index_q) if q is None else q(),
            on(CASE.k_cache) if k is None else k(),
            on(torch.full((4, 4, 16), -7, dtype=torch.int32)) if out is None else out(),
            query_len,
        )
        before = [t.clone() for t in _buffers(args[0])]
        try:
            state.forward(*args)
        finally:  # a refused forward launched nothing: no output, no buffer touched
            assert bool((args[4] == -7).all()), "a refused forward wrote its output"
            assert all(torch.equal(a, b) for a, b in zip(before, _buffers(args[0]))), "a refused forward ran"

    return Row(f"{path}-forward-{id_}", call, exc, name)


def _buffers(layer) -> list[torch.Tensor]:
    """A CP layer's buffers (a stock layer has none)."""
    if hasattr(layer, "tile"):
        return [layer.parity, layer.current, layer.tile.local, layer.recv.local]
    return []


def _forwards() -> list[Row]:
    q, k = lambda: on(CASE.index_q), lambda: on(CASE.k_cache)
    o = lambda: on(torch.full((4, 4, 16), -7, dtype=torch.int32))  # noqa: E731
    rows = []
    for path in ("cp", "stock"):
        other = _stock if path == "cp" else _cp
        rows += [
            _forward_row("q-dtype", path, TypeError, "index_q", q=lambda: q().float()),
            _forward_row("q-rows", path, ValueError, "index_q", q=lambda: q()[:3]),
            _forward_row("q-heads", path, ValueError, "index_q", q=lambda: q()[:, :2]),
            _forward_row("q-strides", path, ValueError, "index_q", q=lambda: q().transpose(0, 1).contiguous().mT),
            _forward_row("k-dtype", path, TypeError, "k_cache", k=lambda: k().view(torch.int8)),
            _forward_row("k-shape", path, ValueError, "k_cache", k=lambda: k()[:, :, :64].contiguous()),
            _forward_row("k-empty", path, ValueError, "k_cache", k=lambda: k()[:0]),
            _forward_row("out-dtype", path, TypeError, "out", out=lambda: o().long()),
            _forward_row("out-shape", path, ValueError, "out", out=lambda: o()[:, :, :8].contiguous()),
            _forward_row("query-len-9", path, ValueError, "query_len", query_len=9),
            _forward_row("query-len-0", path, ValueError, "query_len", query_len=0),
            _forward_row("query-len-bool", path, TypeError, "query_len", query_len=True),
            _forward_row("plan-none", path, TypeError, "plan", plan=lambda: None),
            _forward_row("plan-of-another-state", path, ValueError, "plan", plan=lambda p=path: _fresh_plan(p)),
            _forward_row("layer-of-the-other-path", path, TypeError, "layer", layer=lambda o=other: o().new_layer()),
        ]
    return rows


def _fresh_plan(path):
    state = _cp() if path == "cp" else _stock()
    return state.plan(on(CASE.block_table), on(CASE.seq_lens))


def _device_row(id_, path, args, name):
    """Plan and forward run (nothing the host can see is wrong); check() raises."""

    def call():
        state = _cp() if path == "cp" else _stock()
        plan = state.plan(on(args["block_table"]), on(args["seq_lens"]))
        out = on(torch.full((4, 4, 16), -7, dtype=torch.int32))
        state.forward(state.new_layer(), plan, on(args["index_q"]), on(args["k_cache"]), out, args["query_len"])
        state.check()

    exc = BadBlockIdError if name == "block_table" else BadLengthError
    return Row(f"{path}-check-{id_}", call, exc, name)


def _fast_scorer(fn=score_pages, **kw):
    a = dict(
        q_tile=on(query_tile(CASE.index_q, 2, 2)),
        k_cache=on(CASE.k_cache),
        block_table=on(CASE.block_table),
        lens=on(CASE.seq_lens),
        out=on(torch.full((2, 32, CASE.block_table.shape[1]), 7.0)),
    )
    options = {k: v for k, v in kw.items() if k not in a}
    a |= {k: v for k, v in kw.items() if k in a}

    def call():
        try:
            fn(*a.values(), **options)
        finally:  # refused before any launch
            assert bool((a["out"] == 7.0).all()), "a refused scorer call wrote its output"

    return call


def _variant(**kw):
    return _fast_scorer(score_variant, **kw)


FAST_SCORER = [
    Row("fast-score-kernel-unknown", _fast_scorer(run_scorer, kernel="fp8"), ValueError, "kernel"),
    Row("fast-score-prmt-not-in-the-decode", _fast_scorer(run_scorer, kernel="prmt"), ValueError, "kernel"),
    Row("fast-score-first-slot-8", _fast_scorer(first_slot=8), ValueError, "first_slot"),
    Row("fast-score-first-slot-float", _fast_scorer(first_slot=7.0), ValueError, "first_slot"),
    Row("fast-score-release-without-pdl", _fast_scorer(run_scorer, release=True), ValueError, "release"),
    Row("fast-score-q-set-stride-unaligned", _fast_scorer(q_set_stride=24), ValueError, "q_set_stride"),
    Row("fast-score-q-set-stride-negative", _fast_scorer(q_set_stride=-16), ValueError, "q_set_stride"),
    Row("fast-score-q-sel-int32", _fast_scorer(q_sel=on(torch.zeros(1, dtype=torch.int32))), TypeError, "q_sel"),
    Row(
        "fast-score-q-sel-empty",
        _fast_scorer(q_sel=on(torch.zeros(0, dtype=torch.int64)), q_sets=1),
        ValueError,
        "q_sel",
    ),
    Row(
        "fast-score-q-sel-without-q-sets",
        _fast_scorer(q_sel=on(torch.zeros(1, dtype=torch.int64))),
        ValueError,
        "q_sets",
    ),
    Row("fast-score-q-sets-without-q-sel", _fast_scorer(q_sets=2), ValueError, "q_sets"),
    Row(
        "fast-score-q-sets-0", _fast_scorer(q_sel=on(torch.zeros(1, dtype=torch.int64)), q_sets=0), ValueError, "q_sets"
    ),
    Row(
        "fast-score-q-sets-bool",
        _fast_scorer(q_sel=on(torch.zeros(1, dtype=torch.int64)), q_sets=True),
        TypeError,
        "q_sets",
    ),
    # two sets one stride apart where q_tile's storage holds one: the second would be read past it
    Row(
        "fast-score-q-sets-past-storage",
        _fast_scorer(q_sel=on(torch.zeros(1, dtype=torch.int64)), q_sets=2, q_set_stride=16),
        ValueError,
        "q_sets",
    ),
    Row("fast-score-q-3d", _fast_scorer(q_tile=on(query_tile(CASE.index_q, 2, 2))[0]), ValueError, "q_tile"),
    Row("fast-score-k-int8", _fast_scorer(k_cache=on(CASE.k_cache).view(torch.int8)), TypeError, "k_cache"),
    Row("fast-score-k-shape", _fast_scorer(k_cache=on(CASE.k_cache)[:, :, :64].contiguous()), ValueError, "k_cache"),
    Row("fast-score-k-misaligned", _fast_scorer(k_cache=misaligned(on(CASE.k_cache))), ValueError, "k_cache"),
    Row("fast-score-bt-int64", _fast_scorer(block_table=on(CASE.block_table).long()), TypeError, "block_table"),
    Row("fast-score-lens-short", _fast_scorer(lens=on(CASE.seq_lens)[:1]), ValueError, "lens"),
    Row("fast-score-lens-int64", _fast_scorer(lens=on(CASE.seq_lens).long()), TypeError, "lens"),
    Row("fast-score-out-shape", _fast_scorer(out=on(torch.full((2, 32, 3), 7.0))), ValueError, "out"),
    Row("fast-score-error-words", _fast_scorer(error=on(torch.zeros(4, dtype=torch.int32))), ValueError, "error"),
    Row("fast-score-error-dtype", _fast_scorer(error=new_record(DEV).long()), TypeError, "error"),
    Row("variant-tokens-32", _variant(tokens_per_dot=32, kernel="prmt"), ValueError, "tokens_per_dot"),
    Row("variant-ahead-3", _variant(blocks_ahead=3, kernel="wgmma"), ValueError, "blocks_ahead"),
    Row("variant-ahead-on-table", _variant(blocks_ahead=2, kernel="table"), ValueError, "blocks_ahead"),
    Row("variant-loads-only-on-table", _variant(loads_only=True, kernel="table"), ValueError, "loads_only"),
    Row("variant-signless-on-table", _variant(decode="signless", kernel="table"), ValueError, "decode"),
    Row("variant-no-decode-on-table", _variant(decode="none", kernel="table"), ValueError, "decode"),
    Row("variant-probe-loads-only", _variant(decode="signless", loads_only=True, kernel="wgmma"), ValueError, "decode"),
    Row("variant-unguarded-loads-only", _variant(guard=False, loads_only=True, kernel="wgmma"), ValueError, "guard"),
    Row("variant-decode-unknown", _variant(decode="fast", kernel="wgmma"), ValueError, "decode"),
    Row("variant-ring-5", _variant(ring=5, kernel="wgmma"), ValueError, "ring"),
    Row("variant-ring-float", _variant(ring=2.0, kernel="wgmma"), ValueError, "ring"),
    Row("variant-ring-on-table", _variant(ring=2, kernel="table"), ValueError, "ring"),
    Row("variant-tables-on-table", _variant(tables=True, kernel="table"), ValueError, "tables"),
    Row("variant-tables-int", _variant(tables=1, kernel="wgmma"), ValueError, "tables"),
    Row("variant-ring-with-blocks-ahead", _variant(ring=2, blocks_ahead=2, kernel="wgmma"), ValueError, "ring"),
    Row("variant-cap-300", _variant(register_cap=300, kernel="wgmma"), ValueError, "register_cap"),
    Row("variant-cap-on-table", _variant(register_cap=80, kernel="table"), ValueError, "register_cap"),
    Row("variant-pages-per-program-0", _variant(pages_per_program=0), ValueError, "pages_per_program"),
    Row("variant-partials-3", _variant(partials=3, kernel="wgmma"), ValueError, "partials"),
    Row("variant-partials-on-table", _variant(partials=8, kernel="table"), ValueError, "partials"),
    Row("variant-partials-loads-only", _variant(partials=8, loads_only=True, kernel="wgmma"), ValueError, "partials"),
]
if DEV.type == "cuda":  # the wgmma kernel's shapes: a GPU's (elsewhere the kernel is refused first)
    # N 32 (4 heads, 8 slots) with 8 pages a program: its maxima leave no room for a ring
    past = _variant(ring=1, pages_per_program=8, kernel="wgmma")
    FAST_SCORER += [Row("variant-ring-past-shared", past, ValueError, "ring")]
    # N 8 (4 heads, one slot), 8 pages: the E4M3 probe's q tile stays beside the maxima, so
    # the fourth ring page the exact kernel has room for is one too many for it
    e4m3 = _variant(decode="e4m3", ring=4, pages_per_program=8, first_slot=7, kernel="wgmma")
    FAST_SCORER += [Row("variant-e4m3-ring-past-shared", e4m3, ValueError, "ring")]

API_ROWS = (
    _reference_rows()
    + REFERENCE_SCORER
    + REFERENCE_FORMAT
    + STATES
    + _plans()
    + _forwards()
    + [_device_row(i, p, a, n) for i, a, n in DEVICE_VALUES for p in ("cp", "stock")]
    + FAST_SCORER
)


@pytest.mark.parametrize("row", API_ROWS, ids=[r.id for r in API_ROWS])
def test_api_row(row):
    with pytest.raises(row.exc) as info:
        row.call()
    assert re.match(rf"{re.escape(row.argument)}: ", str(info.value)), f"{type(info.value).__name__}: {info.value}"


def test_rows_are_unique():
    assert len({r.id for r in API_ROWS}) == len(API_ROWS)


# Command lines: {case} a valid case file, {garbage} a file that is not a case, {none} a
# missing file, {invalid} a case the reference refuses, {out} an output path in an existing
# folder, {far} one in a folder that does not exist. (program, line, argument).
COMMAND_LINES = {
    "reference-missing-case": ("reference", "decode --case {none} --path full --out {out}", "case"),
    "reference-garbage-case": ("reference", "decode --case {garbage} --path full --out {out}", "case"),
    "reference-invalid-case": ("reference", "decode --case {invalid} --path full --out {out}", "seq_lens"),
    "reference-cp-with-full": ("reference", "decode --case {case} --path full --cp 2 --out {out}", "cp"),
    "reference-cp-3": ("reference", "decode --case {case} --path cp --cp 3 --out {out}", "cp"),
    "reference-out-folder": ("reference", "decode --case {case} --path cp --cp 2 --out {far}", "out"),
    "reference-cp-path-without-cp": ("reference", "decode --case {case} --path cp --out {out}", "cp"),
    "reference-explain-row": ("reference", "explain --case {case} --row 999 --head 0 --cp 4", "row"),
    "reference-explain-head": ("reference", "explain --case {case} --row 0 --head 9 --cp 4", "head"),
    "reference-explain-missing-case": ("reference", "explain --case {none} --row 0 --head 0 --cp 4", "case"),
    "reference-make-query-len-9": ("reference", "make-case --out {out} --seq-lens 300 --query-len 9", "query-len"),
    "reference-make-heads-3": ("reference", "make-case --out {out} --seq-lens 300 --heads 3", "heads"),
    "reference-make-table-width": ("reference", "make-case --out {out} --seq-lens 300 --table-width -3", "table-width"),
    "reference-make-seq-lens": ("reference", "make-case --out {out} --seq-lens 300,x", "seq-lens"),
    "reference-make-len-below-query-len": (
        "reference",
        "make-case --out {out} --seq-lens 1 --query-len 2",
        "seq_lens",
    ),
    "reference-make-out-folder": ("reference", "make-case --out {far} --seq-lens 300", "out"),
    "fast-missing-case": ("fast", "decode --case {none} --path cp --cp 2 --backend cpu --out {out}", "case"),
    "fast-garbage-case": ("fast", "decode --case {garbage} --path cp --cp 2 --backend cpu --out {out}", "case"),
    "fast-invalid-case": ("fast", "decode --case {invalid} --path cp --cp 2 --backend cpu --out {out}", "seq_lens"),
    "fast-case-q-float32": ("fast", "decode --case {q_float} --path cp --cp 2 --backend cpu --out {out}", "index_q"),
    "fast-case-k-int8": ("fast", "decode --case {k_int8} --path stock --cp 2 --backend cpu --out {out}", "k_cache"),
    "fast-case-heads-3": ("fast", "decode --case {heads_3} --path cp --cp 2 --backend cpu --out {out}", "index_q"),
    "fast-case-query-len-9": (
        "fast",
        "decode --case {query_len_9} --path cp --cp 2 --backend cpu --out {out}",
        "query_len",
    ),
    "reference-case-query-len-2.7": (
        "reference",
        "decode --case {query_len_float} --path full --out {out}",
        "case",
    ),
    "fast-cp-3": ("fast", "decode --case {case} --path cp --cp 3 --backend cpu --out {out}", "cp"),
    "fast-out-folder": ("fast", "decode --case {case} --path cp --cp 2 --backend cpu --out {far}", "out"),
    "fuzz-unknown-target": ("fuzz", "replay nope {{}}", "target"),
    "fuzz-no-json": ("fuzz", "replay reference", "example"),
    "fuzz-not-json": ("fuzz", "replay reference {{seed:", "example"),
    "fuzz-missing-key": ("fuzz", 'replay reference {{"seed":1}}', "example"),
    "fuzz-extra-key": ("fuzz", "replay reference {extra}", "example"),
    "fuzz-mistyped-key": ("fuzz", "replay reference {mistyped}", "example"),
    "fuzz-unknown-breakage": ("fuzz", "replay inputs {breakage}", "example"),
    # values no campaign draws: each its own error line, not a traceback from the target
    **{
        f"fuzz-value-{field}": ("fuzz", f"replay {target} {{value_{field}}}", "example")
        for field, target in (
            ("cp", "reference"),
            ("heads", "reference"),
            ("pattern", "reference"),
            ("seq_lens", "reference"),
            ("query_len", "kernels"),
            ("extra_width", "protocol"),
            ("key_format", "reference"),
            ("msa_on_nvfp4_target", "stock"),
        )
    },
}
if DEV.type != "cuda":
    line = "decode --case {case} --path cp --cp 2 --backend cuda --out {out}"
    COMMAND_LINES["fast-cuda-without-a-gpu"] = ("fast", line, "cp")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    case = make_case(21, [5, 3000], query_len=2, heads=4, pattern="exact")
    case.save(root / "case.pt")
    torch.save(case.to_dict() | {"seq_lens": torch.tensor([1, 3000], dtype=torch.int32)}, root / "invalid.pt")
    broken = {
        "q_float": {"index_q": case.index_q.float()},
        "k_int8": {"k_cache": case.k_cache.view(torch.int8)},
        "heads_3": {"index_q": case.index_q[:, :3].contiguous()},
        "query_len_9": {"query_len": 9},
        "query_len_float": {"query_len": 2.7},
    }
    for name, change in broken.items():
        torch.save(case.to_dict() | change, root / f"{name}.pt")
    (root / "garbage.pt").write_bytes(b"not a torch file")
    cfg = json.loads(example_json(DecodeConfig(1, 2, 4, 1, (3000,), 30, "exact")))
    return dict(
        **{name: root / f"{name}.pt" for name in broken},
        case=root / "case.pt",
        invalid=root / "invalid.pt",
        garbage=root / "garbage.pt",
        none=root / "none.pt",
        far=root / "no" / "o.pt",
        extra=json.dumps(cfg | {"colour": 1}).replace(" ", ""),
        mistyped=json.dumps(cfg | {"heads": "four"}).replace(" ", ""),
        breakage=json.dumps([cfg, "no-such-breakage"]).replace(" ", ""),
        **{
            f"value_{field}": json.dumps(cfg | change).replace(" ", "")
            for field, change in (
                ("cp", {"cp": 3}),
                ("heads", {"heads": 3}),
                ("pattern", {"pattern": "sunny"}),
                ("seq_lens", {"seq_lens": [-5]}),
                ("query_len", {"query_len": 9}),
                ("extra_width", {"extra_width": -1}),
                ("key_format", {"key_format": "int4"}),
                ("msa_on_nvfp4_target", {"key_format": "fp8", "init_blocks": 1, "local_blocks": 2}),
            )
        },
    )


@pytest.mark.parametrize("program,line,name", COMMAND_LINES.values(), ids=COMMAND_LINES.keys())
def test_command_line_row(files, tmp_path, capsys, program, line, name):
    """Exit 2, one line on stderr that starts with ``error: <argument>:``, nothing written."""
    from fast.tools.cli import main as fast_main
    from fuzz.cli import main as fuzz_main
    from reference.cli import main as reference_main

    main = {"reference": reference_main, "fast": fast_main, "fuzz": fuzz_main}[program]
    code = main(line.format(**files, out=tmp_path / "o.pt").split())
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith(f"error: {name}:"), err
    assert not (tmp_path / "o.pt").exists()
