#!/usr/bin/env bash
# Installs everything the build and the tests need. Idempotent; run as root on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

DEBS=(build-essential cmake ninja-build ccache pkg-config python3 python3-venv python3-pip
      nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libgtest-dev googletest libcpp-httplib-dev curl
      zlib1g-dev libbackward-cpp-dev)
missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# XGrammar (mlc-ai, Apache-2.0): the grammar engine behind tool calls and response_format. Not in
# Debian; its PyPI sdist carries the full C++ source, which CMake builds as a static library
# (CMakeLists.txt, DS41RT_XGRAMMAR_DIR). Pinned by version and sha256; cached in third_party/.
XGRAMMAR_VERSION=0.2.9
XGRAMMAR_SHA256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
XGRAMMAR_URL=https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-${XGRAMMAR_VERSION}.tar.gz
XGRAMMAR_DIR=third_party/xgrammar-${XGRAMMAR_VERSION}
if [ ! -f "$XGRAMMAR_DIR/include/xgrammar/xgrammar.h" ]; then
  echo "setup: fetching xgrammar ${XGRAMMAR_VERSION}"
  mkdir -p third_party
  tmp="$(mktemp -d)"
  curl -sSfL -o "$tmp/xgrammar.tar.gz" "$XGRAMMAR_URL"
  echo "$XGRAMMAR_SHA256  $tmp/xgrammar.tar.gz" | sha256sum -c --quiet -
  tar -xzf "$tmp/xgrammar.tar.gz" -C third_party
  rm -rf "$tmp"
fi

# Python test tools live in a project venv (.venv), so the system Python stays untouched.
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r tools/requirements-test.txt
echo "setup: ok"
