#!/usr/bin/env bash
# Session 18 run 3: B = step pieces captured with their temporaries from one arena (no graph
# memory nodes) + 8 warm-up steps; its GPU engine tests; then bench A (run 2's binary) against B,
# V4.1 and V4 C1 (64 steps) and V4.1 C4 / C16 (32), graphs and eager step series.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -e /work/main/tests/fixtures ] || { mkdir -p /work/main/tests; ln -s "$PWD/tests/fixtures" /work/main/tests/fixtures; }
export NCCL_NVLS_ENABLE=0
O=$OUT
W=/tmp/w; mkdir -p $W/a $W/b
tar -C $W/a -xJf build/ab/S.tar.xz; tar -C $W/b -xJf build/ab/R.tar.xz
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "## engine tests (B)"
LD_LIBRARY_PATH=$W/b/d/lib:$NCCL_LIB timeout 150 $W/b/d/ds41rt_cuda_engine_tests > $O/engine-tests.log 2>&1; echo rc=$?
grep -E '^\[  (PASSED|FAILED)|FAILED|logits differ|gpu vs cpu' $O/engine-tests.log | head -40
run() {  # side label args...
  local s=$1 l=$2; shift 2
  LD_LIBRARY_PATH=$W/$s/d/lib:$NCCL_LIB timeout 150 $W/$s/d/ds41rt bench --layers 16 --prefill '' --out $W/j-$s-$l "$@" > $O/bench-$s-$l.log 2>&1
  echo "== $s $l"; grep "bench: decode" $O/bench-$s-$l.log
}
for r in 1 2; do
  for s in a b; do run $s v41-c1-$r --model-type v41 --decode-steps 64 --concurrency 1; done
done
for s in a b; do run $s v41-c4-16 --model-type v41 --decode-steps 32 --concurrency 4,16; done
for s in a b; do run $s v4-c1 --model-type v4 --decode-steps 64 --concurrency 1; done
date
