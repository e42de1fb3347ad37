#!/usr/bin/env bash
# Session 16 run 5: bf16_gemv with x one block ahead: every GPU test, the engine tests, the head
# timing at M 1..16, and the bench with DS41RT_BF16_GEMV_MIN_M 1, 8 and 17 (off), V4.1 16 layers.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -e /work/main/tests/fixtures ] || { mkdir -p /work/main/tests; ln -s "$PWD/tests/fixtures" /work/main/tests/fixtures; }
export NCCL_NVLS_ENABLE=0
O=$OUT
W=/tmp/w; mkdir -p $W/b
tar -C $W/b -xJf build/ab/B.tar.xz
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$W/b/d/lib:$NCCL_LIB
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "## cuda tests"
timeout 200 $W/b/d/ds41rt_cuda_tests > $O/cuda-tests.log 2>&1; echo rc=$?
grep -E '^\[  (PASSED|FAILED)|FAILED|bf16_gemv|dense_linear head' $O/cuda-tests.log | head -40
echo "## engine tests"
timeout 150 $W/b/d/ds41rt_cuda_engine_tests > $O/engine-tests.log 2>&1; echo rc=$?
grep -E '^\[  (PASSED|FAILED)|FAILED' $O/engine-tests.log | head -20
for m in 17 8 1; do
  DS41RT_BF16_GEMV_MIN_M=$m $W/b/d/ds41rt bench --model-type v41 --layers 16 --decode-steps 32 --concurrency 1,4,16 --prefill '' --out $W/j > $O/bench-m$m.log 2>&1
  echo "== min_m $m"; grep "bench: decode" $O/bench-m$m.log
done
