#!/usr/bin/env bash
# Session 18 run 6: B = 48ad339, C = B + the indexer's head weights on the side branch beside the
# compressor's and the indexer's q products. C's engine tests, then bench B / C: V4.1 C1 64 steps
# (B, C, C, B), C4 / C16.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -e /work/main/tests/fixtures ] || { mkdir -p /work/main/tests; ln -s "$PWD/tests/fixtures" /work/main/tests/fixtures; }
export NCCL_NVLS_ENABLE=0
O=$OUT
W=/tmp/w; mkdir -p $W/b $W/c
tar -C $W/b -xJf build/ab/B.tar.xz; tar -C $W/c -xJf build/ab/C.tar.xz
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "## engine tests (C)"
LD_LIBRARY_PATH=$W/c/d/lib:$NCCL_LIB timeout 150 $W/c/d/ds41rt_cuda_engine_tests > $O/engine-tests.log 2>&1; echo rc=$?
grep -E '^\[  (PASSED|FAILED)|FAILED|logits differ|gpu vs cpu' $O/engine-tests.log | head -40
run() {  # side label args...
  local s=$1 l=$2; shift 2
  LD_LIBRARY_PATH=$W/$s/d/lib:$NCCL_LIB timeout 150 $W/$s/d/ds41rt bench --layers 16 --prefill '' --out $W/j-$s-$l "$@" > $O/bench-$s-$l.log 2>&1
  echo "== $s $l"; grep "bench: decode C[0-9]*:\|bench: C1 reads" $O/bench-$s-$l.log
}
for s in b c; do run $s v41-c1 --model-type v41 --decode-steps 64 --concurrency 1; done
for s in c b; do run $s v41-c1-2 --model-type v41 --decode-steps 64 --concurrency 1; done
for s in b c; do run $s v41-c4-16 --model-type v41 --decode-steps 32 --concurrency 4,16; done
date
