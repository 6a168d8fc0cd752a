"""Fuzz targets: what each campaign draws and what it checks.

Every example is a ``DecodeConfig`` (plus, for ``inputs``, the name of one breakage), so any
failure replays from one line of JSON. A check raises AssertionError (or the exception the
code under test raised) on a failure. ``fast`` is imported inside the checks: importing it
settles the Triton backend, which the CLI's ``--backend`` must be able to choose first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from hypothesis import target as steer
from hypothesis.control import currently_in_test_context

import reference
from indexer_constants import MMA_ROUTES, PAGE
from reference import cp as ref_cp
from reference.cases import EXACT_PATTERNS, PATTERNS
from reference.decode import full_scores
from reference.inputs import check_decode_inputs
from reference.rules import own_pages
from reference.selection import stock_keys

from .strategies import MSA_EXACT, DecodeConfig, decode_configs, msa_configs

EXACT = tuple(EXACT_PATTERNS)


@dataclass
class Context:
    """What checks share within a campaign: the backend and lazily started rank pools."""

    backend: str
    pools: dict

    def device(self):
        """The campaign's torch device."""
        from fast.backend import resolve_device

        return resolve_device("cuda" if self.backend == "cuda" else "cpu")

    def pool(self, cp: int):
        """The rank pool of ``cp`` ranks, started on first use (again if it died)."""
        from fast.tools.launcher import RankPool

        if cp not in self.pools or not self.pools[cp]._procs:
            self.pools[cp] = RankPool(cp, self.backend)
        return self.pools[cp]

    def close(self):
        """Stop every pool's ranks."""
        for p in self.pools.values():
            p.close()


def _steer(cfg: DecodeConfig) -> None:
    """Steer toward page and 16-page boundaries (inside a campaign; not on replay)."""
    if not currently_in_test_context():
        return
    dist = min(min((n - 1) % PAGE, PAGE - 1 - (n - 1) % PAGE) for n in cfg.seq_lens)
    steer(-float(dist), label="tokens from a page boundary")
    pages = max((n - 1) // PAGE for n in cfg.seq_lens)
    steer(-float(abs(pages - 16)), label="pages from the 16-page switch")


def check_reference(cfg: DecodeConfig, ctx: Context) -> None:
    """The CP simulation (every rank, step by step) equals the full-context oracle, on the
    example's MMA route."""
    _steer(cfg)
    case = cfg.build()
    width = ref_cp.compact_width(min(case.block_table.shape[1], 8192), cfg.cp) + cfg.extra_width
    got = ref_cp.cp_decode(*case.args(), cp=cfg.cp, width=width, mma=cfg.mma)
    want = reference.full_decode(*case.args(), mma=cfg.mma)
    assert torch.equal(got, want), f"cp_decode != full_decode at {(got != want).nonzero()[:4].tolist()}"


def check_msa_reference(cfg: DecodeConfig, ctx: Context) -> None:
    """MSA format: the CP simulation equals the oracle, and the oracle's rows keep §10.3's
    shape: the forced blocks present, ids distinct, ascending, below n, -1 only at the end."""
    from reference import msa
    from reference.msa.rules import causal_blocks

    _steer(cfg)
    case = cfg.build()
    full = msa.full_decode(*case.args(), **case.windows(), mma=cfg.mma)
    width = -(-min(case.block_table.shape[1], 8192) // cfg.cp) + cfg.extra_width
    out = msa.cp_decode(*case.args(), **case.windows(), cp=cfg.cp, width=width, mma=cfg.mma)
    assert torch.equal(out, full), "CP != full"
    n = causal_blocks(case.seq_lens, cfg.query_len)
    for row, count in enumerate(n.tolist()):
        forced = set(range(cfg.init_blocks)) | set(range(count - cfg.local_blocks, count)) if count > 16 else set()
        for h in range(full.shape[1]):
            ids = full[row, h].tolist()
            chosen = [g for g in ids if g >= 0]
            assert ids == chosen + [-1] * (16 - len(chosen)), f"row {row}: -1 before an id: {ids}"
            assert chosen == sorted(set(chosen)), f"row {row}: not ascending and distinct: {ids}"
            assert forced <= set(chosen) and all(g < count for g in chosen), f"row {row}: forced/causal: {ids}"
            assert len(chosen) == min(count, 16) or count > min(case.block_table.shape[1], 8192), f"row {row}: {ids}"


def _step_rows(buffer: torch.Tensor, heads: int, q: int, width: int) -> torch.Tensor:
    """A score buffer's rows of a step's q queries, on the CPU: ``buffer`` [B, 8 * heads,
    >= width] (row ``slot * heads + head``) -> [B * q, heads, width], the last q slots'
    first ``width`` columns (the reference's ``full_scores`` order)."""
    batch = buffer.shape[0]
    rows = buffer.cpu().view(batch, 8, heads, buffer.shape[-1])[:, 8 - q :, :, :width]
    return rows.reshape(batch * q, heads, width)


def check_msa_kernels(cfg: DecodeConfig, ctx: Context) -> None:
    """MSA format, fast against the reference: the stock select on the kernel's own scores
    equals the reference's selection (forced windows, ascending); on exact-arithmetic inputs
    the scorer matches bit for bit (on a GPU both of its kernels) and the stock decode
    equals the oracle. The CP decode at CP = 1 in one process (a short spin bound: an
    exchange that never ends is a failure here, not a hang) equals the stock decode on every
    input (the same scorer, hence the same scores: random bf16 queries hold 0xFF bytes too)
    and leaves its buffers re-armed."""
    from fast.msa.cp import MsaDecodeCP
    from fast.msa.scorer import KERNELS, run_block_scorer
    from fast.msa.stock import MsaStockDecode
    from fast.route import device_route
    from fast.symm import SingleRankSymmetric
    from reference import msa
    from reference.msa.cases import EXACT_PATTERNS as MSA_EXACT
    from reference.msa.decode import full_scores
    from reference.msa.inputs import check_msa_inputs
    from reference.msa.rules import causal_blocks
    from reference.msa.selection import select as msa_select

    _steer(cfg)
    dev = ctx.device()
    case = cfg.build()
    heads, rows, batch, q = case.index_q.shape[1], case.index_q.shape[0], len(cfg.seq_lens), cfg.query_len
    on = [x.to(dev) for x in (case.index_q, case.k_cache, case.block_table, case.seq_lens)]
    stock = MsaStockDecode(heads=heads, max_reqs=max(1, batch), device=dev, key_format=cfg.key_format, **case.windows())
    plan = stock.plan(on[2], on[3])
    plan.scores.fill_(1e30)  # never stored, never ranked
    out = torch.full((rows, heads, 16), -7, dtype=torch.int32, device=dev)
    stock.forward(stock.new_layer(), plan, on[0], on[1], out, q)
    width = plan.pages
    scores = _step_rows(plan.scores, heads, q, width)
    n = causal_blocks(case.seq_lens, q).repeat_interleave(heads)
    want = msa_select(scores.reshape(-1, width), n, width, cfg.init_blocks, cfg.local_blocks)
    assert torch.equal(out.cpu().view(-1, 16), want), "MSA stock select != reference selection on its own scores"
    if cfg.pattern in MSA_EXACT:
        ref_scores = full_scores(check_msa_inputs(*case.args(), **case.windows()))  # NaN where not stored
        stored = ~torch.isnan(ref_scores)
        assert torch.equal(scores[stored], ref_scores[stored]), "MSA scorer != reference on exact-arithmetic input"
        assert torch.equal(out.cpu(), msa.full_decode(*case.args(), **case.windows())), "MSA stock != full_decode"
        # The Hopper route runs one of two kernels by dtype and N (``hopper_kernel``): on an
        # sm_90 GPU each is held to the reference on every example, not only on the shapes it
        # is chosen for (a bug in the one not chosen would otherwise hide from most examples).
        # Elsewhere the dot kernel is the only one, checked above.
        for kernel in KERNELS if device_route(dev).sm90 else ():
            got = torch.full_like(plan.scores, 1e30)
            run_block_scorer(
                plan.tile,
                on[1],
                plan.block_table[:, :width],
                plan.seq_lens,
                got[:, :, :width],
                num_pages=width,
                first_slot=8 - q,
                kernel=kernel,
            )
            got = _step_rows(got, heads, q, width)
            assert torch.equal(got[stored], ref_scores[stored]), f"MSA {kernel} kernel != reference on exact input"
    stock_out = out.cpu()
    state = MsaDecodeCP(
        heads=heads,
        max_reqs=max(1, batch),
        symm=SingleRankSymmetric(dev),
        key_format=cfg.key_format,
        spin_timeout_s=2.0,
        **case.windows(),
    )
    layer = state.new_layer()
    cp_plan = state.plan(on[2], on[3])
    cp_plan.scores.fill_(1e30)
    out = torch.full((rows, heads, 16), -7, dtype=torch.int32, device=dev)
    state.forward(layer, cp_plan, on[0], on[1], out, q)
    state.check()
    assert torch.equal(out.cpu(), stock_out), "MSA CP=1 != the MSA stock decode"
    assert bool((layer.tile.local == -1).all()) and bool((layer.recv.local == -1).all()), "CP buffers not re-armed"


def check_kernels(cfg: DecodeConfig, ctx: Context) -> None:
    """Each kernel against the reference: the scorer (bit for bit on exact inputs, through
    the feed the decode's policy gives it; ``tests/test_gpu_scorer.py`` forces each feed),
    the stock top-16 on its own scores, and CP = 1 in one process (oracle output, buffers
    re-armed)."""
    from fast.cp import IndexerDecodeCP
    from fast.stock import StockDecode
    from fast.symm import SingleRankSymmetric

    dev = ctx.device()
    case = cfg.build()
    heads, rows = case.index_q.shape[1], case.index_q.shape[0]
    on = [x.to(dev) for x in (case.index_q, case.k_cache, case.block_table, case.seq_lens)]
    batch = len(cfg.seq_lens)
    # Stock: its own scores through the reference's stock selection.
    stock = StockDecode(heads=heads, max_reqs=batch, device=dev)
    stock_plan = stock.plan(on[2], on[3])
    out = torch.full((rows, heads, 16), -7, dtype=torch.int32, device=dev)
    stock.forward(stock.new_layer(), stock_plan, on[0], on[1], out, case.query_len)
    width = min(case.block_table.shape[1], 8192)
    q = case.query_len
    scores = _step_rows(stock_plan.scores, heads, q, width)
    own = own_pages(case.seq_lens, q).repeat_interleave(heads)
    want = reference.selection.select(scores.reshape(-1, width), own, width, key="stock")
    assert torch.equal(out.cpu().view(-1, 16), want), "stock top-16 != reference stock selection on its own scores"
    if cfg.pattern in EXACT:
        ref_scores = full_scores(check_decode_inputs(*case.args()))  # NaN where not stored
        stored = ~torch.isnan(ref_scores)
        assert torch.equal(scores[stored], ref_scores[stored]), "scorer != reference on exact-arithmetic input"
        # CP = 1 in one process: the whole protocol against the oracle.
        state = IndexerDecodeCP(heads=heads, max_reqs=batch, symm=SingleRankSymmetric(dev))
        layer = state.new_layer()
        plan = state.plan(on[2], on[3])
        plan.scores.fill_(1e30)
        out = torch.full((rows, heads, 16), -7, dtype=torch.int32, device=dev)
        state.forward(layer, plan, on[0], on[1], out, q)
        state.check()
        assert torch.equal(out.cpu(), reference.full_decode(*case.args())), "CP=1 != full_decode"
        assert bool((layer.tile.local == -1).all()), "the q tile was not re-armed"
        assert bool((layer.recv.local == -1).all()), "the candidates were not reset"


def check_protocol(cfg: DecodeConfig, ctx: Context) -> None:
    """The multi-rank fast CP path equals the oracle, on CPU ranks or GPUs."""
    from fast.tools.programs import assemble, decode_on_rank

    case = cfg.build()
    results = ctx.pool(cfg.cp).run(decode_on_rank, case.to_dict(), "cp", poison=True, steps=2)
    assert all(r["all_equal"] for r in results), "two steps of one layer gave different outputs"
    assert torch.equal(assemble(results, case.index_q.shape[1]), reference.full_decode(*case.args())), (
        "fast CP != full_decode"
    )


def check_msa_protocol(cfg: DecodeConfig, ctx: Context) -> None:
    """The multi-rank MSA CP path equals the MSA oracle, on CPU ranks or GPUs (two steps of
    one layer, score buffers poisoned)."""
    from fast.tools.programs import assemble, decode_on_rank
    from reference import msa

    case = cfg.build()
    results = ctx.pool(cfg.cp).run(decode_on_rank, case.to_dict(), "cp", poison=True, steps=2)
    assert all(r["all_equal"] for r in results), "two steps of one layer gave different outputs"
    want = msa.full_decode(*case.args(), **case.windows())
    assert torch.equal(assemble(results, case.index_q.shape[1]), want), "fast MSA CP != msa.full_decode"


def check_stock(cfg: DecodeConfig, ctx: Context) -> None:
    """The 16-bit contract: stock agrees with the exact oracle up to 16-bit ties (the q16
    values of the ranked slots, read in order, are equal; short rows and slot 15 exact)."""
    case = cfg.build()
    exact, stock = reference.full_decode(*case.args()), reference.stock_decode(*case.args())
    assert torch.equal(exact[:, :, 15], stock[:, :, 15])
    inputs = check_decode_inputs(*case.args())
    scores = full_scores(inputs)
    own = own_pages(inputs.seq_lens, inputs.query_len)
    rows, heads, width = scores.shape
    j = torch.arange(width)
    for row in range(rows):
        o = int(own[row])
        if o + 1 <= 16:
            assert torch.equal(exact[row], stock[row])
            continue
        valid = (j < min(o, inputs.num_pages))[None, :].expand(heads, width)
        keys = stock_keys(torch.where(valid, scores[row], 0.0), j, valid) >> 16
        for h in range(heads):
            e = [int(keys[h, p]) if p >= 0 else -1 for p in exact[row, h, :15].tolist()]
            s = [int(keys[h, p]) if p >= 0 else -1 for p in stock[row, h, :15].tolist()]
            assert e == s, f"row {row} head {h}: q16 order differs: exact {e} stock {s}"


BREAKAGES = {
    "q-float32": ("index_q", TypeError, lambda a: a.update(index_q=a["index_q"].float())),
    "q-heads-3": (
        "index_q",
        ValueError,
        lambda a: a.update(index_q=a["index_q"][:, :1].expand(-1, 3, -1).contiguous()),
    ),
    "q-rows": ("index_q", ValueError, lambda a: a.update(index_q=a["index_q"][1:])),
    "q-nan": ("index_q", ValueError, lambda a: a["index_q"].view(torch.uint8).view(-1).__setitem__(0, 0xFF)),
    "k-shape": ("k_cache", ValueError, lambda a: a.update(k_cache=a["k_cache"][:, :, :-1].contiguous())),
    "bt-int64": ("block_table", TypeError, lambda a: a.update(block_table=a["block_table"].long())),
    "bt-rows": ("block_table", ValueError, lambda a: a.update(block_table=a["block_table"][:0])),
    "len-int64": ("seq_lens", TypeError, lambda a: a.update(seq_lens=a["seq_lens"].long())),
    "query-len-9": ("query_len", ValueError, lambda a: a.update(query_len=9)),
    "query-len-0": ("query_len", ValueError, lambda a: a.update(query_len=0)),
}


def _reading_request(a: dict) -> int:
    """Make the last request read at least one table column (length >= 129 tokens); returns
    it. The last, not the first: with several requests and query tokens its rows are not
    its index, so a record naming a row for the request is caught."""
    b = a["seq_lens"].shape[0] - 1
    a["seq_lens"][b] = max(int(a["seq_lens"][b]), PAGE + 1, a["query_len"])
    return b


def _id_past_cache(a: dict) -> int:
    b = _reading_request(a)
    a["block_table"][b, 0] = a["k_cache"].shape[0] + 5
    return b


def _id_negative(a: dict) -> int:
    b = _reading_request(a)
    a["block_table"][b, 0] = -7
    return b


def _cache_short(a: dict) -> int:
    """A cache smaller than the table refers to: one page, and request 0 reads page 1."""
    b = _reading_request(a)
    a["block_table"][b, 0] = 1
    a["k_cache"] = a["k_cache"][:1].clone()
    return b


def _len_negative(a: dict) -> int:
    a["seq_lens"][-1] = -5
    return a["seq_lens"].shape[0] - 1


def _len_below_query(a: dict) -> int:
    b = a["seq_lens"].shape[0] - 1
    a["seq_lens"][b] = a["query_len"] - 1 if a["query_len"] > 1 else -1
    return b


# Bad values a host cannot see without a sync: the reference raises; the fast path writes
# the request's rows -1 and check() raises (BadBlockIdError / BadLengthError, ValueErrors).
DEVICE_BREAKAGES = {
    "id-past-cache": ("block_table", _id_past_cache),
    "id-negative": ("block_table", _id_negative),
    "cache-short": ("block_table", _cache_short),
    "len-negative": ("seq_lens", _len_negative),
    "len-below-query-len": ("seq_lens", _len_below_query),
}


# Host-checked breakages that are none in the BF16 / FP8 format: its queries may hold NaN
# (a row holding one is an unwritten row, DESIGN §10.2).
NVFP4_ONLY_BREAKAGES = ("q-nan",)


def _assert_named_is_bad(e, args: dict, msa_format: bool = False) -> None:
    """The request, column and value check() names are bad in the step's inputs (the
    columns a request reads: ``(len - 1) // 128`` of them, the MSA format's ``ceil(len / 128)``)."""
    assert 0 <= e.request < args["seq_lens"].shape[0], (
        f"check() names request {e.request} of {args['seq_lens'].shape[0]}"
    )
    seq = int(args["seq_lens"][e.request])
    if e.argument == "seq_lens":
        assert e.column == -1 and e.value == seq and (seq < 0 or 0 < seq < args["query_len"]), e
    else:
        reads = -(-seq // PAGE) if msa_format else max(seq - 1, 0) // PAGE
        read = min(reads, args["block_table"].shape[1]) if seq >= 1 else 0
        assert 0 <= e.column < read, f"column {e.column} is not read by request {e.request} ({read} read)"
        value = int(args["block_table"][e.request, e.column])
        assert e.value == value and not 0 <= value < args["k_cache"].shape[0], e


def inputs_examples():
    """(config, breakage): a decode example of either format and one named way to break its
    input (``BREAKAGES``: host-checked; ``DEVICE_BREAKAGES``: judged on the device)."""
    names = st.sampled_from(sorted(BREAKAGES) + sorted(DEVICE_BREAKAGES))
    nvfp4 = st.tuples(decode_configs(max_pages=40), names)
    msa_names = names.filter(lambda n: n not in NVFP4_ONLY_BREAKAGES)
    return st.one_of(nvfp4, st.tuples(msa_configs(max_pages=40), msa_names))


def check_inputs(example, ctx: Context) -> None:
    """Bad input raises the documented exception naming the argument, on every entry point
    of the example's format (the reference paths; the fast CP and stock plan + forward),
    never crashes or hangs; a value judged on the device gives its request's rows -1 and a
    check() naming that request (not a row), its column and its value."""
    from fast.cp import IndexerDecodeCP
    from fast.errors import DecodeInputError
    from fast.msa.cp import MsaDecodeCP
    from fast.msa.stock import MsaStockDecode
    from fast.stock import StockDecode
    from fast.symm import SingleRankSymmetric
    from reference import msa

    cfg, name = example
    if isinstance(cfg, dict):
        cfg = DecodeConfig(**cfg)
    msa_format = cfg.key_format != "nvfp4"
    if msa_format and name in NVFP4_ONLY_BREAKAGES:
        raise ValueError(f"example: breakage {name!r} is none in the {cfg.key_format} format")
    on_device = name in DEVICE_BREAKAGES
    if on_device:
        arg, breakage = DEVICE_BREAKAGES[name]
        exc = ValueError
    else:
        arg, exc, breakage = BREAKAGES[name]
    case = cfg.build()
    windows = case.windows() if msa_format else {}
    args = dict(zip(("index_q", "k_cache", "block_table", "seq_lens", "query_len"), case.args()))
    args = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    batch, heads = args["seq_lens"].shape[0], args["index_q"].shape[1]
    bad_request = breakage(args)
    order = ("index_q", "k_cache", "block_table", "seq_lens", "query_len")
    if msa_format:
        calls = {
            "msa-full": lambda: msa.full_decode(*(args[k] for k in order), **windows),
            "msa-cp": lambda: msa.cp_decode(*(args[k] for k in order), **windows, cp=cfg.cp),
        }
    else:
        calls = {
            "full": lambda: reference.full_decode(*(args[k] for k in order)),
            "stock": lambda: reference.stock_decode(*(args[k] for k in order)),
            "cp": lambda: reference.cp_decode(*(args[k] for k in order), cp=cfg.cp),
        }
    dev = ctx.device()
    fmt = dict(key_format=cfg.key_format, **windows) if msa_format else {}
    cp_state, stock_state = (MsaDecodeCP, MsaStockDecode) if msa_format else (IndexerDecodeCP, StockDecode)

    def fast(make_state):
        state = make_state()
        plan = state.plan(args["block_table"].to(dev), args["seq_lens"].to(dev))
        out = torch.full((batch * cfg.query_len, heads, 16), -7, dtype=torch.int32, device=dev)
        state.forward(state.new_layer(), plan, args["index_q"].to(dev), args["k_cache"].to(dev), out, args["query_len"])
        if on_device:
            q = args["query_len"]
            rows = out.cpu()[bad_request * q : (bad_request + 1) * q]
            assert bool((rows == -1).all()), f"{name}: the bad request's rows are not all -1"
            try:
                state.check()
            except DecodeInputError as e:
                _assert_named_is_bad(e, args, msa_format)
                raise

    if name not in ("q-nan",):  # the fast path checks metadata only (no device sync)
        calls["fast-cp"] = lambda: fast(
            lambda: cp_state(heads=heads, max_reqs=batch, symm=SingleRankSymmetric(dev), **fmt)
        )
        calls["fast-stock"] = lambda: fast(lambda: stock_state(heads=heads, max_reqs=batch, device=dev, **fmt))
    for where, call in calls.items():
        try:
            call()
        except exc as e:
            assert arg in str(e), f"{where}: {type(e).__name__} does not name {arg}: {e}"
        else:
            raise AssertionError(f"{where}: {name} raised nothing (expected {exc.__name__} naming {arg})")


@dataclass(frozen=True)
class Target:
    """A campaign: ``examples(smoke)`` is the Hypothesis strategy (smoke campaigns skip the
    8192-page cases, which cost seconds each), ``check(example, ctx)`` the property;
    ``smoke`` the example budget of ``make fuzz-smoke`` (and of the teeth test), ``minutes``
    its share of ``make fuzz`` (``python -m fuzz all``: every target's share, ~10 minutes in
    all). A target's budgets live with it, so a new target cannot be left out of either."""

    examples: Callable
    check: Callable
    smoke: int
    minutes: float


# The E4M3-MMA route's model costs the reference several times the exact matmul: the reference
# targets draw it in campaigns, and CI's smoke budget keeps to the exact route (its fixed
# cases in tests/test_e4m3_mma.py hold CP to the full decode on the route).
def _routes(smoke: bool) -> tuple[str, ...]:
    return ("exact",) if smoke else MMA_ROUTES


TARGETS = {
    "reference": Target(
        lambda smoke: decode_configs(max_pages=300, big=not smoke, routes=_routes(smoke)), check_reference, 150, 2
    ),
    "kernels": Target(lambda smoke: decode_configs(max_pages=24), check_kernels, 12, 1.5),
    # CP = 8 would put 8 interpreter processes on a CI machine's 2 cores; GPUs take it.
    "protocol": Target(
        lambda smoke: decode_configs(max_pages=40, patterns=EXACT, cps=(1, 2, 4)), check_protocol, 12, 1.5
    ),
    "stock": Target(lambda smoke: decode_configs(max_pages=120, patterns=PATTERNS, big=not smoke), check_stock, 60, 1),
    "inputs": Target(lambda smoke: inputs_examples(), check_inputs, 40, 1),
    "msa-reference": Target(
        lambda smoke: msa_configs(max_pages=120, big=not smoke, routes=_routes(smoke)), check_msa_reference, 60, 1
    ),
    "msa-kernels": Target(lambda smoke: msa_configs(max_pages=40, cps=(1,)), check_msa_kernels, 16, 1),
    "msa-protocol": Target(
        lambda smoke: msa_configs(max_pages=40, cps=(1, 2, 4), patterns=MSA_EXACT), check_msa_protocol, 8, 1
    ),
}
