#!/bin/sh
# it_custom_step.sh - examples/custom_step (a user's own model on the public
# API) learns y = 3x - 2, checkpoints, and resumes where it stopped; the
# same program on 2 and 3 replicas (keel launch: 1 ps, the chief and 1 or
# 2 workers) ends with the bits of the run alone, because the ps apply the
# example-weighted mean of the replicas' mean gradients (every replica
# computes the same one here).
set -eu
bin="$KEEL_BUILDDIR/examples/custom_step"
keel="$KEEL_BUILDDIR/keel"
dir=$(mktemp -d "${TMPDIR:-/tmp}/keel-custom-XXXXXX")
trap 'rm -rf "$dir"' EXIT
out=$("$bin" "$dir/run" 200 2>"$dir/err")
echo "$out"
echo "$out" | awk '/^step 200:/ { w=$5+0; b=$8+0; ok = (w > 2.95 && w < 3.05 && b > -2.05 && b < -1.95) } END { exit !ok }'
test -f "$dir/run/model.ckpt-200.h5"
out=$("$bin" "$dir/run" 300 2>"$dir/err")
grep -q "restored .*model.ckpt-200.h5" "$dir/err"
echo "$out" | grep -q "^step 300:"
# 1, 2 and 3 replicas: 20 steps each, the final checkpoints bitwise equal
timeout 60 "$bin" "$dir/r1" 20 >/dev/null 2>"$dir/err1"
for w in 1 2; do
    if ! timeout 120 "$keel" launch --ps 1 --workers "$w" --no-status -- \
            "$bin" "$dir/r$((w + 1))" 20 >"$dir/launch$w" 2>&1; then
        echo "keel launch with $w worker(s) failed:"; tail -20 "$dir/launch$w"
        exit 1
    fi
    if ! "$keel" ckpt diff "$dir/r1/model.ckpt-20.h5" \
            "$dir/r$((w + 1))/model.ckpt-20.h5"; then
        echo "custom_step: $((w + 1)) replicas differ from one process"
        exit 1
    fi
done
echo "custom_step: 3 passed, 0 failed"
