#!/bin/sh
# it_custom_step.sh - examples/custom_step (a user's own model on the public
# API) learns y = 3x - 2, checkpoints, and resumes where it stopped; the
# same program on 2 and 3 replicas (keel launch: 1 ps, the chief and 1 or
# 2 workers) ends with the bits of the run alone, because the ps apply the
# example-weighted mean of the replicas' mean gradients (every replica
# computes the same one here), and the chief's loss lines and scalars.csv
# rows are the run alone's (the loss is a metric, combined over the
# replicas: keel_step_set_metric).
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
# 1, 2 and 3 replicas: 20 steps each, the final checkpoints bitwise equal,
# the chief's loss lines and scalars.csv rows (wall time dropped) the same
timeout 60 "$bin" "$dir/r1" 20 >"$dir/out1" 2>"$dir/err1"
grep '^step [0-9]*: loss ' "$dir/out1" >"$dir/loss1"
cut -d, -f2- "$dir/r1/scalars.csv" >"$dir/csv1"
[ -s "$dir/loss1" ] && [ "$(wc -l <"$dir/csv1")" -ge 2 ] ||
    { echo "custom_step: no loss line or scalars.csv row alone"; exit 1; }
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
    sed -n 's/^chief | \(step [0-9]*: loss \)/\1/p' "$dir/launch$w" \
        >"$dir/loss$((w + 1))"
    cut -d, -f2- "$dir/r$((w + 1))/scalars.csv" >"$dir/csv$((w + 1))"
    if ! cmp -s "$dir/loss1" "$dir/loss$((w + 1))" ||
       ! cmp -s "$dir/csv1" "$dir/csv$((w + 1))"; then
        echo "custom_step: the chief's loss on $((w + 1)) replicas is not" \
             "the run alone's:"
        diff "$dir/loss1" "$dir/loss$((w + 1))" || true
        diff "$dir/csv1" "$dir/csv$((w + 1))" || true
        exit 1
    fi
done
echo "custom_step: 3 passed, 0 failed"
