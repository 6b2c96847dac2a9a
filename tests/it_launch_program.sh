#!/usr/bin/env bash
# it_launch_program.sh - the public cluster seam as a user meets it: keel is
# installed into a temporary DESTDIR, examples/custom_step.c and
# examples/sync_supervisor.c are built with `pkg-config --cflags --libs keel`
# only, and `keel launch -- PROGRAM` runs them as ps, chief and workers.
#  1. custom_step, 1 ps + 2 workers, sync: a SIGKILLed worker and then a
#     SIGKILLed chief come back and the global step never goes back (the
#     chief's step lines and checkpoints only rise; the restarted chief
#     joins the live ps at or past the last step seen); the run ends 0 with
#     w, b near 3, -2; its final checkpoint reads back (`keel ckpt show`)
#     and the example run alone on the same directory continues from it.
#  2. sync_supervisor, 1 ps + 2 workers, sync: every task finishes, exit 0.
set -euo pipefail
build=$KEEL_BUILDDIR
src=$KEEL_SRCDIR
keel="$build/keel"
dest=$(mktemp -d "${TMPDIR:-/tmp}/keel-launch-prog-XXXXXX")
lpid=
cleanup() {
    if [ -n "$lpid" ] && kill -0 "$lpid" 2>/dev/null; then
        kill -KILL "$lpid" 2>/dev/null || true
        wait "$lpid" 2>/dev/null || true
    fi
    rm -rf "$dest"
}
trap cleanup EXIT
fail() { echo "it_launch_program: FAIL: $*" >&2; exit 1; }

make -C "$build" --no-print-directory install DESTDIR="$dest/inst" \
    >"$dest/install.log" 2>&1 || fail "make install: $(tail -20 "$dest/install.log")"
. "$src/tests/common.sh"
libdir=$(keel_pc_libdir "$build")
export PKG_CONFIG_PATH="$dest/inst$libdir/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$dest/inst"
export LD_LIBRARY_PATH="$dest/inst$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# a sanitizer build's libkeel needs its runtime first in the program too
san=$(sed -n 's/^KEEL_SAN_LDFLAGS = //p' "$build/Makefile")
cd "$dest"
# shellcheck disable=SC2046,SC2086
cc $san -o custom_step "$src/examples/custom_step.c" \
    $(pkg-config --cflags --libs keel)
# shellcheck disable=SC2046,SC2086
cc $san -o sync_supervisor "$src/examples/sync_supervisor.c" \
    $(pkg-config --cflags --libs keel) -lm

# wait_for FILE REGEX SECS: until a line of FILE matches (exit 1 at the
# deadline or when the launcher is gone without it)
wait_for() {
    local end=$((SECONDS + $3))
    while ! grep -qE "$2" "$1"; do
        [ $SECONDS -lt $end ] || fail "no line /$2/ in $3 s; output: $(tail -20 "$1")"
        if [ -n "$lpid" ] && ! kill -0 "$lpid" 2>/dev/null && \
           ! grep -qE "$2" "$1"; then
            fail "launcher ended before /$2/; output: $(tail -20 "$1")"
        fi
        sleep 0.05
    done
}
# the highest global step in the chief's step lines so far
chief_step() {
    { grep -E '^chief \| step [0-9]+:' "$1" || true; } |
        sed -E 's/^chief \| step ([0-9]+):.*/\1/' | sort -n | tail -1
}

# ---- 1. custom_step: kills without rollback --------------------------------
steps=2500
out=$dest/custom.out
"$keel" launch --ps 1 --workers 2 --no-status --grace 5 \
    --output-dir "$dest/launch1" -- ./custom_step "$dest/run" $steps \
    >"$out" 2>&1 &
lpid=$!
wait_for "$out" '^chief \| step [3-9][0-9]{2}:|^chief \| step [0-9]{4}:' 120
wpid=$(keel_launch_pid "$out" worker.0)
[ -n "$wpid" ] || fail "no pid for worker.0"
kill -KILL "$wpid"
wait_for "$out" '^launch \| restarted worker\.0 ' 30
wait_for "$out" '^launch \| worker\.0 back at step ' 60
before=$(chief_step "$out")
cpid=$(keel_launch_pid "$out" chief)
[ -n "$cpid" ] || fail "no pid for chief"
kill -KILL "$cpid"
wait_for "$out" '^launch \| restarted chief ' 30
wait_for "$out" '^chief \| chief: joined live parameter servers at step ' 60
joined=$(grep -E '^chief \| chief: joined live parameter servers at step' "$out" |
         tail -1 | sed -E 's/.* at step ([0-9]+).*/\1/')
[ "$joined" -ge "$before" ] ||
    fail "the restarted chief joined at step $joined < $before seen before the kill"
rc=0
wait "$lpid" || rc=$?
lpid=
[ $rc -eq 0 ] || fail "keel launch exited $rc; output: $(tail -30 "$out")"
# the global step never went back: the chief's step lines and saves rise
for pat in 's/^chief \| step ([0-9]+):.*/\1/p' \
           's/^chief \| saved checkpoint for step ([0-9]+):.*/\1/p'; do
    sed -nE "$pat" "$out" | awk 'NR > 1 && $1 < prev { bad = 1; print "step " $1 " after " prev }
                                 { prev = $1 } END { exit bad }' ||
        fail "the global step went back ($pat)"
done
grep -qE '^chief \| chief: told 1 parameter server\(s\) to stop' "$out" ||
    fail "the chief did not stop the ps"
final=$(grep -E "^chief \| step $steps: w = " "$out") ||
    fail "no final line of the chief"
echo "$final" | awk '{ w = $7 + 0; b = $10 + 0; exit !(w > 2.9 && w < 3.1 && b > -2.1 && b < -1.9) }' ||
    fail "did not learn y = 3x - 2: $final"
"$keel" ckpt show "$dest/run/model.ckpt-$steps.h5" >"$dest/show" ||
    fail "keel ckpt show of the final checkpoint failed"
grep -qE "^global_step: +$steps\$" "$dest/show" || fail "ckpt show: $(cat "$dest/show")"
grep -q 'linear/w' "$dest/show" || fail "ckpt show lacks linear/w"
# the same program alone (no TF_CONFIG) continues from the cluster's run
alone=$(env -u TF_CONFIG ./custom_step "$dest/run" $((steps + 100)) 2>"$dest/alone.err") ||
    fail "custom_step alone failed: $(tail -5 "$dest/alone.err")"
grep -q "restored .*model.ckpt-$steps.h5" "$dest/alone.err" ||
    fail "custom_step alone did not restore step $steps: $(head -5 "$dest/alone.err")"
echo "$alone" | grep -q "^step $((steps + 100)): w = " || fail "alone: $alone"
echo "custom_step under keel launch: worker and chief kills without rollback, restore alone"

# ---- 2. sync_supervisor ----------------------------------------------------
out=$dest/sv.out
rc=0
timeout 120 "$keel" launch --ps 1 --workers 2 --no-status --grace 5 \
    --output-dir "$dest/launch2" -- ./sync_supervisor "$dest/sv" 200 \
    >"$out" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "sync_supervisor: keel launch exited $rc: $(tail -30 "$out")"
grep -q '^chief | chief done at step 200$' "$out" || fail "sync_supervisor: chief: $(tail -20 "$out")"
grep -q '^chief | chief: told 1 parameter server(s) to stop' "$out" ||
    fail "sync_supervisor: the chief did not stop the ps"
test -f "$dest/sv/model.ckpt-200.h5" || fail "sync_supervisor: no final checkpoint"
grep -q 'ps.0 | ps 0: .* sync mode, 3 of 3 replicas per step' "$out" ||
    fail "sync_supervisor: not sync over 3 replicas: $(grep 'ps.0 |' "$out" | head -3)"
echo "sync_supervisor under keel launch: finishes"
echo "it_launch_program: 2 passed, 0 failed"
