"""Every checked number at its edges, on every entry point that takes it, from one table.

``EDGES`` gives each argument its boundary values: the valid ends (taken), the first bad
value past each end, and a bool or float where an int is meant (each refused, the message
starting ``argument:``). ``ENTRIES`` gives each argument every entry point that takes it —
the reference and fast APIs, each CLI subcommand and path — as a call of the value with
otherwise valid inputs. A new entry point or argument gets every edge by construction; an
edge an entry point does not check fails here. (``test_bad_inputs.py`` keeps the other
bad inputs: types, shapes, devices, the values only the device sees.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import torch

import reference
from fast import IndexerDecodeCP, MsaDecodeCP, MsaStockDecode, StockDecode, build_cp_decode
from fast.checks import MAX_REQS
from fast.msa.scorer import score_blocks as fast_score_blocks
from fast.scorer import score_pages as fast_score_pages
from fast.symm import SingleRankSymmetric
from fast.tools.cli import main as fast_main
from reference import msa
from reference.cases import make_case
from reference.cli import main as reference_main
from reference.decode import query_tile
from reference.msa.decode import query_tile as msa_query_tile
from support import DEV, on

LENS = [20 * 128 + 3, 300]  # two requests, one long


@dataclass(frozen=True)
class Edge:
    """A value of an argument: ``ok`` (every entry takes it) or refused by ``exc`` naming it."""

    value: object
    ok: bool
    exc: tuple = (ValueError,)


def ok(value) -> Edge:
    return Edge(value, True)


def bad(value, *exc) -> Edge:
    return Edge(value, False, exc or (ValueError,))


WRONG_TYPE = (TypeError, ValueError)  # a bool or float for an int: either names the argument
EDGES = {
    "query_len": [ok(1), ok(8), bad(0), bad(9), bad(True, *WRONG_TYPE), bad(2.0, *WRONG_TYPE)],
    "cp": [ok(1), ok(8), bad(0), bad(3), bad(16), bad(True, *WRONG_TYPE), bad(2.0, *WRONG_TYPE)],
    "heads": [ok(1), ok(8), bad(0), bad(3), bad(16), bad(True, *WRONG_TYPE), bad(4.0, *WRONG_TYPE)],
    # the largest a state takes (MAX_REQS) allocates gigabytes: its first step past is refused
    "max_reqs": [ok(1), bad(0), bad(MAX_REQS + 1), bad(True, *WRONG_TYPE), bad(2.0, *WRONG_TYPE)],
    "spin_timeout_s": [ok(0.001), ok(3600), bad(0), bad(-1.0), bad(3600.5), bad(True, *WRONG_TYPE)],
    "first_slot": [ok(0), ok(7), bad(-1), bad(8), bad(True, *WRONG_TYPE), bad(7.0, *WRONG_TYPE)],
    "init_blocks": [ok(0), ok(16), bad(-1), bad(17), bad(True, *WRONG_TYPE)],
    "local_blocks": [ok(0), ok(16), bad(-1), bad(17), bad(True, *WRONG_TYPE)],
    "table_width": [ok(1), bad(0), bad(-3)],
}
# Integers only reach a command line (argparse reads a bool or float as a usage error).
CLI_EDGES = {name: [e for e in edges if type(e.value) is int] for name, edges in EDGES.items()}


def _valid(value, low: int, high: int, default: int) -> int:
    """``value`` where it is a usable int in ``low..high``, else ``default``: what the other
    inputs are built for, so that only the argument under test is wrong."""
    return value if type(value) is int and low <= value <= high else default


def _nvfp4(q: int = 2, heads: int = 2):
    return make_case(0, LENS, query_len=q, heads=heads, pattern="exact")


def _fp8(q: int = 2, heads: int = 2):
    return msa.make_case(0, LENS, dtype="fp8", query_len=q, heads=heads, pattern="exact")


def _with(args: tuple, query_len) -> tuple:
    return (*args[:4], query_len)


def _forward(state, case, query_len) -> None:
    plan = state.plan(on(case.block_table), on(case.seq_lens))
    out = on(torch.full((case.index_q.shape[0], case.index_q.shape[1], 16), -7, dtype=torch.int32))
    state.forward(state.new_layer(), plan, on(case.index_q), on(case.k_cache), out, query_len)
    state.check()


class _World(SingleRankSymmetric):
    """A one-process allocator that claims ``world`` ranks (for build_cp_decode's checks)."""

    def __init__(self, world: int):
        super().__init__(DEV)
        self.world = world


def _symm() -> SingleRankSymmetric:
    return SingleRankSymmetric(DEV)


def _fp8_state(cls, **kw):
    windows = dict(init_blocks=1, local_blocks=1)
    where = dict(symm=_symm()) if cls is MsaDecodeCP else dict(device=DEV)
    return cls(**(dict(heads=2, max_reqs=2, key_format="fp8") | where | windows | kw))


def _query_len_entries() -> dict:
    def ref(fn, fmt, **kw):
        def call(v):
            case = (_nvfp4 if fmt == "nvfp4" else _fp8)(q=_valid(v, 1, 8, 2))
            windows = case.windows() if fmt == "fp8" else {}
            fn(*_with(case.args(), v), **windows, **kw)

        return call

    def fast(make, fmt):
        def call(v):
            case = (_nvfp4 if fmt == "nvfp4" else _fp8)(q=_valid(v, 1, 8, 2))
            _forward(make(), case, v)

        return call

    return {
        "reference.full_decode": ref(reference.full_decode, "nvfp4"),
        "reference.stock_decode": ref(reference.stock_decode, "nvfp4"),
        "reference.cp_decode": ref(reference.cp_decode, "nvfp4", cp=2),
        "reference.msa.full_decode": ref(msa.full_decode, "fp8"),
        "reference.msa.cp_decode": ref(msa.cp_decode, "fp8", cp=2),
        "StockDecode.forward": fast(lambda: StockDecode(heads=2, max_reqs=2, device=DEV), "nvfp4"),
        "IndexerDecodeCP.forward": fast(lambda: IndexerDecodeCP(heads=2, max_reqs=2, symm=_symm()), "nvfp4"),
        "MsaStockDecode.forward": fast(lambda: _fp8_state(MsaStockDecode), "fp8"),
        "MsaDecodeCP.forward": fast(lambda: _fp8_state(MsaDecodeCP), "fp8"),
    }


def _cp_entries() -> dict:
    def call(fn, fmt):
        def run(v):
            case = _nvfp4() if fmt == "nvfp4" else _fp8()
            fn(*case.args(), **(case.windows() if fmt == "fp8" else {}), cp=v)

        return run

    return {
        "reference.cp_decode": call(reference.cp_decode, "nvfp4"),
        "reference.msa.cp_decode": call(msa.cp_decode, "fp8"),
    }


def _state_entries(argument: str) -> dict:
    """The four decode states and build_cp_decode, ``argument`` set, the rest valid."""

    def make(cls):
        def call(v):
            kw = {argument: v}
            if cls in (StockDecode, IndexerDecodeCP):
                where = dict(symm=_symm()) if cls is IndexerDecodeCP else dict(device=DEV)
                cls(**(dict(heads=2, max_reqs=2) | where | kw))
            else:
                _fp8_state(cls, **kw)

        return call

    entries = {f"{cls.__name__}": make(cls) for cls in (StockDecode, IndexerDecodeCP, MsaStockDecode, MsaDecodeCP)}
    if argument == "spin_timeout_s":
        return {k: v for k, v in entries.items() if "CP" in k}  # the stock states never wait on a peer
    if argument == "max_reqs":
        entries["build_cp_decode"] = lambda v: build_cp_decode(heads=2, max_reqs=v, max_query_len=2, symm=_World(2))
    return entries


def _window_entries(argument: str) -> dict:
    def windows(v) -> dict:
        return {argument: v, ("local_blocks" if argument == "init_blocks" else "init_blocks"): 0}

    def ref(fn, **kw):
        return lambda v: fn(*_fp8().args(), **windows(v), **kw)

    return {
        "reference.msa.full_decode": ref(msa.full_decode),
        "reference.msa.cp_decode": ref(msa.cp_decode, cp=2),
        "MsaStockDecode": lambda v: _fp8_state(MsaStockDecode, **windows(v)),
        "MsaDecodeCP": lambda v: _fp8_state(MsaDecodeCP, **windows(v)),
        "build_cp_decode": lambda v: build_cp_decode(
            heads=2, max_reqs=2, max_query_len=2, symm=_symm(), key_format="fp8", **windows(v)
        ),
    }


def _first_slot_entries() -> dict:
    def nvfp4(v):
        case = _nvfp4()
        tile = on(query_tile(case.index_q, 2, 2))
        out = on(torch.zeros(2, 16, case.block_table.shape[1]))
        args = (tile, on(case.k_cache), on(case.block_table), on(case.seq_lens), out)
        fast_score_pages(*args, first_slot=v)

    def fp8(v):
        case = _fp8()
        tile = on(msa_query_tile(case.index_q, 2, 2))
        out = on(torch.zeros(2, 16, case.block_table.shape[1]))
        args = (tile, on(case.k_cache), on(case.block_table), on(case.seq_lens), out)
        fast_score_blocks(*args, num_pages=case.block_table.shape[1], first_slot=v)

    return {"fast.score_pages": nvfp4, "fast.score_blocks": fp8}


ENTRIES = {
    "query_len": _query_len_entries(),
    "cp": _cp_entries(),
    "heads": _state_entries("heads"),
    "max_reqs": _state_entries("max_reqs"),
    "spin_timeout_s": _state_entries("spin_timeout_s"),
    "first_slot": _first_slot_entries(),
    "init_blocks": _window_entries("init_blocks"),
    "local_blocks": _window_entries("local_blocks"),
}

# Command lines: (program, argument, its flag, the line with {v} where the value goes, the
# edges whose runs are cheap enough for CI where taken: None all). {case} / {fp8} a saved
# case of each format, {out} an output path.
COMMANDS = [
    ("reference", "query_len", "--query-len", "make-case --out {out} --seq-lens 3000 --query-len {v}", None),
    ("reference", "heads", "--heads", "make-case --out {out} --seq-lens 3000 --heads {v}", None),
    ("reference", "table_width", "--table-width", "make-case --out {out} --seq-lens 3000 --table-width {v}", None),
    (
        "reference",
        "init_blocks",
        "--init-blocks",
        "make-case --out {out} --seq-lens 3000 --format fp8 --init-blocks {v} --local-blocks 0",
        None,
    ),
    (
        "reference",
        "local_blocks",
        "--local-blocks",
        "make-case --out {out} --seq-lens 3000 --format fp8 --init-blocks 0 --local-blocks {v}",
        None,
    ),
    ("reference", "cp", "--cp", "decode --case {case} --path cp --cp {v} --out {out}", None),
    ("reference", "cp", "--cp", "explain --case {case} --row 0 --head 0 --cp {v}", None),
    # a taken value of the fast CLI starts that many interpreter ranks: CI runs one
    ("fast", "cp", "--cp", "decode --case {case} --path cp --cp {v} --backend cpu --out {out}", (1,)),
    ("fast", "cp", "--cp", "decode --case {case} --path stock --cp {v} --backend cpu --out {out}", (1,)),
    ("fast", "cp", "--cp", "decode --case {fp8} --path cp --cp {v} --backend cpu --out {out}", (1,)),
]


def _api_rows():
    for argument, entries in ENTRIES.items():
        for entry, call in entries.items():
            for edge in EDGES[argument]:
                yield pytest.param(argument, call, edge, id=f"{argument}-{entry}-{edge.value!r}")


def _cli_rows():
    for program, argument, _flag, line, cheap in COMMANDS:
        for edge in CLI_EDGES[argument]:
            if edge.ok and cheap is not None and edge.value not in cheap:
                continue
            words = line.split()
            yield pytest.param(program, argument, line, edge, id=f"{program}-{words[0]}-{argument}-{edge.value}")


@pytest.mark.parametrize("argument,call,edge", list(_api_rows()))
def test_api_edge(argument, call, edge):
    if edge.ok:
        call(edge.value)
        return
    with pytest.raises(edge.exc) as info:
        call(edge.value)
    assert re.match(rf"{argument}: ", str(info.value)), f"{type(info.value).__name__}: {info.value}"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("edges")
    _nvfp4().save(root / "case.pt")
    _fp8().save(root / "fp8.pt")
    return root


@pytest.mark.parametrize("program,argument,line,edge", list(_cli_rows()))
def test_command_line_edge(saved, tmp_path, capsys, program, argument, line, edge):
    """Taken: exit 0. Refused: exit 2, one ``error: <argument>:`` line, nothing written."""
    main = {"reference": reference_main, "fast": fast_main}[program]
    out = tmp_path / "o.pt"
    words = line.format(case=saved / "case.pt", fp8=saved / "fp8.pt", out=out, v=edge.value).split()
    code = main(words)
    err = capsys.readouterr().err.strip().splitlines()
    if edge.ok:
        assert code == 0, err
        return
    names = (argument, argument.replace("_", "-"))  # the API's name, or the flag's
    assert code == 2 and len(err) == 1 and err[0].split(": ")[:2] in (["error", n] for n in names), (code, err)
    assert not out.exists()


def test_every_argument_has_edges_and_an_entry():
    """The table covers itself: every argument with edges has an entry point (API or
    command line), and every edge list holds a taken value and a refused one past it."""
    reached = set(ENTRIES) | {argument for _, argument, *_ in COMMANDS}
    assert reached == set(EDGES), set(EDGES) ^ reached
    for argument, edges in EDGES.items():
        assert any(e.ok for e in edges) and any(not e.ok for e in edges), argument
