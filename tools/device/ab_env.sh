# Sourced by a device-machine run script (bash), from the repository root: what every A/B run
# of the session scripts under docs/perf/*-scripts/ repeated. Unpacks build/ab/<SIDE>.tar.xz
# (ab_bundle.sh) for each side named in AB_SIDES (default "A B") into $W/<side, lower case>,
# links the test fixtures where the engine tests look for them, keeps NVLink multicast off, and
# defines (SIDE: the side's name in lower case, e.g. a, b2):
#   ab_tests SIDE           the GPU op tests and the GPU engine tests of that side's bundle
#                           (logs under $OUT, PASSED / FAILED lines and the engine's error lines)
#   ab_bench SIDE LABEL ARGS...
#                           `ds41rt bench --layers ${LAYERS:-16} --prefill '' ARGS` of that side,
#                           log $OUT/bench-SIDE-LABEL.log, its decode and roofline lines printed
#   ab_sections SIDE LABEL  the decode section table of that bench run
#   ab_profile SIDE         ncu's kernel table of one C1 step of ${PROFILE_LAYERS:-2} layers
#                           (profile_step.sh), $OUT/kernels-SIDE.txt, its top printed
set -uo pipefail
[ -e /work/main/tests/fixtures ] || { mkdir -p /work/main/tests; ln -s "$PWD/tests/fixtures" /work/main/tests/fixtures; }
export NCCL_NVLS_ENABLE=0
W=${W:-/tmp/w}
for s in ${AB_SIDES:-A B}; do
  l=$(echo "$s" | tr 'A-Z' 'a-z')
  mkdir -p "$W/$l"
  tar -C "$W/$l" -xJf "build/ab/$s.tar.xz"
  # A bundle packed without its libraries borrows the first side's (ab_bundle.sh's lib/ is the
  # same for two builds of one tree, and two copies may not fit the carry limit).
  [ -d "$W/$l/d/lib" ] || ln -s "$W/$(echo "${AB_SIDES:-A B}" | awk '{print tolower($1)}')/d/lib" "$W/$l/d/lib"
done
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

ab_tests() {
  local s=$1
  echo "## cuda tests ($s)"
  LD_LIBRARY_PATH=$W/$s/d/lib timeout 200 "$W/$s/d/ds41rt_cuda_tests" > "$OUT/cuda-tests-$s.log" 2>&1; echo rc=$?
  grep -E '^\[  (PASSED|FAILED)|FAILED' "$OUT/cuda-tests-$s.log" | head -20
  echo "## engine tests ($s)"
  LD_LIBRARY_PATH=$W/$s/d/lib:$NCCL_LIB timeout 150 "$W/$s/d/ds41rt_cuda_engine_tests" > "$OUT/engine-tests-$s.log" 2>&1; echo rc=$?
  grep -E '^\[  (PASSED|FAILED)|FAILED|logits differ|gpu vs cpu' "$OUT/engine-tests-$s.log" | head -40
}

ab_bench() {
  local s=$1 l=$2
  shift 2
  LD_LIBRARY_PATH=$W/$s/d/lib:$NCCL_LIB timeout 150 "$W/$s/d/ds41rt" bench --layers "${LAYERS:-16}" --prefill '' \
    --out "$W/j-$s-$l" "$@" > "$OUT/bench-$s-$l.log" 2>&1
  echo "== $s $l"
  grep "bench: decode C[0-9]*:\|bench: C1 reads" "$OUT/bench-$s-$l.log"
}

ab_sections() {
  sed -n '/^| section (profiled steps)/,/^$/p' "$W/j-$1-$2/bench.md"
}

ab_profile() {
  LAYERS=${PROFILE_LAYERS:-2} LD_LIBRARY_PATH=$NCCL_LIB bash tools/device/profile_step.sh "$W/ps-$1" "$W/$1/d" > /dev/null 2>&1
  echo "== profile $1 rc=$?"
  cp "$W/ps-$1/kernels-${MODEL:-v41}.txt" "$OUT/kernels-$1.txt" && head -32 "$OUT/kernels-$1.txt"
}
