#!/usr/bin/env bash
# Session 22's device runs, as sent (from the repository root on the device machine, with
# build/dev.tar.xz from tools/device/bundle.sh of the commit named carried along).
# Run 1 (b1f705e) and run 2 (d7d1a3a), both on an NVIDIA H100 80GB HBM3 (the H200 asked for was
# not lent); run 2 also timed the routed prefill with the grouped GEMM for every expert size:
set -o pipefail
export COMMIT=${COMMIT:-b1f705e}
timeout 570 bash tools/device/h200_run.sh /tmp/o build "tests v41" 2>&1 | tee /tmp/o-console.log
L=$(grep -o 'loaded [0-9]* layers' /tmp/o/bench-v41.log | grep -o '[0-9]*')
DS41RT_GROUPED_MIN_ROWS=1 LD_LIBRARY_PATH=build/dev/lib:$(python3 -c 'import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],"lib"))') \
  build/dev/ds41rt bench --model-type v41 --layers "${L:-8}" --concurrency '' --prefill 1024,2048,4096,8192 \
  --commit "$COMMIT-grouped1" --out /tmp/o/bench-v41-grouped1
