#!/usr/bin/env bash
# Session 27's device runs (from the repository root on the device machine, with build/dev.tar.xz
# from tools/device/bundle.sh carried along; build/dev/ds41rt-s26 is 4ae113a's ds41rt, before the
# page pools, for an A/B on the same card).
#   runs.sh check: the page pools' and packed keys' GPU tests (attention, indexer, key lists, cache
#     records), every engine test, and the engine tests again with DS41RT_PACKED_KV=1.
#   runs.sh decode: V4.1 C1 / C16 decode, fp32 against packed window KV and entries, and the
#     s26 binary (fp32 index keys, no pages); the C1 bench.md of each to the console.
#   runs.sh ncu-decode: one layer's C1 decode kernels under Nsight Compute (time, speed of light).
#   runs.sh final: every engine test with the landed defaults, and V4.1's full bench.
#   runs.sh v4packed: V4's packed KV records (built after the session's last run): tests and C1 / C16.
#   runs.sh report LAYERS: the full bench (decode C1 / C4 / C16, prefill 1K..32K) of V4.1 and V4.
# Outputs under $O; everything ends up in $O/../all.tar.gz (a device call returns few files).
set -o pipefail
source tools/device/dev_env.sh  # COMMIT, O, L, LIBS, bench(); fixtures linked; the card printed
case "${1:-check}" in
check)
  LD_LIBRARY_PATH=$LIBS timeout 120 build/dev/ds41rt_cuda_tests --gtest_filter='CudaAttention*:CudaIndexer*:CudaKeyList*:CudaCachePack*' > $O/tests.log 2>&1
  grep -E '^\[  (PASSED|FAILED)|^\[  FAILED|paged' $O/tests.log | grep -v '\[ time \]' | head -30
  LD_LIBRARY_PATH=$LIBS timeout 200 build/dev/ds41rt_cuda_engine_tests > $O/engine-tests.log 2>&1
  grep -E '^\[  (PASSED|FAILED)|^\[  FAILED|packed kv|fp32 index' $O/engine-tests.log | head -30
  DS41RT_PACKED_KV=1 LD_LIBRARY_PATH=$LIBS timeout 120 build/dev/ds41rt_cuda_engine_tests --gtest_filter='V41/*' > $O/engine-tests-packed.log 2>&1
  grep -E '^\[  (PASSED|FAILED)|^\[  FAILED' $O/engine-tests-packed.log | head -30
  ;;
decode)
  bench c1 ds41rt v41 X=1 -- --concurrency 1,16 --prefill ''
  bench c1-packed ds41rt v41 DS41RT_PACKED_KV=1 -- --concurrency 1,16 --prefill ''
  bench c1-s26 ds41rt-s26 v41 X=1 -- --concurrency 1,16 --prefill ''
  for n in c1 c1-packed; do echo "---- $n"; sed -n '/^| section/,/^$/p;/^| product/,/^$/p' $O/bench-$n/bench.md | head -60; done
  ;;
ncu-decode)  # one V4.1 layer's C1 decode steps under Nsight Compute: every kernel's time and speed of light
  LD_LIBRARY_PATH=$LIBS timeout 200 /usr/local/cuda/bin/ncu --clock-control none --kernel-name-base demangled \
    -k regex:'moe_routed|gemv|dense_narrow|scores_whole|pv_kernel|collapse|hc_|route_topk|sampling|fill_key|index_rows|topk' --launch-skip 150 --launch-count 120 --section SpeedOfLight --print-summary per-kernel \
    build/dev/ds41rt bench --model-type v41 --layers 1 --concurrency 1 --prefill '' --decode-steps 8 --out $O/ncu-bench \
    > $O/ncu-decode.txt 2>&1
  echo "== ncu-decode: rc $?"; grep -E '^  [a-z_:<>]|Duration|DRAM Throughput|Memory Throughput' $O/ncu-decode.txt | head -150
  ;;
final)  # the defaults as landed (packed KV on): every engine test, then V4.1's full bench
  LD_LIBRARY_PATH=$LIBS timeout 200 build/dev/ds41rt_cuda_engine_tests > $O/engine-tests.log 2>&1
  grep -E '^\[  (PASSED|FAILED)|^\[  FAILED|packed kv|gpu vs cpu' $O/engine-tests.log | head -30
  [ -n "$TESTS_ONLY" ] && exit 0
  bench v41 ds41rt v41 X=1 -- --concurrency 1,4,16
  sed -n '/^| concurrency/,/^$/p;/^| section/,/^$/p' $O/bench-v41/bench.md
  ;;
v4packed)  # for the next run: V4's packed KV records (built after run 4): tests, then C1 / C16 with and without
  LD_LIBRARY_PATH=$LIBS timeout 100 build/dev/ds41rt_cuda_tests --gtest_filter='CudaCachePack*:CudaAttention.Packed*' > $O/v4p-tests.log 2>&1
  grep -E '^\[  (PASSED|FAILED)|^\[  FAILED' $O/v4p-tests.log | head -20
  DS41RT_PACKED_KV=1 LD_LIBRARY_PATH=$LIBS timeout 120 build/dev/ds41rt_cuda_engine_tests --gtest_filter='V4/*' > $O/v4p-engine.log 2>&1
  grep -E '^\[  (PASSED|FAILED)|^\[  FAILED|packed kv' $O/v4p-engine.log | head -20
  bench v4-c1 ds41rt v4 X=1 -- --concurrency 1,16 --prefill ''
  bench v4-c1-packed ds41rt v4 DS41RT_PACKED_KV=1 -- --concurrency 1,16 --prefill ''
  ;;
report)
  bench v41 ds41rt v41 X=1 -- --concurrency 1,4,16
  bench v4 ds41rt v4 X=1 -- --concurrency 1,4,16
  for n in v41 v4; do echo "---- $n"; sed -n '/^| concurrency/,/^$/p;/^| section/,/^$/p' $O/bench-$n/bench.md; done
  ;;
esac
