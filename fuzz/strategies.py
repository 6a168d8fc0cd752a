"""Hypothesis strategies that draw decode *configurations* (never megabyte arrays).

A configuration is a handful of integers and names; ``DecodeConfig.build()`` turns it into
tensors with the shared case builders, so a shrunk failure prints as one readable line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

import torch
from hypothesis import strategies as st

from indexer_constants import MAX_QUERY_LEN, PAGE, SUPPORTED_CP, SUPPORTED_HEADS
from reference import msa
from reference.cases import PATTERNS, Case, make_case
from reference.msa.cases import DTYPES as MSA_DTYPES
from reference.msa.cases import EXACT_PATTERNS as MSA_EXACT
from reference.msa.cases import PATTERNS as MSA_PATTERNS

SMALL_EDGE_PAGES = (0, 1, 3, 15, 16, 17, 129)
BIG_EDGE_PAGES = (2048, 2049, 8191, 8192, 8197)  # the MAX_PAGES edge and past it
EDGE_OFFSETS = (-1, 0, 1, 127)  # tokens past a page boundary (see reference.cases.seq_len_for)


# The key formats an example may carry: NVFP4, or the MSA format's two (docs/DESIGN.md §10).
KEY_FORMATS = ("nvfp4", "bf16", "fp8")


@dataclass(frozen=True)
class DecodeConfig:
    """One decode example: everything needed to rebuild its tensors."""

    seed: int
    cp: int
    heads: int
    query_len: int
    seq_lens: tuple[int, ...]
    table_width: int
    pattern: str
    extra_width: int = 0  # compact width beyond ceil(P / CP) + 1, as a wider first plan leaves
    key_format: str = "nvfp4"  # or "bf16" / "fp8": docs/DESIGN.md §10, with its forced windows
    init_blocks: int = 0
    local_blocks: int = 0
    ff_bytes: bool = False  # bf16 MSA: queries holding 0xFF bytes (``with_ff_bytes``)
    mma: str = "exact"  # the scorer's MMA route (DESIGN §4.1: "e4m3" for NVFP4 and FP8 keys)

    def build(self) -> Case | msa.MsaCase:
        """The example's case: NVFP4 (``reference.cases.make_case``) or the MSA format's
        (``reference.msa.make_case``, its forced windows; 0xFF query bytes if asked)."""
        if self.key_format != "nvfp4":
            case = msa.make_case(
                self.seed,
                list(self.seq_lens),
                dtype=self.key_format,
                query_len=self.query_len,
                heads=self.heads,
                pattern=self.pattern,
                table_width=self.table_width,
                init_blocks=self.init_blocks,
                local_blocks=self.local_blocks,
            )
            return with_ff_bytes(case) if self.ff_bytes else case
        return make_case(
            self.seed,
            list(self.seq_lens),
            query_len=self.query_len,
            heads=self.heads,
            pattern=self.pattern,
            table_width=self.table_width,
            name=repr(self),
        )

    def as_dict(self) -> dict:
        """Its fields (what a replay rebuilds it from)."""
        return asdict(self)


@st.composite
def seq_lens(draw, query_len: int, max_pages: int, big: bool = False):
    """Lengths biased to page boundaries and the 16-page switch; each >= query_len, or 0 (a
    padding request, about one in eight). With ``big``, one request in ~20 sits at the
    8192-page edge or past it (they cost seconds)."""
    batch = draw(st.integers(1, 3))
    out = []
    for _ in range(batch):
        if draw(st.integers(0, 7)) == 0:
            out.append(0)
            continue
        if big and draw(st.integers(0, 19)) == 0:
            pages = draw(st.sampled_from(BIG_EDGE_PAGES))
        else:
            pages = draw(st.one_of(st.sampled_from(SMALL_EDGE_PAGES), st.integers(0, max_pages)))
        offset = draw(st.one_of(st.sampled_from(EDGE_OFFSETS), st.integers(0, PAGE - 1)))
        out.append(max(query_len, pages * PAGE + 1 + offset))
    return tuple(out)


@st.composite
def decode_configs(
    draw, max_pages: int = 300, patterns=PATTERNS, cps=SUPPORTED_CP, big: bool = False, routes=("exact",)
):
    """CP and head layouts, query lengths, lengths, and tables that fit, are narrower than
    the history (lengths past the table) or wider than it; the scorer's MMA route one of
    ``routes``, picked by the example's seed."""
    query_len = draw(st.integers(1, MAX_QUERY_LEN))
    lens = draw(seq_lens(query_len, max_pages, big))
    fit = max(1, max(-(-n // PAGE) for n in lens))
    table = draw(st.sampled_from(["fit", "narrow", "wide"]))
    if table == "narrow":
        width = draw(st.integers(1, fit))
    elif table == "wide":
        width = fit + draw(st.integers(1, 20))
    else:
        width = fit
    config = DecodeConfig(
        seed=draw(st.integers(0, 2**31 - 1)),
        cp=draw(st.sampled_from(cps)),
        heads=draw(st.sampled_from(SUPPORTED_HEADS)),
        query_len=query_len,
        seq_lens=lens,
        table_width=width,
        pattern=draw(st.sampled_from(patterns)),
        extra_width=draw(st.sampled_from([0, 0, 1, 7])),
    )
    # the route from the seed, not a draw of its own: a campaign's other draws (and so the
    # planted bugs its smoke budget finds) stay as they were
    return dataclasses.replace(config, mma=routes[config.seed % len(routes)])


@st.composite
def msa_configs(
    draw, max_pages: int = 300, cps=SUPPORTED_CP, big: bool = False, patterns=MSA_PATTERNS, routes=("exact",)
):
    """``decode_configs`` for the MSA format: a key dtype, its patterns, forced windows of
    0..16 blocks in all (biased to the edges: none, one each, all 16), and for bf16 on an
    exact pattern queries holding 0xFF bytes (``with_ff_bytes``); the route from
    ``routes`` for fp8 keys (bf16 keys have the exact route alone)."""
    base = draw(decode_configs(max_pages=max_pages, patterns=tuple(patterns), cps=cps, big=big, routes=routes))
    init = draw(st.one_of(st.sampled_from([0, 1, 16]), st.integers(0, 16)))
    local = draw(st.one_of(st.sampled_from(sorted({0, min(1, 16 - init), 16 - init})), st.integers(0, 16 - init)))
    fmt = draw(st.sampled_from(sorted(MSA_DTYPES)))
    ff = fmt == "bf16" and base.pattern in MSA_EXACT
    mma = base.mma if fmt == "fp8" else "exact"
    return dataclasses.replace(base, key_format=fmt, init_blocks=init, local_blocks=local, ff_bytes=ff, mma=mma)


# A bf16 value whose low byte is 0xFF (0x3FFF; its negative 0xBFFF): a bf16 query holding it
# must not pass for an unwritten one, whose flag is the 0xFFFF half-word, not a byte. With
# the exact patterns' keys every product is a multiple of 2^-10 and every sum stays below
# 2^10, so scores stay exact in any summation order.
FF_BYTE_BF16 = 255 / 128


def with_ff_bytes(case: msa.MsaCase) -> msa.MsaCase:
    """``case`` with a tenth of its bf16 query elements +-255/128 (drawn from the case's
    size); an fp8 case as it is (a finite E4M3 byte is never 0xFF)."""
    if case.index_q.dtype == torch.bfloat16:
        q = case.index_q.float()
        pick = torch.rand(q.shape, generator=torch.Generator().manual_seed(q.numel())) < 0.1
        case.index_q = torch.where(pick, torch.sign(q + 0.25) * FF_BYTE_BF16, q).to(torch.bfloat16)
    return case
