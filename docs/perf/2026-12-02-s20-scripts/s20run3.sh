#!/usr/bin/env bash
# Session 20 run 3. A = 4a50b66; B = A + one-token GEMV items take x and its activation scales
# through the weight ring (run 2's B); B2 = B for MXFP4 only (FP8's one-token items load x from
# global memory as in A). Run 2's C (B + early PDL triggers in every GEMV, routed kernels reading
# the routing before their wait) was slower: C1 3.99-4.02 against B's 3.95-3.96, C4 7.49 -> 7.96,
# C16 19.84 -> 21.36 ms. B's GPU tests and engine tests, the GEMV quick bench of B and B2, V4.1
# C1 64 steps A B B2 B2 B A, C4 / C16 of A and B, and ncu of B's routed kernel.
cd "$(dirname "$0")/../../.."
AB_SIDES="A B B2" source tools/device/ab_env.sh
date
ab_tests b
for s in b b2; do
  echo "## gemv quick ($s)"
  LD_LIBRARY_PATH=$W/$s/d/lib timeout 100 $W/$s/d/ds41rt_cuda_bench $W/q-$s quick > $W/gemv-quick-$s.log 2>&1; echo rc=$?
  grep -E "M1 " $W/gemv-quick-$s.log
done
date
for s in a b b2; do ab_bench $s c1-1 --model-type v41 --decode-steps 64 --concurrency 1; done
for s in b2 b a; do ab_bench $s c1-2 --model-type v41 --decode-steps 64 --concurrency 1; done
for s in a b; do ab_bench $s c4-16 --model-type v41 --decode-steps 32 --concurrency 4,16; done
date
D=$W/b/d
LD_LIBRARY_PATH=$D/lib:$NCCL_LIB ncu --clock-control none --graph-profiling node --cache-control none -k regex:moe_routed_mxfp4 \
  --launch-skip 12 --launch-count 2 --set full --import-source no -o $W/routed-b \
  "$D/ds41rt" bench --model-type v41 --layers 2 --decode-steps 6 --concurrency 1 --context 16 --prefill '' --out $W/np1 > $W/ncu.log 2>&1
echo "ncu rc=$?"
ncu --import $W/routed-b.ncu-rep --page raw --csv > $W/routed-raw.csv 2>&1
python3 tools/device/ncu_metrics.py $W/routed-raw.csv
ncu --import $W/routed-b.ncu-rep --page source --print-source sass --csv > $OUT/routed-b-sass.csv 2> /dev/null
date
