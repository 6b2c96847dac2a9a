#!/bin/sh
# it_sync_supervisor.sh - examples/sync_supervisor (the Supervisor, a
# global batch of 96 split by the replicas, Adagrad on the ps) alone and
# on 2 and 3 replicas (keel launch: 1 ps, the chief and 1 or 2 workers):
# every replica declares its slice's size and the ps apply the
# example-weighted mean, the mean over the global batch, so the final
# weights and Adagrad's accumulators agree with the run alone within
# 1e-5 (each replica adds its own slice in float: not bitwise). The loss
# is a metric the ps combine over the replicas: the chief's loss lines
# (every 50 steps, 4 decimals) are the run alone's.
#
# Then kills, as a user meets them under keel launch (1 ps, the chief, 1
# worker, plain SGD): the ps SIGKILLed mid-run, later the worker (each
# while the chief is SIGSTOPped for a moment, which pins the kill mid-run
# on a loaded machine; the chief's process goes on after SIGCONT). Only
# those two tasks are restarted (once each; the chief keeps its process),
# the chief re-initializes the restarted ps at the step the job reached
# (0 steps lost), the step lines and checkpoints never go back, the run
# ends 0 at the final step, and its final checkpoint is bitwise equal to
# an undisturbed run's (SGD has no slots: the chief's variables are the
# whole state the ps lost; with Adagrad the accumulators the ps held are
# lost, see docs/session.md). An Adagrad run with the ps killed also ends
# at the final step without rollback. Last, keel launch --chaos kills the
# ps and the worker at random: the same checks, bitwise equal.
set -eu
bin="$KEEL_BUILDDIR/examples/sync_supervisor"
keel="$KEEL_BUILDDIR/keel"
tol=1e-5
dir=$(mktemp -d "${TMPDIR:-/tmp}/keel-syncsv-XXXXXX")
lpid=
stopped=
cleanup() {
    [ -z "$stopped" ] || kill -CONT "$stopped" 2>/dev/null || true
    if [ -n "$lpid" ] && kill -0 "$lpid" 2>/dev/null; then
        kill -KILL "$lpid" 2>/dev/null || true
        wait "$lpid" 2>/dev/null || true
    fi
    [ -n "${KEEL_KEEP:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "it_sync_supervisor: FAIL: $*"; exit 1; }
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
    grep '^step [0-9]*: loss ' "$dir/alone" >"$dir/loss1"
    sed -n 's/^chief | \(step [0-9]*: loss \)/\1/p' "$dir/launch$w" \
        >"$dir/loss$((w + 1))"
    if [ "$(wc -l <"$dir/loss1")" -lt 2 ] ||
       ! cmp -s "$dir/loss1" "$dir/loss$((w + 1))"; then
        echo "sync_supervisor: the chief's loss lines on $((w + 1))" \
             "replicas are not the run alone's:"
        diff "$dir/loss1" "$dir/loss$((w + 1))" || true
        exit 1
    fi
done
echo "sync_supervisor: 1, 2 and 3 replicas agree, their loss lines too"

# ---- kills ------------------------------------------------------------------
. "$KEEL_SRCDIR/tests/common.sh"
steps=4000

# wait_for FILE REGEX SECS: until a line of FILE matches (fails at the
# deadline or when the launcher ended without it)
wait_for() {
    end=$(($(date +%s) + $3))
    while ! grep -qE "$2" "$1"; do
        [ "$(date +%s)" -lt "$end" ] ||
            fail "no line /$2/ in $3 s; output: $(tail -20 "$1")"
        if [ -n "$lpid" ] && ! kill -0 "$lpid" 2>/dev/null &&
           ! grep -qE "$2" "$1"; then
            fail "launcher ended before /$2/; output: $(tail -20 "$1")"
        fi
        sleep 0.05
    done
}
# wait_step LOG STEP SECS: until the chief's LOG (OUTPUT_DIR/logs/, written
# as the lines come, unlike the launcher's stdout to a file) has the line
# of STEP (a multiple of 50); tail -f sees it at once, where polling
# under load saw it seconds late
wait_step() {
    timeout "$3" tail -s 0.05 -n +1 -F "$1" 2>/dev/null | grep -qE -m1 "^step $2:" ||
        fail "the chief did not reach step $2 in $3 s: $(tail -20 "$1")"
}
# kill_task OUT TASK: SIGKILL TASK by the pid keel launch printed while
# the chief is SIGSTOPped (a sync job cannot step without it, so the kill
# lands mid-run however late this shell saw the step line it waited for),
# wait until the launcher restarted TASK, then SIGCONT the chief
kill_task() {
    cpid=$(keel_launch_pid "$1" chief)
    pid=$(keel_launch_pid "$1" "$2")
    [ -n "$pid" ] && [ -n "$cpid" ] || fail "no pid for $2 or the chief"
    kill -STOP "$cpid" ||
        fail "the chief (pid $cpid) ended before the kill of $2: $(tail -20 "$1")"
    stopped=$cpid
    kill -KILL "$pid" ||
        fail "$2 (pid $pid) was gone before its kill: $(grep "^launch |" "$1"; tail -20 "$1")"
    wait_for "$1" "^launch \\| restarted $2 \\(pid" 60
    kill -CONT "$cpid"
    stopped=
}
# check_run OUT DIR: exit 0 at the final step, only ps.0 (and worker.0 if
# $3) restarted once, no step lost, no step going back
check_run() {
    grep -q "^chief | chief done at step $steps\$" "$1" ||
        fail "$2: the chief did not end at step $steps: $(tail -20 "$1")"
    test -f "$2/model.ckpt-$steps.h5" || fail "$2: no final checkpoint"
    for t in chief ps.0 worker.0; do
        n=$(grep -c "^launch | restarted $t (pid" "$1" || true)
        want=0
        [ "$t" = ps.0 ] && want=1
        [ "$t" = worker.0 ] && want=$3
        [ "$n" -eq "$want" ] ||
            fail "$2: $t restarted $n times, not $want: $(grep '^launch |' "$1")"
    done
    grep -q '^chief | .*recovering at global step [0-9]* from the chief' "$1" ||
        fail "$2: the chief did not recover in its process: $(grep '^chief |' "$1" | tail -20)"
    # the chief's publish says how many steps the ps's loss cost
    lost=$(sed -nE 's/^chief \| .*; restarting from step [0-9]+: ([0-9]+) step\(s\) lost.*/\1/p' "$1")
    [ -n "$lost" ] || fail "$2: no line on the steps lost"
    for k in $lost; do
        [ "$k" -eq 0 ] || fail "$2: the ps's loss cost $k steps"
    done
    grep -q "restored .*model.ckpt-" "$1" &&
        fail "$2: a task restored a checkpoint: $(grep 'restored ' "$1")"
    # the global step never went back: the step lines and saves of each task
    for t in chief worker.0; do
        for pat in "s/^$t \\| step ([0-9]+):.*/\\1/p" \
                   "s/^$t \\| saved checkpoint for step ([0-9]+):.*/\\1/p"; do
            sed -nE "$pat" "$1" |
                awk 'NR > 1 && $1 < prev { bad = 1; print "step " $1 " after " prev }
                     { prev = $1 } END { exit bad }' ||
                fail "$2: the global step of $t went back ($pat)"
        done
    done
}

# undisturbed
rc=0
timeout 300 "$keel" launch --ps 1 --workers 1 --no-status -- \
    "$bin" "$dir/ref" $steps sgd >"$dir/ref.out" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "the undisturbed run exited $rc: $(tail -20 "$dir/ref.out")"

# the ps killed, then the worker
out=$dir/kill.out
"$keel" launch --ps 1 --workers 1 --no-status --grace 5 \
    --output-dir "$dir/launch-kill" -- "$bin" "$dir/kill" $steps sgd \
    >"$out" 2>&1 &
lpid=$!
log=$dir/launch-kill/logs/chief.log
wait_step "$log" 100 120
kill_task "$out" ps.0
wait_for "$log" 'recovering at global step' 60
at=$(sed -nE 's/.*recovering at global step ([0-9]+).*/\1/p' "$log" | head -1)
wait_step "$log" $((at / 50 * 50 + 100)) 120
kill_task "$out" worker.0
wait_for "$out" '^launch \| worker\.0 back at step ' 60
rc=0
wait "$lpid" || rc=$?
lpid=
[ $rc -eq 0 ] || fail "keel launch with kills exited $rc: $(tail -30 "$out")"
check_run "$out" "$dir/kill" 1
rc=0
"$keel" ckpt diff "$dir/ref/model.ckpt-$steps.h5" \
    "$dir/kill/model.ckpt-$steps.h5" >"$dir/diffk" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "the final weights after the kills differ from the \
undisturbed run's (ckpt diff exit $rc): $(cat "$dir/diffk")"
echo "sync_supervisor: ps killed at step $at, then worker 0: only they restarted, 0 steps lost, final weights bitwise equal"

# Adagrad: the ps killed; ends at the final step without rollback
out=$dir/kill-ada.out
"$keel" launch --ps 1 --workers 1 --no-status --grace 5 \
    --output-dir "$dir/launch-ada" -- "$bin" "$dir/ada" $steps \
    >"$out" 2>&1 &
lpid=$!
wait_step "$dir/launch-ada/logs/chief.log" 100 120
kill_task "$out" ps.0
rc=0
wait "$lpid" || rc=$?
lpid=
[ $rc -eq 0 ] || fail "keel launch (Adagrad) with the ps killed exited $rc: $(tail -30 "$out")"
check_run "$out" "$dir/ada" 0
echo "sync_supervisor: Adagrad, ps killed: only it restarted, 0 steps lost"

# Adagrad on 2 ps: ps.1 killed; only it is initialized with the chief's
# slots, ps.0 survives and keeps its own accumulators
out=$dir/kill-ada2.out
"$keel" launch --ps 2 --workers 1 --no-status --grace 5 \
    --output-dir "$dir/launch-ada2" -- "$bin" "$dir/ada2" $steps \
    >"$out" 2>&1 &
lpid=$!
wait_step "$dir/launch-ada2/logs/chief.log" 100 120
kill_task "$out" ps.1
rc=0
wait "$lpid" || rc=$?
lpid=
[ $rc -eq 0 ] || fail "keel launch (Adagrad, 2 ps) with ps.1 killed exited $rc: $(tail -30 "$out")"
grep -q "^chief | chief done at step $steps\$" "$out" ||
    fail "2 ps: the chief did not end at step $steps: $(tail -20 "$out")"
grep -qE '^chief \| chief: 2 parameter server\(s\) initialized at step [1-9][0-9]*; .*, 1 kept their slots\)' "$out" ||
    fail "2 ps: the survivor did not keep its slots: $(grep 'initialized at step' "$out")"
grep -qE '^ps\.0 \| ps 0: initialized by the chief .* at step [1-9][0-9]*: [0-9]+ variables, 0 slot tensors' "$out" ||
    fail "2 ps: ps.0 got slots again: $(grep '^ps.0 | .*initialized' "$out")"
grep -qE '^ps\.1 \| ps 1: initialized by the chief .* at step [1-9][0-9]*: [0-9]+ variables, [1-9][0-9]* slot tensors' "$out" ||
    fail "2 ps: the restarted ps.1 got no slots: $(grep '^ps.1 | .*initialized' "$out")"
echo "sync_supervisor: Adagrad on 2 ps, ps.1 killed: ps.0 kept its slots"

# keel launch --chaos on the ps and the worker (seeded victims, real-time
# gaps): whatever it killed, the chief was never restarted, no kill of the
# ps cost a step, and the final weights are the undisturbed run's
out=$dir/chaos.out
rc=0
timeout 300 "$keel" launch --ps 1 --workers 1 --no-status --grace 5 \
    --chaos 3,1 --chaos-targets ps,worker --output-dir "$dir/launch-chaos" \
    -- "$bin" "$dir/chaos" $steps sgd >"$out" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "keel launch --chaos exited $rc: $(tail -30 "$out")"
grep -q "^chief | chief done at step $steps\$" "$out" ||
    fail "chaos: the chief did not end at step $steps: $(tail -20 "$out")"
grep -q '^launch | restarted chief' "$out" &&
    fail "chaos: the chief was restarted: $(grep '^launch |' "$out")"
sed -nE 's/^chief \| .*; restarting from step [0-9]+: ([0-9]+) step\(s\) lost.*/\1/p' \
    "$out" | awk '$1 != 0 { bad = 1 } END { exit bad }' ||
    fail "chaos: a ps's loss cost steps: $(grep 'step(s) lost' "$out")"
rc=0
"$keel" ckpt diff "$dir/ref/model.ckpt-$steps.h5" \
    "$dir/chaos/model.ckpt-$steps.h5" >"$dir/diffc" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "chaos: the final weights differ from the undisturbed \
run's (ckpt diff exit $rc): $(cat "$dir/diffc")"
echo "sync_supervisor: --chaos killed $(grep -c '^chaos | killed' "$out") time(s), the chief never; final weights bitwise equal"
echo "sync_supervisor: 6 passed, 0 failed"
