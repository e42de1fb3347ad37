#!/usr/bin/env bash
# Installs everything the build and the tests need. Idempotent; run as root on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

DEBS=(build-essential cmake ninja-build ccache pkg-config python3 python3-venv python3-pip
      nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libgtest-dev googletest libcpp-httplib-dev
      zlib1g-dev)
missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# Python test tools live in a project venv (.venv), so the system Python stays untouched.
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r tools/requirements-test.txt
echo "setup: ok"
