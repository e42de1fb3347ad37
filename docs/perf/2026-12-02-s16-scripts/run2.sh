#!/usr/bin/env bash
# Session 16 run 2: B's GPU tests and engine tests, the L2 prefetch timing, ncu C1 table of B,
# bench A (2c75a50) against B with DS41RT_L2_PREFETCH=0 and =1, V4.1 16 layers.
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
LD_LIBRARY_PATH=$W/b/d/lib timeout 240 $W/b/d/ds41rt_cuda_tests > $O/cuda-tests.log 2>&1; echo rc=$?
grep -E '^\[  (PASSED|FAILED)|FAILED|l2_prefetch|after l2|row_strides|Strides|CudaL2' $O/cuda-tests.log | head -40
date
echo "## engine tests (B)"
LD_LIBRARY_PATH=$W/b/d/lib:$NCCL_LIB timeout 200 $W/b/d/ds41rt_cuda_engine_tests > $O/engine-tests.log 2>&1; echo rc=$?
grep -E '^\[  (PASSED|FAILED)|FAILED|logits differ|gpu vs cpu' $O/engine-tests.log | head -40
date
echo "## ncu C1 2 layers (B, prefetch on)"
LD_LIBRARY_PATH=$W/b/d/lib:$NCCL_LIB timeout 120 ncu --clock-control none --graph-profiling node --cache-control none --metrics gpu__time_duration.sum --csv $W/b/d/ds41rt bench --model-type v41 --layers 2 --decode-steps 2 --concurrency 1 --context 16 --prefill '' --out $W/ncu-b > $O/ncu-b.csv 2>/dev/null
python3 tools/device/kernel_table.py $O/ncu-b.csv 40 > $O/kernels-b.txt; cat $O/kernels-b.txt
date
bench() {  # side label env
  LD_LIBRARY_PATH="$W/$1/d/lib:$NCCL_LIB" env $3 "$W/$1/d/ds41rt" bench --model-type v41 --layers 16 --decode-steps 32 \
    --concurrency 1,4,16 --prefill '' --out "$W/json-$2" > "$O/bench-$2.log" 2>&1
  echo "== $2"; grep "bench: decode" "$O/bench-$2.log"
}
for r in 1 2; do
  bench a a-$r DS41RT_L2_PREFETCH=1
  bench b b-nopf-$r DS41RT_L2_PREFETCH=0
  bench b b-pf-$r DS41RT_L2_PREFETCH=1
done
date
