#!/usr/bin/env bash
# Session 19 run 3: A = 36de60e (MXFP4 decode + official one-token instances); B = A + one-token
# instances for reference numerics too (the official bf16 linears, e.g. wo_a, run the reference
# GEMV) + the routed MXFP4 ONE kernel held to 7 blocks an SM (72 registers), with the experiment
# switch DS41RT_GEMV_FP4_MIN_SLICES (K slices of MXFP4 matrices, default 1: C1's routed launches
# run one 16-row tile a warp and ~13 warps an SM). B's GEMV / MoE GPU tests and engine tests, then
# V4.1 C1 64 steps: A, B, B slices 2, B slices 3 (twice, reversed), C4 / C16 A, B, B slices 2.
set -uo pipefail
cd "$(dirname "$0")/../../.."
[ -e /work/main/tests/fixtures ] || { mkdir -p /work/main/tests; ln -s "$PWD/tests/fixtures" /work/main/tests/fixtures; }
export NCCL_NVLS_ENABLE=0
O=$OUT
W=/tmp/w; mkdir -p $W/a $W/b
tar -C $W/a -xJf build/ab/A.tar.xz; tar -C $W/b -xJf build/ab/B.tar.xz
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date
echo "## cuda tests (B): gemv, moe"
LD_LIBRARY_PATH=$W/b/d/lib timeout 200 $W/b/d/ds41rt_cuda_tests --gtest_filter='*Gemv*:*Moe*:*Routed*:*Nvfp4*' > $O/cuda-tests.log 2>&1; echo rc=$?
grep -E '^\[  (PASSED|FAILED)|FAILED' $O/cuda-tests.log | head -20
echo "## engine tests (B)"
LD_LIBRARY_PATH=$W/b/d/lib:$NCCL_LIB timeout 150 $W/b/d/ds41rt_cuda_engine_tests > $O/engine-tests.log 2>&1; echo rc=$?
grep -E '^\[  (PASSED|FAILED)|FAILED|logits differ|gpu vs cpu' $O/engine-tests.log | head -40
date
run() {  # side slices label concurrency steps
  local s=$1 k=$2 l=$3 c=$4 n=$5
  DS41RT_GEMV_FP4_MIN_SLICES=$k LD_LIBRARY_PATH=$W/$s/d/lib:$NCCL_LIB timeout 150 $W/$s/d/ds41rt bench --layers 16 --prefill '' --out $W/j-$s-$k-$l --model-type v41 --decode-steps $n --concurrency $c > $O/bench-$s-$k-$l.log 2>&1
  echo "== $s slices $k $l"; grep "bench: decode C[0-9]*:\|bench: C1 reads" $O/bench-$s-$k-$l.log
}
run a 1 c1 1 64; run b 1 c1 1 64; run b 2 c1 1 64; run b 3 c1 1 64
run b 3 c1-2 1 64; run b 2 c1-2 1 64; run b 1 c1-2 1 64; run a 1 c1-2 1 64
run a 1 c4-16 4,16 32; run b 1 c4-16 4,16 32; run b 2 c4-16 4,16 32
date
