#!/usr/bin/env bash
# Session 24's device runs, as sent (from the repository root on the device machine, with
# build/dev.tar.xz from tools/device/bundle.sh carried along; build/dev/ds41rt-base is f88919c's
# ds41rt, for A/Bs in the same run).
#   runs.sh decode: every GPU test, then the grouped MXFP4 decode rewrite (session 23's patch)
#     against f88919c at 1K-8K tokens, and with every expert on the grouped GEMM (1K / 2K).
#   runs.sh ring: the ring shapes of the grouped MXFP4 GEMM (DS41RT_GEMM_FP4_RING, from
#     grouped-decode-and-ring-shapes.patch) against f88919c; never ran (the device time left after
#     fourteen refused requests allowed only ring-min).
#   runs.sh ring-min (run 2): every GPU test, then four shapes at 8192 tokens.
#   runs.sh bench: tools/device/h200_run.sh's V4.1 bench.
set -o pipefail
export COMMIT=${COMMIT:-unknown}
O=${O:-/tmp/o}  # results (a folder under $OUT keeps what a cut-off run wrote)
mkdir -p $O
NCCL=$(python3 -c 'import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],"lib"))' 2>/dev/null)
mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
L=${LAYERS:-$([ "${mem_mib:-0}" -ge 100000 ] && echo 16 || echo 8)}
bench() {  # NAME BINARY ENV... -- ARGS...
  local name=$1 bin=$2; shift 2
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" LD_LIBRARY_PATH=build/dev/lib:$NCCL timeout 150 build/dev/$bin bench --model-type v41 --layers "$L" \
    --concurrency '' --commit "$COMMIT-$name" --out "$O/bench-$name" "$@" > "$O/bench-$name.log" 2>&1
  echo "== $name: $(grep -E '^\| [0-9]+ \|' "$O/bench-$name/bench.md" | cut -d'|' -f2-5 | tr '\n' ';')"
  grep -E '^\| ffn.experts' "$O/bench-$name/bench.md"
}
case "${1:-decode}" in
decode)
  timeout 240 bash tools/device/h200_run.sh $O build tests 2>&1 | tee $O/console.log
  bench new ds41rt X=1 -- --prefill 1024,2048,4096,8192
  bench base ds41rt-base X=1 -- --prefill 1024,2048,4096,8192
  bench new-grouped1 ds41rt DS41RT_GROUPED_MIN_ROWS=1 -- --prefill 1024,2048
  bench base-grouped1 ds41rt-base DS41RT_GROUPED_MIN_ROWS=1 -- --prefill 1024,2048
  ;;
ring)  # run 2, cut to the device time left: the grouped MXFP4 GEMM's ring shapes
  # (DS41RT_GEMM_FP4_RING=STAGESxRAW; 3x4 is f88919c's shape with the decode rewrite) against
  # f88919c, then the GEMM tests in every shape and the GPU-vs-CPU engine tests in the default
  tar -C build -xJf build/dev.tar.xz
  bench r-base ds41rt-base X=1 -- --prefill 8192
  for r in 3x4 4x4 4x6 3x12; do bench r-$r ds41rt DS41RT_GEMM_FP4_RING=$r -- --prefill 8192; done
  bench r1-base ds41rt-base DS41RT_GROUPED_MIN_ROWS=1 -- --prefill 1024
  for r in 4x6 3x12; do bench r1-$r ds41rt DS41RT_GROUPED_MIN_ROWS=1 DS41RT_GEMM_FP4_RING=$r -- --prefill 1024; done
  [ -e /work/main/tests/fixtures ] || { mkdir -p /work/main/tests; ln -s "$PWD/tests/fixtures" /work/main/tests/fixtures; }
  for r in 3x4 4x4 4x6 3x12; do
    DS41RT_GEMM_FP4_RING=$r LD_LIBRARY_PATH=build/dev/lib:$NCCL build/dev/ds41rt_cuda_tests --gtest_filter='CudaGemmFp8*' > $O/gemm-tests-$r.log 2>&1
    echo "gemm tests, ring $r: $(grep -E '^\[  (PASSED|FAILED)' $O/gemm-tests-$r.log | tr '\n' ' ')"
  done
  DS41RT_GEMM_FP8_RING=4x3 LD_LIBRARY_PATH=build/dev/lib:$NCCL build/dev/ds41rt_cuda_tests --gtest_filter='CudaGemmFp8*' > $O/gemm-tests-fp8-4x3.log 2>&1
  echo "gemm tests, FP8 ring 4x3: $(grep -E '^\[  (PASSED|FAILED)' $O/gemm-tests-fp8-4x3.log | tr '\n' ' ')"
  LD_LIBRARY_PATH=build/dev/lib:$NCCL timeout 120 build/dev/ds41rt_cuda_engine_tests --gtest_filter='*GpuVsCpu*' > $O/engine-tests.log 2>&1
  grep -E '^\[  (PASSED|FAILED)|gpu vs cpu' $O/engine-tests.log
  ;;
ring-min)  # cut to what the device time left allows: every GPU test (the packed index keys, the
  # default ring shape), the ring shapes at 8192 tokens against f88919c, the GEMM tests in two more
  timeout 150 bash tools/device/h200_run.sh $O build tests 2>&1
  bench r-base ds41rt-base X=1 -- --prefill 8192
  for r in 3x4 4x6 3x12; do bench r-$r ds41rt DS41RT_GEMM_FP4_RING=$r -- --prefill 8192; done
  for r in 3x4 3x12; do
    DS41RT_GEMM_FP4_RING=$r LD_LIBRARY_PATH=build/dev/lib:$NCCL build/dev/ds41rt_cuda_tests --gtest_filter='CudaGemmFp8*' > $O/gemm-tests-$r.log 2>&1
    echo "gemm tests, ring $r: $(grep -E '^\[  (PASSED|FAILED)' $O/gemm-tests-$r.log | tr '\n' ' ')"
  done
  ;;
bench)
  LAYERS=$L timeout 580 bash tools/device/h200_run.sh $O build v41 2>&1 | tee $O/console.log
  ;;
esac
