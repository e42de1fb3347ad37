#!/usr/bin/env bash
# Probe builds of ds41rt_cuda_bench for the decode GEMVs' instruction-issue question: gemv.cu
# recompiled with -DDS41RT_GEMV_PROBE=P (gemv_kernel.cuh: bit 1 drops the weights' conversions,
# bit 2 x's; wrong sums, timings only) and linked ahead of BUILD's backend library, as
# BUILD/dev/ds41rt_cuda_bench-pP, for tools/device/bundle.sh to pack. Needs a configured and built
# BUILD (its objects and libraries are reused). Usage: gemv_probe_build.sh [BUILD] [P...] (default:
# build, 0 1 2 3).
set -euo pipefail
B=$(cd "${1:-build}" && pwd); shift || true
SRC=$(cd "$(dirname "$0")/../.." && pwd)/src
mkdir -p "$B/dev" "$B/probe"
for P in "${@:-0 1 2 3}"; do
  for p in $P; do
    /usr/local/cuda/bin/nvcc -DDS41RT_HAVE_SM90A -DDS41RT_GEMV_PROBE=$p -I"$SRC" -O3 -DNDEBUG \
      --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] -lineinfo -std=c++17 -x cu \
      -c "$SRC/backend/cuda/gemv.cu" -o "$B/probe/gemv$p.o"
    (cd "$B" && g++ -O3 CMakeFiles/ds41rt_cuda_bench.dir/tests/cuda/gemv_bench.cpp.o \
      CMakeFiles/ds41rt_cuda_bench.dir/tests/cuda/grouped_gemm_bench.cpp.o "probe/gemv$p.o" -o "dev/ds41rt_cuda_bench-p$p" \
      -L/usr/local/cuda/targets/x86_64-linux/lib libds41rt_backend_cuda.a libds41rt_core.a -static-libstdc++ -static-libgcc \
      libds41rt_backend.a libds41rt_core.a /usr/local/cuda/lib/libcudart_static.a -ldl -lcudadevrt -lrt -lpthread)
    strip "$B/dev/ds41rt_cuda_bench-p$p"
    echo "built $B/dev/ds41rt_cuda_bench-p$p"
  done
done
