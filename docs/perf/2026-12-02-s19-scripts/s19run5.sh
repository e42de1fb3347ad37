#!/usr/bin/env bash
# Session 19 run 5: the session's last code. A = 36de60e; B = A + gemv_tuning::fp4_waves = 2
# (MXFP4 matrices sliced for two waves of items). B's GPU tests (all) and engine tests, then V4.1
# C1 64 steps (A B B A) and C4 / C16 (A B).
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
echo "## cuda tests (B)"
LD_LIBRARY_PATH=$W/b/d/lib timeout 200 $W/b/d/ds41rt_cuda_tests > $O/cuda-tests.log 2>&1; echo rc=$?
grep -E '^\[  (PASSED|FAILED)|FAILED' $O/cuda-tests.log | head -20
echo "## engine tests (B)"
LD_LIBRARY_PATH=$W/b/d/lib:$NCCL_LIB timeout 150 $W/b/d/ds41rt_cuda_engine_tests > $O/engine-tests.log 2>&1; echo rc=$?
grep -E '^\[  (PASSED|FAILED)|FAILED|logits differ|gpu vs cpu' $O/engine-tests.log | head -40
date
run() {  # side label concurrency steps
  local s=$1 l=$2 c=$3 n=$4
  LD_LIBRARY_PATH=$W/$s/d/lib:$NCCL_LIB timeout 150 $W/$s/d/ds41rt bench --layers 16 --prefill '' --out $W/j-$s-$l --model-type v41 --decode-steps $n --concurrency $c > $O/bench-$s-$l.log 2>&1
  echo "== $s $l"; grep "bench: decode C[0-9]*:\|bench: C1 reads" $O/bench-$s-$l.log
}
run a c1 1 64; run b c1 1 64; run b c1r 1 64; run a c1r 1 64
run a c4-16 4,16 32; run b c4-16 4,16 32
date
