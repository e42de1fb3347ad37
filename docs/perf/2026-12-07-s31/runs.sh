#!/usr/bin/env bash
# Session 31's device runs (from the repository root on the device machine, with build/dev.tar.xz
# from tools/device/bundle.sh carried along and unpacked); see docs/perf/2026-12-07-session31.md.
# Runs 1-3 were session 30's script (`2026-12-07-s30/runs.sh probe candidate`, `async split
# routed-src`, `report`). This one:
#   runs.sh blocksum (from branch block-sum's checkout): the decode GEMVs' K slices of a tile summed inside their block
#     (gemv_tuning::block_sum; build/dev/ds41rt, this commit) against the counter path in the same
#     binary (DS41RT_GEMV_BLOCK_SUM=0) and candidate-s30's build (build/dev/ds41rt-main): every GPU
#     op and engine test, the decode GEMV quick bench both ways, V4.1 C1 / C4 twice and V4 once
#     each way (candidate-s30's with WITH_MAIN=1), the routed GEMVs under ncu's source view (with
#     WITH_NCU=1). TESTS_FILTER narrows the GPU op tests, REPS sets the V4.1 repeats (short calls).
set -o pipefail
source tools/device/dev_env.sh  # COMMIT, O, L, LIBS, bench(), gtests(); fixtures linked; the card printed
MAIN=${MAIN:-ds41rt-main}
S30=docs/perf/2026-12-07-s30/runs.sh
for mode in "${@:-blocksum}"; do
echo "######## $mode"
case "$mode" in
blocksum)
  gtests tests ds41rt_cuda_tests 240 "${TESTS_FILTER:-}"
  grep -E 'moe routed|MoeRouted.*(OK|FAILED)' $O/tests.log | head -12
  gtests engine-tests ds41rt_cuda_engine_tests 200 ''
  for bs in 1 0; do
    DS41RT_GEMV_BLOCK_SUM=$bs LD_LIBRARY_PATH=$LIBS timeout 100 build/dev/ds41rt_cuda_bench $O/quick-bs$bs quick > $O/quick-bs$bs.log 2>&1
    echo "== quick block_sum $bs: rc $?"; grep -E ' M1 |copy bandwidth' $O/quick-bs$bs.log
  done
  for i in $(seq ${REPS:-2}); do
    bench v41-bs$i ds41rt v41 X=1 -- --concurrency 1,4 --prefill ''
    bench v41-counter$i ds41rt v41 DS41RT_GEMV_BLOCK_SUM=0 -- --concurrency 1,4 --prefill ''
    [ -n "$WITH_MAIN" ] && bench v41-main$i $MAIN v41 X=1 -- --concurrency 1,4 --prefill ''
  done
  bench v4-bs ds41rt v4 X=1 -- --concurrency 1,4 --prefill ''
  bench v4-counter ds41rt v4 DS41RT_GEMV_BLOCK_SUM=0 -- --concurrency 1,4 --prefill ''
  [ -n "$WITH_NCU" ] && bash $S30 routed-src
  ;;
*) bash $S30 "$mode" ;;  # session 30's modes (traced timeline: candidate; report: ...)
esac
done
