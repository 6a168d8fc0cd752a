"""The mutation campaign's planted bugs (``fuzz.campaign`` runs them): each one a plausible
slip in one file, the fast tests of its subject (sharpest first) and the fuzz target that
runs after them; the bugs CI rotates through; and the changes that survive because they
cannot alter any output, each with its reason. How to add one: docs/CAMPAIGN.md.

A bug's snippet must occur exactly once in its file: a patch that no longer applies (the
code moved or changed) is an error, never a silent pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from .mutants import MUTANTS

# The fast tiers by subject: the single-process test files that hold each part to the
# reference (pytest stops at the first failure), and the multi-rank tests the protocol needs.
REFERENCE_TESTS = (
    "tests/test_reference_selection.py",
    "tests/test_reference_scores.py",
    "tests/test_reference_cp.py",
    "tests/test_nvfp4_format.py",
)
# (quick, sharp files first: pytest stops at the first failure, and the budget is per bug)
CP_TESTS = ("tests/test_guards.py", "tests/test_cp_one_rank.py")
# The multi-rank tests the protocol's bugs need, a pytest run of their own (their -m and -k
# would deselect the single-process files of the same run): two replicas a head with a
# lagging rank, a rank skipping an all-short step, lengths past the table on every rank.
RANK_TESTS = ("-m multirank tests/test_protocol_ranks.py -k 'cp2-h1 or waits_for_nobody or table_edge'",)
# The BF16 / FP8 format's fast parts: the scorer, then the stock decode (guards, select).
MSA_TESTS = ("tests/test_msa_scorer.py", "tests/test_msa_stock.py")
# Its CP path in one process (plan, protocol at CP = 1), then across CPU ranks.
MSA_CP_TESTS = ("tests/test_msa_cp_one_rank.py",)
MSA_RANK_TESTS = ("-m multirank tests/test_msa_protocol_ranks.py -k 'windows_at_the_edges and cp2'",)
MISSING_PEER = ("-m multirank tests/test_protocol_ranks.py -k missing_peer",)
FLAGGED = ("-m multirank tests/test_protocol_ranks.py -k waits_for_nothing_again",)


@dataclass(frozen=True)
class Bug:
    """One planted bug: ``old`` -> ``new`` in ``file``; ``tests`` the fast tiers that must
    kill it, each entry one pytest run (test files; an entry with a space is a whole
    command line, split as a shell would); ``target`` the fuzz campaign run after them."""

    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    target: str
    gpu: bool = False  # in code only GPUs run (Gluon kernels, PDL, bulk copies): a CPU run skips it


def _from_mutant(m) -> Bug:
    """The fuzz teeth test's mutants (``fuzz.mutants``), as campaign bugs."""
    if m.module.startswith("reference"):
        tests = REFERENCE_TESTS
    elif m.name.startswith("msa"):
        tests = MSA_CP_TESTS + MSA_TESTS
    else:
        tests = CP_TESTS
    if m.gpu_only:  # the GPU tiers of its subject
        tests = GPU_MSA_TESTS if m.name.startswith("msa") else GPU_NVFP4_TESTS
    return Bug(m.name, m.module.replace(".", "/") + ".py", m.old, m.new, tests, m.target, gpu=m.gpu_only)


# The GPU tiers the GPU-only bugs need (a CPU run lists those bugs and runs none).
GPU_NVFP4_TESTS = ("tests/test_gpu_scorer.py", "tests/test_scorer.py", "tests/test_gpu_graphs.py")
GPU_MSA_TESTS = ("tests/test_msa_scorer.py", "tests/test_msa_stock.py", "tests/test_gpu_graphs.py")

BUGS = [_from_mutant(m) for m in MUTANTS] + [
    # The reference: formats, scores, both keys, the CP simulation, its checks.
    Bug(
        "E2M1 magnitudes in the wrong sign half",
        "reference/nvfp4.py",
        "    return torch.cat([mags, -mags])\n",
        "    return torch.cat([-mags, mags])\n",
        ("tests/test_nvfp4_format.py",) + REFERENCE_TESTS,
        "reference",
    ),
    Bug(
        "quantizer rounds 0.75 down",
        "reference/nvfp4.py",
        "(a >= 0.75)",
        "(a > 0.75)",
        ("tests/test_nvfp4_format.py",) + REFERENCE_TESTS,
        "reference",
    ),
    Bug(
        "reference scorer stores its own page",
        "reference/scores.py",
        "            keep = torch.arange(start, stop)[None, :] < own[b][:, None]\n",
        "            keep = torch.arange(start, stop)[None, :] <= own[b][:, None]\n",
        REFERENCE_TESTS,
        "reference",
    ),
    Bug(
        "reference scores one page fewer",
        "reference/rules.py",
        "    return ((lens.to(_I64) - 1) // PAGE).clamp(0, width)\n",
        "    return ((lens.to(_I64) - 1) // PAGE - 1).clamp(0, width)\n",
        REFERENCE_TESTS,
        "reference",
    ),
    Bug(
        "-0.0 ranks below every negative score",
        "reference/selection.py",
        "    return torch.where(negative, bits ^ 0xFFFFFFFF, bits ^ 0x80000000)\n",
        "    return torch.where(negative & (bits != 0x80000000), bits ^ 0xFFFFFFFF, bits ^ 0x80000000)\n",
        REFERENCE_TESTS,
        "reference",
    ),
    Bug(
        "exact key breaks ties by the higher page",
        "reference/selection.py",
        "    key = KEY_VALID_BIT | (ordered_bits(scores) << 16) | (PAGE_MASK - pages.to(_I64))\n",
        "    key = KEY_VALID_BIT | (ordered_bits(scores) << 16) | pages.to(_I64)\n",
        REFERENCE_TESTS,
        "reference",
    ),
    Bug(
        "stock key's bias 0.5",
        "reference/selection.py",
        "    bias = fmaf(-lo, scale, torch.tensor(1.5))\n",
        "    bias = fmaf(-lo, scale, torch.tensor(0.5))\n",
        REFERENCE_TESTS,
        "stock",
    ),
    Bug(
        "stock range over every column",
        "reference/selection.py",
        "    hi = torch.where(valid, scores, -torch.inf).amax(dim=-1, keepdim=True)\n"
        "    lo = torch.where(valid, scores, torch.inf).amin(dim=-1, keepdim=True)\n",
        "    hi = scores.amax(dim=-1, keepdim=True)\n    lo = scores.amin(dim=-1, keepdim=True)\n",
        REFERENCE_TESTS,
        "stock",
    ),
    Bug(
        "short rows stop one page early",
        "reference/rules.py",
        "    return torch.where(k[None, :] <= own[:, None], k[None, :], -1).to(torch.int32)\n",
        "    return torch.where(k[None, :] < own[:, None], k[None, :], -1).to(torch.int32)\n",
        REFERENCE_TESTS,
        "reference",
    ),
    Bug(
        "a request is long from 16 pages",
        "reference/rules.py",
        "    return seq_lens.to(_I64) > TOPK * PAGE\n",
        "    return seq_lens.to(_I64) > (TOPK - 1) * PAGE\n",
        REFERENCE_TESTS,
        "reference",
    ),
    Bug(
        "reference refuses padding",
        "reference/inputs.py",
        "    invalid = (sl < query_len) & (sl != 0)\n",
        "    invalid = sl < query_len\n",
        REFERENCE_TESTS + ("tests/test_guards.py",),
        "reference",
    ),
    Bug(
        "reference checks one column too many",
        "reference/inputs.py",
        "    read = ((sl.to(torch.int64) - 1) // PAGE).clamp(min=0)  # pages before the own one\n",
        "    read = ((sl.to(torch.int64) - 1) // PAGE).clamp(min=0) + 1\n",
        REFERENCE_TESTS + ("tests/test_guards.py",),
        "inputs",
    ),
    Bug(
        "head layout gives every rank the first heads",
        "reference/cp.py",
        "        first = (rank // self.replicas) * self.heads_per_rank\n",
        "        first = (rank % self.replicas) * self.heads_per_rank\n",
        REFERENCE_TESTS,
        "reference",
    ),
    Bug(
        "reference takes NaN query bytes",
        "reference/inputs.py",
        "    if bool(((qb & 0x7F) == 0x7F).any()):\n",
        "    if False:\n",
        ("tests/test_bad_inputs.py",),
        "inputs",
    ),
    # The kernels: compact table, exchange, push, merge, parity, stock select, scorer masks.
    Bug(
        "compact page count loses its bound at W - 1",
        "fast/kernels/cp.py",
        "    n_local = tl.minimum((hist + (CP - 1 - RANK)) // CP, W - 1)\n",
        "    n_local = (hist + (CP - 1 - RANK)) // CP\n",
        CP_TESTS + RANK_TESTS,
        "protocol",
    ),
    Bug(
        "read pages lose their bound at the table",
        "fast/kernels/rules.py",
        "    return tl.where(length >= 1, tl.minimum((length - 1) // _PAGE, width), 0)\n",
        "    return tl.where(length >= 1, (length - 1) // _PAGE, 0)\n",
        ("tests/test_stock_decode.py::test_stock_plan_bounds_stop_at_the_table",) + CP_TESTS + RANK_TESTS,
        "protocol",
    ),
    Bug(
        "the lying length without its 8 slots",
        "fast/kernels/cp.py",
        "n_local * _PAGE + _SLOTS, 0))",
        "n_local * _PAGE, 0))",
        CP_TESTS,
        "kernels",
    ),
    Bug(
        "causal cut one page late in the push",
        "fast/kernels/cp.py",
        "        n_rank = tl.minimum((own + (CP - 1 - RANK)) // CP, n_local)\n",
        "        n_rank = tl.minimum((own + (CP - RANK)) // CP, n_local)\n",
        CP_TESTS + RANK_TESTS,
        "protocol",
    ),
    Bug(
        "merge leaves the parity",
        "fast/kernels/cp.py",
        "        tl.store(parity_ptr, 1 - current)\n",
        "        tl.store(parity_ptr, current)\n",
        ("tests/test_cp_one_rank.py -k after_a_timeout", "tests/test_cp_one_rank.py") + RANK_TESTS,
        "protocol",
    ),
    Bug(
        "merge does not reset the candidates",
        "fast/kernels/cp.py",
        "        tl.store(recv + off, tl.full([HR, CP * _TOPK], -1, tl.int64))\n",
        "",
        CP_TESTS + RANK_TESTS,
        "kernels",
    ),
    Bug(
        "short CP rows stop one page early",
        "fast/kernels/cp.py",
        "tl.where(failed, -1, short_row(k, own))",
        "tl.where(failed | (k == own), -1, short_row(k, own))",
        ("tests/test_cp_one_rank.py -k short_long",) + CP_TESTS,
        "kernels",
    ),
    Bug(
        "push ignores the guard's verdict",
        "fast/kernels/cp.py",
        "    if ~is_short_row(own) & (verdict == 0):\n",
        "    if ~is_short_row(own):\n",
        CP_TESTS,
        "inputs",
    ),
    Bug(
        "exchange does not wait",
        "fast/kernels/cp.py",
        "        while pending & (clock_ns(WALL) < deadline):\n"
        "            pending = has_unwritten(tl.load(local, volatile=True), HALVES)\n",
        "        pending = False\n",
        RANK_TESTS,
        "protocol",
    ),
    Bug(
        "stock range stands in 0 for unranked columns",
        "fast/kernels/stock.py",
        "        ranked = tl.where(j < n, row, first)\n",
        "        ranked = tl.where(j < n, row, 0.0)\n",
        ("tests/test_stock_decode.py -k by_hand", "tests/test_stock_decode.py"),
        "kernels",
    ),
    Bug(
        "stock short rows from 16 pages",
        "fast/kernels/stock.py",
        "    elif is_short_row(own):\n",
        "    elif is_short_row(own - 1):\n",
        ("tests/test_stock_decode.py -k short_long", "tests/test_stock_decode.py", "tests/test_guards.py"),
        "kernels",
    ),
    Bug(
        "table scorer stores its own page",
        "fast/kernels/scorer_table.py",
        "(j[:, None] < own[None, :])",
        "(j[:, None] <= own[None, :])",
        ("tests/test_scorer.py",),
        "kernels",
    ),
    Bug(
        "table scorer loads a bad id",
        "fast/kernels/scorer_table.py",
        "        live = live & ~bad\n",
        "",
        ("tests/test_guards.py",),
        "inputs",
    ),
    Bug(
        "exchange replicas store the same words",
        "fast/kernels/cp.py",
        "    w = (RANK % R) * (WORDS // R) + tl.arange(0, WORDS // R)  # this replica's words\n",
        "    w = (RANK // R) * (WORDS // R) + tl.arange(0, WORDS // R)  # this replica's words\n",
        RANK_TESTS,
        "protocol",
    ),
    Bug(
        "an exchange that gave up waits again",
        "fast/kernels/cp.py",
        "        deadline = tl.where(worst != 0, 0, deadline_ns(timeout_ns, WALL))\n",
        "        deadline = deadline_ns(timeout_ns, WALL)\n",
        FLAGGED,
        "protocol",
    ),
    Bug(
        "a merge that gave up waits again",
        "fast/kernels/cp.py",
        "        deadline = tl.where(failed, 0, deadline_ns(timeout_ns, WALL))\n",
        "        deadline = deadline_ns(timeout_ns, WALL)\n",
        FLAGGED,
        "protocol",
    ),
    Bug(
        "merge gives up silently",
        "fast/kernels/cp.py",
        "        if pending & (worst == 0):  # the first spin to give up names itself (as the exchange's)\n"
        "            tl.store(err_ptr, _ERR_MERGE)\n",
        "",
        MISSING_PEER,
        "protocol",
    ),
    Bug(
        "split slices keep their own column numbers",
        "fast/select/levels.py",
        "        mine = tl.where(mine > 0, mine - first * CP, 0).to(mine.dtype)\n",
        "",
        ("tests/test_stock_decode.py -k longer_than_a_chunk",) + CP_TESTS,
        "stock",
    ),
    Bug(
        "no split slice is the last",
        "fast/select/levels.py",
        '    return tl.atomic_add(count_ptr, 1, sem="acq_rel") == SPLIT - 1\n',
        '    return tl.atomic_add(count_ptr, 1, sem="acq_rel") == SPLIT\n',
        ("tests/test_stock_decode.py",),
        "stock",
    ),
    Bug(
        "split merge leaves its count",
        "fast/select/levels.py",
        "    tl.store(count_ptr, 0)\n    return best\n",
        "    return best\n",
        ("tests/test_stock_decode.py -k rearms", "tests/test_cp_one_rank.py"),
        "stock",
    ),
    Bug(
        "stock range maps onto 65535 steps",
        "fast/kernels/stock.py",
        "tl.math.div_rn(65534.0,",
        "tl.math.div_rn(65535.0,",
        ("tests/test_stock_decode.py -k by_hand", "tests/test_stock_decode.py"),
        "stock",
    ),
    Bug(
        "table scorer swaps the code nibbles",
        "fast/kernels/scorer_table.py",
        "            k = tl.reshape(tl.join(lo, hi), [V, 64, 128])",
        "            k = tl.reshape(tl.join(hi, lo), [V, 64, 128])",
        ("tests/test_scorer.py",),
        "kernels",
    ),
    Bug(
        "table scorer takes the next group's scale",
        "fast/kernels/scorer_table.py",
        "            group = _CODE_BYTES + t[:, None] * 8 + i[None, :] // 8\n",
        "            group = _CODE_BYTES + t[:, None] * 8 + (i[None, :] // 8 + 1) % 8\n",
        ("tests/test_scorer.py",),
        "kernels",
    ),
    # The guards and the error record.
    Bug(
        "guard passes ids past the cache",
        "fast/kernels/guards.py",
        "    bad_block = low_bad | (hi >= num_blocks)\n",
        "    bad_block = low_bad | (hi > num_blocks)\n",
        ("tests/test_guards.py",),
        "inputs",
    ),
    Bug(
        "guard takes length 1 for padding",
        "fast/kernels/guards.py",
        "    bad_len = (seq < 0) | ((seq > 0) & (seq < QLEN))\n",
        "    bad_len = (seq < 0) | ((seq > 1) & (seq < QLEN))\n",
        ("tests/test_guards.py",),
        "inputs",
    ),
    Bug(
        "id bounds name the smallest id's column for the largest",
        "fast/kernels/guards.py",
        "    tl.store(bounds_row + 3, tl.where(none, -1, hi_col))\n",
        "    tl.store(bounds_row + 3, tl.where(none, -1, lo_col))\n",
        ("tests/test_cp_one_rank.py", "tests/test_guards.py"),
        "inputs",
    ),
    Bug(
        "check() calls a bad length a bad id",
        "fast/errors.py",
        "    if code == BAD_BLOCK:\n",
        "    if code in (BAD_BLOCK, BAD_LENGTH):\n",
        ("tests/test_guards.py",),
        "inputs",
    ),
    Bug(
        "a later bad input overwrites the first one's details",
        "fast/kernels/guards.py",
        "        if old == 0:\n",
        "        if old >= 0:\n",
        ("tests/test_guards.py",),
        "inputs",
    ),
    Bug(
        "reset leaves the candidates",
        "fast/cp.py",
        "                layer.recv.local.fill_(-1)\n",
        "",
        MISSING_PEER,
        "protocol",
    ),
    # The host checks.
    Bug(
        "forward takes any query_len",
        "fast/checks.py",
        '    check_int("query_len", query_len, low=1, high=MAX_QUERY_LEN)\n    rows = batch * query_len\n',
        "    rows = batch * query_len\n",
        ("tests/test_bad_inputs.py",),
        "inputs",
    ),
    Bug(
        "plan takes a strided table",
        "fast/checks.py",
        "    if not x.is_contiguous():\n",
        "    if False:\n",
        ("tests/test_bad_inputs.py",),
        "inputs",
    ),
    Bug(
        "plan takes a wider table",
        "fast/checks.py",
        "    if width > planned:\n",
        "    if False:\n",
        ("tests/test_bad_inputs.py",),
        "inputs",
    ),
    Bug(
        "forward takes an out of any shape",
        "fast/checks.py",
        "    if tuple(out.shape) != (rows, heads, TOPK):\n",
        "    if False:\n",
        ("tests/test_bad_inputs.py",),
        "inputs",
    ),
    Bug(
        "spin bound takes 0 seconds",
        "fast/checks.py",
        "not 0 < seconds <= 3600:",
        "not 0 <= seconds <= 3600:",
        ("tests/test_bad_inputs.py",),
        "inputs",
    ),
    # The BF16 / FP8 format (docs/DESIGN.md §10): its scorer, its guards and its select.
    Bug(
        "msa scorer skips the query's own block",
        "fast/msa/kernels/rules.py",
        "    return tl.minimum((tl.maximum(length, 0) + _PAGE - 1) // _PAGE, width)\n",
        "    return tl.minimum(tl.maximum(length, 0) // _PAGE, width)\n",
        MSA_TESTS,
        "msa-kernels",
    ),
    Bug(
        "msa scorer scores unwritten query rows",
        "fast/msa/kernels/scorer_dot.py",
        '            score = tl.where(ok & ~unwritten, score, float("nan"))\n',
        '            score = tl.where(ok, score, float("nan"))\n',
        MSA_TESTS,
        "msa-kernels",
    ),
    Bug(
        "msa guards judge the ids before the own block only",
        "fast/msa/kernels/rules.py",
        "    return tl.minimum((tl.maximum(length, 0) + _PAGE - 1) // _PAGE, width)\n",
        "    return tl.minimum((tl.maximum(length, 1) - 1) // _PAGE, width)\n",
        MSA_TESTS,
        "msa-kernels",
    ),
    Bug(
        "msa select keeps one candidate too many",
        "fast/msa/kernels/stock.py",
        "    m = _TOPK - init - local\n",
        "    m = _TOPK - init - local + 1\n",
        MSA_TESTS,
        "msa-kernels",
    ),
    Bug(
        "msa select takes every column tied at its threshold",
        "fast/msa/kernels/ascending.py",
        "    chosen = (above > 0) | ((tied > 0) & (tied_before < room))\n",
        "    chosen = (above > 0) | (tied > 0)\n",
        ("tests/test_select_ascending.py", *MSA_TESTS),
        "msa-kernels",
    ),
    Bug(
        "msa reference forced init window one block long",
        "reference/msa/selection.py",
        "    return (blocks < n) & ((blocks < init_blocks) | (blocks >= n - local_blocks))\n",
        "    return (blocks < n) & ((blocks <= init_blocks) | (blocks >= n - local_blocks))\n",
        ("tests/test_msa_reference.py",),
        "msa-reference",
    ),
    # Its CP path: the plan and the push (the exchange's flag and the merge are fuzz/mutants.py's).
    Bug(
        "msa plan counts the rank's read columns one short",
        "fast/msa/kernels/cp.py",
        "    tl.store(n_local_ptr + b, _columns_below(reads, CP, RANK))\n",
        "    tl.store(n_local_ptr + b, _columns_below(tl.maximum(reads - 1, 0), CP, RANK))\n",
        MSA_CP_TESTS + MSA_RANK_TESTS,
        "msa-protocol",
    ),
    Bug(
        "msa push ranks the rank's columns as if it were rank 0",
        "fast/msa/kernels/cp.py",
        "    lo = _columns_below(init, CP, RANK)\n    hi = tl.minimum(_columns_below(n - local, CP, RANK), n_local)\n",
        "    lo = _columns_below(init, CP, 0)\n    hi = tl.minimum(_columns_below(n - local, CP, 0), n_local)\n",
        MSA_RANK_TESTS,
        "msa-protocol",
    ),
    # Arguments that must agree with each other (a table row per request, and the like):
    # each alone is valid, only one check compares them (tests/test_argument_pairs.py).
    Bug(
        "scorer takes a block table with more rows than requests",
        "fast/checks.py",
        "    if block_table.shape[0] != batch:  # a row per request",
        "    if block_table.shape[0] < batch:  # a row per request",
        ("tests/test_argument_pairs.py",),
        "inputs",
    ),
    Bug(
        "plan takes a block table with more rows than requests",
        "fast/checks.py",
        "    if block_table.shape[0] != batch:\n        raise ValueError(\n",
        "    if block_table.shape[0] < batch:\n        raise ValueError(\n",
        ("tests/test_argument_pairs.py",),
        "inputs",
    ),
    Bug(
        "reference scorer takes a block table of another batch",
        "reference/scores.py",
        "    if block_table.shape[0] != batch:\n",
        "    if block_table.shape[0] < 0:\n",
        ("tests/test_argument_pairs.py",),
        "reference",
    ),
    # The scorers' own guards at the id bounds' edges, called directly (public API): no
    # decode's verdict masks a bad id first (tests/test_guards.py's edge test).
    Bug(
        "table scorer loads the id N",
        "fast/kernels/scorer_table.py",
        "        bad = live & ((page < 0) | (page >= num_blocks))\n",
        "        bad = live & ((page < 0) | (page > num_blocks))\n",
        ("tests/test_guards.py -k edges",),
        "kernels",
    ),
    Bug(
        "msa dot scorer takes id -1 for a block",
        "fast/msa/kernels/scorer_dot.py",
        "            ok = col & (block >= 0) & (block < num_blocks)\n",
        "            ok = col & (block >= -1) & (block < num_blocks)\n",
        ("tests/test_guards.py -k edges",),
        "msa-kernels",
    ),
    Bug(
        "table scorer records the id where the column goes",
        "fast/kernels/scorer_table.py",
        "            record_input(err_ptr, tl.where(column < 2**31 - 1, _BAD_BLOCK, 0), b, column, value)\n",
        "            record_input(err_ptr, tl.where(column < 2**31 - 1, _BAD_BLOCK, 0), b, value, column)\n",
        ("tests/test_guards.py -k edges",),
        "inputs",
    ),
    # Code only GPUs run: the wgmma scorer and the PDL order (compiled out under the
    # interpreter). Listed on every machine; run where a GPU is (docs/CAMPAIGN.md).
    Bug(
        "wgmma scorer stores its own page",
        "fast/kernels/scorer_wgmma.py",
        "(j[:, None] < own[None, :])",
        "(j[:, None] <= own[None, :])",
        GPU_NVFP4_TESTS,
        "kernels",
        gpu=True,
    ),
    Bug(
        "q exchange reads index_q before its producer is done",
        "fast/kernels/cp.py",
        "    pdl_wait(PDL)  # for index_q's producer\n",
        "",
        ("tests/test_gpu_graphs.py", "tests/test_cp_one_rank.py"),
        "protocol",
        gpu=True,
    ),
    Bug(
        "merge re-arms a short row's tile before the scorer is done",
        "fast/kernels/cp.py",
        "            pdl_wait(PDL)  # no push for this row: make sure the scorer is done before re-arming\n",
        "            pass\n",
        ("tests/test_gpu_graphs.py", "tests/test_cp_one_rank.py"),
        "protocol",
        gpu=True,
    ),
    # The error record's fields, per entry point that records (both formats).
    Bug(
        "msa stock select records the row for the request",
        "fast/msa/kernels/stock.py",
        "                record_input(err_ptr, verdict, b, column, value)\n",
        "                record_input(err_ptr, verdict, t, column, value)\n",
        ("tests/test_guards.py -k msa_decodes", *MSA_TESTS),
        "inputs",
    ),
    Bug(
        "merge records the row for the request",
        "fast/kernels/cp.py",
        "            record_input(err_ptr, verdict, b, column, value)\n",
        "            record_input(err_ptr, verdict, t, column, value)\n",
        CP_TESTS,
        "inputs",
    ),
    # State reset() must restore, piece by piece (tests/test_reset.py).
    Bug(
        "reset leaves the layers' parity",
        "fast/cp.py",
        "                layer.parity.zero_()\n",
        "",
        ("tests/test_reset.py",),
        "protocol",
    ),
    Bug(
        "reset leaves the exchange's copy of the parity",
        "fast/cp.py",
        "                layer.current.zero_()\n",
        "",
        ("tests/test_reset.py",),
        "protocol",
    ),
    Bug(
        "reset leaves the push's split counts",
        "fast/cp.py",
        "        self._counts.zero_()\n        self.error.zero_()\n        self.symm.barrier()\n",
        "        self.error.zero_()\n        self.symm.barrier()\n",
        ("tests/test_reset.py",),
        "protocol",
    ),
    Bug(
        "stock reset leaves the split counts",
        "fast/stock.py",
        "        self._counts.zero_()\n        self.error.zero_()\n",
        "        self.error.zero_()\n",
        ("tests/test_reset.py",),
        "stock",
    ),
    Bug(
        "reference decode takes a table with more rows than lengths",
        "reference/inputs.py",
        "    if bt.shape[0] != batch:\n",
        "    if bt.shape[0] < batch:\n",
        ("tests/test_argument_pairs.py",),
        "reference",
    ),
    # Issue 74's classes: a validation at its edge on one path, which spin gave up, the
    # padding of a graph step after a larger one, a multi-step command's exit status, the
    # GPU count of the CLI.
    Bug(
        "fast CLI checks --cp on the cp path only",
        "fast/tools/cli.py",
        "    if args.cp not in SUPPORTED_CP:\n",
        '    if args.path == "cp" and args.cp not in SUPPORTED_CP:\n',
        ("tests/test_boundaries.py",),
        "inputs",
    ),
    Bug(
        "spin bound takes a bool",
        "fast/checks.py",
        "    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 3600:\n",
        "    if not isinstance(seconds, (int, float)) or not 0 < seconds <= 3600:\n",
        ("tests/test_boundaries.py",),
        "inputs",
    ),
    Bug(
        "merge records its timeout as the exchange's",
        "fast/kernels/cp.py",
        "            tl.store(err_ptr, _ERR_MERGE)\n",
        "            tl.store(err_ptr, _ERR_Q)\n",
        CP_TESTS + MISSING_PEER,
        "protocol",
    ),
    Bug(
        "graph padding keeps the earlier step's lengths",
        "fast/graphs.py",
        "        s.seq_lens[b:].zero_()\n",
        "",
        ("tests/test_gpu_graphs.py -k padding",),
        "kernels",
        gpu=True,
    ),
    Bug(
        "fuzz smoke reports the last target's verdict",
        "fuzz/cli.py",
        "        ok &= _report(",
        "        ok = _report(",
        ("tests/test_fuzz.py -k multi_target",),
        "reference",
    ),
    Bug(
        "CLI refuses as many ranks as GPUs",
        "fast/tools/cli.py",
        '    if backend == "cuda" and args.cp > gpu_count():\n',
        '    if backend == "cuda" and args.cp >= gpu_count():\n',
        ("-m multirank tests/test_protocol_ranks.py -k cli_decode_runs",),
        "kernels",
        gpu=True,
    ),
]

# The bugs CI rotates through (``--rotate``): each one was killed by a single-process test
# within 15 s in the last full campaign (docs/CAMPAIGN-RESULTS.md: 52 of its 72), so a day's pair
# costs CI well under a minute.
CI_POOL = (
    "tie order by rank, not page",
    "causal cut one page late",
    "compact width without its extra column",
    "two-level select keeps only the best group",
    "merge does not re-arm the q tile",
    "query slots from the front",
    "own page not forced into slot 15",
    "msa push keys not shifted back to their blocks",
    "msa merge takes one candidate too many",
    "msa rank's candidates start one column early",
    "E2M1 magnitudes in the wrong sign half",
    "quantizer rounds 0.75 down",
    "reference scorer stores its own page",
    "reference scores one page fewer",
    "-0.0 ranks below every negative score",
    "exact key breaks ties by the higher page",
    "stock key's bias 0.5",
    "stock range over every column",
    "short rows stop one page early",
    "a request is long from 16 pages",
    "reference refuses padding",
    "head layout gives every rank the first heads",
    "reference takes NaN query bytes",
    "read pages lose their bound at the table",
    "the lying length without its 8 slots",
    "causal cut one page late in the push",
    "merge leaves the parity",
    "merge does not reset the candidates",
    "short CP rows stop one page early",
    "push ignores the guard's verdict",
    "stock range stands in 0 for unranked columns",
    "stock short rows from 16 pages",
    "table scorer stores its own page",
    "split slices keep their own column numbers",
    "no split slice is the last",
    "split merge leaves its count",
    "stock range maps onto 65535 steps",
    "table scorer swaps the code nibbles",
    "table scorer takes the next group's scale",
    "guard passes ids past the cache",
    "guard takes length 1 for padding",
    "id bounds name the smallest id's column for the largest",
    "check() calls a bad length a bad id",
    "forward takes any query_len",
    "plan takes a strided table",
    "plan takes a wider table",
    "spin bound takes 0 seconds",
    "spin bound takes a bool",
    "msa scorer skips the query's own block",
    "msa scorer scores unwritten query rows",
    "msa select takes every column tied at its threshold",
    "msa reference forced init window one block long",
    "msa plan counts the rank's read columns one short",
)

# Survivors that are not bugs: name -> why the change cannot alter any output.
EQUIVALENT: dict[str, str] = {
    "compact page count loses its bound at W - 1": (
        "hist <= P and W = ceil(P_first / CP) + 1 with P <= P_first (plan refuses a wider table), so"
        " (hist + CP - 1 - r) // CP <= ceil(P / CP) <= W - 1: the cap never binds; it stays as the"
        " compact row's own bound"
    ),
}
