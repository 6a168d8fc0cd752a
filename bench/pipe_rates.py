"""``python -m bench.pipe_rates``: the issue rate of each instruction the scorer's decode
spends its page on (``prmt``, ``lop3``, the E4M3 -> f16 conversion, ``imad``), against
``fma.rn.f32`` (the FMA pipe at full rate), on the GPU at hand. The scorer's budget
(``python -m bench.sass --parts``, bench/PERF.md) counts instructions a page;
these rates say what each costs.

Each thread runs 8 independent dependency chains of one instruction (enough to cover its
latency), so the kernel measures throughput; ``--compile-only`` prints the loop's SASS mix
instead (any machine), to check that the loop is the instruction under test and little else.
"""

from __future__ import annotations

import argparse
import collections

import torch
import triton
import triton.language as tl

from .timing import launch_ns

CHAINS = 8
ITERS = 16384  # trips of the timed loop, each one instruction per chain (~1 ms a launch: no overhead)
THREADS = 256
BLOCKS_PER_SM = 8

# One step of a chain: $0 = f($1) with the chain's value as both input and output.
STEPS = {
    "fma.f32": "fma.rn.f32 $0, $1, 0f3F7FFFFF, 0f33800000;",
    "imad": "mad.lo.u32 $0, $1, 1664525, 1013904223;",
    "prmt": "prmt.b32 $0, $1, 0x01234567, 0x4152;",
    "lop3": "lop3.b32 $0, $1, 0x5A5A5A5A, 0x33CC33CC, 0x96;",
    # the E4M3 pair of the low half to f16x2 (the decode's F2FP); mov of a half is free
    "cvt.e4m3x2": "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; cvt.rn.f16x2.e4m3x2 $0, lo; }",
}


@triton.jit
def _chains_kernel(out_ptr, seed, ITERS: tl.constexpr, STEP: tl.constexpr, CHAINS: tl.constexpr, THREADS: tl.constexpr):
    """``CHAINS`` chains per thread of ITERS steps each; stores their xor (kept live)."""
    t = tl.program_id(0) * THREADS + tl.arange(0, THREADS)
    x = (t[:, None] * CHAINS + tl.arange(0, CHAINS)[None, :] + seed).to(tl.int32)
    for _ in range(ITERS):
        x = tl.inline_asm_elementwise(STEP, "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(out_ptr + t, tl.xor_sum(x, axis=1))


def _launch(step: str, out: torch.Tensor, blocks: int) -> None:
    _chains_kernel[(blocks,)](
        out, 1, ITERS=ITERS, STEP=STEPS[step], CHAINS=CHAINS, THREADS=THREADS, num_warps=THREADS // 32
    )


def rates(device: torch.device, reps: int = 20) -> dict[str, float]:
    """Step -> warp instructions issued per SM and ns (the median of ``reps`` timed launches)."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    blocks = sms * BLOCKS_PER_SM
    out = torch.empty(blocks * THREADS, dtype=torch.int32, device=device)
    result = {}
    for step in STEPS:
        ns = launch_ns(lambda step=step: _launch(step, out, blocks), reps)
        warp_instructions = blocks * (THREADS // 32) * ITERS * CHAINS
        result[step] = warp_instructions / sms / ns
    return result


def compiled_mix(step: str) -> collections.Counter:
    """Opcode -> count in the timed loop of ``step``'s kernel, compiled for sm_90 here."""
    from .sass import kernel_loop_mix

    signature = {"out_ptr": "*i32", "seed": "i32"}
    constexprs = {"ITERS": ITERS, "STEP": STEPS[step], "CHAINS": CHAINS, "THREADS": THREADS}
    return kernel_loop_mix(_chains_kernel, signature, constexprs, THREADS // 32, mma=False)


def main(argv=None) -> int:
    """Print each pipe's measured rate (or, ``--compile-only``, each loop's SASS mix);
    returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bench.pipe_rates", description=__doc__)
    parser.add_argument("--compile-only", action="store_true", help="print each loop's SASS mix (no GPU needed)")
    args = parser.parse_args(argv)
    if args.compile_only:
        for step in STEPS:
            mix = compiled_mix(step)
            print(f"{step:<11} loop: " + ", ".join(f"{op} {n}" for op, n in mix.most_common(6)))
        return 0
    if not torch.cuda.is_available():
        print("error: no CUDA GPU (--compile-only works anywhere)")
        return 2
    measured = rates(torch.device("cuda"))
    base = measured["fma.f32"]
    print(f"{'step':<11} warp instr / SM / ns   relative to fma.f32 (4 a cycle per SM: the full rate)")
    for step, rate in measured.items():
        print(f"{step:<11} {rate:10.3f}   {rate / base:5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
