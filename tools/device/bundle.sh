#!/usr/bin/env bash
# Packs what the H200 run needs from a build made here (scripts/build.sh) into BUILD/dev: the
# GPU binaries, stripped, and the non-glibc shared libraries ds41rt links (the device machine has
# no Debian -dev packages; libnccl is left out: ~200 MB, and the device brings its own, e.g. torch's
# nvidia-nccl-cu13, put on LD_LIBRARY_PATH by h200x2_nccl_run.sh), and BUILD/dev.tar.xz of it: the
# device run copies at most 64 MiB with the repository (~42 MB of it tracked files), and the bundle
# is ~105 MB unpacked, 10 MB packed with xz -9 (-6 -T2: 20 MB). Anything else put in BUILD/dev
# (e.g. a second ds41rt for an A/B) goes along, and costs little: the window finds what it shares.
# Usage: tools/device/bundle.sh [BUILD_DIR [SUFFIX]]   (default: build). With SUFFIX the binaries
# go in as NAME-SUFFIX beside what is there (a branch's build next to the candidate's: e.g. check
# out the branch, build, `bundle.sh build async`, and run its ds41rt-async); without, as NAME.
set -euo pipefail
B=${1:-build}
SFX=${2:+-$2}
mkdir -p "$B/dev/lib"
for bin in ds41rt ds41rt_cuda_tests ds41rt_cuda_engine_tests ds41rt_cuda_bench; do
  strip -o "$B/dev/$bin$SFX" "$B/$bin"
done
for lib in $(ldd "$B/ds41rt" | awk '/=>/ {print $3}' | grep -v -E 'lib(c|m|stdc\+\+|nccl)\.so|ld-linux'); do
  cp -L "$lib" "$B/dev/lib/"
done
# The kernel tracer (kernel_trace.cpp: the decode graph's timeline, for want of Nsight Systems
# there) and the CUPTI it links, when this machine's toolkit has CUPTI.
CUDA=${CUDA_HOME:-/usr/local/cuda}
if [ -e "$CUDA/include/cupti.h" ]; then
  g++ -O2 -shared -fPIC -I"$CUDA/include" "$(dirname "$0")/kernel_trace.cpp" -L"$CUDA/lib64" -lcupti \
    -Wl,-rpath,'$ORIGIN' -o "$B/dev/lib/libkernel_trace.so"
  cp -L "$CUDA/lib64/libcupti.so.13" "$B/dev/lib/"
fi
XZ_OPT="-9 -T1" tar -C "$B" -cJf "$B/dev.tar.xz" dev  # one thread: -9's 64 MB window finds the binaries' shared bytes
du -sh "$B/dev" "$B/dev.tar.xz"
