#!/usr/bin/env bash
# Session 16 run 1: B's GPU tests and engine tests, attention / engram timing of A and B, ncu C1
# table of B, A/B bench V4.1.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -e /work/main/tests/fixtures ] || { mkdir -p /work/main/tests; ln -s "$PWD/tests/fixtures" /work/main/tests/fixtures; }
export NCCL_NVLS_ENABLE=0
O=$OUT
W=/tmp/w; mkdir -p $W/a $W/b
tar -C $W/a -xJf build/ab/A.tar.xz; tar -C $W/b -xJf build/ab/B.tar.xz
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
date
echo "## cuda tests (B)"
LD_LIBRARY_PATH=$W/b/d/lib timeout 240 $W/b/d/ds41rt_cuda_tests > $O/cuda-tests.log 2>&1; echo rc=$?
grep -E '^\[  (PASSED|FAILED)|FAILED|key rows|attention|engram|Engram' $O/cuda-tests.log | head -60
for s in a b; do
echo "## attention + engram timing ($s)"
LD_LIBRARY_PATH=$W/$s/d/lib timeout 60 $W/$s/d/ds41rt_cuda_tests --gtest_filter='CudaAttention.TimingAtV41Shape:CudaEngram.V41DecodeAndPrefill' 2>&1 | grep -E '\[ time|us|OK|FAIL'
done
date
echo "## engine tests (B)"
LD_LIBRARY_PATH=$W/b/d/lib:$NCCL_LIB timeout 200 $W/b/d/ds41rt_cuda_engine_tests > $O/engine-tests.log 2>&1; echo rc=$?
grep -E '^\[  (PASSED|FAILED)|FAILED|logits differ|gpu vs cpu' $O/engine-tests.log | head -40
date
for s in b; do
echo "## ncu C1 2 layers ($s)"
LD_LIBRARY_PATH=$W/$s/d/lib:$NCCL_LIB timeout 120 ncu --clock-control none --graph-profiling node --cache-control none --metrics gpu__time_duration.sum --csv $W/$s/d/ds41rt bench --model-type v41 --layers 2 --decode-steps 2 --concurrency 1 --context 16 --prefill '' --out $W/ncu-$s > $O/ncu-$s.csv 2>/dev/null
python3 tools/device/kernel_table.py $O/ncu-$s.csv 40 > $O/kernels-$s.txt; cat $O/kernels-$s.txt
done
date
MODEL=v41 CONC=1,4,16 STEPS=32 bash tools/device/ab_bench.sh $O/ab-v41 build/ab/A.tar.xz build/ab/B.tar.xz 2
date
