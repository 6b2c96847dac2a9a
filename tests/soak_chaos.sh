#!/bin/sh
# soak_chaos.sh - `make check-long`: KEEL_SOAK_MINUTES (default 30) of
# seeded chaos (SIGKILLs of ps, chief and workers) on the Fashion-MNIST MLP
# under `keel launch`, then an undisturbed run of the same config to the same
# step. Passes when the chaos run stopped cleanly, every checkpoint of both
# runs verifies, the final checkpoints are bitwise equal (`keel ckpt diff`)
# and the test accuracies are within 0.5 points. Not part of `make check`.
#
# Environment: KEEL_BUILDDIR (the build tree, set by make), KEEL_SOAK_MINUTES
# (30), KEEL_SOAK_SEED (1), KEEL_SOAK_PERIOD (mean seconds between kills, 10),
# KEEL_SOAK_DATA (/usr/share/datasets/fashion-mnist), KEEL_SOAK_KEEP=1 keeps
# the temporary directory (it is always kept on failure). Exit 77: skipped.
set -u

: "${KEEL_BUILDDIR:=$(cd "$(dirname "$0")/.." && pwd)}"
KEEL=$KEEL_BUILDDIR/keel
MINUTES=${KEEL_SOAK_MINUTES:-30}
SEED=${KEEL_SOAK_SEED:-1}
PERIOD=${KEEL_SOAK_PERIOD:-10}
DATA=${KEEL_SOAK_DATA:-/usr/share/datasets/fashion-mnist}

say() { printf 'soak: %s\n' "$*"; }
die() { printf 'soak: FAIL: %s\n' "$*" >&2; FAILED=1; }

. "$(dirname "$0")/common.sh"
keel_require_fashion_mnist "$DATA"
case $MINUTES in
    ''|*[!0-9.]*) say "KEEL_SOAK_MINUTES='$MINUTES' is not a number"; exit 99;;
esac

TMP=$(mktemp -d "${TMPDIR:-/tmp}/keel-soak.XXXXXX") || exit 99
FAILED=0
LPID=
cleanup() {
    if [ -n "$LPID" ] && kill -0 "$LPID" 2>/dev/null; then
        kill -KILL "$LPID" 2>/dev/null   # its tasks die with it (PDEATHSIG)
        wait "$LPID" 2>/dev/null
    fi
    if [ "$FAILED" = 0 ] && [ "${KEEL_SOAK_KEEP:-0}" != 1 ]; then
        rm -rf "$TMP"
    else
        say "kept $TMP (logs: chaos.log, ref.log, */logs/)"
    fi
}
trap cleanup EXIT
trap 'FAILED=1; exit 1' INT TERM

# A full INI, so the checkpoint's stored config and `keel eval` agree on the
# model without any -s override. One ps, the chief and one worker; a fixed
# number of model and OpenBLAS threads (results are bitwise reproducible for
# fixed thread counts); epochs far beyond what the soak reaches; every
# checkpoint kept, so each one written under chaos is verified and compared.
cat > "$TMP/mlp.ini" <<EOF
[model]
type = mlp
hidden = 256,256
[data]
dir = $DATA
format = idx
[optimizer]
name = adam
learning_rate = 0.001
[train]
batch_size = 64
epochs = 100000
seed = 0
threads = 1
model_threads = 1
[checkpoint]
dir = $TMP/unused
save_steps = 1000
max_to_keep = 0
[hooks]
log_every_steps = 100
summary_every_steps = 1000
EOF

SECS=$(awk -v m="$MINUTES" 'BEGIN { printf "%d", m * 60 + 0.5 }')
say "$(date -u '+%H:%M:%S') chaos run: $MINUTES min, --chaos $SEED,$PERIOD, 1 ps + chief + 1 worker, $TMP"
T0=$(date +%s)
# timeout SIGTERMs the launcher at the deadline: it stops every task in
# order and the chief writes a final checkpoint (exit 0). --foreground:
# otherwise timeout signals its whole process group as well, and the
# launcher takes a second SIGTERM as "kill every task at once".
OUTPUT_DIR=$TMP/chaos timeout --foreground --preserve-status -k 300 "$SECS" \
    "$KEEL" launch "$TMP/mlp.ini" --ps 1 --workers 1 --no-status \
    --chaos "$SEED,$PERIOD" --max-restarts "${KEEL_SOAK_MAX_RESTARTS:-3}" \
    > "$TMP/chaos.log" 2>&1 &
LPID=$!
wait "$LPID"
CHAOS_RC=$?
LPID=
T1=$(date +%s)
say "chaos run ended after $((T1 - T0)) s with exit status $CHAOS_RC"
[ "$CHAOS_RC" = 0 ] || die "keel launch with chaos exited $CHAOS_RC: $(grep -E '^(launch|keel)' "$TMP/chaos.log" | tail -3)"

# Kills per role and recoveries: a kill counts as recovered when the victim
# was restarted and the chief then reported a step before the next kill.
STATS=$(awk '
    /^chaos \| killed / {
        v = $4; sub(/\..*/, "", v); kills[v]++; n++; victim = $4; next }
    victim != "" && /^launch \| restarted / && index($0, " " victim " ") {
        victim = ""; restarted++; next }
    /^chief \| step [0-9]/ { rec += restarted; restarted = 0 }
    /^launch \| restarting .*\(restart [0-9]/ { failures++ }
    /step\(s\) lost/ { for (i = 1; i <= NF; i++)
        if ($i ~ /^step\(s\)$/) steps_lost += $(i - 1); ps_rollbacks++ }
    / back at step / { b = $(NF - 4) + 0; if (b > maxback) maxback = b; nb++ }
    END { printf "%d %d %d %d %d %d %d %.3f %d %d\n", n, kills["chief"] + 0,
            kills["worker"] + 0, kills["ps"] + 0, rec + 0, n - rec,
            steps_lost + 0, maxback + 0, nb + 0, failures + 0 }' "$TMP/chaos.log")
set -- $STATS
KILLS=$1 K_CHIEF=$2 K_WORKER=$3 K_PS=$4 RECOVERED=$5 UNRECOVERED=$6
STEPS_LOST=$7 MAX_BACK=$8 N_BACK=$9 FAILURES=${10}
[ "$KILLS" -gt 0 ] || die "chaos killed nothing in $MINUTES min"
# only the last kill may be cut short by the stop
[ "$UNRECOVERED" -le 1 ] || die "$UNRECOVERED kills were not followed by a step of the restarted cluster"

# Every checkpoint of the chaos run verifies; the newest is the final one.
if ! "$KEEL" ckpt verify "$TMP/chaos" > "$TMP/verify_chaos.txt" 2>&1; then
    die "keel ckpt verify $TMP/chaos: $(grep -v '^ok' "$TMP/verify_chaos.txt" | head -3)"
fi
N_CKPT=$(grep -c '^ok' "$TMP/verify_chaos.txt")
N_TMP=$(find "$TMP/chaos" -maxdepth 1 -name '*.tmp*' | wc -l)
FINAL=$(sed -n 's/^model_checkpoint_path: "\(.*\)"$/\1/p' "$TMP/chaos/checkpoint")
STEP=$(printf '%s\n' "$FINAL" | sed -n 's/^model\.ckpt-\([0-9][0-9]*\)\.h5$/\1/p')
if [ -z "$STEP" ]; then
    die "no final checkpoint in $TMP/chaos/checkpoint"
    exit 1
fi
say "chaos run reached step $STEP ($N_CKPT checkpoints verify, $N_TMP temp files left by kills)"

# The undisturbed run: the same config and cluster shape, to the same step.
say "$(date -u '+%H:%M:%S') undisturbed run to step $STEP"
T2=$(date +%s)
OUTPUT_DIR=$TMP/ref timeout --foreground -k 60 $((SECS * 3 + 600)) \
    "$KEEL" launch "$TMP/mlp.ini" --ps 1 --workers 1 --no-status \
    -s train.max_steps="$STEP" > "$TMP/ref.log" 2>&1 &
LPID=$!
wait "$LPID"
REF_RC=$?
LPID=
T3=$(date +%s)
say "undisturbed run ended after $((T3 - T2)) s with exit status $REF_RC"
if [ "$REF_RC" != 0 ]; then
    die "undisturbed keel launch exited $REF_RC: $(grep -E '^(launch|keel)' "$TMP/ref.log" | tail -3)"
    exit 1
fi
"$KEEL" ckpt verify "$TMP/ref" > "$TMP/verify_ref.txt" 2>&1 ||
    die "keel ckpt verify $TMP/ref: $(grep -v '^ok' "$TMP/verify_ref.txt" | head -3)"

DIFF=$("$KEEL" ckpt diff "$TMP/chaos/$FINAL" "$TMP/ref/$FINAL" 2>&1)
DIFF_RC=$?
[ "$DIFF_RC" = 0 ] || die "final checkpoints differ (keel ckpt diff exit $DIFF_RC): $(printf '%s\n' "$DIFF" | head -5)"

# Every step both runs checkpointed: the same bits there too.
N_SAME=0 N_DIFFER=0
for f in "$TMP"/ref/model.ckpt-*.h5; do
    b=${f##*/}
    [ -f "$TMP/chaos/$b" ] || continue
    if "$KEEL" ckpt diff "$TMP/chaos/$b" "$f" > /dev/null 2>&1; then
        N_SAME=$((N_SAME + 1))
    else
        N_DIFFER=$((N_DIFFER + 1))
        [ "$N_DIFFER" -gt 1 ] || die "$b differs between the runs"
    fi
done
[ "$N_DIFFER" = 0 ] || die "$N_DIFFER checkpoints differ between the runs"

acc() {
    "$KEEL" eval "$TMP/mlp.ini" --checkpoint "$1" --json |
        sed -n 's/.*"accuracy": \([0-9.]*\).*/\1/p'
}
ACC_CHAOS=$(acc "$TMP/chaos/$FINAL")
ACC_REF=$(acc "$TMP/ref/$FINAL")
if [ -z "$ACC_CHAOS" ] || [ -z "$ACC_REF" ]; then
    die "keel eval failed (chaos '$ACC_CHAOS', undisturbed '$ACC_REF')"
    ACC_OK=0
else
    ACC_OK=$(awk -v a="$ACC_CHAOS" -v b="$ACC_REF" 'BEGIN {
        d = (a - b) * 100; if (d < 0) d = -d; print (d <= 0.5) ? 1 : 0 }')
    [ "$ACC_OK" = 1 ] || die "accuracy $ACC_CHAOS (chaos) vs $ACC_REF (undisturbed): more than 0.5 points apart"
fi

echo "soak summary ---------------------------------------------------------"
printf '  chaos minutes      %s (seed %s, mean gap %s s; run took %d s)\n' \
    "$MINUTES" "$SEED" "$PERIOD" "$((T1 - T0))"
printf '  kills              %s: chief %s, worker %s, ps %s\n' \
    "$KILLS" "$K_CHIEF" "$K_WORKER" "$K_PS"
printf '  recoveries         %s (cluster stepped again after the restart; %s cut short by the stop)\n' \
    "$RECOVERED" "$UNRECOVERED"
printf '  chief restarts     %s back at a step, slowest %.3f s after the kill\n' \
    "$N_BACK" "$MAX_BACK"
printf '  ps restarts        %s step(s) recomputed from checkpoints\n' "$STEPS_LOST"
printf '  other failures     %s task exits not caused by a kill (restarted)\n' "$FAILURES"
printf '  final step         %s; %s checkpoints, all verify\n' "$STEP" "$N_CKPT"
printf '  accuracy           chaos %s, undisturbed %s (run took %d s)\n' \
    "$ACC_CHAOS" "$ACC_REF" "$((T3 - T2))"
printf '  ckpt diff          %s\n' "$(printf '%s\n' "$DIFF" | tail -1)"
printf '  every common step  %s checkpoints bitwise equal, %s differ\n' \
    "$N_SAME" "$N_DIFFER"
if [ "$FAILED" = 0 ]; then
    echo "soak: PASS"
else
    echo "soak: FAIL"
fi
exit "$FAILED"
