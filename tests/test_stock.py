"""Stock (16-bit key) selection against the exact oracle: where they may and may not differ."""

import torch
from hypothesis import given

from fuzz.strategies import decode_configs
from fuzz.targets import Context, check_stock
from reference import full_decode, stock_decode
from indexer_constants import CODE_BYTES, PAGE_BYTES


@given(decode_configs(max_pages=120))
def test_stock_agrees_with_exact_up_to_16_bit_ties(cfg):
    """Rule: short rows and slot 15 are equal; in the ranked slots, the q16 values read in
    order are equal (q16 is monotone in the score, so both lists take every page above the
    boundary bucket and differ only in which pages of the boundary bucket they keep, and
    in order within equal buckets). The rule lives in the fuzz target, which checks it."""
    check_stock(cfg, Context("cpu", {}))


def separated_cache() -> torch.Tensor:
    """71 pages; page i scores exactly E4M3 byte 0x38 + i (1.0 .. 448) against the query e_0.

    Every token's element 0 is code 2 (1.0) under a scale byte of its own, everything else
    +0. Neighbouring values are >= 0.125 apart and the span is < 448, so distinct scores sit
    >= 18 16-bit buckets apart (65534 * 0.125 / 448 > 18).
    """
    n = 0x7E - 0x38 + 1
    pages = torch.zeros(n, PAGE_BYTES, dtype=torch.uint8)
    tokens = torch.arange(128)
    pages[:, tokens * 64] = 2  # element 0 of each token: code 2, low nibble
    pages[:, CODE_BYTES + tokens * 8] = (0x38 + torch.arange(n, dtype=torch.uint8))[:, None]
    pages[:, CODE_BYTES:].view(n, 128, 8)[:, :, 1:] = 0x38  # other groups: any finite scale
    return pages.view(n, 128, 72)


@given(decode_configs(max_pages=120))
def test_stock_equals_exact_when_scores_are_well_separated(cfg):
    """Scores either equal (a repeated page: both keys break the tie by the lower page) or at
    least 18 buckets apart: stock must pick the oracle's pages in the oracle's order."""
    case = cfg.build()
    q = torch.zeros(case.index_q.shape)
    q[:, :, 0] = 1.0
    k_cache = separated_cache()
    table = case.block_table.remainder(k_cache.shape[0])
    args = (q.to(torch.float8_e4m3fn), k_cache, table, case.seq_lens, case.query_len)
    assert torch.equal(full_decode(*args), stock_decode(*args))
