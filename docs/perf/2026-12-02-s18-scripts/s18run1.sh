#!/usr/bin/env bash
# Session 18 run 1: B's GPU tests and engine tests, then the GEMV quick bench A / B alternated.
# A = dc3c85c, B = A + FP8 weight scales in registers before the PDL wait + the ring slot refilled
# right after its stage's wait.
set -uo pipefail
cd "$(dirname "$0")/../.."
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
date
echo "## engine tests (B)"
LD_LIBRARY_PATH=$W/b/d/lib:$NCCL_LIB timeout 150 $W/b/d/ds41rt_cuda_engine_tests > $O/engine-tests.log 2>&1; echo rc=$?
grep -E '^\[  (PASSED|FAILED)|FAILED|logits differ|gpu vs cpu' $O/engine-tests.log | head -40
date
for r in 1 2; do
  for side in a b; do
    LD_LIBRARY_PATH=$W/$side/d/lib timeout 90 $W/$side/d/ds41rt_cuda_bench $W/q-$side-$r quick > $O/quick-$side-$r.log 2>&1
    cp $W/q-$side-$r/gemv.md $O/quick-$side-$r.md 2>/dev/null
    echo "== quick $side $r"; grep -E '^\|' $O/quick-$side-$r.md | head -30
  done
done
date
