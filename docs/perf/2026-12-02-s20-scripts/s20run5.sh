#!/usr/bin/env bash
# Session 20 run 5. A = b6ef244 (routed experts at B = 1 on collapse_norm's split); E = A + V4.1's
# attention expand and FFN collapse + norm + split in one launch (hc_expand_collapse_norm). E's GPU
# tests and engine tests, V4.1 C1 64 steps A E E A, C4 / C16 of A and E, V4 C1 of A and E.
cd "$(dirname "$0")/../../.."
AB_SIDES="A E" source tools/device/ab_env.sh
date
ab_tests e
grep -E "CudaCollapseNorm|producer_split" $OUT/cuda-tests-e.log | grep -E "OK|FAILED" | head
date
OUT=$W  # bench logs stay on the device; their lines are printed
ab_bench a c1-1 --model-type v41 --decode-steps 64 --concurrency 1
ab_bench e c1-1 --model-type v41 --decode-steps 64 --concurrency 1
ab_bench e c1-2 --model-type v41 --decode-steps 64 --concurrency 1
ab_bench a c1-2 --model-type v41 --decode-steps 64 --concurrency 1
ab_sections e c1-1
for s in a e; do ab_bench $s c4-16 --model-type v41 --decode-steps 32 --concurrency 4,16; done
for s in a e; do ab_bench $s v4-c1 --model-type v4 --decode-steps 64 --concurrency 1; done
date
