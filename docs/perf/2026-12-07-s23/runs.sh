#!/usr/bin/env bash
# Session 23's device runs, as sent (from the repository root on the device machine, with
# build/dev.tar.xz from tools/device/bundle.sh of the commit named carried along).
#   runs.sh tests: every GPU test, then the A/B runs of this session's changes on V4.1 dummy
#     weights: serve's 128-token chunks with every prefill product on the GEMM as before
#     (DS41RT_PREFILL_GEMV_MAX_M=16) and with run_linears' GEMV choice; 512-token chunks; the
#     grouped expert GEMM in its old x-major block order (DS41RT_GEMM_RASTER=jobs) against the new
#     one at 4K / 8K tokens, and for every expert size (DS41RT_GROUPED_MIN_ROWS=1) at 1K / 2K.
#   runs.sh bench: tools/device/h200_run.sh's V4.1 bench (decode C1 / C4 / C16, prefill 1K..32K).
#   runs.sh all: the tests, the chunk-128 GEMM and raster A/Bs, then the bench, in one call;
#   runs.sh ab2: 512-token chunks, the grouped GEMM at 1K-4K in both block orders, V4's bench.
#   runs.sh sampled: serve's CPU and CUDA backends on one seeded, sampled request with logprobs.
#   runs.sh ncu: Nsight Compute on the grouped MXFP4 product (stall reasons, per-instruction samples).
#   runs.sh decode: with grouped-mxfp4-decode.patch applied, the tests and the grouped GEMM A/Bs;
#   decode-short: the GEMM and GPU-vs-CPU tests and one grouped bench. Neither ran: every device
#   request after the ncu calls was refused.
set -o pipefail
export COMMIT=${COMMIT:-unknown}
mkdir -p /tmp/o
NCCL=$(python3 -c 'import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],"lib"))' 2>/dev/null)
mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
L=${LAYERS:-$([ "${mem_mib:-0}" -ge 100000 ] && echo 16 || echo 8)}
bench() {  # NAME ENV... -- ARGS...
  local name=$1; shift
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" LD_LIBRARY_PATH=build/dev/lib:$NCCL timeout 120 build/dev/ds41rt bench --model-type v41 --layers "$L" \
    --concurrency '' --commit "$COMMIT-$name" --out "/tmp/o/bench-$name" "$@" > "/tmp/o/bench-$name.log" 2>&1
  echo "== $name: $(grep -E '^\| [0-9]+ \|' "/tmp/o/bench-$name/bench.md" | cut -d'|' -f2-5 | tr '\n' ';')"
}
case "${1:-tests}" in
tests)
  timeout 300 bash tools/device/h200_run.sh /tmp/o build tests 2>&1 | tee /tmp/o/console.log
  bench chunk128 X=1 -- --prefill 2048 --prefill-chunk 128
  bench chunk128-gemm16 DS41RT_PREFILL_GEMV_MAX_M=16 -- --prefill 2048 --prefill-chunk 128
  bench chunk512 X=1 -- --prefill 2048 --prefill-chunk 512
  bench raster-new X=1 -- --prefill 4096,8192
  bench raster-jobs DS41RT_GEMM_RASTER=jobs -- --prefill 4096,8192
  bench grouped1-new DS41RT_GROUPED_MIN_ROWS=1 -- --prefill 1024,2048
  bench grouped1-jobs DS41RT_GROUPED_MIN_ROWS=1 DS41RT_GEMM_RASTER=jobs -- --prefill 1024,2048
  ;;
bench)
  LAYERS=$L timeout 580 bash tools/device/h200_run.sh /tmp/o build v41 2>&1 | tee /tmp/o/console.log
  ;;
all)  # one call: the tests, the two A/B runs that matter most, then the V4.1 bench in what is left
  timeout 240 bash tools/device/h200_run.sh /tmp/o build tests 2>&1 | tee /tmp/o/console.log
  bench chunk128-gemm16 DS41RT_PREFILL_GEMV_MAX_M=16 -- --prefill 2048 --prefill-chunk 128
  bench raster-jobs DS41RT_GEMM_RASTER=jobs -- --prefill 8192
  LAYERS=$L timeout $((570 - SECONDS)) bash tools/device/h200_run.sh /tmp/o build v41 2>&1 | tee -a /tmp/o/console.log
  ;;
ab2)  # the second call: the remaining A/Bs, and V4's bench
  bench chunk512 X=1 -- --prefill 2048 --prefill-chunk 512
  bench grouped1-new DS41RT_GROUPED_MIN_ROWS=1 -- --prefill 1024,2048,4096
  bench grouped1-jobs DS41RT_GROUPED_MIN_ROWS=1 DS41RT_GEMM_RASTER=jobs -- --prefill 1024,2048,4096
  V4_LAYERS=$L timeout $((560 - SECONDS)) bash tools/device/h200_run.sh /tmp/o build v4 2>&1 | tee -a /tmp/o/console.log
  ;;
sampled)  # serve on the fixture, CPU and CUDA backends, one sampled request with logprobs
  M=tests/fixtures/deepseek-v41-flash-quant
  req='{"model":"deepseek-ai/DeepSeek-V4.1-Flash","prompt":"hello world","max_tokens":16,"temperature":0.9,"top_p":0.95,"seed":7,"logprobs":3,"frequency_penalty":0.5}'
  for be in cpu cuda; do
    LD_LIBRARY_PATH=build/dev/lib:$NCCL build/dev/ds41rt serve --model $M --tokenizer $M/tokenizer.json --backend $be --port 18182 > /tmp/o/s-$be.log 2>&1 &
    pid=$!; for _ in $(seq 100); do curl -sf localhost:18182/health > /dev/null && break; sleep 0.2; done
    curl -s localhost:18182/v1/completions -H 'content-type: application/json' -d "$req" > /tmp/o/c-$be.json; kill $pid; wait $pid
  done
  ;;
ncu)  # the grouped MXFP4 product of one layer's 8192-token prefill: stall reasons, then per-instruction samples
  LD_LIBRARY_PATH=build/dev/lib:$NCCL /usr/local/cuda/bin/ncu --clock-control none --kernel-name-base demangled \
    -k regex:'gemm_kernel<.int.2>' --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats \
    --metrics regex:'smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    build/dev/ds41rt bench --model-type v41 --layers 1 --concurrency '' --prefill 8192 --out /tmp/nb > /tmp/o/ncu-grouped-fp4.txt 2>&1
  LD_LIBRARY_PATH=build/dev/lib:$NCCL /usr/local/cuda/bin/ncu --clock-control none --kernel-name-base demangled \
    -k regex:'gemm_kernel<.int.2>' --launch-count 1 --section SourceCounters --section WarpStateStats -o /tmp/o/g -f \
    build/dev/ds41rt bench --model-type v41 --layers 1 --concurrency '' --prefill 8192 --out /tmp/nb > /dev/null 2>&1
  /usr/local/cuda/bin/ncu -i /tmp/o/g.ncu-rep --page source --csv --print-source sass > /tmp/o/src.csv
  ;;
decode)  # the third call (the grouped MXFP4 decode rewritten): tests, then the grouped GEMM A/Bs
  timeout 240 bash tools/device/h200_run.sh /tmp/o build tests 2>&1 | tee /tmp/o/console.log
  bench decode-new X=1 -- --prefill 1024,2048,4096,8192
  bench decode-grouped1 DS41RT_GROUPED_MIN_ROWS=1 -- --prefill 1024,2048
  bench decode-raster-jobs DS41RT_GEMM_RASTER=jobs -- --prefill 8192
  ;;
decode-short)  # the same, cut to what the device time left allows
  export LD_LIBRARY_PATH=build/dev/lib:$NCCL
  [ -e /work/main/tests/fixtures ] || { mkdir -p /work/main/tests; ln -s "$PWD/tests/fixtures" /work/main/tests/fixtures; }
  tar -C build -xJf build/dev.tar.xz
  build/dev/ds41rt_cuda_tests --gtest_filter='CudaGemmFp8*' > /tmp/o/gemm-tests.log 2>&1; grep -E '^\[  (PASSED|FAILED)' /tmp/o/gemm-tests.log
  build/dev/ds41rt_cuda_engine_tests --gtest_filter='*GpuVsCpu*' > /tmp/o/engine-tests.log 2>&1
  grep -E '^\[  (PASSED|FAILED)|grouped experts vs' /tmp/o/engine-tests.log
  bench decode-grouped1 DS41RT_GROUPED_MIN_ROWS=1 -- --prefill 1024,2048,8192
  grep -E '^\| ffn.experts' /tmp/o/bench-decode-grouped1/bench.md
  ;;
esac
