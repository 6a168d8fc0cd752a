"""Case builders shared by tests, fuzzing, the demo and the benchmarks.

A case is built from a seed and a small configuration, never stored as megabytes: the same
(seed, configuration) always gives the same tensors.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import torch

from indexer_constants import HEAD_DIM, PAGE

from .nvfp4 import join_pages, quantize_nvfp4

PATTERNS = ("random", "gaussian", "exact", "ties", "clustered", "zeros")
# Patterns whose every fp32 dot product is exact in any summation order (q in
# {0, ±0.5, ±1, ±2}, K = E2M1 x power-of-two scale <= 4: products are multiples of 2^-3 and
# sums stay below 2^13), so every scorer must give the same scores bit for bit.
EXACT_PATTERNS = ("exact", "ties", "clustered", "zeros")
# History lengths (pages) where things break: empty, short, the 16-page switch, group and
# table edges, the MAX_PAGES edge and past it.
EDGE_PAGES = (0, 1, 3, 15, 16, 17, 129, 2048, 2049, 5078, 8192, 8197)

_E4M3 = torch.float8_e4m3fn
_COLD_SCALE, _HOT_SCALE = 0.5, 4.0
_HOT_BLOCKS = 32  # distinct "winner" pages of the clustered pattern
_CLUSTER = 24  # winners per request in the clustered pattern (more than 16, fewer than 2 ranks' worth)


@dataclass
class Case:
    """Decode inputs in the CLI's case format.

    index_q: float8_e4m3fn [B * query_len, H, 128]; k_cache: uint8 [N, 128, 72];
    block_table: int32 [B, P_table]; seq_lens: int32 [B]; query_len: 1..8.
    """

    index_q: torch.Tensor
    k_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_len: int
    name: str = ""

    def args(self) -> tuple:
        """Positional arguments of the decode functions."""
        return (self.index_q, self.k_cache, self.block_table, self.seq_lens, self.query_len)

    def to_dict(self) -> dict:
        """The decode's inputs by name: what ``save`` writes and a rank program receives."""
        return {
            "index_q": self.index_q,
            "k_cache": self.k_cache,
            "block_table": self.block_table,
            "seq_lens": self.seq_lens,
            "query_len": self.query_len,
        }

    def save(self, path) -> None:
        """Write ``to_dict`` to ``path`` (``torch.save``; ``load`` reads it back)."""
        torch.save(self.to_dict(), path)

    @classmethod
    def load(cls, path, saved: dict | None = None) -> Case:
        """A case saved by ``save`` (``saved``: the file's dict, already read); ValueError
        naming the case where the file is missing, is not a saved case, or lacks a field (the
        tensors are checked where they are used)."""
        d = load_case_dict(path, (), saved)
        return cls(d["index_q"], d["k_cache"], d["block_table"], d["seq_lens"], d["query_len"], str(path))


CASE_FIELDS = ("index_q", "k_cache", "block_table", "seq_lens", "query_len")


def read_case_file(path) -> dict:
    """What a case's ``save`` wrote to ``path``, unchecked; ValueError naming the case where
    the file is missing or holds no dict."""
    try:
        d = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"case: no such file: {path}") from None
    except (OSError, EOFError, RuntimeError, pickle.UnpicklingError) as exc:
        raise ValueError(f"case: {path} is not a saved case ({type(exc).__name__})") from None
    if not isinstance(d, dict):
        raise ValueError(f"case: {path} holds a {type(d).__name__}, not a dict of the case's fields")
    return d


def load_case_dict(path, extra: tuple[str, ...], saved: dict | None = None) -> dict:
    """The dict a case's ``save`` wrote (``saved``, where the caller has read the file
    already), holding the five decode fields and the ``extra`` ones, query_len and the extra
    ones as ints. ValueError naming the case otherwise."""
    d = read_case_file(path) if saved is None else saved
    missing = set(CASE_FIELDS + extra) - set(d)
    if missing:
        raise ValueError(f"case: {path} lacks {sorted(missing)}")
    ints = {}
    for name in ("query_len",) + extra:
        value = d[name]
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"case: {name} in {path} must be an int, got {value!r}")
        ints[name] = value
    return {**d, **ints}


def seq_len_for(pages: int, offset: int = 0) -> int:
    """A length whose history holds ``pages`` full pages: ``(len - 1) // 128 == pages`` for
    offsets 0..127; offset -1 sits on the page boundary just below."""
    return pages * PAGE + 1 + offset


def edge_seq_lens(query_len: int = 1) -> list[int]:
    """Every EDGE_PAGES boundary and its neighbours (-1, 0, +1 tokens), at least query_len."""
    lens = {seq_len_for(p, d) for p in EDGE_PAGES for d in (-1, 0, 1)}
    return sorted(n for n in lens if n >= query_len)


def _e4m3_bytes(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).to(_E4M3).view(torch.uint8)


def _pick(gen: torch.Generator, choices: torch.Tensor, shape) -> torch.Tensor:
    return choices[torch.randint(0, choices.numel(), shape, generator=gen)]


def _exact_queries(gen, shape) -> torch.Tensor:
    return _pick(gen, torch.tensor([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0]), shape).to(_E4M3)


def _random_codes(gen, blocks: int) -> torch.Tensor:
    return torch.randint(0, 256, (blocks, PAGE, HEAD_DIM // 2), dtype=torch.uint8, generator=gen)


def _build(gen, pattern: str, rows: int, heads: int, blocks: int):
    """Queries [rows, H, 128] e4m3 and the cache [blocks, 128, 72] for one pattern, plus the
    number of leading blocks that are 'hot' (clustered pattern only)."""
    qshape = (rows, heads, HEAD_DIM)
    sshape = (blocks, PAGE, HEAD_DIM // 16)
    if pattern == "random":
        q = (torch.randn(qshape, generator=gen) * 2).to(_E4M3)
        # Any finite scale byte from 2^-6 to 8: codes x scales cover most of E4M3.
        scales = torch.randint(0x08, 0x51, sshape, dtype=torch.uint8, generator=gen)
        return q, join_pages(_random_codes(gen, blocks), scales), 0
    if pattern == "gaussian":
        q = (torch.randn(qshape, generator=gen) * 2).to(_E4M3)
        spread = torch.exp2(torch.randint(-4, 4, (blocks, PAGE, 1), generator=gen).float())
        return q, quantize_nvfp4(torch.randn((blocks, PAGE, HEAD_DIM), generator=gen) * spread), 0
    q = _exact_queries(gen, qshape)
    codes = _random_codes(gen, blocks)
    if pattern == "exact":
        scales = _pick(gen, _e4m3_bytes([0.5, 1.0, 2.0, 4.0]), sshape)
        return q, join_pages(codes, scales), 0
    if pattern == "ties":
        return q, join_pages(codes, _pick(gen, _e4m3_bytes([1.0]), sshape)), 0
    if pattern == "zeros":
        scales = _pick(gen, _e4m3_bytes([0.5, 1.0, 2.0, 4.0]), sshape)
        return q, join_pages(torch.zeros_like(codes), scales), 0
    if pattern == "clustered":
        scales = torch.full(sshape, int(_e4m3_bytes([_COLD_SCALE])), dtype=torch.uint8)
        scales[:_HOT_BLOCKS] = int(_e4m3_bytes([_HOT_SCALE]))
        return q, join_pages(codes, scales), _HOT_BLOCKS
    raise ValueError(f"pattern: expected one of {PATTERNS}, got {pattern!r}")


def make_case(
    seed: int,
    seq_lens: list[int],
    *,
    query_len: int = 1,
    heads: int = 4,
    pattern: str = "random",
    table_width: int | None = None,
    num_blocks: int | None = None,
    name: str | None = None,
) -> Case:
    """Build a decode case.

    seq_lens: one length per request (each >= query_len); table_width: P_table (default:
    every page each request touches, own page included); num_blocks: N cache pages
    (default: enough for distinct pages per row, at most 8192; ``ties`` uses 3).
    Patterns: ``random`` (raw codes, wide scales), ``gaussian`` (quantize_nvfp4 of normal
    keys), and the exact-arithmetic ones: ``exact``, ``ties`` (3 distinct pages: massive
    score ties), ``clustered`` (24 winners per request packed into one contiguous run or
    one rank's stride), ``zeros`` (all-zero K: every score +0.0).
    """
    gen = torch.Generator().manual_seed(seed)
    batch = len(seq_lens)
    width = table_width or max([1] + [-(-n // PAGE) for n in seq_lens])
    if pattern == "ties":
        blocks = num_blocks or 3
    else:
        blocks = num_blocks or max(1, min(width, 8192))
        if pattern == "clustered":
            blocks += _HOT_BLOCKS
    q, k_cache, hot = _build(gen, pattern, batch * query_len, heads, blocks)
    cold = blocks - hot
    if cold >= width:
        rows = [torch.randperm(cold, generator=gen)[:width] for _ in range(batch)]
        table = torch.stack(rows) if rows else torch.zeros((0, width), dtype=torch.int64)
    else:
        table = torch.randint(0, cold, (batch, width), generator=gen)
    table = table + hot
    if hot:
        for b, n in enumerate(seq_lens):
            table[b] = _place_cluster(gen, table[b], (n - 1) // PAGE, hot)
    return Case(
        index_q=q,
        k_cache=k_cache,
        block_table=table.to(torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_len=query_len,
        name=name or f"{pattern}-s{seed}",
    )


def _place_cluster(gen, row: torch.Tensor, history: int, hot: int) -> torch.Tensor:
    """Put hot pages on _CLUSTER positions of one row below its history: a contiguous run
    (winners spread over every rank) or a stride of 2, 4 or 8 (winners on few ranks)."""
    span = min(history, row.numel())
    if span <= 0:
        return row
    stride = int(_pick(gen, torch.tensor([1, 2, 4, 8]), ()))
    count = min(_CLUSTER, -(-span // stride))
    start = int(torch.randint(0, span - (count - 1) * stride, (), generator=gen))
    positions = start + stride * torch.arange(count)
    row = row.clone()
    row[positions] = torch.randint(0, hot, (count,), generator=gen).to(row.dtype)
    return row


def every_element_case() -> Case:
    """A case whose page scores are single dequantized elements: every (scale byte, code).

    32 pages; token 0 of page p holds, in group g, scale byte 8p + g (the NaN bytes 0x7F /
    0xFF replaced by 0x00, which the reference rejects) and the 16 codes rotated by p + g
    (every code at every position); every other token is zero. 4 requests of 8 query slots
    x 8 heads score all 32 pages: row r = slot * 8 + head of request b is +-1 on dimension
    32 b + r // 2 (+ for even r), so its score of page p is max(+-k[0, d], 0) — one exact
    product, the same in every summation order — and the + and - rows give k itself.
    """
    pages = 32
    scales = torch.full((pages, PAGE, 8), 0x38, dtype=torch.uint8)  # 1.0 on the zero tokens
    first = torch.arange(pages * 8).view(pages, 8)
    scales[:, 0] = torch.where((first & 0x7F) == 0x7F, 0, first).to(torch.uint8)
    codes = torch.zeros(pages, PAGE, HEAD_DIM, dtype=torch.uint8)
    rot = first[:, :, None] + torch.arange(16)  # [page, group, element]
    codes[:, 0] = (rot % 16).reshape(pages, HEAD_DIM).to(torch.uint8)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    batch, slots, heads = 4, 8, 8
    q = torch.zeros(batch, slots * heads, HEAD_DIM)
    r = torch.arange(slots * heads)
    for b in range(batch):
        q[b, r, 32 * b + r // 2] = 1.0 - 2.0 * (r % 2)
    index_q = q.view(batch * slots, heads, HEAD_DIM).to(_E4M3)
    table = torch.arange(pages, dtype=torch.int32).repeat(batch, 1)
    lens = torch.full((batch,), (pages + 1) * PAGE + slots, dtype=torch.int32)  # every slot owns all 32
    return Case(index_q, join_pages(packed, scales), table, lens, slots, "every_element")
