#!/usr/bin/env bash
# Session 19 run 4: A = 36de60e; B1 = A + one-token instances for reference numerics too (wo_a's
# bf16 GEMV) + the DS41RT_GEMV_FP4_WAVES switch (MXFP4 matrices' K slices sized for that many
# waves); B2 = A + the switch + the routed MXFP4 ONE kernel at 7 blocks an SM (72 registers),
# without reference ONE (run 3 had both and was 0.15 ms slower than A at one wave). B1's GEMV /
# MoE GPU tests at waves 3, then V4.1 C1 64 steps at waves 1 / 2 / 3 (twice, reversed), C4 / C16.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export NCCL_NVLS_ENABLE=0
O=$OUT
W=/tmp/w; mkdir -p $W/a $W/b1 $W/b2
tar -C $W/a -xJf build/ab/A.tar.xz; tar -C $W/b1 -xJf build/ab/B1.tar.xz; tar -C $W/b2 -xJf build/ab/B2.tar.xz
ln -s $W/b1/d/lib $W/b2/d/lib
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date
echo "## cuda tests (B1, DS41RT_GEMV_FP4_WAVES=3): gemv, moe"
DS41RT_GEMV_FP4_WAVES=3 LD_LIBRARY_PATH=$W/b1/d/lib timeout 200 $W/b1/d/ds41rt_cuda_tests --gtest_filter='*Gemv*:*Moe*:*Routed*:*Nvfp4*' > $O/cuda-tests.log 2>&1; echo rc=$?
grep -E '^\[  (PASSED|FAILED)|FAILED' $O/cuda-tests.log | head -20
run() {  # side waves label concurrency steps
  local s=$1 w=$2 l=$3 c=$4 n=$5
  DS41RT_GEMV_FP4_WAVES=$w LD_LIBRARY_PATH=$W/$s/d/lib:$NCCL_LIB timeout 150 $W/$s/d/ds41rt bench --layers 16 --prefill '' --out $W/j-$s-$w-$l --model-type v41 --decode-steps $n --concurrency $c > $O/bench-$s-$w-$l.log 2>&1
  echo "== $s waves $w $l: $(grep -o 'steps median [0-9.]*' $O/bench-$s-$w-$l.log | tr '\n' ' ')"; grep "bench: decode C[0-9]*:" $O/bench-$s-$w-$l.log | cut -c1-60
}
run a 1 c1 1 64; run b1 1 c1 1 64; run b1 2 c1 1 64; run b1 3 c1 1 64; run b2 1 c1 1 64; run b2 2 c1 1 64; run b2 3 c1 1 64
run b2 3 c1r 1 64; run b2 2 c1r 1 64; run b2 1 c1r 1 64; run b1 3 c1r 1 64; run b1 2 c1r 1 64; run b1 1 c1r 1 64; run a 1 c1r 1 64
run a 1 c4-16 4,16 32; run b1 3 c4-16 4,16 32; run b2 3 c4-16 4,16 32
date
