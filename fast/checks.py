"""Host-side checks of the fast path's inputs: metadata only (no device sync), a clear
exception naming the argument (``"name: ..."``), raised before any kernel is launched.

Written for ``fast`` on its own (the reference validates its inputs with its own code);
``tests/test_rules.py`` holds the two to the same verdicts.
"""

from __future__ import annotations

import torch

from indexer_constants import HEAD_DIM, MAX_QUERY_LEN, MMA_ROUTES, PAGE, ROW_BYTES, SLOTS, TOPK

# Most requests a decode state holds: the kernels' int32 offsets into a layer's buffers stay
# below 2^31 (two tile sets of max_reqs x 8 rows x H x 32 words: < 2^30 at H = 8).
MAX_REQS = ((1 << 21) - 1) // SLOTS


def check_int(name: str, value, *, allowed=None, low=None, high=None) -> int:
    """A Python int (not a bool) in ``allowed`` and ``low..high``; TypeError / ValueError
    naming the argument otherwise. Returns it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if allowed is not None and value not in allowed:
        raise ValueError(f"{name}: must be one of {tuple(allowed)}, got {value}")
    if (low is not None and value < low) or (high is not None and value > high):
        bound = f"in {low}..{high}" if high is not None else f">= {low}"
        raise ValueError(f"{name}: must be {bound}, got {value}")
    return value


def check_tensor(name: str, x, dtype: torch.dtype, dims: int) -> None:
    """A torch.Tensor of ``dtype`` with ``dims`` dimensions, or TypeError / ValueError."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {x.dtype}")
    if x.dim() != dims:
        raise ValueError(f"{name}: expected {dims} dimensions, got shape {list(x.shape)}")


def mma_route(mma, route, key_dtype: torch.dtype = torch.float8_e4m3fn) -> str:
    """The scorer's MMA route (DESIGN §4.1): one of ``MMA_ROUTES``; "e4m3" only where
    ``route`` (``fast.route.Route``) runs Hopper's E4M3 MMA and the keys are E4M3 values
    (NVFP4 pages, or ``key_dtype`` float8_e4m3fn). ValueError naming ``mma`` otherwise."""
    if not isinstance(mma, str) or mma not in MMA_ROUTES:
        raise ValueError(f"mma: must be one of {MMA_ROUTES}, got {mma!r}")
    if mma == "e4m3" and not route.e4m3_mma:
        raise ValueError(
            f"mma: 'e4m3' runs Hopper's E4M3 MMA, which the {route.name} route on {route.device} does not "
            "(an sm_90 GPU on the hopper route; the reference computes the same scores anywhere)"
        )
    if mma == "e4m3" and key_dtype != torch.float8_e4m3fn:
        raise ValueError(f"mma: 'e4m3' scores E4M3 keys, not {key_dtype}")
    return mma


def device_tensor(name: str, x, dtype: torch.dtype, dims: int, device: torch.device) -> None:
    """``check_tensor``, contiguous and on ``device``."""
    check_tensor(name, x, dtype, dims)
    if x.device != device:
        raise ValueError(f"{name}: expected device {device}, got {x.device}")
    if not x.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (strides {x.stride()})")


def cache_aligned(name: str, x: torch.Tensor) -> None:
    """A key cache whose first byte is 16-byte aligned: the GPU scorers copy its pages or
    half-blocks by bulk copies, which take 16-byte aligned addresses only (a view that
    starts mid-row passes every other check). ValueError otherwise."""
    if x.data_ptr() % 16:
        raise ValueError(f"{name}: its first byte must be 16-byte aligned (data_ptr() % 16 = {x.data_ptr() % 16})")


def query_sets(q_tile, q_sel, q_set_stride, q_sets, device: torch.device, unit: str) -> int:
    """A scorer's choice of query tile set. ``q_set_stride``: an int >= 0, a multiple of 16
    ``unit`` (the Gluon scorers read a query row in 16-byte pieces from every set). ``q_sel``
    None (the tile itself; ``q_sets`` None too), or int64 [n] on ``device`` picking set
    ``q_sel[0]`` of ``q_sets`` >= 1 sets, each ``q_set_stride`` elements of ``q_tile`` past
    the last, all inside q_tile's storage (the kernels bound ``q_sel[0]`` by ``q_sets`` on
    the device). Returns the kernels' SETS: 0 without q_sel, else q_sets. TypeError /
    ValueError otherwise."""
    check_int("q_set_stride", q_set_stride, low=0)
    if q_set_stride % 16:
        raise ValueError(f"q_set_stride: must be a multiple of 16 {unit}, got {q_set_stride}")
    if q_sel is None:
        if q_sets is not None:
            raise ValueError(f"q_sets: counts the tile sets q_sel picks among; without q_sel, None (got {q_sets!r})")
        return 0
    device_tensor("q_sel", q_sel, torch.int64, 1, device)
    if q_sel.shape[0] < 1:
        raise ValueError("q_sel: must hold the set's index (an empty tensor)")
    if q_sets is None:
        raise ValueError("q_sets: needed with q_sel (how many tile sets q_sel[0] picks among)")
    check_int("q_sets", q_sets, low=1)
    room = q_tile.untyped_storage().nbytes() // q_tile.element_size() - q_tile.storage_offset() - q_tile.numel()
    if (q_sets - 1) * q_set_stride > room:
        raise ValueError(
            f"q_sets: {q_sets} tile sets {q_set_stride} {unit} apart reach past q_tile's storage"
            f" ({room} {unit} past the first set)"
        )
    return q_sets


def plan_inputs(block_table, seq_lens, max_reqs: int, device: torch.device) -> int:
    """block_table int32 [B, P_table >= 1], seq_lens int32 [B], B <= max_reqs. Returns B."""
    device_tensor("block_table", block_table, torch.int32, 2, device)
    device_tensor("seq_lens", seq_lens, torch.int32, 1, device)
    batch = seq_lens.shape[0]
    if block_table.shape[0] != batch:
        raise ValueError(
            f"block_table: expected {batch} rows (one per request in seq_lens), got {block_table.shape[0]}"
        )
    if block_table.shape[1] < 1:
        raise ValueError("block_table: must have at least one column")
    if batch > max_reqs:
        raise ValueError(f"seq_lens: {batch} requests, more than the {max_reqs} this state was built for")
    return batch


def table_not_wider(width: int, planned: int) -> None:
    """ValueError unless a plan's compact width ``width`` fits the ``planned`` width that
    the state's first plan fixed (its buffers and select shape are that wide)."""
    if width > planned:
        raise ValueError(f"block_table: {width} pages is wider than the {planned} fixed by the first plan")


def forward_inputs(
    index_q,
    k_cache,
    out,
    query_len,
    batch: int,
    heads: int,
    device: torch.device,
    *,
    q_dtype: torch.dtype = torch.float8_e4m3fn,
    k_dtype: torch.dtype = torch.uint8,
    k_row: int = ROW_BYTES,
) -> None:
    """index_q ``q_dtype`` [B * q, heads, 128], k_cache ``k_dtype`` [N, 128, k_row], out int32
    [B * q, heads, 16]. The defaults are the NVFP4 format's (e4m3 queries, 72-byte key rows);
    the MSA format passes its dtype twice and 128 elements a row."""
    check_int("query_len", query_len, low=1, high=MAX_QUERY_LEN)
    rows = batch * query_len
    device_tensor("index_q", index_q, q_dtype, 3, device)
    if tuple(index_q.shape) != (rows, heads, HEAD_DIM):
        raise ValueError(
            f"index_q: expected [{rows}, {heads}, {HEAD_DIM}] (planned requests x query_len), got {list(index_q.shape)}"
        )
    device_tensor("k_cache", k_cache, k_dtype, 3, device)
    if tuple(k_cache.shape[1:]) != (PAGE, k_row) or k_cache.shape[0] < 1:
        raise ValueError(f"k_cache: expected [N >= 1, {PAGE}, {k_row}], got {list(k_cache.shape)}")
    device_tensor("out", out, torch.int32, 3, device)
    if tuple(out.shape) != (rows, heads, TOPK):
        raise ValueError(f"out: expected [{rows}, {heads}, {TOPK}], got {list(out.shape)}")


def forced_windows(init_blocks, local_blocks) -> None:
    """The MSA forced windows: ints >= 0 whose sum is at most 16."""
    check_int("init_blocks", init_blocks, low=0, high=TOPK)
    check_int("local_blocks", local_blocks, low=0, high=TOPK)
    if init_blocks + local_blocks > TOPK:
        raise ValueError(
            f"local_blocks: init_blocks + local_blocks must be <= {TOPK}, got {init_blocks} + {local_blocks}"
        )


def score_shapes(q_tile, block_table, out) -> tuple[int, int, int]:
    """The scorer's operands: q_tile ``[B, 8, Hs, 128]`` (E4M3 or its bytes), block_table
    int32 ``[B, W]``, out float32 ``[B, 8 * Hs, W]`` with contiguous columns. Returns
    (B, Hs, W)."""
    if not isinstance(q_tile, torch.Tensor) or q_tile.dim() != 4:
        raise ValueError(
            f"q_tile: expected a tensor [B, {SLOTS}, Hs, {HEAD_DIM}], got {getattr(q_tile, 'shape', q_tile)!r}"
        )
    batch, slots, hs, dim = q_tile.shape
    if slots != SLOTS or dim != HEAD_DIM:
        raise ValueError(f"q_tile: expected [B, {SLOTS}, Hs, {HEAD_DIM}], got {list(q_tile.shape)}")
    check_tensor("block_table", block_table, torch.int32, 2)
    if block_table.shape[0] != batch:  # a row per request: more would be ignored, fewer read past the table
        raise ValueError(f"block_table: expected {batch} rows (one per request of q_tile), got {block_table.shape[0]}")
    width = block_table.shape[1]
    check_tensor("out", out, torch.float32, 3)
    if tuple(out.shape) != (batch, SLOTS * hs, width):
        raise ValueError(f"out: expected float32 [{batch}, {SLOTS * hs}, {width}], got {list(out.shape)}")
    if out.stride(2) != 1:
        raise ValueError(f"out: columns must be contiguous (strides {out.stride()})")
    return batch, hs, width


def error_record(error, device: torch.device) -> None:
    """An error record: int32 [5] (``fast.kernels.guards.ERR_WORDS``) on the operands' device."""
    device_tensor("error", error, torch.int32, 1, device)
    if error.shape[0] != 5:
        raise ValueError(f"error: expected 5 words (an error record), got {error.shape[0]}")


def scorer_operands(k_cache, lens, batch: int, device: torch.device) -> None:
    """The scorer's cache uint8 [N >= 1, 128, 72] (16-byte aligned) and lengths int32 [B],
    contiguous on ``device``."""
    device_tensor("k_cache", k_cache, torch.uint8, 3, device)
    if tuple(k_cache.shape[1:]) != (PAGE, ROW_BYTES) or k_cache.shape[0] < 1:
        raise ValueError(f"k_cache: expected [N >= 1, {PAGE}, {ROW_BYTES}], got {list(k_cache.shape)}")
    cache_aligned("k_cache", k_cache)
    device_tensor("lens", lens, torch.int32, 1, device)
    if lens.shape[0] != batch:
        raise ValueError(f"lens: expected {batch} lengths (one per request of q_tile), got {lens.shape[0]}")


def state_operands(layer, plan, layer_type: type, plan_type: type, plans: dict) -> None:
    """forward's layer and plan: of this decode's kinds, and the plan one this state made
    (its latest for that batch size: a plan's buffers are the state's)."""
    if not isinstance(layer, layer_type):
        raise TypeError(f"layer: expected a {layer_type.__name__} from new_layer(), got {type(layer).__name__}")
    if not isinstance(plan, plan_type):
        raise TypeError(f"plan: expected a {plan_type.__name__} from plan(), got {type(plan).__name__}")
    if plans.get(plan.batch) is not plan:
        raise ValueError("plan: not made by this state's plan()")


def spin_timeout(seconds) -> float:
    """A spin's bound in seconds: a number in (0, 3600]."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 3600:
        raise ValueError(f"spin_timeout_s: seconds in (0, 3600], got {seconds!r}")
    return float(seconds)


def device_arg(device) -> torch.device:
    """A device argument torch understands (a string, index or torch.device)."""
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: not a device ({device!r}: {e})") from None
