#!/bin/sh
# it_custom_step.sh - examples/custom_step (a user's own model on the public
# API) learns y = 3x - 2, checkpoints, and resumes where it stopped.
set -eu
bin="$KEEL_BUILDDIR/examples/custom_step"
dir=$(mktemp -d "${TMPDIR:-/tmp}/keel-custom-XXXXXX")
trap 'rm -rf "$dir"' EXIT
out=$("$bin" "$dir/run" 200 2>"$dir/err")
echo "$out"
echo "$out" | awk '/^step 200:/ { w=$5+0; b=$8+0; ok = (w > 2.95 && w < 3.05 && b > -2.05 && b < -1.95) } END { exit !ok }'
test -f "$dir/run/model.ckpt-200.h5"
out=$("$bin" "$dir/run" 300 2>"$dir/err")
grep -q "restored .*model.ckpt-200.h5" "$dir/err"
echo "$out" | grep -q "^step 300:"
echo "custom_step: 2 passed, 0 failed"
