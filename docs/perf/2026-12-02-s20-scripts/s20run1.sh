#!/usr/bin/env bash
# Session 20 run 1: where the C1 step's time goes at 4a50b66 (A). The 16-layer C1 bench, then
# Nsight Compute: the routed MXFP4 kernel's launches (full set: stall reasons, occupancy, SASS
# stall samples), the FP8 / MXFP4 GEMV launches of one layer (the same sections less source),
# and every kernel of one C1 step of 2 layers (profile_step.sh).
cd "$(dirname "$0")/../../.."
AB_SIDES=A source tools/device/ab_env.sh
D=$W/a/d; ln -sfn $W/a/d $W/a/dev  # profile_step.sh takes BUILD_DIR/dev
export LD_LIBRARY_PATH=$D/lib:$NCCL_LIB
date
ab_bench a c1 --model-type v41 --decode-steps 64 --concurrency 1
ab_sections a c1
date
BENCH2=(bench --model-type v41 --layers 2 --decode-steps 6 --concurrency 1 --context 16 --prefill '')
N="ncu --clock-control none --graph-profiling node --cache-control none"
# The routed kernel: 2 layers x (up, down) a step; skip the warm-up steps' launches.
$N -k regex:moe_routed_mxfp4 --launch-skip 12 --launch-count 2 --set full --import-source no -o $OUT/routed \
  "$D/ds41rt" "${BENCH2[@]}" --out $W/np1 > $W/ncu-routed.log 2>&1; echo "ncu routed rc=$?"; tail -3 $W/ncu-routed.log
ncu --import $OUT/routed.ncu-rep --page raw --csv > $W/routed-raw.csv 2>&1
python3 tools/device/ncu_metrics.py $W/routed-raw.csv
ncu --import $OUT/routed.ncu-rep --page source --print-source sass --csv > $OUT/routed-sass.csv 2> $W/sass.err; echo "sass rc=$?"; head -c 600 $W/sass.err
date
# The GEMV launches of one layer (9 or so), after the warm-up.
$N -k regex:gemv_kernel --launch-skip 60 --launch-count 10 --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats --section SchedulerStats -o $W/gemv \
  "$D/ds41rt" "${BENCH2[@]}" --out $W/np2 > $W/ncu-gemv.log 2>&1; echo "ncu gemv rc=$?"; tail -3 $W/ncu-gemv.log
ncu --import $W/gemv.ncu-rep --page raw --csv > $W/gemv-raw.csv 2>&1
python3 tools/device/ncu_metrics.py $W/gemv-raw.csv | tee $OUT/gemv-metrics.txt
date
LAYERS=2 bash tools/device/profile_step.sh $W/ps $W/a > /dev/null 2>&1; echo "profile_step rc=$?"
cp $W/ps/kernels-v41.txt $OUT/kernels-c1-2layers.txt; head -45 $OUT/kernels-c1-2layers.txt
date
