"""Fixed numbers of the contract (docs/DESIGN.md §2) and the NVFP4 page layout (§3).

Numbers only, no rules: both halves import them (`reference/` and `fast/`), and every rule
that uses them is computed by each half on its own.
"""

PAGE = 128  # tokens per KV page
HEAD_DIM = 128  # index head dimension
SLOTS = 8  # query slots per request in the scorer; query_len q uses the last q slots
TOPK = 16  # output entries per (query, head)
RANKED = TOPK - 1  # ranked output slots; slot RANKED holds the query's own page
MAX_PAGES = 8192  # largest page table considered (1M tokens); page ids fit 16 bits
MAX_QUERY_LEN = SLOTS

# The scorer's MMA (§4, §4.1): 16-bit operands summed in fp32 (the default), or Hopper's
# E4M3 MMA on the E4M3 values themselves, whose sums the reference models bit for bit.
MMA_ROUTES = ("exact", "e4m3")

SUPPORTED_HEADS = (1, 2, 4, 8)
SUPPORTED_CP = (1, 2, 4, 8)

# NVFP4 page: PAGE tokens x HEAD_DIM E2M1 codes (two per byte), then one E4M3 scale per
# group of GROUP elements. The [N, 128, 72] shape of k_cache is only a view of this.
GROUP = 16
CODE_BYTES = PAGE * HEAD_DIM // 2  # 8192
SCALE_BYTES = PAGE * HEAD_DIM // GROUP  # 1024
PAGE_BYTES = CODE_BYTES + SCALE_BYTES  # 9216
ROW_BYTES = PAGE_BYTES // PAGE  # 72: the last dim of the k_cache view

E4M3_MAX = 448.0
E4M3_MIN_SUBNORMAL = 2.0**-9
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

# Exact selection key: 1 << 48 | ordered(score) << 16 | (0xFFFF - page). Valid keys are
# positive; 0 means "no page"; -1 is the "not yet written" sentinel of the CP exchange.
KEY_VALID_BIT = 1 << 48
PAGE_MASK = 0xFFFF
NO_KEY = 0
PENDING = -1
