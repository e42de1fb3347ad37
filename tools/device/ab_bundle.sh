#!/usr/bin/env bash
# A slim bundle for an A/B run on the device machine: the named binaries of a build (stripped) and
# the shared libraries ds41rt links (as bundle.sh picks them), packed as OUT (.tar.xz, one folder
# `d`). Two of them fit the 64 MiB a device run carries with the repository, where two full
# bundles do not. Build the other side in a worktree (git worktree add /work/base REV; its own
# scripts/build.sh; ccache makes it quick).
# Usage: tools/device/ab_bundle.sh BUILD_DIR OUT.tar.xz [BINARY ...]   (default: ds41rt)
set -euo pipefail
B=${1:?usage: ab_bundle.sh BUILD_DIR OUT.tar.xz [BINARY ...]}
OUT=${2:?usage: ab_bundle.sh BUILD_DIR OUT.tar.xz [BINARY ...]}
shift 2
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(ds41rt)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/d/lib"
for bin in "${bins[@]}"; do strip -o "$T/d/$bin" "$B/$bin"; done
for lib in $(ldd "$B/ds41rt" | awk '/=>/ {print $3}' | grep -v -E 'lib(c|m|stdc\+\+|nccl)\.so|ld-linux'); do
  cp -L "$lib" "$T/d/lib/"
done
mkdir -p "$(dirname "$OUT")"
XZ_OPT="-9 -T2" tar -C "$T" -cJf "$OUT" d
du -h "$OUT"
