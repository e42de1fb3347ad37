#!/usr/bin/env bash
# Session 26's device runs (session 25's plan, which never got a machine), as sent (from the repository root on the device machine, with
# build/dev.tar.xz from tools/device/bundle.sh carried along; build/dev/ds41rt-base is 068e0e5's
# ds41rt, for a sanity A/B).
#   runs.sh groups: every GPU test (packed cache records as attention keys and V4.1's entries
#     stored as them, packed index keys staged a word at a time, the grouped GEMM's short tiles,
#     finish_rows), the indexer's timings, the grouped MXFP4 GEMM on its own at V4.1's
#     shapes in every setting (ds41rt_cuda_bench grouped: tile heights, the L2 256-byte fetch, the
#     probes; the dense products in both tile widths), then the whole prefill with the short tiles
#     (groups, single products, both) against the tall ones at 8192 tokens and all-grouped at 1024,
#     and with the packed index keys.
set -o pipefail
export COMMIT=${COMMIT:-unknown} NCCL_NVLS_ENABLE=0
O=${O:-/tmp/o}
mkdir -p $O
NCCL=$(python3 -c 'import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],"lib"))' 2>/dev/null)
mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
L=${LAYERS:-$([ "${mem_mib:-0}" -ge 100000 ] && echo 16 || echo 8)}
CUBLAS=$(dirname "$(find /usr/local /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
LIBS=build/dev/lib:$NCCL:$CUBLAS
bench() {  # NAME BINARY ENV... -- ARGS... (prefill only, unless ARGS hold --concurrency C --prefill '')
  local name=$1 bin=$2; shift 2
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  local conc=(--concurrency ''); [[ " $* " == *" --concurrency "* ]] && conc=()
  env "${envs[@]}" LD_LIBRARY_PATH=$LIBS timeout 150 build/dev/$bin bench --model-type v41 --layers "$L" \
    "${conc[@]}" --commit "$COMMIT-$name" --out "$O/bench-$name" "$@" > "$O/bench-$name.log" 2>&1
  echo "== $name: $(grep -E '^\| [0-9]+ \|' "$O/bench-$name/bench.md" | cut -d'|' -f2-5 | tr '\n' ';')"
  grep -E '^\| ffn.experts' "$O/bench-$name/bench.md"
}
case "${1:-groups}" in
groups)  # most telling first: a cut-off run still returns what it measured
  [ -e /work/main/tests/fixtures ] || { mkdir -p /work/main/tests; ln -s "$PWD/tests/fixtures" /work/main/tests/fixtures; }
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  LD_LIBRARY_PATH=$LIBS timeout 100 build/dev/ds41rt_cuda_tests --gtest_filter='CudaAttention*:CudaCachePack*:CudaKeyList*:CudaGemmFp8*' > $O/new-tests.log 2>&1
  grep -E '^\[  (PASSED|FAILED)|tiles 128 x 256|grouped.*rel err' $O/new-tests.log | head -30
  LD_LIBRARY_PATH=$LIBS timeout 150 build/dev/ds41rt_cuda_engine_tests > $O/cuda-engine-tests.log 2>&1
  grep -E '^\[  (PASSED|FAILED)|gpu vs cpu' $O/cuda-engine-tests.log | head -40
  LD_LIBRARY_PATH=$LIBS timeout 150 build/dev/ds41rt_cuda_bench $O grouped 2>&1 | tee $O/grouped-console.txt | tail -80
  bench t256 ds41rt X=1 -- --prefill 8192
  bench t128 ds41rt DS41RT_GEMM_GROUP_ROWS=128 -- --prefill 8192
  bench both128 ds41rt DS41RT_GEMM_GROUP_ROWS=128 DS41RT_GEMM_IMAGE_COLS=128 -- --prefill 8192
  bench kv-packed ds41rt DS41RT_PACKED_KV=1 -- --prefill 8192
  bench c1 ds41rt X=1 -- --concurrency 1,16 --prefill ''
  bench c1-kv-packed ds41rt DS41RT_PACKED_KV=1 -- --concurrency 1,16 --prefill ''
  bench t256-g1 ds41rt DS41RT_GROUPED_MIN_ROWS=1 -- --prefill 1024
  bench t128-g1 ds41rt DS41RT_GROUPED_MIN_ROWS=1 DS41RT_GEMM_GROUP_ROWS=128 -- --prefill 1024
  bench packed ds41rt DS41RT_PACKED_INDEX_KEYS=1 -- --prefill 8192
  bench base ds41rt-base X=1 -- --prefill 8192
  LD_LIBRARY_PATH=$LIBS timeout 200 build/dev/ds41rt_cuda_tests > $O/cuda-tests.log 2>&1
  grep -E '^\[  (PASSED|FAILED)|index_scores' $O/cuda-tests.log | head -30
  ;;
paged)  # session 27: the page pools (binaries -paged): the indexer's and key lists' paged reads, every engine test
  LD_LIBRARY_PATH=$LIBS timeout 80 build/dev/ds41rt_cuda_tests-paged --gtest_filter='CudaIndexer*:CudaKeyList*:CudaAttention.Packed*' > $O/paged-tests.log 2>&1
  grep -E '^\[  (PASSED|FAILED)|FAILED|paged' $O/paged-tests.log | head -30
  LD_LIBRARY_PATH=$LIBS timeout 150 build/dev/ds41rt_cuda_engine_tests-paged > $O/paged-engine-tests.log 2>&1
  grep -E '^\[  (PASSED|FAILED)|FAILED' $O/paged-engine-tests.log | head -30
  DS41RT_PACKED_KV=1 DS41RT_PACKED_INDEX_KEYS=1 LD_LIBRARY_PATH=$LIBS timeout 100 build/dev/ds41rt_cuda_engine_tests-paged --gtest_filter='V41/GpuVsCpu.*:V4/GpuVsCpu.*' > $O/paged-packed-engine-tests.log 2>&1
  grep -E '^\[  (PASSED|FAILED)|FAILED' $O/paged-packed-engine-tests.log | head -30
  ;;
benches)  # the whole-model runs of groups alone, after short
  bench t256 ds41rt X=1 -- --prefill 8192
  bench t128 ds41rt DS41RT_GEMM_GROUP_ROWS=128 -- --prefill 8192
  bench both128 ds41rt DS41RT_GEMM_GROUP_ROWS=128 DS41RT_GEMM_IMAGE_COLS=128 -- --prefill 8192
  bench c1 ds41rt X=1 -- --concurrency 1,16 --prefill ''
  bench c1-kv-packed ds41rt DS41RT_PACKED_KV=1 -- --concurrency 1,16 --prefill ''
  bench kv-packed ds41rt DS41RT_PACKED_KV=1 -- --prefill 8192
  ;;
short)  # what a few minutes can show: the new paths' tests, then the grouped GEMM's tiles
  [ -e /work/main/tests/fixtures ] || { mkdir -p /work/main/tests; ln -s "$PWD/tests/fixtures" /work/main/tests/fixtures; }
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  LD_LIBRARY_PATH=$LIBS timeout 60 build/dev/ds41rt_cuda_tests --gtest_filter='CudaAttention.Packed*:CudaCachePack*:CudaKeyList*:CudaGemmFp8*' > $O/new-tests.log 2>&1
  grep -E '^\[  (PASSED|FAILED)|tiles 128 x 256|grouped.*rel err' $O/new-tests.log | head -30
  LD_LIBRARY_PATH=$LIBS timeout 90 build/dev/ds41rt_cuda_engine_tests --gtest_filter='V41/GpuVsCpu.*:V4/GpuVsCpu.PrefillAndGreedyDecode/*' > $O/cuda-engine-tests.log 2>&1
  grep -E '^\[  (PASSED|FAILED)|gpu vs cpu|packed kv' $O/cuda-engine-tests.log | head -40
  LD_LIBRARY_PATH=$LIBS timeout 100 build/dev/ds41rt_cuda_bench $O grouped 2>&1 | tee $O/grouped-console.txt | tail -60
  ;;
esac
