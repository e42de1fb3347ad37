#!/usr/bin/env bash
# Session 21 run 1. A = 00321be (b6ef244's kernels); B = A + the FP8 one-token GEMV items take x,
# its activation scales and the tile's weight-scale word through the weight ring
# (docs/perf/2026-12-02-s20-scripts/fp8-one-ring.patch). B's GPU tests and engine tests, the GEMV
# quick bench of both (M1 rows), V4.1 C1 64 steps A B B A, C4 / C16 of A and B, ncu of one C1 step
# of B (2 layers).
cd "$(dirname "$0")/../../.."
AB_SIDES="A B" source tools/device/ab_env.sh
date
ab_tests b
for s in a b; do
  echo "## gemv quick ($s)"
  LD_LIBRARY_PATH=$W/$s/d/lib timeout 100 $W/$s/d/ds41rt_cuda_bench $W/q-$s quick > $OUT/gemv-quick-$s.log 2>&1; echo rc=$?
  grep -E "M1 " $OUT/gemv-quick-$s.log
done
date
KEEP=$OUT; OUT=$W
ab_bench a c1-1 --model-type v41 --decode-steps 64 --concurrency 1
ab_bench b c1-1 --model-type v41 --decode-steps 64 --concurrency 1
ab_bench b c1-2 --model-type v41 --decode-steps 64 --concurrency 1
ab_bench a c1-2 --model-type v41 --decode-steps 64 --concurrency 1
for s in a b; do ab_bench $s c4-16 --model-type v41 --decode-steps 32 --concurrency 4,16; done
date
OUT=$KEEP ab_profile b
date
