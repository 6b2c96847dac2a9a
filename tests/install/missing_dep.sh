#!/usr/bin/env bash
# missing_dep.sh - configure without libzmq visible to pkg-config must stop
# and name the Debian package to install.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/keel-nodep-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/pc" "$tmp/build"
for dir in $(pkg-config --variable pc_path pkg-config | tr ':' ' '); do
  for pc in "$dir"/*.pc; do
    [ -e "$pc" ] || continue
    case $(basename "$pc") in libzmq.pc) ;; *) ln -sf "$pc" "$tmp/pc/" ;; esac
  done
done
if (cd "$tmp/build" && PKG_CONFIG_LIBDIR="$tmp/pc" "$src/configure" --quiet >"$tmp/out" 2>&1); then
  echo "missing dep: configure succeeded without libzmq" >&2; exit 1
fi
grep -q 'apt-get install libzmq3-dev' "$tmp/out" || { cat "$tmp/out" >&2; exit 1; }
echo "missing dep: 1 passed, 0 failed"
