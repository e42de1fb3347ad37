#!/usr/bin/env bash
# The H200 run of the CUDA backend (issue 4), reproducible in one command on the device machine
# from a bundle made by tools/device/bundle.sh: every GPU test (kernels against the CPU
# reference), the GPU engine's fixture tests (against the CPU engine and transformers), and
# `ds41rt bench` on full-size V4.1 and V4 dummy weights. Logs and bench.json / bench.md go to OUT.
# Usage: tools/device/h200_run.sh OUT [BUILD_DIR] (env LAYERS / V4_LAYERS: dummy layers, default 16; COMMIT)
set -uo pipefail
OUT=${1:?usage: h200_run.sh OUT [BUILD_DIR]}
B=${2:-build}
D=$B/dev
if [ -f "$B/dev.tar.xz" ]; then rm -rf "$D" && tar -C "$B" -xJf "$B/dev.tar.xz"; fi  # never a stale bundle
# ds41rt and ds41rt_cuda_engine_tests link libnccl.so.2 (the NCCL transport), which the bundle
# leaves out: take the device's own (python's nvidia.nccl package, torch's), or NCCL_LIB.
export NCCL_NVLS_ENABLE=0
if [ -z "${NCCL_LIB:-}" ]; then
  NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
fi
export LD_LIBRARY_PATH="$D/lib${NCCL_LIB:+:$NCCL_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
rc=0
"$D/ds41rt_cuda_tests" > "$OUT/cuda-tests.log" 2>&1 || rc=1
grep -E '^\[  (PASSED|FAILED)' "$OUT/cuda-tests.log"
"$D/ds41rt_cuda_engine_tests" > "$OUT/cuda-engine-tests.log" 2>&1 || rc=1
grep -E '^\[  (PASSED|FAILED)|gpu vs cpu' "$OUT/cuda-engine-tests.log"
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
"$D/ds41rt" bench --model-type v41 --layers "${LAYERS:-16}" --decode-steps 16 --concurrency 1,4,16 \
  --prefill 512,2048 --commit "${COMMIT:-unknown}" --out "$OUT/bench-v41" 2>&1 | tee "$OUT/bench-v41.log" | grep -v '^$' || rc=1
"$D/ds41rt" bench --model-type v4 --layers "${V4_LAYERS:-16}" --decode-steps 16 --concurrency 1,4,16 \
  --prefill 512,2048 --commit "${COMMIT:-unknown}" --out "$OUT/bench-v4" 2>&1 | tee "$OUT/bench-v4.log" | grep -v '^$' || rc=1
exit $rc
