#!/usr/bin/env bash
# Session 28's device runs (from the repository root on the device machine, with build/dev.tar.xz
# from tools/device/bundle.sh carried along and unpacked). Runs 2-5 were made on branch
# routed-fused, the fp8ring mode is for branch fp8-one-ring; see docs/perf/2026-12-07-session28.md.
#   runs.sh ncu-routed: GEMV launches of a one-layer bench under Nsight Compute with the memory,
#     scheduler, warp-state and occupancy sections (run 1, at 4042903: the skip landed on the
#     prompt's MXFP4 GEMV pieces, then the C1 FP8 one-token GEMVs).
#   runs.sh check: the routed-expert and GEMV tests (on routed-fused: the fused one-row launch
#     against run_moe_decode's bits and the CPU), then every engine test.
#   runs.sh decode: V4.1 and V4 C1 / C4 with the fused routed launch and without
#     (DS41RT_ROUTED_FUSED=0), then the routed kernels of one layer under Nsight Compute.
#   runs.sh quick: the fused kernel's tests, V4.1 C1 with and without it, its stall reasons.
#   runs.sh fp8ring: the FP8 one-token ring (branch fp8-one-ring) against main's ds41rt bundled as
#     build/dev/ds41rt-main: GEMV / MoE / dense tests and the packed-key attention test (its two
#     loops made one helper after run 1, not yet run since), every engine test, V4.1 C1 twice each way.
#   runs.sh sweep: the GEMV launch tuning (DS41RT_GEMV_WAVES / _FP4_WAVES / _MIN_KB /
#     _BLOCKS_PER_SM) in the whole V4.1 C1 / C4 step; not run yet.
#   runs.sh ncu-all: every kernel of a one-layer C1 step under Nsight Compute (the launch chain,
#     each launch's time); not run yet.
#   runs.sh report: the full bench (decode C1 / C4 / C16, prefill 1K..32K) of V4.1 and V4.
# Outputs under $O; everything ends up in $O/../all.tar.gz (a device call returns few files).
set -o pipefail
source tools/device/dev_env.sh  # COMMIT, O, L, LIBS, bench(); fixtures linked; the card printed
case "${1:-check}" in
ncu-routed)
  LD_LIBRARY_PATH=$LIBS timeout 240 /usr/local/cuda/bin/ncu --clock-control none --kernel-name-base demangled \
    -k regex:'moe_routed_mxfp4|gemv_kernel' --launch-skip 40 --launch-count 12 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats \
    --section WarpStateStats --section LaunchStats --section ComputeWorkloadAnalysis \
    build/dev/ds41rt bench --model-type v41 --layers 1 --concurrency 1 --prefill '' --decode-steps 8 --out $O/ncu-bench \
    > $O/ncu-routed.txt 2>&1
  echo "== ncu-routed: rc $?"
  grep -E '^  [a-z_:<>]|Duration|DRAM Throughput|Achieved Occupancy|Issued Warp|Eligible Warps|Warp Cycles Per Issued' $O/ncu-routed.txt | head -120
  ;;
check)
  LD_LIBRARY_PATH=$LIBS timeout 200 build/dev/ds41rt_cuda_tests --gtest_filter='MoeRouted*:MoeDecode*:Gemv*:NvFp4*' > $O/tests.log 2>&1
  echo "== cuda tests: rc $?"
  grep -E '^\[  (PASSED|FAILED)|^\[  FAILED|graph replay|moe routed \] official D5120 B1|bandwidth|B = 1' $O/tests.log | head -40
  LD_LIBRARY_PATH=$LIBS timeout 240 build/dev/ds41rt_cuda_engine_tests > $O/engine-tests.log 2>&1
  echo "== engine tests: rc $?"
  grep -E '^\[  (PASSED|FAILED)|^\[  FAILED' $O/engine-tests.log | head -30
  ;;
decode)
  bench v41 ds41rt v41 X=1 -- --concurrency 1,4 --prefill ''
  bench v41-apart ds41rt v41 DS41RT_ROUTED_FUSED=0 -- --concurrency 1,4 --prefill ''
  bench v4 ds41rt v4 X=1 -- --concurrency 1,4 --prefill ''
  bench v4-apart ds41rt v4 DS41RT_ROUTED_FUSED=0 -- --concurrency 1,4 --prefill ''
  for n in v41 v41-apart; do echo "---- $n"; sed -n '/^| product/,/^$/p' $O/bench-$n/bench.md | head -6; done
  LD_LIBRARY_PATH=$LIBS timeout 120 /usr/local/cuda/bin/ncu --clock-control none --kernel-name-base demangled \
    -k regex:'moe_routed' --launch-skip 20 --launch-count 12 --section SpeedOfLight \
    build/dev/ds41rt bench --model-type v41 --layers 1 --concurrency 1 --prefill '' --decode-steps 8 --out $O/ncu-bench \
    > $O/ncu-fused.txt 2>&1
  echo "== ncu fused: rc $?"; grep -E '^  [a-z_:<>v]|Duration|DRAM Throughput' $O/ncu-fused.txt | sed 's/(unnamed>::routed_params.*)//' | head -40
  ;;
quick)  # the fused kernel against the separate launches: its tests, V4.1 C1, and its stall reasons
  LD_LIBRARY_PATH=$LIBS timeout 200 build/dev/ds41rt_cuda_tests --gtest_filter='MoeRouted*' > $O/tests.log 2>&1
  echo "== cuda tests: rc $?"; grep -E '^\[  (PASSED|FAILED)|^\[  FAILED' $O/tests.log
  bench v41 ds41rt v41 X=1 -- --concurrency 1 --prefill ''
  bench v41-apart ds41rt v41 DS41RT_ROUTED_FUSED=0 -- --concurrency 1 --prefill ''
  for n in v41 v41-apart; do grep -E 'ffn.experts' $O/bench-$n/bench.md | head -1; done
  LD_LIBRARY_PATH=$LIBS timeout 120 /usr/local/cuda/bin/ncu --clock-control none --kernel-name-base demangled \
    -k regex:'moe_routed_fused' --launch-skip 4 --launch-count 2 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --metrics smsp__pcsamp_warps_issue_stalled_sleeping,smsp__pcsamp_warps_issue_stalled_long_scoreboard,smsp__pcsamp_warps_issue_stalled_barrier,smsp__pcsamp_warps_issue_stalled_membar,smsp__pcsamp_warps_issue_stalled_lg_throttle,smsp__pcsamp_sample_count \
    build/dev/ds41rt bench --model-type v41 --layers 1 --concurrency 1 --prefill '' --decode-steps 8 --out $O/ncu-bench \
    > $O/ncu-fused.txt 2>&1
  echo "== ncu fused: rc $?"; grep -E 'Duration|DRAM Throughput|Warp Cycles Per Issued|Eligible Warps|stalled|sample_count|Est. Speedup|spends' $O/ncu-fused.txt | head -40
  ;;
fp8ring)  # session 20's fp8-one-ring.patch (FP8 one-token GEMVs take x, its scales and the weight-scale word through the ring) against main (build/dev/ds41rt-main)
  LD_LIBRARY_PATH=$LIBS timeout 200 build/dev/ds41rt_cuda_tests --gtest_filter='Gemv*:MoeRouted*:MoeDecode*:Dense*:CudaAttention.Packed*' > $O/tests.log 2>&1
  echo "== cuda tests: rc $?"; grep -E '^\[  (PASSED|FAILED)|^\[  FAILED' $O/tests.log
  LD_LIBRARY_PATH=$LIBS timeout 240 build/dev/ds41rt_cuda_engine_tests > $O/engine-tests.log 2>&1
  echo "== engine tests: rc $?"; grep -E '^\[  (PASSED|FAILED)|^\[  FAILED' $O/engine-tests.log | head
  for i in 1 2; do
    bench v41-ring$i ds41rt v41 X=1 -- --concurrency 1 --prefill ''
    bench v41-main$i ds41rt-main v41 X=1 -- --concurrency 1 --prefill ''
  done
  for n in v41-ring1 v41-main1; do echo "---- $n"; grep -E 'fp8 gemv' $O/bench-$n/bench.md | head -8; done
  ;;
sweep)  # for the next session: the GEMVs' launch tuning in the whole V4.1 C1 / C4 step (gemv_default_tuning's environment)
  bench v41-default ds41rt v41 X=1 -- --concurrency 1,4 --prefill ''
  for w in 0.5 0.75 1.5; do bench v41-waves$w ds41rt v41 DS41RT_GEMV_WAVES=$w -- --concurrency 1,4 --prefill ''; done
  for w in 1.5 3; do bench v41-fp4waves$w ds41rt v41 DS41RT_GEMV_FP4_WAVES=$w -- --concurrency 1,4 --prefill ''; done
  bench v41-minkb4 ds41rt v41 DS41RT_GEMV_MIN_KB=4 -- --concurrency 1,4 --prefill ''
  bench v41-walk4 ds41rt v41 DS41RT_GEMV_BLOCKS_PER_SM=4 -- --concurrency 1,4 --prefill ''
  ;;
ncu-all)  # every kernel of one layer's C1 decode step (no name filter), time and speed of light: the launch chain
  LD_LIBRARY_PATH=$LIBS timeout 200 /usr/local/cuda/bin/ncu --clock-control none --kernel-name-base demangled \
    --launch-skip 400 --launch-count 80 --section SpeedOfLight \
    build/dev/ds41rt bench --model-type v41 --layers 1 --concurrency 1 --prefill '' --decode-steps 8 --out $O/ncu-bench \
    > $O/ncu-all.txt 2>&1
  echo "== ncu-all: rc $?"
  awk '/^  [a-zA-Z_:<>]/{n=$0; sub(/\(.*/, "", n)} /Duration/{print $3, n}' $O/ncu-all.txt | head -90
  ;;
report)
  bench v41 ds41rt v41 X=1 -- --concurrency 1,4,16
  bench v4 ds41rt v4 X=1 -- --concurrency 1,4,16
  for n in v41 v4; do echo "---- $n"; sed -n '/^| concurrency/,/^$/p;/^| section/,/^$/p' $O/bench-$n/bench.md; done
  ;;
esac
