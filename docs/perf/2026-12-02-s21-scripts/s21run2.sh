#!/usr/bin/env bash
# Session 21 run 2. A = 00321be; R = A + q's RoPE inside the attention's score launch, the
# output's inverse RoPE and the P.V fold inside the P.V launch (three launches a layer fewer),
# plus DS41RT_GEMV_WAVES / DS41RT_GEMV_FP4_WAVES overrides. R's GPU tests and engine tests,
# V4.1 C1 64 steps A R R A, R with the FP8 GEMVs sliced for half a wave and three quarters
# (MXFP4 kept at two waves), C4 / C16 of A and R, V4 C1 of A and R.
cd "$(dirname "$0")/../../.."
AB_SIDES="A R" source tools/device/ab_env.sh
date
ab_tests r
grep -E "FusedRope|OK \] CudaAttention" $OUT/cuda-tests-r.log | head
date
KEEP=$OUT; OUT=$W
ab_bench a c1-1 --model-type v41 --decode-steps 64 --concurrency 1
ab_bench r c1-1 --model-type v41 --decode-steps 64 --concurrency 1
ab_bench r c1-2 --model-type v41 --decode-steps 64 --concurrency 1
ab_bench a c1-2 --model-type v41 --decode-steps 64 --concurrency 1
DS41RT_GEMV_WAVES=0.5 DS41RT_GEMV_FP4_WAVES=4 ab_bench r w05-1 --model-type v41 --decode-steps 64 --concurrency 1
DS41RT_GEMV_WAVES=0.75 DS41RT_GEMV_FP4_WAVES=2.6667 ab_bench r w075-1 --model-type v41 --decode-steps 64 --concurrency 1
DS41RT_GEMV_WAVES=0.5 DS41RT_GEMV_FP4_WAVES=4 ab_bench r w05-2 --model-type v41 --decode-steps 64 --concurrency 1
ab_bench r c1-3 --model-type v41 --decode-steps 64 --concurrency 1
for s in a r; do ab_bench $s c4-16 --model-type v41 --decode-steps 32 --concurrency 4,16; done
DS41RT_GEMV_WAVES=0.5 DS41RT_GEMV_FP4_WAVES=4 ab_bench r w05-c4-16 --model-type v41 --decode-steps 32 --concurrency 4,16
for s in a r; do ab_bench $s v4-c1 --model-type v4 --decode-steps 64 --concurrency 1; done
date
