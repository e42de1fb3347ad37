#!/usr/bin/env bash
# Session 19 run 1: A = 7117741 (session 18's last commit), B = A + the MXFP4 decode through hb
# bytes and a byte permute (11 integer ops per 8 codes, was 15) + one-token (M = 1) instances of
# the official GEMV kernels that skip the second token column's scale products. B's GPU tests (all) and engine
# tests (7117741's indexer / run_linears refactor had not run on a GPU yet), the GEMV quick bench
# of A and B, then bench A / B: V4.1 C1 64 steps (A B B A), C4 / C16.
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
for s in a b; do
  echo "## gemv quick ($s)"
  LD_LIBRARY_PATH=$W/$s/d/lib timeout 100 $W/$s/d/ds41rt_cuda_bench $W/q-$s quick > $O/gemv-quick-$s.log 2>&1; echo rc=$?
  grep -E "expert|copy|wq_b|wo_b" $O/gemv-quick-$s.log
done
run() {  # side label args...
  local s=$1 l=$2; shift 2
  LD_LIBRARY_PATH=$W/$s/d/lib:$NCCL_LIB timeout 150 $W/$s/d/ds41rt bench --layers 16 --prefill '' --out $W/j-$s-$l "$@" > $O/bench-$s-$l.log 2>&1
  echo "== $s $l"; grep "bench: decode C[0-9]*:\|bench: C1 reads" $O/bench-$s-$l.log
}
for s in a b; do run $s v41-c1 --model-type v41 --decode-steps 64 --concurrency 1; done
for s in b a; do run $s v41-c1-2 --model-type v41 --decode-steps 64 --concurrency 1; done
for s in a b; do run $s v41-c4-16 --model-type v41 --decode-steps 32 --concurrency 4,16; done
date
