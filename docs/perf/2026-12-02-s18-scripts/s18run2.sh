#!/usr/bin/env bash
# Session 18 run 2: where the C1 mean leaves the median: every step's time, graphs and eager
# (bench with the step series, cmd_bench.cpp as of this run), V4.1 and V4, 16 layers.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
O=$OUT
W=/tmp/w; mkdir -p $W/s
tar -C $W/s -xJf build/ab/S.tar.xz
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
run() {  # label args...
  local l=$1; shift
  LD_LIBRARY_PATH=$W/s/d/lib:$NCCL_LIB timeout 150 $W/s/d/ds41rt bench --layers 16 --prefill '' --out $W/j-$l "$@" > $O/bench-$l.log 2>&1
  echo "== $l"; grep "bench: decode" $O/bench-$l.log
}
run v41-c1 --model-type v41 --decode-steps 64 --concurrency 1
run v41-c4-16 --model-type v41 --decode-steps 32 --concurrency 4,16
run v4-c1 --model-type v4 --decode-steps 64 --concurrency 1
run v41-c1-ctx1k --model-type v41 --decode-steps 64 --concurrency 1 --context 1024
date
