#!/usr/bin/env bash
# Session 20 run 2. A = 4a50b66; B = A + one-token GEMV items take x and its activation scales
# through the weight ring (run 1: x's loads were the routed kernel's longest stall); C = B + every
# GEMV item lets its successor launch right after its PDL wait, and the routed MXFP4 kernels read
# the group kernel's outputs and start their weight stream before their wait. C's GPU tests and
# engine tests, C's GEMV quick bench, then V4.1 C1 64 steps A B C C B A, and C4 / C16 for A and C.
cd "$(dirname "$0")/../../.."
AB_SIDES="A B C" source tools/device/ab_env.sh
date
ab_tests c
echo "## gemv quick (c)"
LD_LIBRARY_PATH=$W/c/d/lib timeout 100 $W/c/d/ds41rt_cuda_bench $W/q quick > $OUT/gemv-quick-c.log 2>&1; echo rc=$?
grep -E "M1 " $OUT/gemv-quick-c.log
date
for s in a b c; do ab_bench $s c1-1 --model-type v41 --decode-steps 64 --concurrency 1; done
for s in c b a; do ab_bench $s c1-2 --model-type v41 --decode-steps 64 --concurrency 1; done
ab_sections c c1-1
for s in a c; do ab_bench $s c4-16 --model-type v41 --decode-steps 32 --concurrency 4,16; done
date
