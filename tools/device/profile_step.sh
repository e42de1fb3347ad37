#!/usr/bin/env bash
# Kernel times of one decode step on the device machine: Nsight Compute over a short
# `ds41rt bench` (dummy weights, LAYERS layers, C1), then tools/device/kernel_table.py on the
# last step (each kernel alone: launch gaps are not in it; the bench's ms/step has them), at the
# clocks the card runs (--clock-control none: ncu's default locks them to base, inflating times).
# Usage: tools/device/profile_step.sh OUT [DIR] (env LAYERS, default 2; MODEL v41 | v4). DIR: a
# build folder holding dev/ (bundle.sh's layout, default build) or an unpacked ab_bundle.sh
# bundle's d/ (ds41rt and lib/ in it).
set -uo pipefail
OUT=${1:?usage: profile_step.sh OUT [DIR]}
D=${2:-build}
{ [ -x "$D/ds41rt" ] && [ -d "$D/lib" ]; } || D=$D/dev
export LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$OUT"
ncu --clock-control none --graph-profiling node --cache-control none --metrics gpu__time_duration.sum --csv \
  "$D/ds41rt" bench --model-type "${MODEL:-v41}" --layers "${LAYERS:-2}" --decode-steps 2 --concurrency 1 \
  --context 16 --prefill '' --out "$OUT/bench-profiled" > "$OUT/ncu-${MODEL:-v41}.csv" 2> "$OUT/ncu-${MODEL:-v41}.err"
python3 "$(dirname "$0")/kernel_table.py" "$OUT/ncu-${MODEL:-v41}.csv" 40 --sequence | tee "$OUT/kernels-${MODEL:-v41}.txt"
