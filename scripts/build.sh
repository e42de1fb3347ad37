#!/usr/bin/env bash
# Builds into build/ (binary build/ds41rt), or into $DS41RT_BUILD_DIR. Extra arguments go to
# cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${DS41RT_BUILD_DIR:-build}
JOBS=${DS41RT_JOBS:-$(nproc)}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=${DS41RT_BUILD_TYPE:-Release} "$@" >/dev/null
cmake --build "$BUILD" -j "$JOBS"
