#!/usr/bin/env bash
# Builds into build/ (binary build/ds41rt). Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${DS41RT_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=${DS41RT_BUILD_TYPE:-Release} "$@" >/dev/null
cmake --build build -j "$JOBS"
