#!/usr/bin/env bash
# Session 18 run 4: ncu kernel sequence of one C1 step of 4 V4.1 layers (layers 2-3 have the
# ratio-2 compressor and indexer), 762b4b4 + the bench's unprofiled warm-up.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
O=$OUT
W=/tmp/w; mkdir -p $W/p
tar -C $W/p -xJf build/ab/P.tar.xz
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for ctx in 16 17; do
LD_LIBRARY_PATH=$W/p/d/lib:$NCCL_LIB timeout 200 ncu --clock-control none --graph-profiling node --cache-control none --metrics gpu__time_duration.sum --csv \
  $W/p/d/ds41rt bench --model-type v41 --layers 4 --decode-steps 2 --warmup-steps 3 --concurrency 1 --context $ctx --prefill '' --out $W/bp > $O/ncu-$ctx.csv 2> $O/ncu-$ctx.err
python3 tools/device/kernel_table.py $O/ncu-$ctx.csv 45 --sequence > $O/kernels-c1-4layers-ctx$ctx.txt
head -50 $O/kernels-c1-4layers-ctx$ctx.txt
done
date
