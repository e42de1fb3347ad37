# Sourced by a device-machine run script (bash), from the repository root, for runs of the
# bundle tools/device/bundle.sh packs (build/dev, unpacked there first): what the session scripts
# under docs/perf/*/runs.sh each set up. Keeps NVLink multicast off, makes $O, links the test
# fixtures where the engine tests look for them, prints the card, and sets
#   L     layers to bench: $LAYERS, else 16 on a card of 100 GB or more, 8 below
#   LIBS  LD_LIBRARY_PATH for build/dev's binaries: the bundle's libraries, the NCCL wheel's and
#         the toolkit's cuBLASLt (loaded at run time by ds41rt bench)
# and defines bench NAME BINARY MODEL [ENV=VALUE...] -- [ARGS...]: build/dev/BINARY bench of MODEL
# at $L dummy layers with ENV set, into $O/bench-NAME (and .log); prints its summary lines; and
# gtests NAME BINARY TIMEOUT FILTER [ENV=VALUE...]: build/dev/BINARY (a gtest binary; FILTER ''
# for every test) with ENV set, into $O/NAME.log; prints its rc and its PASSED / FAILED lines.
export COMMIT=${COMMIT:-unknown} NCCL_NVLS_ENABLE=0
O=${O:-/tmp/o}
mkdir -p "$O"
[ -e /work/main/tests/fixtures ] || { mkdir -p /work/main/tests; ln -s "$PWD/tests/fixtures" /work/main/tests/fixtures; }
NCCL=$(python3 -c 'import nvidia.nccl,os;print(os.path.join(list(nvidia.nccl.__path__)[0],"lib"))' 2>/dev/null)
mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
L=${LAYERS:-$([ "${mem_mib:-0}" -ge 100000 ] && echo 16 || echo 8)}
CUBLAS=$(dirname "$(find /usr/local /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)" 2>/dev/null)
LIBS=build/dev/lib:$NCCL:$CUBLAS
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
bench() {
  local name=$1 bin=$2 model=$3; shift 3
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" LD_LIBRARY_PATH=$LIBS timeout 280 build/dev/$bin bench --model-type $model --layers "$L" \
    --commit "$COMMIT-$name" --out "$O/bench-$name" "$@" > "$O/bench-$name.log" 2>&1
  echo "== $name ($model, $L layers): rc $?"
  grep -E '^bench: (decode C|C1 reads|prefill)' "$O/bench-$name.log" | grep -v 'steps, ms'
}
gtests() {
  local name=$1 bin=$2 secs=$3 filter=$4; shift 4
  env "$@" LD_LIBRARY_PATH=$LIBS timeout "$secs" build/dev/$bin ${filter:+--gtest_filter="$filter"} > "$O/$name.log" 2>&1
  echo "== $name: rc $?"
  grep -E '^\[  (PASSED|FAILED)' "$O/$name.log" | head
}
