#!/usr/bin/env bash
# Session 16 run 3: the reproducible run of 740a539 (tools/device/h200_run.sh), then ncu tables of
# one C16 and one C4 step (2 layers) for where the batched step's time goes.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -e /work/main/tests/fixtures ] || { mkdir -p /work/main/tests; ln -s "$PWD/tests/fixtures" /work/main/tests/fixtures; }
mkdir -p /tmp/b && cp build/ab/dev.tar.xz /tmp/b/
COMMIT=740a539 timeout 400 bash tools/device/h200_run.sh $OUT/r /tmp/b; echo "h200_run rc=$?"
export LD_LIBRARY_PATH=/tmp/b/dev/lib:$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
for c in 16 4; do
echo "## ncu C$c 2 layers"
timeout 100 ncu --clock-control none --graph-profiling node --cache-control none --metrics gpu__time_duration.sum --csv /tmp/b/dev/ds41rt bench --model-type v41 --layers 2 --decode-steps 2 --concurrency $c --context 16 --prefill '' --out /tmp/ncu-$c > /tmp/ncu-$c.csv 2>/dev/null
python3 tools/device/kernel_table.py /tmp/ncu-$c.csv 45 | tee $OUT/kernels-c$c.txt
done
