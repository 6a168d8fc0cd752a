"""``make demo``: the main job on an embedded synthetic workload (MiniMax-M3 shapes: 4 index
heads, mixed lengths, query_len 1 and 4), CP and stock through ``fast`` on the ranks this
machine has, each checked against the reference."""

from __future__ import annotations

import sys

import torch

import reference
from reference import msa
from reference.cases import make_case, seq_len_for

from ..backend import gpu_count, p2p_gpus
from .launcher import RankPool
from .programs import assemble, decode_on_rank

HEADS = 4
# History pages per request: short rows, the 16-page switch, and long rows. The interpreter
# runs ~1K pages a second, so CPU runs stay small; GPUs take up to 1M tokens.
CPU_PAGES = (3, 17, 60, 130)
GPU_PAGES = (3, 17, 1000, 8192)
# The MSA oracle scores in float64 on the host: GPU runs stop at 2000 blocks (256K tokens).
MSA_GPU_PAGES = (3, 17, 300, 2000)
MSA_WINDOWS = (1, 2)  # init_blocks, local_blocks


def _check_paths(pool: RankPool, case, want: dict, steps: int, backend: str, lead: str, file) -> bool:
    """The stock and CP decodes of ``case`` on ``pool``'s ranks, ``steps`` back to back (after
    one untimed step on GPUs, where the kernels compile; none under the interpreter, which
    compiles nothing and runs a step in seconds), each against ``want[path]`` (int32 [rows,
    heads, 16]); a printed row each, ``lead`` its first columns. True if both agree."""
    ok = True
    warmup = 1 if backend == "cuda" else 0
    for path in ("stock", "cp"):
        results = pool.run(decode_on_rank, case.to_dict(), path, steps=steps, warmup=warmup, pdl=backend == "cuda")
        agree = torch.equal(assemble(results, HEADS), want[path])
        ok &= agree
        step = max(r["seconds"] for r in results) * 1e3
        print(f"{lead} {path:>5} {case.index_q.shape[0]:>5} {'yes' if agree else 'NO':>6} {step:>9.1f}", file=file)
    return ok


def demo_plan(backend: str) -> list[int]:
    """CP sizes to run: the GPUs that have P2P between them (one CP group; 1 on a single GPU,
    where production falls back to stock but the CP path still runs for the check), or 2 and
    4 simulated CPU ranks."""
    if backend == "cuda":
        return [max(1, p2p_gpus())]
    return [2, 4]


def run_demo(backend: str = "auto", file=None) -> bool:
    """``make demo``: the NVFP4 stock and CP decodes at each CP size ``demo_plan`` gives
    the backend, q 1 and 4, on exact-arithmetic keys, then the MSA format's
    (``run_msa_demo``), each against the reference, with step times; "auto"
    picks the GPU where one exists. True if all agree."""
    file = file or sys.stdout
    if backend == "auto":
        backend = "cuda" if gpu_count() else "cpu"
    pages = GPU_PAGES if backend == "cuda" else CPU_PAGES
    ok = True
    print(
        f"backend {backend}; {HEADS} index heads; requests with {list(pages)} pages of history; exact-arithmetic keys",
        file=file,
    )
    print(f"{'cp':>3} {'q':>2} {'path':>5} {'rows':>5} {'agree':>6} {'step ms':>9}", file=file)
    for cp in demo_plan(backend):
        with RankPool(cp, backend) as pool:
            for q in (1, 4):
                case = make_case(
                    cp * 10 + q, [seq_len_for(p, 3) for p in pages], query_len=q, heads=HEADS, pattern="exact"
                )
                oracle = {"cp": reference.full_decode(*case.args()), "stock": reference.stock_decode(*case.args())}
                ok &= _check_paths(pool, case, oracle, 2, backend, f"{cp:>3} {q:>2}", file)
    ok &= run_msa_demo(backend, file)
    print("fast CP and stock agree with the reference" if ok else "MISMATCH against the reference", file=file)
    return ok


def run_msa_demo(backend: str, file) -> bool:
    """The BF16 / FP8 format (docs/DESIGN.md §10): its stock and CP decodes on the first CP
    size of ``demo_plan`` against the reference's oracle, on the ``late`` exact-arithmetic
    keys (the token mask decides scores)."""
    pages = MSA_GPU_PAGES if backend == "cuda" else CPU_PAGES
    init, local = MSA_WINDOWS
    cp = demo_plan(backend)[0]
    print(
        f"\nBF16 / FP8 keys under the MSA rules: forced windows {init} + {local} blocks (example values), requests "
        f"with {list(pages)} blocks, CP = {cp}",
        file=file,
    )
    print(f"{'format':>6} {'q':>2} {'path':>5} {'rows':>5} {'agree':>6} {'step ms':>9}", file=file)
    ok = True
    with RankPool(cp, backend) as pool:
        for fmt in ("fp8", "bf16"):
            for q in (1, 4):
                case = msa.make_case(
                    q,
                    [seq_len_for(p, 3) for p in pages],
                    dtype=fmt,
                    query_len=q,
                    heads=HEADS,
                    pattern="late",
                    init_blocks=init,
                    local_blocks=local,
                )
                want = msa.full_decode(*case.args(), **case.windows())  # one oracle: both paths equal it
                ok &= _check_paths(pool, case, {"stock": want, "cp": want}, 1, backend, f"{fmt:>6} {q:>2}", file)
    return ok
