#!/usr/bin/env bash
# Session 30's device runs (from the repository root on the device machine, with build/dev.tar.xz
# from tools/device/bundle.sh carried along and unpacked); see docs/perf/2026-12-07-session30.md.
#   runs.sh scores: branch latency-kernels (main's ds41rt bundled as build/dev/ds41rt-main): the
#     decode scores tile with staging warps, the router's picks from registers, PDL release before
#     wait: attention, router and engine tests, V4.1 C1 / C4 twice each way, the branch's timeline.
#   runs.sh split: the routed experts' K slicing in the whole step: MXFP4 GEMVs at fewer, longer
#     slices (DS41RT_GEMV_FP4_WAVES below the default 2; DS41RT_GEMV_MIN_KB of whole rows), V4.1 C1 / C4.
#   runs.sh routed-src: the routed MXFP4 GEMVs (up and down) under Nsight Compute's source view:
#     each SASS instruction's issue and stall samples (the instruction mix per stage).
#   runs.sh probe: ds41rt_cuda_bench quick (the decode GEMVs alone) built four ways from main + the
#     DS41RT_GEMV_PROBE knob (gemv_kernel.cuh; wrong sums): p0 as is, p1 without the weights'
#     conversions, p2 without x's, p3 without both: whether the GEMVs are bound by instruction issue.
#   runs.sh engram: branch engram-device (main's ds41rt bundled as build/dev/ds41rt-main): V4.1's
#     Engram ids hashed on the device, the lookup inside the graph pieces: every engine test
#     (CudaEngramHash, GpuVsCpu among them), V4.1 C1 / C4 twice each way.
#   runs.sh candidate: branch candidate-s30 (main + latency-kernels + engram-device + one-sync;
#     main's ds41rt bundled as build/dev/ds41rt-main): every GPU op test and every engine test,
#     V4.1 C1 / C4 twice each way, V4 once each way, the candidate's timeline. If a test fails,
#     the branches' own modes (scores, engram) tell which.
#   runs.sh async: branch async-gpu (candidate-s30 + decode steps issued ahead), bundled as
#     build/dev/ds41rt-async and ds41rt_cuda_engine_tests-async: every engine test (the issued-ahead
#     twin GpuLogitRows.GpuEngineStepsIssuedAheadPickAsStepSampled among them), V4.1 and V4 C1 / C4
#     with the bench's "issued ahead" timing beside the usual one.
#   runs.sh report: the full bench (decode C1 / C4 / C16, prefill 1K..32K) of V4.1 and V4.
# Several modes in one call: runs.sh scores split. Outputs under $O; everything ends up in
# $O/../all.tar.gz (a device call returns few files).
set -o pipefail
source tools/device/dev_env.sh  # COMMIT, O, L, LIBS, bench(), gtests(); fixtures linked; the card printed
MAIN=${MAIN:-ds41rt-main}
# traced NAME [ENV=VALUE...]: the V4.1 C1 step's timeline under ENV (tools/device/kernel_trace.cpp),
# its table (trace_table.py) in $O/trace-NAME.txt.
traced() {
  local name=$1; shift
  bench $name-traced ds41rt v41 "$@" CUDA_INJECTION64_PATH=$PWD/build/dev/lib/libkernel_trace.so \
    KTRACE_OUT=$O/trace-$name.csv -- --concurrency 1 --prefill ''
  python3 tools/device/trace_table.py $O/trace-$name.csv > $O/trace-$name.txt 2>&1; echo "== trace $name: rc $?"
}
for mode in "${@:-scores}"; do
echo "######## $mode"
case "$mode" in
scores)  # session 29's mode, as written there (its tests, C1 / C4 each way, the timeline)
  bash docs/perf/2026-12-07-s29/runs.sh scores
  ;;
split)
  for w in 1 0.5 0.25; do bench v41-fp4waves$w ds41rt v41 DS41RT_GEMV_FP4_WAVES=$w -- --concurrency 1,4 --prefill ''; done
  bench v41-minkb72 ds41rt v41 DS41RT_GEMV_MIN_KB=72 -- --concurrency 1,4 --prefill ''
  traced fp4w05 DS41RT_GEMV_FP4_WAVES=0.5
  grep -E 'graphed steps|moe_routed_mxfp4' $O/trace-fp4w05.txt | head -4
  ;;
routed-src)
  LD_LIBRARY_PATH=$LIBS timeout 150 /usr/local/cuda/bin/ncu --clock-control none --kernel-name-base function \
    -k regex:'moe_routed_mxfp4' --launch-skip 8 --launch-count 2 --import-source yes \
    --section SpeedOfLight --section SourceCounters --section WarpStateStats --section Occupancy --section LaunchStats \
    -o $O/routed -f build/dev/ds41rt bench --model-type v41 --layers 2 --concurrency 1 --prefill '' --decode-steps 8 \
    --out $O/ncu-bench > $O/routed-ncu.log 2>&1
  echo "== routed ncu: rc $?"
  /usr/local/cuda/bin/ncu -i $O/routed.ncu-rep --print-summary none > $O/routed.txt 2>&1
  grep -E '^  [a-z_]|Duration|Grid Size|Registers|Achieved Occ|Warp Cycles Per Issued|Issued Warp' $O/routed.txt | head -20
  /usr/local/cuda/bin/ncu -i $O/routed.ncu-rep --page source --csv --print-source sass > $O/routed-src.csv 2>&1
  echo "== source page: rc $?, $(wc -l < $O/routed-src.csv) lines"
  ;;
probe)
  for p in 0 1 2 3; do
    LD_LIBRARY_PATH=$LIBS timeout 100 build/dev/ds41rt_cuda_bench-p$p $O/probe$p quick > $O/probe$p.log 2>&1
    echo "== probe p$p: rc $?"; grep -E ' M1 |copy bandwidth' $O/probe$p.log
  done
  ;;
engram)
  gtests engine-tests-engram ds41rt_cuda_engine_tests 200 ''
  grep -E 'EngramHash|GpuVsCpu' $O/engine-tests-engram.log | grep -E 'OK|FAILED' | head -40
  for i in 1 2; do
    bench v41-engram$i ds41rt v41 X=1 -- --concurrency 1,4 --prefill ''
    bench v41-main$i $MAIN v41 X=1 -- --concurrency 1,4 --prefill ''
  done
  ;;
candidate)
  gtests tests ds41rt_cuda_tests 240 ''
  gtests engine-tests ds41rt_cuda_engine_tests 200 ''
  for i in 1 2; do
    bench v41-cand$i ds41rt v41 X=1 -- --concurrency 1,4 --prefill ''
    bench v41-main$i $MAIN v41 X=1 -- --concurrency 1,4 --prefill ''
  done
  bench v4-cand ds41rt v4 X=1 -- --concurrency 1,4 --prefill ''
  bench v4-main $MAIN v4 X=1 -- --concurrency 1,4 --prefill ''
  traced v41
  head -30 $O/trace-v41.txt
  ;;
async)
  gtests engine-tests-async ds41rt_cuda_engine_tests-async 200 ''
  grep -E 'IssuedAhead|EngramHash' $O/engine-tests-async.log | grep -E 'OK|FAILED' | head
  for m in v41 v4; do bench $m-async ds41rt-async $m X=1 -- --concurrency 1,4 --prefill ''; done
  ;;
report)
  bench v41 ds41rt v41 X=1 -- --concurrency 1,4,16
  bench v4 ds41rt v4 X=1 -- --concurrency 1,4,16
  for n in v41 v4; do echo "---- $n"; sed -n '/^| concurrency/,/^$/p;/^| section/,/^$/p' $O/bench-$n/bench.md; done
  ;;
*) echo "unknown mode $mode" ;;
esac
done
