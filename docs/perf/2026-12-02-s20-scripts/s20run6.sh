#!/usr/bin/env bash
# Session 20 run 6. A = b6ef244; W = A with gemv_tuning waves 2 and fp4_waves 1 (FP8 GEMVs sliced
# for two waves of items as the MXFP4 ones are; MXFP4 unchanged). Run 5's E (the attention expand
# fused with the FFN collapse) moved nothing: C1 3.89 / 3.87 -> 3.89 / 3.87 ms. W's GPU tests and
# engine tests, V4.1 C1 64 steps A W W A, C4 / C16 of A and W, then ncu of one C1 step of A
# (2 layers, profile_step.sh).
cd "$(dirname "$0")/../../.."
AB_SIDES="A W" source tools/device/ab_env.sh
date
ab_tests w
date
KEEP=$OUT; OUT=$W  # bench logs stay on the device; their lines are printed
ab_bench a c1-1 --model-type v41 --decode-steps 64 --concurrency 1
ab_bench w c1-1 --model-type v41 --decode-steps 64 --concurrency 1
ab_bench w c1-2 --model-type v41 --decode-steps 64 --concurrency 1
ab_bench a c1-2 --model-type v41 --decode-steps 64 --concurrency 1
for s in a w; do ab_bench $s c4-16 --model-type v41 --decode-steps 32 --concurrency 4,16; done
date
ln -sfn $W/a/d $W/a/dev
LAYERS=2 LD_LIBRARY_PATH=$NCCL_LIB bash tools/device/profile_step.sh $W/ps $W/a > /dev/null 2>&1; echo "profile_step rc=$?"
cp $W/ps/kernels-v41.txt $KEEP/kernels-c1-2layers-b6ef244.txt; head -32 $KEEP/kernels-c1-2layers-b6ef244.txt
date
