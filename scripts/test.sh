#!/usr/bin/env bash
# The README's test command: set up, build, run every test. This is what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh "$@"
cd build
ctest --output-on-failure -j "${DS41RT_JOBS:-$(nproc)}"
