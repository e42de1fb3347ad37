#!/usr/bin/env bash
# On the device machine: `ds41rt bench` of two builds, alternated ROUNDS times in one run (the
# card's state drifts between runs by about as much as a small change moves C1), each bundle
# made by ab_bundle.sh. Prints every run's decode lines; the full logs go to OUT.
# Usage: tools/device/ab_bench.sh OUT A.tar.xz B.tar.xz [ROUNDS] (env MODEL v41 | v4, LAYERS 16,
# STEPS 32, CONC 1,16, PREFILL: prompt lengths, e.g. 2048,8192 (default none), each printed with
# its largest sections; SECTIONS=1: each run's decode section table, every concurrency; EXTRA: more
# bench arguments)
set -uo pipefail
OUT=${1:?usage: ab_bench.sh OUT A.tar.xz B.tar.xz [ROUNDS]}
A=${2:?}; B=${3:?}; ROUNDS=${4:-2}
mkdir -p "$OUT"
W=$(mktemp -d)
for side in a b; do
  mkdir -p "$W/$side"
  tar -C "$W/$side" -xJf "$([ $side = a ] && echo "$A" || echo "$B")"
done
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for r in $(seq "$ROUNDS"); do
  for side in a b; do
    log="$OUT/bench-$side-$r.log"
    LD_LIBRARY_PATH="$W/$side/d/lib${NCCL_LIB:+:$NCCL_LIB}" "$W/$side/d/ds41rt" bench --model-type "${MODEL:-v41}" --layers "${LAYERS:-16}" --decode-steps "${STEPS:-32}" \
      --concurrency "${CONC:-1,16}" --prefill "${PREFILL:-}" --out "$W/json-$side-$r" ${EXTRA:-} > "$log" 2>&1
    echo "== $side round $r"
    grep "bench: decode" "$log"
    [ -z "${PREFILL:-}" ] || sed -n '/^| prefill tokens/,$p' "$W/json-$side-$r/bench.md" | tail -n +3 | tee -a "$log"
    [ -z "${SECTIONS:-}" ] || sed -n '/^| section (profiled steps)/,/^$/p' "$W/json-$side-$r/bench.md" | tee -a "$log"
  done
done
rm -rf "$W"
