#!/usr/bin/env bash
# The README's test command: set up, build, run every test. This is what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${DS41RT_BUILD_DIR:-build}
scripts/setup.sh
scripts/build.sh "$@"
(cd "$BUILD" && ctest --output-on-failure -j "${DS41RT_JOBS:-$(nproc)}")
# End-to-end: ds41rt serve on the tiny V4.1 fixture, driven by the official openai client.
DS41RT_BUILD_DIR="$BUILD" .venv/bin/python -m pytest -q tests/e2e
