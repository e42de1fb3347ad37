#!/usr/bin/env bash
# The README's test command: set up, build, run every test. This is what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh "$@"
(cd build && ctest --output-on-failure -j "${DS41RT_JOBS:-$(nproc)}")
# End-to-end: build/ds41rt serve on the tiny V4.1 fixture, driven by the official openai client.
DS41RT_BUILD_DIR=build .venv/bin/python -m pytest -q tests/e2e
