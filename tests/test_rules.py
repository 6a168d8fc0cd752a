"""Every rule ``fast`` computes for itself, held against the reference's own version.

``fast`` imports no rule from ``reference`` (a bug shared by both would be invisible to
every comparison between them): these tests are where the two meet.
"""

import subprocess
import sys

import pytest
import torch

from fast import checks, layout, tables
from indexer_constants import SUPPORTED_CP, SUPPORTED_HEADS
from reference import cp as ref_cp
from reference import inputs as ref_inputs
from reference import nvfp4 as ref_nvfp4
from reference import scores as ref_scores
from reference.cases import make_case


def test_runtime_imports_no_reference():
    """The public API loads without the reference (a fresh interpreter)."""
    code = (
        "import sys, fast\n"
        "from fast import build_cp_decode, StockDecode, GraphedDecode, open_cuda_symmetric\n"
        "bad = [m for m in sys.modules if m == 'reference' or m.startswith('reference.') or "
        "m.startswith('fast.tools') or m == 'bench' or m.startswith('bench.')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_runtime_package_imports_nothing_of_the_lab():
    """No module under fast/ imports the performance lab (bench/), which the wheel leaves
    out: an installed copy would fail at that import."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    offenders = []
    for path in sorted((root / "fast").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(root)}: {n}" for n in names if n.split(".")[0] in ("bench", "tests")]
    assert not offenders, offenders


def test_runtime_signatures_carry_no_benchmark_knob():
    """What a server calls takes no argument that only the bench or the tests set: stage
    timing, kernel choice, PDL prefetch / release, select shapes, ring probes (those go
    through ``plan_scorer`` / ``plan_block_scorer``, ``bench.variants``,
    ``select.policy.force_select`` and ``bench.stages``)."""
    import inspect

    import fast

    knobs = {"stage_times", "kernel", "prefetch", "release", "split", "max_chunk", "ppp", "stages", "loads_only"}
    knobs |= {"tensor_copies"}
    for name in fast.__all__:
        obj = getattr(fast, name)
        calls = [obj.__init__, obj.forward, obj.plan] if inspect.isclass(obj) and hasattr(obj, "forward") else [obj]
        for fn in calls:
            if callable(fn) and not inspect.isclass(fn):
                params = set(inspect.signature(fn).parameters)
                assert not params & knobs, f"{name}.{fn.__name__}: {sorted(params & knobs)}"
    for cls in (fast.IndexerDecodeCP, fast.StockDecode):
        public = {m for m in dir(cls) if not m.startswith("_") and inspect.isfunction(getattr(cls, m))}
        assert public <= {"new_layer", "plan", "forward", "check", "reset"}, sorted(public)


@pytest.mark.parametrize("cp", SUPPORTED_CP)
@pytest.mark.parametrize("heads", SUPPORTED_HEADS)
def test_head_layout_matches_reference(cp, heads):
    mine, ref = layout.HeadLayout(cp, heads), ref_cp.HeadLayout(cp, heads)
    assert (mine.heads_per_rank, mine.replicas) == (ref.heads_per_rank, ref.replicas)
    for rank in range(cp):
        assert mine.heads_of(rank) == ref.heads_of(rank)
    owners = [r for h in range(heads) for r in range(cp) if h in mine.heads_of(r)]
    assert len(owners) == heads * mine.replicas  # every head owned, R times


@pytest.mark.parametrize("cp", SUPPORTED_CP)
def test_compact_width_matches_reference(cp):
    for pages in [*range(1, 70), 127, 128, 129, 4095, 4096, 4097, 8191, 8192]:
        assert layout.compact_width(pages, cp) == ref_cp.compact_width(pages, cp), pages


def test_dequant_bytes_match_reference_on_every_pair():
    """Each (scale byte, code) pair: fast's ladder rounding against torch's conversion, to
    the byte (-0 included); the NaN scales (0x7F, 0xFF) give NaN in both."""
    ref = ref_nvfp4.dequant_table()
    nan = ref.isnan()
    assert int(nan.sum()) == 32 and bool(nan[[0x7F, 0xFF]].all())
    ref_bytes = ref.to(torch.float8_e4m3fn).view(torch.uint8)
    mine = tables.dequant_bytes()
    assert torch.equal(mine[~nan], ref_bytes[~nan])
    assert bool((mine[nan] & 0x7F == 0x7F).all())


def test_scorer_tables_follow_the_bytes():
    lut = tables.dequant_lut("cpu").view(256, 16)
    ref = ref_nvfp4.dequant_table().to(torch.float16)
    same = (lut == ref) & (lut.signbit() == ref.signbit())
    assert bool((same | ref.isnan()).all())
    packed = tables.scale_tables("cpu").view(torch.uint8).view(256, 8)
    assert torch.equal(packed, tables.dequant_bytes()[:, :8])
    # the wgmma scorer computes an entry's address in the low 32 bits alone
    assert tables.scale_tables("cpu").data_ptr() % 2048 == 0


def test_round_e4m3_edges():
    assert tables.round_e4m3(448.0) == 0x7E
    assert tables.round_e4m3(1e9) == 0x7E  # saturates
    assert tables.round_e4m3(2.0**-10) == 0x00  # half the least subnormal: ties to even (0)
    assert tables.round_e4m3(3 * 2.0**-10) == 0x02  # 1.5 subnormal steps: to even (2)
    assert tables.round_e4m3(0.0) == 0x00


_INT_CASES = [
    ("q", 3, dict(low=1, high=8)),
    ("q", 0, dict(low=1, high=8)),
    ("q", 9, dict(low=1, high=8)),
    ("q", True, dict(low=1)),
    ("q", 2.0, dict(low=1)),
    ("cp", 3, dict(allowed=SUPPORTED_CP)),
    ("cp", 4, dict(allowed=SUPPORTED_CP)),
    ("n", -1, dict(low=0)),
]


def _verdict(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except (TypeError, ValueError) as e:
        return type(e), str(e).split(":")[0]
    return None


@pytest.mark.parametrize("name,value,bounds", _INT_CASES, ids=[f"{n}={v!r}" for n, v, _ in _INT_CASES])
def test_check_int_matches_reference(name, value, bounds):
    assert _verdict(checks.check_int, name, value, **bounds) == _verdict(ref_inputs.check_int, name, value, **bounds)


_TENSORS = [
    torch.zeros(2, 3, dtype=torch.int32),
    torch.zeros(2, dtype=torch.int32),
    torch.zeros(2, 3, dtype=torch.int64),
    [[0, 1]],
    None,
]


@pytest.mark.parametrize("x", _TENSORS, ids=["ok", "dims", "dtype", "list", "none"])
def test_check_tensor_matches_reference(x):
    args = ("block_table", x, torch.int32, 2)
    assert _verdict(checks.check_tensor, *args) == _verdict(ref_inputs.check_tensor, *args)


@pytest.mark.parametrize(
    "q_shape,table_shape,out_shape",
    [
        ((2, 8, 4, 128), (2, 5), (2, 32, 5)),
        ((2, 7, 4, 128), (2, 5), (2, 28, 5)),
        ((2, 8, 4, 64), (2, 5), (2, 32, 5)),
        ((2, 8, 4, 128), (2, 5), (2, 32, 6)),
        ((2, 8, 4, 128), (2, 5), (3, 32, 5)),
        ((2, 8, 1, 128), (2, 5), (2, 16, 5)),
    ],
    ids=["ok", "slots", "dim", "width", "batch", "rows"],
)
def test_score_shapes_match_reference(q_shape, table_shape, out_shape):
    q = torch.zeros(q_shape, dtype=torch.uint8)
    table = torch.zeros(table_shape, dtype=torch.int32)
    out = torch.zeros(out_shape)
    assert _verdict(checks.score_shapes, q, table, out) == _verdict(ref_scores.check_score_shapes, q, table, out)


def test_fast_checks_reject_what_the_reference_rejects():
    """The forward's shape checks and the reference's decode checks name the same argument
    for the same bad shape (the checks that need values are the reference's alone)."""
    good = make_case(0, [3000], query_len=2, heads=4, pattern="exact")
    bad = {
        "index_q": good.index_q[:, :, :64].contiguous(),
        "k_cache": good.k_cache[:, :, :70].contiguous(),
        "query_len": 9,
    }
    for name, value in bad.items():
        args = dict(index_q=good.index_q, k_cache=good.k_cache, query_len=good.query_len) | {name: value}
        out = torch.zeros(good.index_q.shape[0], 4, 16, dtype=torch.int32)
        mine = _verdict(
            checks.forward_inputs, args["index_q"], args["k_cache"], out, args["query_len"], 1, 4, torch.device("cpu")
        )
        ref = _verdict(
            ref_inputs.check_decode_inputs,
            args["index_q"],
            args["k_cache"],
            good.block_table,
            good.seq_lens,
            args["query_len"],
        )
        assert mine is not None and ref is not None and mine[1] == ref[1] == name, (name, mine, ref)


# The kernels' hooks: constexpr parameters whose default is a jit function (the runtime's
# rule), which the bench may replace with a probe or a structure of its own
# (bench/probes.py, bench/ring_variants.py) and the runtime never sets. Any other
# constexpr of a launched kernel is set by a launch in fast/.
KERNEL_HOOKS = {
    "score_kernel_wgmma": {"GROUP_DECODE", "GROUP_DECODE_E4M3", "IN_CACHE", "RING_PAGES"},
    "merge_kernel": {"OUTPUT"},
}
# Every inline-asm string fast/ defines as a module constant, by module: each one a kernel
# of fast/ runs. A new one (a probe's, say) fails here until it is listed, and a listed one
# no kernel of fast/ uses fails too.
RUNTIME_ASM = {
    "fast.kernels.dequant_prmt": {
        *("LOOKUP_STEP", "SIGN_STEP", "WIDEN_STEP", "BYTES_STEP", "TABLE_FROM_ENTRY"),
        *("GROUP_ASM", "GROUP_ASM_E4M3"),
    },
    "fast.kernels.loads": {"_LOAD_SCALE", "_LOAD_SCALE_IF", "_GATHER_TABLE"},
    "fast.kernels.page_ring": {"_REPORT", "_WAIT_TABLES", "_BASE", "_TABLE_BASE", "_GATHER"},
    "fast.msa.kernels.block_ring": {"_BASE"},
    "fast.select.levels": {"_LOAD_QUAD"},
}


def _fast_modules():
    """Every module of fast/ but the user tools (imported), with its source."""
    import importlib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for path in sorted((root / "fast").rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        if not name.startswith("fast.tools"):
            yield importlib.import_module(name), path.read_text()


def _launch_source() -> str:
    """The source of fast/'s modules outside its kernel packages: where launches are."""
    return "\n".join(text for module, text in _fast_modules() if ".kernels" not in module.__name__)


def _jit_functions():
    """(name, function, [(constexpr name, default)]) of every jit function fast/ defines,
    Triton's (interpreted on a CPU) and Gluon's."""
    import inspect

    for module, _ in _fast_modules():
        for name, obj in vars(module).items():
            fn = getattr(obj, "fn", None)
            if fn is None or not hasattr(obj, "run") or fn.__module__ != module.__name__:
                continue
            params = inspect.signature(fn).parameters.values()
            yield name, [(p.name, p.default) for p in params if "constexpr" in str(p.annotation)]


def test_runtime_kernels_take_only_what_a_launch_in_fast_sets():
    """Each kernel fast/ launches (``name[grid]`` or a ``ScorerLaunch``) takes no
    compile-time parameter that only the bench or the tests set: every constexpr is passed
    by name in fast/'s launch code (``NAME=`` or a ``"NAME"`` key), or is one of
    KERNEL_HOOKS, a jit function the runtime leaves at its default. Probes (a LOADS_ONLY, a
    guard switch, a decode probe) cannot creep back into a runtime kernel unseen."""
    import re

    launches = _launch_source()
    kernels = {
        name: constexprs
        for name, constexprs in _jit_functions()
        if re.search(rf"(\b{name}\[|ScorerLaunch\(\s*{name}\b)", launches)
    }
    assert {"score_kernel_wgmma", "msa_score_kernel_mma", "score_kernel_table", "merge_kernel"} <= set(kernels)
    unset = []
    for name, constexprs in sorted(kernels.items()):
        for param, default in constexprs:
            if param in KERNEL_HOOKS.get(name, ()):
                assert hasattr(default, "fn"), f"{name}.{param}: a hook defaults to the runtime's rule"
            elif not re.search(rf"(\b{param}\s*=[^=]|[\"']{param}[\"'])", launches):
                unset.append(f"{name}.{param}")
    assert not unset, f"constexprs no launch in fast/ sets (a probe? bench/ holds those): {unset}"
    for name, hooks in KERNEL_HOOKS.items():
        assert hooks <= {param for param, _ in kernels[name]}, name


def test_runtime_asm_strings_are_the_runtimes():
    """The inline-asm strings fast/ keeps as module constants are RUNTIME_ASM's, each used by
    code of fast/ besides its definition: a probe's asm lives in bench/."""
    import re

    from triton.language import constexpr

    ptx = re.compile(r"\b(ld|st|mov|prmt|cvt|mul|mad|lop3|setp|mbarrier|cp)\.[a-z0-9]")
    found, sources = {}, {}
    for module, text in _fast_modules():
        sources[module.__name__] = text
        for name, obj in vars(module).items():
            value = obj.value if isinstance(obj, constexpr) else obj
            if isinstance(value, str) and ptx.search(value) and re.search(rf"^{name}\s*=", text, flags=re.M):
                found.setdefault(module.__name__, set()).add(name)
    assert found == RUNTIME_ASM, found
    everything = "\n".join(sources.values())
    for module, names in RUNTIME_ASM.items():
        for name in names:
            uses = len(re.findall(rf"\b{name}\b", everything))
            assert uses >= 2, f"{module}.{name}: defined, used by nothing in fast/"


def _comment_density(folder) -> float:
    """Docstring and comment-only lines over the other non-blank lines of a folder's modules."""
    import ast
    from pathlib import Path

    said = code = 0
    for path in sorted(Path(folder).glob("*.py")):
        text = path.read_text()
        docs = set()
        for node in ast.walk(ast.parse(text)):
            body = getattr(node, "body", None)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and body:
                first = body[0]
                if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant):
                    if isinstance(first.value.value, str):
                        docs |= set(range(first.lineno, first.end_lineno + 1))
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                if number in docs or line.strip().startswith("#"):
                    said += 1
                else:
                    code += 1
    return said / code


@pytest.mark.parametrize("folder", ["fast/kernels", "fast/select", "fast/msa/kernels"])
def test_kernel_comments_say_why_in_a_line(folder):
    """The kernel folders' docstring and comment lines stay at most a quarter of their code
    lines: one line on why beside the code, the rationale in docs/KERNELS.md, figures and
    history in bench/PERF.md (issue 73 brought them from 0.40-0.46 to 0.25)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    assert _comment_density(root / folder) <= 0.25, f"{folder}: {_comment_density(root / folder):.3f}"
