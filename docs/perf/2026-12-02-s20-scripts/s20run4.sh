#!/usr/bin/env bash
# Session 20 run 4. A = fd17890 (MXFP4 one-token x through the ring); D = A + the routed experts
# at B = 1 read hc_collapse_norm's split of x instead of splitting it per route (the split launch
# gone); D3 = D + MXFP4 K slices rounded to the nearest count for fp4_waves (C1's routed w2: 2 ->
# 3 slices, 1.21 -> 1.82 waves of the routed kernel's resident warps). D3's GPU tests and engine
# tests, V4.1 C1 64 steps A D D3 D3 D A, C4 / C16 of A and D3.
cd "$(dirname "$0")/../../.."
AB_SIDES="A D D3" source tools/device/ab_env.sh
date
ab_tests d3
grep -E "producer_split|OK \] MoeRouted" $OUT/cuda-tests-d3.log | head
date
OUT=$W  # bench logs stay on the device; their lines are printed
for s in a d d3; do ab_bench $s c1-1 --model-type v41 --decode-steps 64 --concurrency 1; done
for s in d3 d a; do ab_bench $s c1-2 --model-type v41 --decode-steps 64 --concurrency 1; done
for s in a d3; do ab_bench $s c4-16 --model-type v41 --decode-steps 32 --concurrency 4,16; done
date
