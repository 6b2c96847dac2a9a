#!/bin/sh
# it_sync_supervisor.sh - examples/sync_supervisor (the Supervisor, a
# global batch of 96 split by the replicas, Adagrad on the ps) alone and
# on 2 and 3 replicas (keel launch: 1 ps, the chief and 1 or 2 workers):
# every replica declares its slice's size and the ps apply the
# example-weighted mean, the mean over the global batch, so the final
# weights and Adagrad's accumulators agree with the run alone within
# 1e-5 (each replica adds its own slice in float: not bitwise).
set -eu
bin="$KEEL_BUILDDIR/examples/sync_supervisor"
keel="$KEEL_BUILDDIR/keel"
tol=1e-5
dir=$(mktemp -d "${TMPDIR:-/tmp}/keel-syncsv-XXXXXX")
trap 'rm -rf "$dir"' EXIT
timeout 60 "$bin" "$dir/s1" 60 >"$dir/alone" 2>&1 ||
    { echo "sync_supervisor alone failed:"; tail -20 "$dir/alone"; exit 1; }
for w in 1 2; do
    if ! timeout 120 "$keel" launch --ps 1 --workers "$w" --no-status -- \
            "$bin" "$dir/s$((w + 1))" 60 >"$dir/launch$w" 2>&1; then
        echo "keel launch with $w worker(s) failed:"; tail -20 "$dir/launch$w"
        exit 1
    fi
    # exit 0 (bitwise equal) or 1 with every max_abs_diff within tol
    rc=0
    "$keel" ckpt diff "$dir/s1/model.ckpt-60.h5" \
        "$dir/s$((w + 1))/model.ckpt-60.h5" >"$dir/diff$w" 2>&1 || rc=$?
    cat "$dir/diff$w"
    if [ "$rc" -gt 1 ] || grep -q "only in" "$dir/diff$w" ||
       ! awk -v tol="$tol" '/^differs/ { if ($NF + 0 > tol + 0) bad = 1 }
                            END { exit bad }' "$dir/diff$w"; then
        echo "sync_supervisor: $((w + 1)) replicas differ from one process by more than $tol"
        exit 1
    fi
done
echo "sync_supervisor: 2 passed, 0 failed"
