"""``python -m bench.fp8_mma``: what Hopper's E4M3 MMA does to a score — the facts an
E4M3-MMA scorer route's contract (issue 65) would rest on, measured rather than assumed.

The exact route multiplies 16-bit operands into fp32 accumulators (docs/DESIGN.md §4):
E4M3 to fp16 is exact, so is each product, and the MMA sums them in fp32. Hopper's E4M3
MMA takes the bytes as they are and is known not to accumulate in fp32. What a route built
on it must know, per score (one token's 128 products with one query row):

- **agreement**: whether it equals the fp16 route's score, bit for bit;
- **error**: its distance from the exact sum (float64), over the sum of the products'
  magnitudes (the scale any accumulator's rounding is measured on), as a power of two;
- **independence**: whether a score depends on the MMA's N (how many query rows one
  instruction scores: Hs x slots differs between a stock rank and a CP rank), on the
  instruction (``mma.sync`` up to N 8, wgmma above, as the scorers issue them) or on the
  token's row within the tile. A CP decode equals the full-context decode bit for bit
  only if it does not;
- **promotion**: the same with the running sum moved to fp32 every 32 products
  (``tl.dot``'s ``max_num_imprecise_acc=32``: each k32 MMA from zero, then an fp32 add);
- **the model**: whether the wgmma E4M3 scores equal ``reference.e4m3_mma``'s, bit for bit
  (the E4M3-MMA route's contract, DESIGN §4.1; here K in natural order, so step s is
  dimensions 32 s .. 32 s + 31).

sm_90 multiplies E4M3 natively in wgmma alone (``QGMMA``): ptxas expands an E4M3
``mma.sync`` m16n8k32 into fp16 halves (``F2FP``, two ``HMMA.16816``, ``FADD``), so its
cases say what that expansion computes, and an E4M3 route runs wgmma at N 8 too
(``--compile-only`` prints each case's PTX and SASS MMAs).

Each case is one warpgroup's MMA of a [64, 128] key tile, held in registers as a scorer
holds its decoded keys, and a [128, N] query tile in shared memory, in four K chunks of 32:
``mma.sync`` (m16n8k32 E4M3, m16n8k16 fp16) at N 8-32, wgmma (m64nNk32 / k16, A from
registers) at N 16-64. Inputs: ``random`` (keys and queries ~ N(0, 1)), ``large`` (|x| up
to 448), ``cancel`` (each token's products summing to about zero from large terms) and
``integers`` (small integers: every order of every accumulator of >= 12 bits is exact).
"""

from __future__ import annotations

import argparse
import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

DIM = 128  # K: the head dimension
CHUNK = 32  # K of one E4M3 MMA instruction, and of a promotion
TOKENS = 4096  # keys a case scores (64 tiles of M 64)
ROWS = 64  # query rows; a case of N scores the first N
CASES = [("mma.sync", n) for n in (8, 16, 32)] + [("wgmma", n) for n in (8, 16, 32, 64)]
ROUTES = ("f16", "e4m3", "e4m3-k32")  # fp16 operands; E4M3 as is; E4M3 promoted every 32
PATTERNS = ("random", "large", "cancel", "integers")
_M = gl.constexpr(64)
_CHUNK = gl.constexpr(CHUNK)


@gluon.jit
def _scores_kernel(k_ptr, q_ptr, out_ptr, N: gl.constexpr, WGMMA: gl.constexpr, ROUTE: gl.constexpr):
    """Program i: out[64 i + t, n] = the dot of key row 64 i + t and query row n, on one
    warpgroup, in four K chunks of 32 chained into one accumulator (ROUTE 0: fp16 operands;
    1: E4M3) or each from zero and added in fp32 (2: E4M3 promoted every chunk)."""
    if ROUTE == 0:
        dtype: gl.constexpr = gl.float16
        width: gl.constexpr = 2
    else:
        dtype: gl.constexpr = gl.float8e4nv
        width: gl.constexpr = 4
    if WGMMA:
        mma: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 8 * width]
        )
    else:
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=width)
    b_layout: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=width)
    rows: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([N, _CHUNK], dtype)
    tokens = gl.program_id(0) * _M + gl.arange(0, _M, layout=gl.SliceLayout(1, a_layout))
    dims = gl.arange(0, _CHUNK, layout=gl.SliceLayout(0, a_layout))
    q_rows = gl.arange(0, N, layout=gl.SliceLayout(1, rows))
    q_dims = gl.arange(0, _CHUNK, layout=gl.SliceLayout(0, rows))
    acc = gl.zeros([_M, N], gl.float32, mma)
    total = gl.zeros([_M, N], gl.float32, mma)
    for c in gl.static_range(4):
        a = gl.load(k_ptr + tokens[:, None] * 128 + c * _CHUNK + dims[None, :]).to(dtype)
        q = gl.load(q_ptr + q_rows[:, None] * 128 + c * _CHUNK + q_dims[None, :]).to(dtype)
        q_smem = gl.allocate_shared_memory(dtype, [N, _CHUNK], q_layout, q)
        fence_async_shared()
        gl.thread_barrier()
        if ROUTE == 2:
            acc = gl.zeros([_M, N], gl.float32, mma)
        if WGMMA:
            acc = warpgroup_mma(a, q_smem.permute((1, 0)), acc)
        else:
            acc = mma_v2(a, q_smem.permute((1, 0)).load(b_layout), acc)
        if ROUTE == 2:
            total = total + acc
        gl.thread_barrier()
    if ROUTE != 2:
        total = acc
    out_rows = gl.program_id(0) * _M + gl.arange(0, _M, layout=gl.SliceLayout(1, mma))
    out_cols = gl.arange(0, N, layout=gl.SliceLayout(0, mma))
    gl.store(out_ptr + out_rows[:, None] * N + out_cols[None, :], total)


def inputs(pattern: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys [TOKENS, 128], queries [ROWS, 128]) as float32 holding E4M3 values."""
    e4m3 = torch.float8_e4m3fn

    def fp8(x):
        return x.clamp(-448, 448).to(e4m3).float()

    if pattern == "random":
        return fp8(torch.randn(TOKENS, DIM, generator=gen)), fp8(torch.randn(ROWS, DIM, generator=gen))
    if pattern == "large":
        return fp8(torch.randn(TOKENS, DIM, generator=gen) * 150), fp8(torch.randn(ROWS, DIM, generator=gen) * 150)
    if pattern == "cancel":
        # dims pair up: key d and d + 64 equal, query d and d + 64 opposite and near equal
        # (one E4M3 step apart): each token's products cancel but for a few small terms
        half = fp8(torch.randn(TOKENS, DIM // 2, generator=gen) * 100)
        q = fp8(torch.randn(ROWS, DIM // 2, generator=gen) * 100)
        nudge = fp8(q * (1 + 2.0**-3 * torch.randint(0, 2, q.shape, generator=gen)))
        return torch.cat([half, half], 1), torch.cat([q, -nudge], 1)
    if pattern == "integers":
        return (
            torch.randint(-8, 9, (TOKENS, DIM), generator=gen).float(),
            torch.randint(-8, 9, (ROWS, DIM), generator=gen).float(),
        )
    raise ValueError(f"pattern: {pattern!r} (one of {PATTERNS})")


def run_case(keys: torch.Tensor, queries: torch.Tensor, mma: str, n: int, route: str) -> torch.Tensor:
    """float32 [TOKENS, n]: every key's score with the first n queries by one case."""
    k8 = keys.to(torch.float8_e4m3fn)
    q8 = queries[:n].contiguous().to(torch.float8_e4m3fn)
    out = torch.empty(keys.shape[0], n, dtype=torch.float32, device=keys.device)
    route_id = ROUTES.index(route)
    _scores_kernel[(keys.shape[0] // 64,)](k8, q8, out, N=n, WGMMA=mma == "wgmma", ROUTE=route_id, num_warps=4)
    return out


def instruction(mma: str, n: int, route: str) -> tuple[str, str]:
    """The MMA a case compiles to for sm_90: (its PTX's instruction names, the SASS's MMA
    opcodes and the F2FP / FADD beside them). sm_90 runs E4M3 natively in wgmma alone
    (``QGMMA``); ptxas expands an E4M3 ``mma.sync`` into fp16 ``HMMA`` halves."""
    from .sass import compile_here, disassemble
    from .sass_listing import instruction_mix

    signature = {"k_ptr": "*fp8e4nv", "q_ptr": "*fp8e4nv", "out_ptr": "*fp32"}
    constexprs = {"N": n, "WGMMA": mma == "wgmma", "ROUTE": ROUTES.index(route)}
    kernel = compile_here(_scores_kernel, signature, constexprs, 4)
    ptx = kernel.asm["ptx"]
    names = {line.split()[0] for line in ptx.splitlines() if "wgmma.mma_async" in line or "mma.sync" in line}
    mix = instruction_mix(disassemble(kernel.asm["cubin"]))
    sass = [f"{op} {mix[op]}" for op in ("HMMA", "HGMMA", "QGMMA", "F2FP", "FADD") if mix[op]]
    return ", ".join(sorted(names)), ", ".join(sass)


def model_scores(keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """float32 [TOKENS, ROWS]: ``reference.e4m3_mma``'s scores of these E4M3 values with this
    kernel's steps (natural K order: the model's ``STEP_DIMS`` take the columns moved there)."""
    from reference.e4m3_mma import STEP_DIMS, e4m3_mma_dot

    def as_steps(x):
        out = torch.empty_like(x)
        out[:, STEP_DIMS.flatten()] = x
        return out

    return e4m3_mma_dot(as_steps(queries.double()), as_steps(keys.double()))


def measure(device, patterns=PATTERNS, cases=CASES, seed: int = 0) -> list[dict]:
    """One row per (pattern, route, case): ``agree`` (fraction equal to the fp16 route's
    score of the same case, bit for bit), ``err_log2`` (log2 of the largest |score - exact|
    / sum |products|; -inf where every score is exact), ``exact`` (fraction equal to the
    exact sum rounded to fp32), and ``same_as`` (per other case of this route: the count of
    scores of their common query rows that differ), ``rolled`` (scores that change when the
    keys move 16 rows within their tiles), ``model`` (wgmma E4M3, plain: the fraction equal
    to ``model_scores`` bit for bit; None for the other routes and instructions)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for pattern in patterns:
        keys, queries = inputs(pattern, gen)
        exact = keys.double() @ queries.double().T  # [TOKENS, ROWS]
        model = model_scores(keys, queries)
        scale = keys.double().abs() @ queries.double().abs().T
        k, q = keys.to(device), queries.to(device)
        got = {}
        for route in ROUTES:
            for name, n in cases:
                got[(route, name, n)] = run_case(k, q, name, n, route).cpu()
        for route in ROUTES:
            for name, n in cases:
                s = got[(route, name, n)]
                ex, sc = exact[:, :n], scale[:, :n]
                err = ((s.double() - ex).abs() / sc.clamp(min=1e-300)).max().item()
                rolled = run_case(k.roll(16, 0), q, name, n, route).cpu().roll(-16, 0)
                rows.append(
                    {
                        "pattern": pattern,
                        "route": route,
                        "mma": name,
                        "n": n,
                        "agree": (s == got[("f16", name, n)]).float().mean().item(),
                        "exact": (s == ex.float()).float().mean().item(),
                        "err_log2": math.log2(err) if err > 0 else float("-inf"),
                        "same_as": {
                            f"{o}/{on}": int((s[:, : min(n, on)] != got[(route, o, on)][:, : min(n, on)]).sum())
                            for o, on in cases
                            if (o, on) != (name, n)
                        },
                        "rolled": int((rolled != s).sum()),
                        "model": (
                            (s.view(torch.int32) == model[:, :n].view(torch.int32)).float().mean().item()
                            if (route, name) == ("e4m3", "wgmma")
                            else None
                        ),
                    }
                )
    return rows


def print_rows(rows: list[dict]) -> None:
    """The rows as one table a pattern."""
    for pattern in dict.fromkeys(r["pattern"] for r in rows):
        print(
            f"\n{pattern}: route, case, = fp16 route, = exact, log2 max error / sum |products|, "
            "scores differing from the route's other cases (common rows), when rolled 16 rows,"
            " = reference.e4m3_mma (wgmma E4M3)"
        )
        for r in (r for r in rows if r["pattern"] == pattern):
            diffs = " ".join(f"{k}:{v}" for k, v in r["same_as"].items())
            print(
                f"  {r['route']:<9} {r['mma']:<8} N {r['n']:<3} {r['agree']:6.3f} {r['exact']:6.3f} "
                f"{r['err_log2']:7.1f}  {diffs}  rolled {r['rolled']}"
                + ("" if r["model"] is None else f"  model {r['model']:.4f}")
            )


def main(argv=None) -> int:
    """Measure and print (``--compile-only``: print each case's MMA instruction, any machine)."""
    parser = argparse.ArgumentParser(prog="python -m bench.fp8_mma", description=__doc__)
    parser.add_argument("--compile-only", action="store_true", help="print each case's MMA instruction (no GPU)")
    args = parser.parse_args(argv)
    if args.compile_only:
        for route in ROUTES:
            for name, n in CASES:
                ptx, sass = instruction(name, n, route)
                print(f"{route:<9} {name:<8} N {n:<3}: {ptx} | {sass}")
        return 0
    if not torch.cuda.is_available():
        print("error: no CUDA GPU (--compile-only works anywhere)")
        return 2
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(dev))
    print_rows(measure(dev))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
