#!/bin/sh
# it_kfac_user.sh - examples/kfac_user (a user's own MLP, its two dense
# layers registered in K-FAC's layer collection, keel/kfac.h): after 100
# steps K-FAC's loss on the whole set is below 0.12, which momentum SGD
# (its best learning rate of 0.2, 0.4, 0.8, 1.6 on this set) does not
# reach in the same steps, and lower than SGD's; it resumes from its
# checkpoint; the same program on a cluster in K-FAC's chief mode (keel
# launch: 1 ps, the chief and 1 worker) trains to the same bound; in roles
# mode (1 ps, the chief and 2 workers: gradient, covariance and inverse
# worker) it trains to the same bound, every task exits 0 and the next run
# resumes from its checkpoint; a SIGKILLed inverse worker, restarted by
# keel launch, costs no steps (no rollback, the run ends at its last step)
# and preconditions the chief's later steps again.
set -eu
bin="$KEEL_BUILDDIR/examples/kfac_user"
keel="$KEEL_BUILDDIR/keel"
dir=$(mktemp -d "${TMPDIR:-/tmp}/keel-kfacuser-XXXXXX")
trap 'rm -rf "$dir"' EXIT
export OPENBLAS_NUM_THREADS=1
loss_of() { awk -v w="$2" '$1 == w":" && $3 == "'"$3"':" { print $5 }' "$1"; }
timeout 120 "$bin" "$dir/kfac" 100 kfac >"$dir/kfac.out" 2>"$dir/kfac.err" ||
    { cat "$dir/kfac.err"; exit 1; }
timeout 120 "$bin" "$dir/sgd" 100 sgd >"$dir/sgd.out" 2>"$dir/sgd.err" ||
    { cat "$dir/sgd.err"; exit 1; }
cat "$dir/kfac.out" "$dir/sgd.out"
k=$(loss_of "$dir/kfac.out" kfac 100)
s=$(loss_of "$dir/sgd.out" sgd 100)
if ! awk -v k="$k" -v s="$s" 'BEGIN { exit !(k != "" && s != "" &&
        k < 0.12 && s >= 0.12 && k < s) }'; then
    echo "kfac_user: K-FAC's loss $k, SGD's $s after 100 steps (want K-FAC" \
         "< 0.12 <= SGD)"
    exit 1
fi
# resume: the next run goes on from the checkpoint of step 100
timeout 120 "$bin" "$dir/kfac" 150 kfac >"$dir/kfac2.out" 2>"$dir/kfac2.err"
grep -q "restored .*model.ckpt-100.h5" "$dir/kfac2.err" ||
    { echo "kfac_user: no restore"; cat "$dir/kfac2.err"; exit 1; }
grep -q "^kfac: step 150:" "$dir/kfac2.out"
# a cluster, chief mode: the chief observes and applies K-FAC to the mean
if ! timeout 180 "$keel" launch --ps 1 --workers 1 --no-status -- \
        "$bin" "$dir/cluster" 100 kfac >"$dir/launch" 2>&1; then
    echo "kfac_user: keel launch failed:"; tail -20 "$dir/launch"; exit 1
fi
c=$(sed -n 's/^chief | kfac: step 100: loss \([0-9.]*\)$/\1/p' "$dir/launch")
if ! awk -v c="$c" 'BEGIN { exit !(c != "" && c < 0.12) }'; then
    echo "kfac_user: on a cluster, loss '$c' after 100 steps"
    tail -20 "$dir/launch"; exit 1
fi
echo "kfac_user: cluster loss $c"

# launch_roles NAME STEPS: the example in roles mode on 1 ps + 3 replicas
# (the chief a gradient worker, worker.0 covariance, worker.1 inverse)
# into $dir/NAME.launch, its checkpoints in $dir/roles
launch_roles() {
    if ! timeout 180 "$keel" launch --ps 1 --workers 2 --no-status -- \
            "$bin" "$dir/roles" "$2" kfac roles >"$dir/$1.launch" 2>&1; then
        echo "kfac_user: roles: keel launch failed:"
        tail -20 "$dir/$1.launch"; exit 1
    fi
    for t in ps.0 chief worker.0 worker.1; do
        grep -q "^launch | $t (pid [0-9]*) ended: exit status 0$" \
            "$dir/$1.launch" ||
            { echo "kfac_user: roles: $t did not exit 0"
              tail -20 "$dir/$1.launch"; exit 1; }
    done
}
launch_roles roles 100
r=$(sed -n 's/^chief | kfac: step 100: loss \([0-9.]*\)$/\1/p' \
    "$dir/roles.launch")
if ! awk -v r="$r" 'BEGIN { exit !(r != "" && r < 0.12) }'; then
    echo "kfac_user: roles mode, loss '$r' after 100 steps"
    tail -20 "$dir/roles.launch"; exit 1
fi
echo "kfac_user: roles mode loss $r"
launch_roles roles2 150
grep -q "^chief | restored .*model.ckpt-100.h5" "$dir/roles2.launch" ||
    { echo "kfac_user: roles: no restore"; tail -20 "$dir/roles2.launch"
      exit 1; }
grep -q "^chief | kfac: step 150: loss" "$dir/roles2.launch" ||
    { echo "kfac_user: roles: no step 150"; tail -20 "$dir/roles2.launch"
      exit 1; }

# roles mode, worker.1 (the inverse worker) SIGKILLed past step 100
. "$KEEL_SRCDIR/tests/common.sh"
out=$dir/kill.launch
last=1500
timeout 240 "$keel" launch --ps 1 --workers 2 --no-status -- \
    "$bin" "$dir/kill" $last kfac roles >"$out" 2>&1 &
lpid=$!
# wait_for REGEX SECS: until a line of $out matches
wait_for() {
    end=$(($(date +%s) + $2))
    until grep -qE "$1" "$out"; do
        if [ "$(date +%s)" -ge "$end" ] || ! kill -0 "$lpid" 2>/dev/null; then
            echo "kfac_user: kill: no line /$1/"; tail -20 "$out"; exit 1
        fi
        sleep 0.05
    done
}
wait_for '^chief \| saved checkpoint for step 100:' 120
ipid=$(keel_launch_pid "$out" worker.1)
[ -n "$ipid" ] || { echo "kfac_user: kill: no pid of worker.1"; exit 1; }
kill -KILL "$ipid"
wait_for '^launch \| restarted worker\.1 ' 60
# the chief's step when the restart was seen: its last staleness line
at=$(sed -n 's/^chief | K-FAC: step \([0-9]*\) preconditioned.*/\1/p' "$out" |
     tail -1)
wait "$lpid" || { echo "kfac_user: kill: keel launch failed"; tail -20 "$out"
                  exit 1; }
grep -q "^chief | kfac: step $last: loss" "$out" &&
    ! grep -qE '^chief \| (restored|restarting from)' "$out" ||
    { echo "kfac_user: kill: the chief rolled back or stopped short"
      tail -20 "$out"; exit 1; }
# the chief's staleness lines after the restart: inverses at most 20
# steps old again at the last one
stale=$(sed -n 's/^chief | K-FAC: step \([0-9]*\) preconditioned .* at most \([0-9]*\) .*/\1 \2/p' \
        "$out" | tail -1)
if ! echo "$stale" | awk -v at="${at:-0}" '{ ok = $1 > at && $2 <= 20 }
        END { exit !ok }'; then
    echo "kfac_user: kill: last staleness (step, age) '$stale'," \
         "restart seen at step ${at:-0}"
    grep 'K-FAC: step' "$out"; exit 1
fi
echo "kfac_user: inverse worker killed and restarted; (step, age) $stale"
echo "kfac_user: 5 passed, 0 failed"
