"""Rank programs only the multi-rank tests run (each rank calls one through
``fast.tools.launcher.RankPool``): back-to-back steps with changing queries, the stages
after a forward, a step one rank skips, CUDA-graph replays against the reference."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from types import SimpleNamespace

import torch

import reference
from bench.layers import cp_stage_layers
from bench.stages import StagedCP, StagedMsaCP
from fast.cp import IndexerDecodeCP
from fast.errors import DecodeInputError, PeerTimeoutError
from fast.graphs import GraphedDecode
from fast.layout import HeadLayout
from fast.tools.programs import case_format, on_device
from fuzz.strategies import FF_BYTE_BF16
from reference.cases import make_case


@dataclass
class OneLayer:
    """This rank's part of a case: ``c`` (the case on this rank's device), ``owned`` (this
    rank's heads), a CP ``state`` with one ``layer``, and ``q`` (this rank's queries,
    [rows, Hr, 128] in the case's query dtype)."""

    c: dict
    owned: list[int]
    state: IndexerDecodeCP
    layer: object
    q: torch.Tensor

    def step(self, queries=None, table=None, lens=None) -> torch.Tensor:
        """One forward on a fresh plan: ``queries`` (this rank's heads, on its device; ``q``
        where None), ``table`` and ``lens`` (the case's where None). Returns ``out``, int32
        [rows, Hr, 16] on the device, prefilled with -7."""
        c, queries = self.c, self.q if queries is None else queries
        table = c["block_table"] if table is None else table
        lens = c["seq_lens"] if lens is None else lens
        out = torch.full((queries.shape[0], len(self.owned), 16), -7, dtype=torch.int32, device=queries.device)
        self.state.forward(self.layer, self.state.plan(table, lens), queries, c["k_cache"], out, c["query_len"])
        return out


def one_layer(ctx, case: dict, **state_options) -> OneLayer:
    """``OneLayer`` of ``case`` on this rank (an MSA case: ``MsaDecodeCP`` with its format and
    windows), its stages callable alone (``bench.stages``); state_options:
    ``IndexerDecodeCP`` keywords."""
    c = on_device(ctx.device, case)
    heads = c["index_q"].shape[1]
    owned = list(HeadLayout(ctx.world, heads).heads_of(ctx.rank))
    key_format, windows = case_format(c)
    common = dict(heads=heads, max_reqs=c["seq_lens"].shape[0], symm=ctx.symm, **state_options)
    state = StagedMsaCP(**common, key_format=key_format, **windows) if windows else StagedCP(**common)
    return OneLayer(c, owned, state, state.new_layer(), c["index_q"][:, owned].contiguous())


def changing_queries_on_rank(
    ctx, case: dict, short_lens: torch.Tensor, *, steps: int, seed: int, lag: dict | None = None, pdl: bool = False
) -> list[torch.Tensor]:
    """``steps`` back-to-back CP forwards of one layer with new queries every step (drawn
    from ``seed``, the same on every rank: ``step_queries``), on ``case``'s table; steps
    ``s`` with ``(s // 2) % 2 == 0`` use ``short_lens`` (int32 [B], every row short), the
    others the case's lengths. Returns this rank's outputs, int32 [rows, Hr, 16] per step.
    A step whose rows are all short re-arms its tile without waiting for anyone; the step
    two later uses the same buffer set with long rows, so a query store that landed after
    that re-arm would be scored as if fresh — repeating one query would hide it. ``lag``:
    seconds this rank sleeps before each step, by rank (a peer that falls behind)."""
    rank = one_layer(ctx, case, pdl=pdl)
    short = short_lens.to(ctx.device)
    outs = []
    for step, q in enumerate(step_queries(case["index_q"].shape, steps, seed, case["index_q"].dtype)):
        time.sleep((lag or {}).get(ctx.rank, 0.0))
        queries = q[:, rank.owned].contiguous().to(ctx.device)
        outs.append(rank.step(queries, lens=short if (step // 2) % 2 == 0 else None))
    rank.state.check()
    return [o.cpu() for o in outs]


def stages_after_forward_on_rank(ctx, case: dict, *, pdl: bool = False) -> list[dict]:
    """A CP forward of one layer, then its stages but the scorer (``cp_stage_layers``: the
    benchmark's overhead by stage) twice on the scores it left; each run's ``{"heads",
    "out"}`` (int32 [rows, Hr, 16]), forward's first. The stages' runs land in the layer's
    other buffer set and then back in the forward's, so both sets' re-arms are checked."""
    rank = one_layer(ctx, case, pdl=pdl)
    c, owned, state, layer, q = rank.c, rank.owned, rank.state, rank.layer, rank.q
    plan = state.plan(c["block_table"], c["seq_lens"])
    outs = [torch.full((q.shape[0], len(owned), 16), -7, dtype=torch.int32, device=ctx.device) for _ in range(3)]
    state.forward(layer, plan, q, c["k_cache"], outs[0], c["query_len"])
    for out in outs[1:]:
        cp_stage_layers(
            [c["k_cache"]], state, [layer], SimpleNamespace(plan=plan, index_q=q[None], out=out[None]), c["query_len"]
        )
    state.check()
    return [{"heads": owned, "out": o.cpu()} for o in outs]


def short_step_skipped_on_rank(ctx, case: dict, short_lens: torch.Tensor, *, skip_rank: int, pdl: bool = False) -> dict:
    """Three CP steps of one layer: the case's lengths, ``short_lens`` (int32 [B], every row
    short), the case's lengths again; rank ``skip_rank`` never calls the middle step's
    forward. A step without a long request waits for nobody and keeps the parity, so the
    other ranks finish it alone and every rank meets again in the third step. Returns
    ``{"heads", "outs": 3 x int32 [rows, Hr, 16] (None where skipped), "parity": the
    layer's parity after each step}``."""
    rank = one_layer(ctx, case, pdl=pdl)
    outs, parity = [], []
    for step, lens in enumerate([None, short_lens.to(ctx.device), None]):
        skipped = step == 1 and ctx.rank == skip_rank
        outs.append(None if skipped else rank.step(lens=lens).cpu())
        parity.append(int(rank.layer.parity.item()))
    rank.state.check()
    return {"heads": rank.owned, "outs": outs, "parity": parity}


def bad_input_then_reset_on_rank(ctx, case: dict, bad_table: torch.Tensor, bad_lens: torch.Tensor) -> dict:
    """Two CP steps of one layer: ``bad_table`` and ``bad_lens`` (ids or lengths only the
    device sees are bad), then — after check() raised and a collective reset() — the case's
    own table and lengths. Returns ``{"heads", "bad_out", "error": (exception name, request,
    column, value) or None, "good_out", "clean": whether check() passed after reset}``."""
    rank = one_layer(ctx, case)
    state = rank.state
    outs, error = [], None
    for table, lens in ((bad_table.to(ctx.device), bad_lens.to(ctx.device)), (None, None)):
        outs.append(rank.step(table=table, lens=lens).cpu())
        if error is None:
            try:
                state.check()
            except DecodeInputError as e:
                error = (type(e).__name__, e.request, e.column, e.value)
            state.reset()
    state.check()
    return {"heads": rank.owned, "bad_out": outs[0], "error": error, "good_out": outs[1], "clean": True}


# The spin bound while a test checks that no spin gives up (its delays are a fraction of the
# bound the test's timeouts used; this leaves any load's delays room). A wait that never ends
# still ends here, as a failure.
LIFTED_BOUND_S = 60.0


def timeout_then_reset_on_rank(ctx, case: dict, *, timeout_s: float | None, steps: int, seed: int) -> dict:
    """A missing peer, reported, then recovery in place. Step A: every rank (a normal
    step, timed). Step B: rank 1 never calls forward, so rank 0's exchange gives up after
    the state's time bound (rank 1 waits at a host barrier until it has: a peer that only
    arrives late is no error). Step C: every rank again; rank 1's merge gives up too (rank 0, flagged, pushes
    nothing). Each rank's check() must raise PeerTimeoutError naming the stage that gave up; then reset() on every rank
    and ``steps`` back-to-back forwards with new queries every step (``step_queries(seed)``),
    rank 1 pushing half a time bound late in steps 1 and 3 (the bound lifted meanwhile). Returns ``{"heads", "step_s":
    step A's seconds, "reported_s": rank 0's seconds from step B's forward to check()
    raising (None elsewhere), "raised": ["PeerTimeoutError: <its stage>" after B (rank 0)
    and C], "outs": the steps' outputs}``."""
    rank = one_layer(ctx, case, spin_timeout_s=timeout_s)
    state, owned, step = rank.state, rank.owned, rank.step

    def raised() -> str | None:
        try:
            state.check()
        except PeerTimeoutError as e:
            return f"{type(e).__name__}: {e.stage}"
        return None

    start = time.monotonic()
    step()
    state.check()
    step_s = time.monotonic() - start
    names, reported_s = [], None
    if ctx.rank != 1:
        start = time.monotonic()
        step()
        names.append(raised())
        reported_s = time.monotonic() - start
    # Rank 1 stays missing until every other rank's exchange gave up (the host barrier after
    # their check()): missing, not only late, however long a loaded machine makes step B.
    ctx.symm.barrier()
    step()
    names.append(raised())
    state.reset()
    # Rank 1's push of step C landed in rank 0's candidates after rank 0 gave up: only
    # reset() clears them. In the odd steps after it (the set they are in) rank 1 pushes
    # late, so a rank 0 that finds stale candidates there merges them instead of waiting.
    # Late is half the bound the timeouts above had, and the bound is lifted while this is
    # checked: no spin may give up here, and a loaded machine's delays must not make one.
    late_s = 0.5 * state.timeout_s
    state.timeout_s, state._timeout_ns = LIFTED_BOUND_S, int(LIFTED_BOUND_S * 1e9)
    push = state._push

    def late_push(*args):
        time.sleep(late_s)
        push(*args)

    outs = []
    for i, queries in enumerate(step_queries(case["index_q"].shape, steps, seed, case["index_q"].dtype)):
        state._push = late_push if ctx.rank == 1 and i in (1, 3) else push
        outs.append(step(queries[:, owned].contiguous().to(ctx.device)).cpu())
    state.check()
    return {"heads": owned, "step_s": step_s, "reported_s": reported_s, "raised": names, "outs": outs}


def flagged_steps_on_rank(ctx, case: dict, *, timeout_s: float, steps: int) -> dict:
    """A rank whose spin gave up waits for nothing again. Step A: every rank. Step B: rank 1
    never calls forward, so rank 0's exchange gives up after ``timeout_s``; rank 0 then runs
    ``steps`` more steps alone (timed: each must skip its spins, not wait the bound again)
    while rank 1 waits in reset(). Then one step on every rank, which must be exact.
    Returns ``{"heads", "flagged_s": rank 0's seconds for its lone steps (None elsewhere),
    "step_s": step A's seconds, "raised": rank 0's exception and stage after them, "outs":
    [the lone steps' outputs (rank 0), the step after reset]}``."""
    rank = one_layer(ctx, case, spin_timeout_s=timeout_s)
    state = rank.state

    def step():
        return rank.step().cpu()

    start = time.monotonic()
    step()
    state.check()
    step_s = time.monotonic() - start
    outs, flagged_s, raised = [], None, None
    if ctx.rank == 0:
        step()  # B: gives up after the bound
        start = time.monotonic()
        outs = [step() for _ in range(steps)]
        flagged_s = time.monotonic() - start
        try:
            state.check()
        except PeerTimeoutError as e:
            raised = f"{type(e).__name__}: {e.stage}"
    state.reset()  # (rank 1 waits in its first barrier until rank 0's lone steps are done)
    outs.append(step())
    state.check()
    return {"heads": rank.owned, "flagged_s": flagged_s, "step_s": step_s, "raised": raised, "outs": outs}


def step_queries(shape, steps: int, seed: int, dtype=torch.float8_e4m3fn) -> list[torch.Tensor]:
    """``exact_queries`` of ``shape`` and ``dtype``, one per step, drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return [exact_queries(shape, gen, dtype) for _ in range(steps)]


def exact_queries(shape, gen: torch.Generator, dtype=torch.float8_e4m3fn) -> torch.Tensor:
    """Queries of ``shape`` and ``dtype`` (float8_e4m3fn or bfloat16) with exact-arithmetic
    values: multiples of 0.5 in [-1, 1], and for bf16 also +-255/128 (``FF_BYTE_BF16``).
    Every summation order gives the same fp32 score on the cases' exact keys."""
    q = torch.randint(-2, 3, tuple(shape), generator=gen).float() * 0.5
    if dtype == torch.bfloat16:
        q = torch.where(torch.rand(tuple(shape), generator=gen) < 0.1, torch.sign(q + 0.25) * FF_BYTE_BF16, q)
    return q.to(dtype)


def random_step(
    gen: torch.Generator, batch: int, pages: int, blocks: int, query_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode step's block table (int32 [batch, pages], distinct blocks per request out of
    ``blocks``) and lengths (int32 [batch]) covering every length class: the first rows at 0,
    16 and 15 pages (short, the 16-page switch), a padding request (length 0) fourth, the rest
    up to 40 pages past the table."""
    table = torch.stack([torch.randperm(blocks, generator=gen)[:pages] for _ in range(batch)]).to(torch.int32)
    n_pages = torch.randint(0, pages + 40, (batch,), generator=gen)
    n_pages[: min(batch, 3)] = torch.tensor([0, 16, 15])[: min(batch, 3)]
    lens = (n_pages * 128 + 1 + torch.randint(0, 128, (batch,), generator=gen)).clamp(min=query_len).to(torch.int32)
    lens[3:4] = 0  # the fourth request, where there is one, is padding
    return table, lens


def graph_replay_on_rank(
    ctx, *, steps: int, check_every: int, pdl: bool, seed: int = 0, heads: int = 4, query_len: int = 4, pages: int = 300
) -> dict:
    """CP decode through ``GraphedDecode`` on this rank's GPU: ``steps`` back-to-back replays
    (nothing else synchronizes the ranks) with a new batch size (1..8, padded to 1/2/4/8),
    block table, lengths and queries every step, planned between replays. Every
    ``check_every`` steps and at the last, this rank's heads are compared with
    ``reference.full_decode``; a mismatch raises. Every rank draws the same steps (same seed).
    Returns ``{"checked": n, "graphs": capture sizes used}``."""
    gen = torch.Generator().manual_seed(seed)
    base = make_case(
        seed, [query_len] * 8, query_len=query_len, heads=heads, pattern="exact", table_width=pages, num_blocks=1024
    )
    k_cache = base.k_cache.to(ctx.device)
    owned = list(HeadLayout(ctx.world, heads).heads_of(ctx.rank))
    state = IndexerDecodeCP(heads=heads, max_reqs=8, symm=ctx.symm, pdl=pdl)
    graphed = GraphedDecode(state, query_len=query_len, table_width=pages, k_caches=[k_cache], sizes=(1, 2, 4, 8))
    checked = 0
    for step in range(steps):
        batch = int(torch.randint(1, 9, (), generator=gen))
        table, lens = random_step(gen, batch, pages, k_cache.shape[0], query_len)
        q = exact_queries((batch * query_len, heads, 128), gen)
        out = graphed.step(table.to(ctx.device), lens.to(ctx.device), q[:, owned].to(ctx.device))
        if step % check_every == 0 or step == steps - 1:
            want = reference.full_decode(q, base.k_cache, table, lens, query_len)[:, owned]
            got = out[0].cpu()
            if not torch.equal(got, want):
                raise AssertionError(
                    f"rank {ctx.rank} step {step} (batch {batch}): CP graph replay differs from the reference"
                )
            checked += 1
    torch.cuda.synchronize()
    state.check()
    return {"checked": checked, "graphs": graphed.captured}


def die_on_rank(ctx, rank: int, how: str) -> int:
    """Rank ``rank`` prints a line and dies (``how``: "exit" — os._exit(3) — or "segv", a
    SIGSEGV to itself); the others return their rank at once."""
    if ctx.rank == rank:
        print(f"rank {rank} about to die", flush=True)
        if how == "exit":
            os._exit(3)
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(60)  # not reached: the signal ends the process
    return ctx.rank
