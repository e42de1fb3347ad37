#!/usr/bin/env bash
# Session 19 run 2: which one-token instances pay. A = 7117741; B = run 1's B with the
# DS41RT_GEMV_ONE switch: all (MXFP4 and FP8 GEMVs of M = 1), fp4 (MXFP4 only), 0 (none: the new
# MXFP4 decode alone). GEMV quick bench of B all / fp4 (run 1: wo_b M1 16.98 -> 19.03 us with
# ONE), then V4.1 C1 64 steps with the decode section table of each.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export NCCL_NVLS_ENABLE=0
O=$OUT
W=/tmp/w; mkdir -p $W/a $W/b
tar -C $W/a -xJf build/ab/A.tar.xz; tar -C $W/b -xJf build/ab/B.tar.xz
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date
for one in all fp4; do
  echo "## gemv quick (b, ONE=$one)"
  DS41RT_GEMV_ONE=$one LD_LIBRARY_PATH=$W/b/d/lib timeout 100 $W/b/d/ds41rt_cuda_bench $W/q-$one quick > $O/gemv-quick-$one.log 2>&1; echo rc=$?
  grep -E "M1 " $O/gemv-quick-$one.log
done
run() {  # side one label
  local s=$1 one=$2 l=$3
  DS41RT_GEMV_ONE=$one LD_LIBRARY_PATH=$W/$s/d/lib:$NCCL_LIB timeout 150 $W/$s/d/ds41rt bench --layers 16 --prefill '' --out $W/j-$s-$one-$l --model-type v41 --decode-steps 64 --concurrency 1 > $O/bench-$s-$one-$l.log 2>&1
  echo "== $s ONE=$one $l"; grep "bench: decode C[0-9]*:\|bench: C1 reads" $O/bench-$s-$one-$l.log
  sed -n '/^| section (profiled steps)/,/^$/p' $W/j-$s-$one-$l/bench.md | head -40 > $O/sections-$s-$one-$l.md
}
run a all 1; run b all 1; run b fp4 1; run b 0 1
run b 0 2; run b fp4 2; run b all 2; run a all 2
for f in $O/sections-a-all-1.md $O/sections-b-all-1.md $O/sections-b-fp4-1.md $O/sections-b-0-1.md; do echo "## $f"; cat $f; done
date
