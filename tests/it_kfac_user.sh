#!/bin/sh
# it_kfac_user.sh - examples/kfac_user (a user's own MLP, its two dense
# layers registered in K-FAC's layer collection, keel/kfac.h): after 100
# steps K-FAC's loss on the whole set is below 0.12, which momentum SGD
# (its best learning rate of 0.2, 0.4, 0.8, 1.6 on this set) does not
# reach in the same steps, and lower than SGD's; it resumes from its
# checkpoint; the same program on a cluster in K-FAC's chief mode (keel
# launch: 1 ps, the chief and 1 worker) trains to the same bound.
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
echo "kfac_user: 3 passed, 0 failed"
