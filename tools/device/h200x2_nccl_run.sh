#!/usr/bin/env bash
# The 2-GPU NCCL run (issue 5) from a bundle made by tools/device/bundle.sh: the partial-reduce
# kernel test, the GPU worker tests (TCP) and the NCCL worker tests (coordinator on GPU 0, `ds41rt
# worker` processes on GPU 1), then `ds41rt bench-remote`: full-size V4.1 dummy weights, the first
# LAYERS layers, the last REMOTE of them on TP dummy workers on GPU 1, per-layer round trip at C1
# and C16 and decode tok/s, over TCP and over NCCL. Logs and bench_remote.json / .md go to OUT.
# NCCL is not bundled: NCCL_LIB (default: the lib folder of python's nvidia.nccl package, e.g.
# torch's nvidia-nccl-cu13) goes on LD_LIBRARY_PATH. NVLink SHARP / multicast stays off.
# Usage: tools/device/h200x2_nccl_run.sh OUT [BUILD_DIR]   (env LAYERS 8, REMOTE 4, TP 1, COMMIT, SKIP_TESTS)
set -uo pipefail
OUT=${1:?usage: h200x2_nccl_run.sh OUT [BUILD_DIR]}
B=${2:-build}
D=$B/dev
if [ -f "$B/dev.tar.xz" ]; then rm -rf "$D" && tar -C "$B" -xJf "$B/dev.tar.xz"; fi  # never a stale bundle
export NCCL_NVLS_ENABLE=0
if [ -z "${NCCL_LIB:-}" ]; then
  NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
fi
if [ -z "${NCCL_LIB:-}" ] || [ ! -e "$NCCL_LIB/libnccl.so.2" ]; then
  NCCL_LIB=$(dirname "$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null | xargs -n1 -I{} find {} -name libnccl.so.2 2>/dev/null | head -1)" 2>/dev/null)
fi
echo "libnccl from: ${NCCL_LIB:-<not found>}"
export LD_LIBRARY_PATH="$D/lib${NCCL_LIB:+:$NCCL_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
rc=0
if [ -z "${SKIP_TESTS:-}" ]; then  # SKIP_TESTS=1: the bench only
  "$D/ds41rt_cuda_tests" --gtest_filter='PartialReduce*' > "$OUT/partial-reduce.log" 2>&1 || rc=1
  grep -E '^\[  (PASSED|FAILED)|partial reduce' "$OUT/partial-reduce.log"
  # Bounded: a hang must not eat the bench's time. stdout unbuffered, so a cut log shows where.
  timeout 300 stdbuf -o0 "$D/ds41rt_cuda_engine_tests" --gtest_filter='NcclWorkers*:DummyWorker*:GpuWorker*' \
    > "$OUT/nccl-tests.log" 2>&1 || rc=1
  grep -E '^\[  (PASSED|FAILED|SKIPPED)|nccl worker|dummy worker|gpu worker\] (GPU|CPU) coord' "$OUT/nccl-tests.log"
fi

LAYERS=${LAYERS:-8} REMOTE=${REMOTE:-4} TP=${TP:-1}
python3 - "$LAYERS" "$REMOTE" "$TP" > "$OUT/plan.json" <<'PY'
import json, sys
layers, remote, tp = (int(a) for a in sys.argv[1:4])
workers = [{"endpoint": f"127.0.0.1:{29501 + r}", "device": 1, "transport": "nccl",
            "budget": {"name": f"worker{r}", "budget_bytes": 0}} for r in range(tp)]
ls = [{"layer": l, "remote": True, "ranks": list(range(tp))} if l >= layers - remote else
      {"layer": l, "remote": False, "local_device": 0} for l in range(layers)]
print(json.dumps({"model_type": "deepseek_v41", "format": "official", "num_layers": layers,
                  "coordinator": [{"name": "gpu0", "budget_bytes": 0}], "workers": workers, "layers": ls}, indent=2))
PY
pids=()
for r in $(seq 0 $((TP - 1))); do
  "$D/ds41rt" worker --load-format dummy --model-type v41 --seed 1 --plan "$OUT/plan.json" --rank "$r" --device 1 \
    > "$OUT/worker$r.log" 2>&1 &
  pids+=($!)
done
for r in $(seq 0 $((TP - 1))); do
  for _ in $(seq 600); do grep -q listening "$OUT/worker$r.log" && break; sleep 0.2; done
  grep -q listening "$OUT/worker$r.log" || { echo "worker $r did not start:"; tail -5 "$OUT/worker$r.log"; rc=1; }
done
timeout 300 "$D/ds41rt" bench-remote --plan "$OUT/plan.json" --model-type v41 --seed 1 --rows 1,16 --iters 200 --decode-steps 16 \
  --commit "${COMMIT:-unknown}" --out "$OUT/bench-remote" 2>&1 | tee "$OUT/bench-remote.log" | grep -v '^$' || rc=1
kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null
exit $rc
