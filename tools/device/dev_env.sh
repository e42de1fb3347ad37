# Sourced by a device-machine run script (bash), from the repository root, for runs of the
# bundle tools/device/bundle.sh packs (build/dev, unpacked there first): what the session scripts
# under docs/perf/*/runs.sh each set up. Keeps NVLink multicast off, makes $O, links the test
# fixtures where the engine tests look for them, prints the card, and sets
#   L     layers to bench: $LAYERS, else 16 on a card of 100 GB or more, 8 below
#   LIBS  LD_LIBRARY_PATH for build/dev's binaries: the bundle's libraries, the NCCL wheel's and
#         the toolkit's cuBLASLt (loaded at run time by ds41rt bench)
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
