"""``python -m bench.mma_rates``: how fast the tensor pipe runs the MMA shapes the
scorers issue, and the page rate that MMA alone would allow each scorer shape — the ceiling
its MMA puts on it however cheap the decode and the loads become.

The scorers put 64 tokens on M (a warpgroup's, or four warps' m16 tiles), the page's 128
dimensions on K and the query rows on N: per 128 tokens, ``128 * 128 * N`` multiply-adds
with fp16 operands and fp32 accumulators, whatever the key format. What differs is the
instruction that carries them: ``mma.sync`` m16n8k16 at N = 8 (Hs 1, and Hs 4 at one slot),
wgmma m64nNk16 with A from registers at N = 16 and 32 (Hs 4 at 4 and 8 slots). The fp16
tensor pipe's dense peak is 2048 multiply-adds a cycle and SM; at the read ceiling (~4.5
TB/s over 132 SMs at ~1.98 GHz, ~17 bytes a cycle and SM) that is ~119 a byte, while an
NVFP4 page at N = 32 needs 57 a byte (half the peak), an FP8 block at N = 32 32. So the
small-N instructions must run near their share of the peak, or the MMA alone would bound
the scorer; the caps printed say whether they do.

Each program is one warpgroup (4 warps) running ``ITERS`` steps of a 64 x 128 x N product
(8 m16n8k16 a warp and n8 tile, or 8 m64nNk16 wgmma, then the synchronous ``warpgroup_mma``'s
wait), A in registers, q's tile in shared memory (wgmma) or registers (``mma.sync``): either
into the same accumulators (``chain``: a GEMM's K loop; ``mma.sync`` keeps two chains, so one
chain's latency is not what is timed) or from zero each step, folded into a running maximum
(``fresh``, wgmma: the scorer's block without its decode and loads). ``--compile-only``
prints each loop's SASS mix instead (any machine), to check that it is those MMAs and
little else.
"""

from __future__ import annotations

import argparse
import collections

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from indexer_constants import PAGE, PAGE_BYTES

from .timing import ceilings, launch_ns

ITERS = 2048  # steps a program: ~0.1-1 ms a launch, no launch overhead in the rate
TOKENS = 64  # M: one step's tokens (a warpgroup's)
DIM = 128  # K: the head dimension
_TOKENS = gl.constexpr(TOKENS)
_DIM = gl.constexpr(DIM)
PROGRAMS_PER_SM = (1, 2, 5, 8)  # the N 32 scorer runs 5 (95 registers), N 8 and N 16 6-7
# The scorers' bytes per 128 tokens (one MMA of 128 x 128 x N): an NVFP4 page, an MSA block.
KEY_BYTES = {"nvfp4": PAGE_BYTES, "fp8": 128 * 128, "bf16": 128 * 128 * 2}


@gluon.jit
def _mma_steps_kernel(out_ptr, ITERS: gl.constexpr, N: gl.constexpr, WGMMA: gl.constexpr, FRESH: gl.constexpr):
    """ITERS steps of a [64, 128] @ q [128, N] (fp16, fp32 accumulators) on one warpgroup:
    into the same accumulators (``FRESH`` false: a GEMM's K loop; ``mma.sync`` keeps two
    such chains so the loop is not one chain's latency), or from zero each step and folded
    into a running maximum (``FRESH``, wgmma only: the scorer's block). Stores one value a
    program so nothing is dead."""
    if WGMMA:
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 16])
    else:
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    rows: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    # small exact values, so the sums stay finite over every step
    pid = gl.program_id(0)
    ka = gl.arange(0, _DIM, layout=gl.SliceLayout(0, a_layout))
    ta = gl.arange(0, _TOKENS, layout=gl.SliceLayout(1, a_layout))
    a = ((ta[:, None] + ka[None, :] + pid) % 64 + 1).to(gl.float16) * (1.0 / 64)
    kq = gl.arange(0, _DIM, layout=gl.SliceLayout(0, rows))
    nq = gl.arange(0, N, layout=gl.SliceLayout(1, rows))
    q = ((nq[:, None] * 3 + kq[None, :]) % 64 + 1).to(gl.float16) * (1.0 / 4096)
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([N, _DIM], gl.float16)
    q_smem = gl.allocate_shared_memory(gl.float16, [N, _DIM], q_layout, q)
    fence_async_shared()
    gl.thread_barrier()
    if WGMMA:
        q_op = q_smem.permute((1, 0))
    else:
        q_op = q_smem.permute((1, 0)).load(gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2))
    zeros = gl.zeros([_TOKENS, N], gl.float32, mma)
    acc = zeros
    other = zeros + 1.0  # not zeros: the two chains must not be merged as one
    for _ in range(ITERS):
        if WGMMA:
            if FRESH:
                acc = gl.maximum(acc, warpgroup_mma(a, q_op, zeros, use_acc=False))
            else:
                acc = warpgroup_mma(a, q_op, acc)
        else:
            acc = mma_v2(a, q_op, acc)
            other = mma_v2(a, q_op, other)
    gl.store(out_ptr + pid, gl.max(gl.max(gl.maximum(acc, other), axis=1), axis=0))


# (instruction, N, fresh): the scorers' shapes, then wider wgmma for comparison.
SHAPES = (
    ("mma.sync", 8, False),
    ("mma.sync", 32, False),
    ("wgmma", 16, False),
    ("wgmma", 16, True),
    ("wgmma", 32, False),
    ("wgmma", 32, True),
    ("wgmma", 64, False),
    ("wgmma", 64, True),
    ("wgmma", 128, False),
)


def _steps(kind: str) -> int:
    """64 x 128 x N products a program and step (``mma.sync`` runs two chains)."""
    return 2 if kind == "mma.sync" else 1


def _launch(kind: str, n: int, fresh: bool, out: torch.Tensor, programs: int) -> None:
    _mma_steps_kernel[(programs,)](out, ITERS=ITERS, N=n, WGMMA=kind == "wgmma", FRESH=fresh, num_warps=4)


def rates(device: torch.device, reps: int = 10) -> dict[tuple[str, int, bool, int], float]:
    """(instruction, N, fresh, programs an SM) -> multiply-adds a ns and SM (the median of
    ``reps`` timed launches of ``programs an SM x SMs`` programs)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    result = {}
    for kind, n, fresh in SHAPES:
        for per_sm in PROGRAMS_PER_SM:
            programs = sms * per_sm
            out = torch.empty(programs, dtype=torch.float32, device=device)
            ns = launch_ns(lambda: _launch(kind, n, fresh, out, programs), reps)
            macs = programs * ITERS * _steps(kind) * TOKENS * DIM * n
            result[(kind, n, fresh, per_sm)] = macs / sms / ns
    return result


def page_cap(macs_per_ns_sm: float, n: int, key_bytes: int, sms: int, ceiling_gbps: float) -> float:
    """The fraction of the read ceiling a scorer reaches if its MMA, at ``macs_per_ns_sm``
    on every SM, were its only cost: 128 tokens of ``key_bytes`` need ``128 * 128 * n``
    multiply-adds."""
    tokens_128_per_ns = macs_per_ns_sm * sms / (PAGE * DIM * n)
    return tokens_128_per_ns * key_bytes / ceiling_gbps  # bytes a ns = GB/s


def compiled_mix(kind: str, n: int, fresh: bool) -> collections.Counter:
    """Opcode -> count in the timed loop of the (kind, N) kernel, compiled for sm_90 here."""
    from .sass import kernel_loop_mix

    constexprs = {"ITERS": ITERS, "N": n, "WGMMA": kind == "wgmma", "FRESH": fresh}
    return kernel_loop_mix(_mma_steps_kernel, {"out_ptr": "*fp32"}, constexprs, 4)


def main(argv=None) -> int:
    """Print each shape's measured rate and the caps it puts on the scorers (or,
    ``--compile-only``, each loop's SASS mix); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bench.mma_rates", description=__doc__)
    parser.add_argument("--compile-only", action="store_true", help="print each loop's SASS mix (no GPU needed)")
    args = parser.parse_args(argv)
    if args.compile_only:
        for kind, n, fresh in SHAPES:
            mix = compiled_mix(kind, n, fresh)
            listed = ", ".join(f"{op} {c}" for op, c in mix.most_common(6))
            print(f"{kind:<8} N {n:<3} {'fresh' if fresh else 'chain'} loop: {listed}")
        return 0
    if not torch.cuda.is_available():
        print("error: no CUDA GPU (--compile-only works anywhere)")
        return 2
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    ceiling = ceilings(device)["stream_read_GBps"]
    measured = rates(device)
    print(f"read ceiling {ceiling:.0f} GB/s, {sms} SMs")
    print("MMA       N   steps  programs/SM  MAC/ns/SM   the MMA alone caps (fraction of the ceiling):")
    print(" " * 46 + "  ".join(f"{k:>6}" for k in KEY_BYTES))
    for (kind, n, fresh, per_sm), rate in measured.items():
        caps = "  ".join(f"{page_cap(rate, n, b, sms, ceiling):6.2f}" for b in KEY_BYTES.values())
        print(f"{kind:<9} {n:<3} {'fresh' if fresh else 'chain':<6} {per_sm:^12} {rate:9.0f}   {caps}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
