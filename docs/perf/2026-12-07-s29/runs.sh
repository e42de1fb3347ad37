#!/usr/bin/env bash
# Session 29's device runs (from the repository root on the device machine, with build/dev.tar.xz
# from tools/device/bundle.sh carried along and unpacked); see docs/perf/2026-12-07-session29.md.
#   runs.sh ring: branch fp8-one-ring (the FP8 one-token GEMVs take x, its scales and the weight-
#     scale word through the cp.async ring) against main's ds41rt bundled as build/dev/ds41rt-main:
#     GEMV / MoE / dense / packed-key tests, every engine test, V4.1 C1 twice each way.
#   runs.sh sweep: the GEMV launch tuning (gemv_default_tuning's DS41RT_GEMV_WAVES / _FP4_WAVES /
#     _MIN_KB / _BLOCKS_PER_SM) in the whole V4.1 C1 / C4 step.
#   runs.sh chain: every kernel of one layer's V4.1 C1 step, as the graph runs it (nsys, if there)
#     and each alone (ncu): the launch chain with each launch's time.
#   runs.sh trace: the C1 step as its graph runs it (tools/device/kernel_trace.cpp, a CUPTI
#     timeline): each kernel's cost in the step, gaps and PDL overlaps included.
#   runs.sh prefetch: weights into L2 ahead of their GEMV (l2_prefetch, runs 3-4; removed after
#     run 4, so these modes need those commits' builds): its tests, every engine test with it on,
#     V4.1 C1 over prefetch budgets and sites.
#   runs.sh ncu-small: the attention scores and the router kernels under Nsight Compute.
#   runs.sh final: ncu-small, the prefetch's tests, V4.1 C1 over prefetch budgets, the timeline
#     with the host's runtime calls, in one call.
#   runs.sh scores: branch latency-kernels (not run yet; main's ds41rt bundled as
#     build/dev/ds41rt-main): the decode scores tile with staging warps, the router's picks from
#     registers, PDL release before wait: attention, router and engine tests, V4.1 C1 / C4 twice
#     each way, the branch's timeline.
#   runs.sh report: the full bench (decode C1 / C4 / C16, prefill 1K..32K) of V4.1 and V4.
# Outputs under $O; everything ends up in $O/../all.tar.gz (a device call returns few files).
set -o pipefail
source tools/device/dev_env.sh  # COMMIT, O, L, LIBS, bench(); fixtures linked; the card printed
MAIN=${MAIN:-ds41rt-main}
case "${1:-ring}" in
ring)
  gtests tests ds41rt_cuda_tests 150 'Gemv*:MoeRouted*:MoeDecode*:Dense*:CudaAttention.Packed*'
  gtests engine-tests ds41rt_cuda_engine_tests 200 ''
  for i in 1 2; do
    bench v41-ring$i ds41rt v41 X=1 -- --concurrency 1 --prefill ''
    bench v41-main$i $MAIN v41 X=1 -- --concurrency 1 --prefill ''
  done
  for n in v41-ring1 v41-main1; do echo "---- $n"; grep -E 'fp8 gemv' $O/bench-$n/bench.md | head -8; done
  ;;
sweep)
  bench v41-default ds41rt v41 X=1 -- --concurrency 1,4 --prefill ''
  for w in 0.5 0.75 1.5; do bench v41-waves$w ds41rt v41 DS41RT_GEMV_WAVES=$w -- --concurrency 1,4 --prefill ''; done
  for w in 1.5 3; do bench v41-fp4waves$w ds41rt v41 DS41RT_GEMV_FP4_WAVES=$w -- --concurrency 1,4 --prefill ''; done
  bench v41-minkb4 ds41rt v41 DS41RT_GEMV_MIN_KB=4 -- --concurrency 1,4 --prefill ''
  bench v41-walk4 ds41rt v41 DS41RT_GEMV_BLOCKS_PER_SM=4 -- --concurrency 1,4 --prefill ''
  ;;
chain)  # every kernel of one layer's C1 step: under Nsight Systems with graph nodes traced (the
  # step as the graph runs it, gaps included) if nsys is there, and under Nsight Compute (each launch
  # alone); the dummy-weight fills are filtered out by name (run 1's skip of 400 landed in them)
  NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
  echo "nsys: ${NSYS:-none}"
  if [ -n "$NSYS" ]; then
    LD_LIBRARY_PATH=$LIBS timeout 150 $NSYS profile --cuda-graph-trace=node -o $O/chain -f true \
      build/dev/ds41rt bench --model-type v41 --layers 1 --concurrency 1 --prefill '' --decode-steps 8 --out $O/nsys-bench > $O/nsys.log 2>&1
    echo "== nsys: rc $?"
    timeout 100 $NSYS stats -r cuda_gpu_trace -f csv -o $O/chain $O/chain.nsys-rep > /dev/null 2>&1; echo "== nsys stats: rc $?"; ls $O | grep chain
  fi
  LD_LIBRARY_PATH=$LIBS timeout 150 /usr/local/cuda/bin/ncu --clock-control none --kernel-name-base function \
    -k regex:'^([^f]|f[^i])' --launch-skip 300 --launch-count 150 --section SpeedOfLight \
    build/dev/ds41rt bench --model-type v41 --layers 1 --concurrency 1 --prefill '' --decode-steps 8 --out $O/ncu-bench \
    > $O/ncu-all.txt 2>&1
  echo "== ncu-all: rc $?"
  awk '/^  [a-zA-Z_:<>]/{n=$0; sub(/\(.*/, "", n)} /Duration/{print $3, $2, n}' $O/ncu-all.txt | head -150
  ;;
trace)  # the V4.1 (then V4) C1 step as its graph runs it: kernel_trace.cpp's CUPTI timeline of an
  # 8-layer C1 bench, each kernel's cost in the step (tools/device/trace_table.py); an untraced
  # bench first for the tracer's own cost
  for m in ${MODELS:-v41}; do
    bench $m-plain ds41rt $m X=1 -- --concurrency 1 --prefill ''
    bench $m-traced ds41rt $m CUDA_INJECTION64_PATH=$PWD/build/dev/lib/libkernel_trace.so KTRACE_OUT=$O/trace-$m.csv -- --concurrency 1 --prefill ''
    python3 tools/device/trace_table.py $O/trace-$m.csv --sequence 80 > $O/trace-$m.txt 2>&1; echo "== trace $m: rc $?"
    head -45 $O/trace-$m.txt
    bench $m-traced-api ds41rt $m CUDA_INJECTION64_PATH=$PWD/build/dev/lib/libkernel_trace.so KTRACE_OUT=$O/trace-api-$m.csv KTRACE_API=1 -- --concurrency 1 --prefill ''
    python3 tools/device/trace_table.py $O/trace-api-$m.csv > $O/trace-api-$m.txt 2>&1; echo "== trace with host calls $m: rc $?"
    sed -n '1,2p;/^host runtime/,/^us cost/p' $O/trace-api-$m.txt | head -70
  done
  ;;
prefetch)  # (run 3 and 4's binaries; removed after run 4) weights into L2 ahead of their GEMV (DS41RT_L2_PREFETCH_MB / _SITES): its tests, every
  # engine test with it on, V4.1 C1 over budgets and sites
  gtests l2-tests ds41rt_cuda_tests 100 'CudaL2Prefetch*'
  gtests engine-tests-l2 ds41rt_cuda_engine_tests 200 '' DS41RT_L2_PREFETCH_MB=32
  for mb in ${BUDGETS:-0 8 16 32}; do bench v41-l2-$mb ds41rt v41 DS41RT_L2_PREFETCH_MB=$mb -- --concurrency 1 --prefill ''; done
  for st in 1 2; do bench v41-l2-32-sites$st ds41rt v41 DS41RT_L2_PREFETCH_MB=32 DS41RT_L2_PREFETCH_SITES=$st -- --concurrency 1 --prefill ''; done
  ;;
ncu-small)  # the attention scores and the router, the two longest latency-bound kernels of the C1 step
  LD_LIBRARY_PATH=$LIBS timeout 100 /usr/local/cuda/bin/ncu --clock-control none --kernel-name-base function \
    -k regex:'scores_whole|route_kernel' --launch-skip 20 --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    build/dev/ds41rt bench --model-type v41 --layers 2 --concurrency 1 --prefill '' --decode-steps 8 --out $O/ncu-bench \
    > $O/ncu-small.txt 2>&1
  echo "== ncu-small: rc $?"
  grep -E '^  [a-z_]|Duration|Grid Size|Block Size|Registers|Dynamic Shared|Achieved Occ|Eligible Warps|Warp Cycles Per Issued|Issued Warp|spends|stall' $O/ncu-small.txt | head -60
  ;;
final)  # run 4 in one call (device time was short): ncu-small, the prefetch's tests and engine tests,
  # V4.1 C1 at prefetch 0 / 16 / 32 MB, the V4.1 timeline with the host's calls
  bash "$0" ncu-small
  gtests l2-tests ds41rt_cuda_tests 60 'CudaL2Prefetch*'
  gtests engine-tests-l2 ds41rt_cuda_engine_tests 150 '' DS41RT_L2_PREFETCH_MB=32
  for mb in 0 16 32; do bench v41-l2-$mb ds41rt v41 DS41RT_L2_PREFETCH_MB=$mb -- --concurrency 1 --prefill ''; done
  bench v41-traced-api ds41rt v41 CUDA_INJECTION64_PATH=$PWD/build/dev/lib/libkernel_trace.so KTRACE_OUT=$O/trace-api-v41.csv KTRACE_API=1 -- --concurrency 1 --prefill ''
  python3 tools/device/trace_table.py $O/trace-api-v41.csv > $O/trace-api-v41.txt 2>&1; echo "== trace with host calls: rc $?"
  sed -n '1,2p;/^host runtime/,/^us cost/p' $O/trace-api-v41.txt | head -80
  ;;
scores)  # run 5: the decode scores tile with staging warps (16 entries on 2 MMA warps, 4 warps staging)
  gtests attn-tests ds41rt_cuda_tests 90 'CudaAttention*:*Router*:*Route*'
  grep -E 'differ' $O/attn-tests.log | head -5
  gtests engine-tests ds41rt_cuda_engine_tests 120 ''
  for i in 1 2; do  # against main's ds41rt bundled as build/dev/ds41rt-main
    bench v41-branch$i ds41rt v41 X=1 -- --concurrency 1,4 --prefill ''
    bench v41-main$i $MAIN v41 X=1 -- --concurrency 1,4 --prefill ''
  done
  bench v41-traced ds41rt v41 CUDA_INJECTION64_PATH=$PWD/build/dev/lib/libkernel_trace.so KTRACE_OUT=$O/trace-v41.csv -- --concurrency 1 --prefill ''
  python3 tools/device/trace_table.py $O/trace-v41.csv > $O/trace-v41.txt 2>&1; echo "== trace: rc $?"
  grep -E 'graphed steps|scores|route_kernel' $O/trace-v41.txt | head -5
  ;;
report)
  bench v41 ds41rt v41 X=1 -- --concurrency 1,4,16
  bench v4 ds41rt v4 X=1 -- --concurrency 1,4,16
  for n in v41 v4; do echo "---- $n"; sed -n '/^| concurrency/,/^$/p;/^| section/,/^$/p' $O/bench-$n/bench.md; done
  ;;
esac
