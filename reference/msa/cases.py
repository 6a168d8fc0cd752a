"""Synthetic MSA cases for both key dtypes, built from a seed (never stored as megabytes)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from indexer_constants import HEAD_DIM, PAGE

from ..cases import load_case_dict

PATTERNS = ("random", "exact", "ties", "zeros", "late")
# Every fp32 dot product of these is exact in any summation order: q and k in
# {0, +-0.5, +-1, +-2}, so products are multiples of 2^-2 and sums stay below 2^10.
EXACT_PATTERNS = ("exact", "ties", "zeros", "late")
DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}

_EXACT_VALUES = torch.tensor([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0])


@dataclass
class MsaCase:
    """MSA decode inputs: index_q [B * q, H, 128] and k_cache [N, 128, 128] of one key
    dtype; block_table int32 [B, P_table]; seq_lens int32 [B]; query_len; the windows."""

    index_q: torch.Tensor
    k_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_len: int
    init_blocks: int
    local_blocks: int
    name: str = ""

    def args(self) -> tuple:
        """Positional arguments of the decode functions."""
        return (self.index_q, self.k_cache, self.block_table, self.seq_lens, self.query_len)

    def windows(self) -> dict:
        """The keyword arguments naming the forced windows."""
        return {"init_blocks": self.init_blocks, "local_blocks": self.local_blocks}

    def to_dict(self) -> dict:
        """The decode's inputs and forced windows by name: what ``save`` writes."""
        names = ("index_q", "k_cache", "block_table", "seq_lens", "query_len")
        return {**dict(zip(names, self.args())), **self.windows()}

    def save(self, path) -> None:
        """Write ``to_dict`` to ``path`` (``torch.save``; ``load`` reads it back)."""
        torch.save(self.to_dict(), path)

    @classmethod
    def load(cls, path, saved: dict | None = None) -> MsaCase:
        """A case ``save`` wrote (``saved``: the file's dict, already read); ValueError naming
        the case where it is not one."""
        d = load_case_dict(path, WINDOW_FIELDS, saved)
        fields = (d["index_q"], d["k_cache"], d["block_table"], d["seq_lens"], d["query_len"])
        return cls(*fields, d["init_blocks"], d["local_blocks"], str(path))


WINDOW_FIELDS = ("init_blocks", "local_blocks")  # what a saved MSA case holds beyond a decode case


def _pick(gen, shape) -> torch.Tensor:
    return _EXACT_VALUES[torch.randint(0, _EXACT_VALUES.numel(), shape, generator=gen)]


def _values(gen, pattern: str, rows: int, heads: int, blocks: int):
    """float32 queries [rows, H, 128] and keys [blocks, 128, 128] of one pattern."""
    qshape, kshape = (rows, heads, HEAD_DIM), (blocks, PAGE, HEAD_DIM)
    if pattern == "random":
        spread = torch.exp2(torch.randint(-3, 4, (blocks, PAGE, 1), generator=gen).float())
        return torch.randn(qshape, generator=gen) * 2, torch.randn(kshape, generator=gen) * spread
    q = _pick(gen, qshape)
    if pattern == "exact":
        return q, _pick(gen, kshape)
    if pattern == "ties":  # only 3 distinct blocks exist: massive exact ties
        return q, _pick(gen, kshape)
    if pattern == "zeros":  # every score +0.0
        return q, torch.zeros(kshape)
    if pattern == "late":
        # Small keys, except the last 16 tokens of every block are large: a token mask one
        # token off (or none) moves the partial block's score by a lot.
        k = _pick(gen, kshape) * 0.25
        k[:, PAGE - 16 :] = _pick(gen, (blocks, 16, HEAD_DIM)) * 2
        return q, k
    raise ValueError(f"pattern: expected one of {PATTERNS}, got {pattern!r}")


def make_case(
    seed: int,
    seq_lens: list[int],
    *,
    dtype: str = "bf16",
    query_len: int = 1,
    heads: int = 4,
    pattern: str = "random",
    init_blocks: int = 1,
    local_blocks: int = 1,
    table_width: int | None = None,
    num_blocks: int | None = None,
) -> MsaCase:
    """Build an MSA decode case.

    seq_lens: one length per request; dtype: ``"bf16"`` or ``"fp8"`` (queries and keys);
    table_width: P_table (default: every block a request's length reaches); num_blocks: N
    (default: one distinct block per table column, at most 8192; ``ties``: 3). Patterns:
    ``random`` (normal values, keys spread over 2^-3..2^3), and the exact-arithmetic ones:
    ``exact``, ``ties``, ``zeros``, ``late`` (the last 16 tokens of each block dominate).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {tuple(DTYPES)}, got {dtype!r}")
    gen = torch.Generator().manual_seed(seed)
    batch = len(seq_lens)
    width = table_width or max([1] + [-(-n // PAGE) for n in seq_lens])
    blocks = num_blocks or (3 if pattern == "ties" else max(1, min(width, 8192)))
    q, k = _values(gen, pattern, batch * query_len, heads, blocks)
    if blocks >= width:
        table = torch.stack([torch.randperm(blocks, generator=gen)[:width] for _ in range(batch)])
    else:
        table = torch.randint(0, blocks, (batch, width), generator=gen)
    return MsaCase(
        index_q=q.to(DTYPES[dtype]),
        k_cache=k.to(DTYPES[dtype]),
        block_table=table.reshape(batch, width).to(torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_len=query_len,
        init_blocks=init_blocks,
        local_blocks=local_blocks,
        name=f"msa-{dtype}-{pattern}-s{seed}",
    )
