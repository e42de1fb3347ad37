#!/usr/bin/env bash
# The H200 run of the CUDA backend (issue 4), reproducible in one command on the device machine
# from a bundle made by tools/device/bundle.sh: every GPU test (kernels against the CPU
# reference), the GPU engine's fixture tests (against the CPU engine and transformers), and
# `ds41rt bench` on full-size V4.1 and V4 dummy weights (decode at C1 / C4 / C16, prefill of 1K to
# 32K tokens, the weight products' table against the copy and matrix rates measured in the same
# run). Logs and bench.json / bench.md go to OUT.
# Usage: tools/device/h200_run.sh OUT [BUILD_DIR] [PARTS]
#   env LAYERS / V4_LAYERS: dummy layers (default: 16 on a card of 100 GB or more, else 8, what
#   fits beside the activations of a 32K prefill); COMMIT: the label bench records.
#   PARTS: any of tests, serve, v41, v4 (default all four), for splitting the run over calls.
set -uo pipefail
OUT=${1:?usage: h200_run.sh OUT [BUILD_DIR] [PARTS]}
B=${2:-build}
PARTS=${3:-tests serve v41 v4}
D=$B/dev
if [ -f "$B/dev.tar.xz" ]; then rm -rf "$D" && tar -C "$B" -xJf "$B/dev.tar.xz"; fi  # never a stale bundle
# The engine tests find the fixtures where the build put them (DS41RT_FIXTURES_DIR).
[ -e /work/main/tests/fixtures ] || { mkdir -p /work/main/tests; ln -s "$PWD/tests/fixtures" /work/main/tests/fixtures; }
# ds41rt and ds41rt_cuda_engine_tests link libnccl.so.2 (the NCCL transport), which the bundle
# leaves out: take the device's own (python's nvidia.nccl package, torch's), or NCCL_LIB. bench
# loads cuBLASLt at run time for the matrix rates: python's nvidia.cublas, or the toolkit's.
export NCCL_NVLS_ENABLE=0
if [ -z "${NCCL_LIB:-}" ]; then
  NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
fi
CUBLAS_LIB=$(dirname "$(find /usr/local /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
export LD_LIBRARY_PATH="$D/lib${NCCL_LIB:+:$NCCL_LIB}${CUBLAS_LIB:+:$CUBLAS_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
default_layers=$([ "${mem_mib:-0}" -ge 100000 ] && echo 16 || echo 8)
rc=0
has() { [[ " $PARTS " == *" $1 "* ]]; }
if has tests; then
  "$D/ds41rt_cuda_tests" > "$OUT/cuda-tests.log" 2>&1 || rc=1
  grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda-tests.log"
  "$D/ds41rt_cuda_engine_tests" > "$OUT/cuda-engine-tests.log" 2>&1 || rc=1
  grep -E '^\[  (PASSED|FAILED)|gpu vs cpu' "$OUT/cuda-engine-tests.log"
fi
if has serve; then
  # The GPU engine behind the HTTP API: the same greedy completion as the CPU engine's.
  M=tests/fixtures/deepseek-v41-flash-quant
  req='{"model":"deepseek-ai/DeepSeek-V4.1-Flash","prompt":"hello world","max_tokens":12,"temperature":0}'
  for be in cpu cuda; do
    "$D/ds41rt" serve --model "$M" --tokenizer "$M/tokenizer.json" --backend "$be" --port 18181 > "$OUT/serve-$be.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do curl -sf localhost:18181/health > /dev/null && break; sleep 0.2; done
    curl -s localhost:18181/v1/completions -H 'content-type: application/json' -d "$req" > "$OUT/completion-$be.json"
    kill "$pid"; wait "$pid"
  done
  python3 - "$OUT" <<'PY' || rc=1
import json, sys
t = [json.load(open(f"{sys.argv[1]}/completion-{b}.json"))["choices"][0]["text"] for b in ("cpu", "cuda")]
print("serve: cpu and cuda completions", "identical" if t[0] == t[1] else "DIFFER", repr(t[1]))
sys.exit(t[0] != t[1])
PY
fi
for model in v41 v4; do
  has $model || continue
  layers=$([ $model = v41 ] && echo "${LAYERS:-$default_layers}" || echo "${V4_LAYERS:-$default_layers}")
  "$D/ds41rt" bench --model-type $model --layers "$layers" --decode-steps 32 --concurrency 1,4,16 \
    --commit "${COMMIT:-unknown}" --out "$OUT/bench-$model" 2>&1 | tee "$OUT/bench-$model.log" | grep -v '^$' || rc=1
  # A prompt as serve feeds it by default (--prefill-chunk 512): what a user's prefill gets.
  "$D/ds41rt" bench --model-type $model --layers "$layers" --concurrency '' --prefill 2048 --prefill-chunk 512 \
    --commit "${COMMIT:-unknown}" --out "$OUT/bench-$model-chunk512" 2>&1 | tee "$OUT/bench-$model-chunk512.log" |
    grep 'prefill' || rc=1
done
exit $rc
