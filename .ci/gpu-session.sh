#!/usr/bin/env bash
# One batch of GPU checks for a lent device machine: each stage's log under $OUT, a summary
# at the end. Usage: bash .ci/gpu-session.sh STAGE... (stages: the case arms below;
# test-units + test-ranks are make test's two steps, test-units-0 + test-units-1 the first
# in halves). Never multicast (docs/DESIGN.md §8). tests/test_gpu_session.py runs every stage
# with its programs stubbed and holds each command to the files, modules and targets it names.
# A lent machine's copy of the tree may carry an older .git than its files: pass
# BENCH_COMMIT=<hash> (the bench report's commit) where the bench stages run.
set -u
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
summary="$OUT/summary.txt"
failed=0  # the script's exit status: 1 when any stage failed, whichever it was
stage() {  # stage NAME LIMIT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" bash -c "$*" > "$OUT/$name.log" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || failed=1
    echo "$name: rc=$rc in $((SECONDS - start)) s" | tee -a "$summary"
    tail -n 4 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$summary"
}
# the single-GPU tests of the scorers and decodes, run on each route (portable, hopper)
route_files="tests/test_route.py tests/test_gpu_scorer.py tests/test_scorer.py tests/test_stock_decode.py tests/test_cp_one_rank.py tests/test_msa_scorer.py tests/test_msa_stock.py tests/test_msa_cp_one_rank.py tests/test_gpu_graphs.py tests/test_guards.py"
for s in "$@"; do
    case $s in
    info) stage info 60 "nvidia-smi; nvidia-smi topo -m; python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.device_count())'" ;;
    dequant) stage dequant 300 "python3 -m pytest -q -x tests/test_gpu_scorer.py" ;;
    test) stage test 900 "make test" ;;
    test-units) stage test-units 580 "python3 -m pytest -n auto -q -m 'not multirank and not slow'" ;;
    # the same tier in two halves (conftest.py's --shard), each well inside a 600-s call:
    # whole, it has outgrown one on a single H200
    test-units-0|test-units-1) stage "$s" 540 "python3 -m pytest -n auto -q -m 'not multirank and not slow' --shard ${s#test-units-}/2" ;;
    test-gpu) stage test-gpu 600 "python3 -m pytest -q -n 8 tests/test_gpu_scorer.py tests/test_gpu_graphs.py tests/test_scorer.py tests/test_select_levels.py tests/test_warp_select.py tests/test_stock_decode.py tests/test_cp_one_rank.py tests/test_bad_inputs.py tests/test_guards.py" ;;
    msa) stage msa 400 "python3 -m pytest -q -n 4 tests/test_msa_scorer.py tests/test_msa_stock.py tests/test_msa_reference.py tests/test_stock_decode.py tests/test_bench.py -p no:cacheprovider" ;;
    msa-cp) stage msa-cp 240 "python3 -m pytest -q -n 4 tests/test_msa_cp_one_rank.py tests/test_cp_fallback.py tests/test_sass.py tests/test_bench.py tests/test_cp_one_rank.py tests/test_gpu_graphs.py tests/test_msa_stock.py tests/test_bad_inputs.py -p no:cacheprovider" ;;
    msa-ranks) stage msa-ranks 300 "python3 -m pytest -q -n 4 -m multirank tests/test_msa_protocol_ranks.py --durations=5 -p no:cacheprovider" ;;  # serial: past 200 s
    guards) stage guards 300 "python3 -m pytest -q -n 4 tests/test_guards.py tests/test_bad_inputs.py -p no:cacheprovider" ;;
    sanitizer-guards) stage sanitizer-guards 400 "compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 python3 -m pytest -q -x tests/test_guards.py -p no:cacheprovider" ;;
    guards-ranks) stage guards-ranks 400 "python3 -m pytest -v -s -m multirank -k 'missing_peer or bad_device or waits_for_nothing' -p no:cacheprovider" ;;
    exchange) stage exchange 420 "python3 -m pytest -q -n 4 tests/test_cp_one_rank.py tests/test_guards.py -p no:cacheprovider && python3 -m pytest -v -s -m 'multirank and not slow' -k 'missing_peer or bad_device or waits_for_nothing or replicas or back_to_back or cp_equals_oracle or table_edge' -p no:cacheprovider" ;;
    # the portable route (fast.route) forced on this sm_90 GPU: the single-GPU tests of the
    # scorers and decodes, then the multi-rank tier's CP-against-oracle cases
    portable) stage portable 560 "FAST_ROUTE=portable python3 -m pytest -q -n 8 $route_files -p no:cacheprovider" ;;
    # the same files on the route the device takes by itself (sm_90: Hopper), for one run of both
    hopper) stage hopper 560 "python3 -m pytest -q -n 8 $route_files -p no:cacheprovider" ;;
    hopper-ranks) stage hopper-ranks 400 "python3 -m pytest -q -m 'multirank and not slow' -k 'cp_equals_oracle or msa or table_edge or replicas or missing_peer or back_to_back' -p no:cacheprovider" ;;
    # the mutation campaign's GPU bugs (fuzz/bugs.py, gpu=True) through their GPU tiers, side by side
    mutants-gpu) stage mutants-gpu 560 "python3 -m fuzz mutants --gpu --jobs 6 --budget 300" ;;
    portable-ranks) stage portable-ranks 400 "FAST_ROUTE=portable python3 -m pytest -q -m 'multirank and not slow' -k 'cp_equals_oracle or msa or table_edge or replicas' -p no:cacheprovider" ;;
    test-ranks) stage test-ranks 520 "python3 -m pytest -v -s -m 'multirank and not slow' --durations=0" ;;
    race-teeth) stage race-teeth 300 "python3 -m pytest -q -m slow tests/test_gpu_graphs.py" ;;
    fuzz-teeth) stage fuzz-teeth 540 "python3 -m pytest -rf -q -n 6 tests/test_fuzz.py -p no:cacheprovider" ;;  # GPU-only mutants run only here
    fuzz-gpu) stage fuzz-gpu 400 "python3 -m fuzz kernels --examples 40 --backend cuda && python3 -m fuzz msa-kernels --examples 40 --backend cuda" ;;  # the GPU-only feeds and kernels, clean
    refail) stage refail 90 "python3 -m pytest -q -x tests/test_stock_decode.py tests/test_cp_one_rank.py tests/test_fuzz.py -k 'stock_topk or cp1 or replay'" ;;
    bench-mid) stage bench-mid 200 "python3 -m bench --contexts 2048 8192 131072 1048576 --batches 1 32 --out $OUT/bench-mid" ;;
    bench-quick) stage bench-quick 600 "python3 -m bench --quick --out $OUT/bench-quick" ;;
    bench) stage bench 900 "python3 -m bench --out $OUT/bench" ;;
    ncu) stage ncu 240 "ncu --kernel-name regex:score_kernel_wgmma --launch-skip 1 --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section LaunchStats python3 -c 'from bench.suite import scorer_once; scorer_once()'" ;;
    ncu-stalls) stage ncu-stalls 300 "for hs in 1 4; do ncu --clock-control none --kernel-name regex:score_kernel_wgmma --launch-skip 1 --launch-count 1 --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio python3 -c \"from bench.suite import scorer_once; scorer_once(hs=\$hs)\"; done" ;;
    # what bounds each wgmma shape: its row beside its probes and knobs, against g (bench/bounds.py)
    bounds) stage bounds 540 "python3 -m bench.bounds" ;;
    # the same with every id folded onto half the L2: each arm's own work's floor (an H100's SMs
    # and clock are an H200's, so on an H100 this is what the H200 can show at best)
    bounds-resident) stage bounds-resident 540 "python3 -m bench.bounds --resident" ;;
    # what part of the NVFP4 page ring binds (bench/PERF.md, Leads): its probes alone, resident
    ring-floors) stage ring-floors 240 "python3 -m bench.bounds --resident --shapes N32 N16 --arms ring_loads ring_loads-ppp4 ring_loads3 ring_copies loads_only" ;;
    # N 32 and N 16 at 1M (8 and 32 rows), where the rounds spread most: the A/B a knob owes there
    bounds-1m) stage bounds-1m 540 "python3 -m bench.bounds --grids 8x8192 32x8192 --shapes N32 N16" ;;
    # the MSA mma kernel's the same way (bench/msa_bounds.py), cold and with every id in L2
    msa-bounds) stage msa-bounds 480 "python3 -m bench.msa_bounds" ;;
    msa-bounds-resident) stage msa-bounds-resident 480 "python3 -m bench.msa_bounds --resident" ;;
    pipes) stage pipes 120 "python3 -m bench.pipe_rates" ;;
    # what makes a scorer section's first rows slow (NVFP4's, MSA fp8's): the rows timed after each prelude, in a child
    first-rows) stage first-rows 540 "python3 -m bench.first_rows" ;;
    mmas) stage mmas 180 "python3 -m bench.mma_rates" ;;
    # what Hopper's E4M3 MMA does to a score (an E4M3-MMA route's facts), then the probe's own
    # test and the scorer's E4M3 probe (wgmma m64n8k32 at N 8: run it before a bench that times it)
    fp8-mma) stage fp8-mma 300 "python3 -m bench.fp8_mma && python3 -m pytest -q tests/test_bench.py tests/test_gpu_scorer.py -k 'fp8_mma or e4m3' -p no:cacheprovider" ;;
    ncu-pipes) stage ncu-pipes 300 "for hs in 1 4; do ncu --clock-control none --kernel-name regex:score_kernel_wgmma --launch-skip 1 --launch-count 1 --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats --metrics regex:sm__inst_executed_pipe_.*sum.pct_of_peak_sustained_active,regex:sm__pipe_.*_cycles_active.avg.pct_of_peak_sustained_active python3 -c \"from bench.suite import scorer_once; scorer_once(hs=\$hs)\"; done" ;;
    # make bench's single-GPU run, the goals' grids (bench/PERF.md's current table): one call on a
    # cold machine (its first compile takes minutes; a warm one runs it in one to two)
    bench-goals) stage bench-goals 560 "python3 -m bench --world 1 --contexts 131072 1048576 --batches 8 32 --out $OUT/bench-goals" ;;
    scorer) stage scorer 420 "python3 -m bench --world 1 --contexts 131072 1048576 --batches 1 8 32 --out $OUT/scorer" ;;
    sanitizer) stage sanitizer 600 "compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 python3 -m pytest -q -x tests/test_gpu_scorer.py tests/test_gpu_graphs.py -k 'not pdl' -p no:cacheprovider" ;;
    demo) stage demo 300 "make demo" ;;
    *)
        echo "unknown stage $s" | tee -a "$summary"
        failed=1
        ;;
    esac
done
exit $failed
