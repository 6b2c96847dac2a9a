#!/bin/sh
# algorithms_accuracy.sh - every update rule (docs/algorithms.md) trains the
# MLP on Fashion-MNIST with 1 ps and 2 training replicas (the chief and one
# worker, `keel launch --ps 1 --workers 1`; --replicas N: the chief and N - 1
# workers) for 3 epochs of examples (180,000), then `keel eval` gives its
# test accuracy. One line per rule: accuracy, wall time, examples per
# second; exits 1 if a rule ends under 84 % (or fails). The long form of
# check_algorithms' cluster test (too slow for `make check` on 2 cores);
# `make check-long` runs it.
#
#   bench/algorithms_accuracy.sh [--replicas N] [BUILD_DIR] [RULE...]
#                                               (2 replicas, all rules)
#
# Each run holds /tmp/keel-bench.lock (flock) so that its examples per
# second are not measured beside another benchmark (KEEL_BENCH_LOCK=0:
# not).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
replicas=2
if [ "${1:-}" = --replicas ]; then
    replicas=${2:-}
    shift 2 || { echo "algorithms_accuracy: --replicas needs a count" >&2; exit 2; }
fi
case $replicas in
    [2-9]|[1-5][0-9]|6[0-5]) ;;
    *) echo "algorithms_accuracy: --replicas '$replicas': want 2..65 (the chief and up to 64 workers)" >&2; exit 2 ;;
esac
build=${1:-${KEEL_BUILDDIR:-$here/_build}}
[ $# -gt 0 ] && shift
. "$here/tests/common.sh"
rules=${*:-$KEEL_ALL_RULES}
keel="$build/keel"
[ -x "$keel" ] || { echo "algorithms_accuracy: no $keel (build first)" >&2; exit 2; }
data=/usr/share/datasets/fashion-mnist
[ -f "$data/train-images-idx3-ubyte.gz" ] || {
    echo "algorithms_accuracy: no Fashion-MNIST in $data (apt-get install dataset-fashion-mnist)" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/keel-algos-XXXXXX")
trap 'rm -rf "$work"' EXIT
{ keel_rules_mlp_ini "$data"; cat <<EOF; } >"$work/mlp.ini"
[checkpoint]
dir = $work/run
save_steps = 0
save_secs = 0
[hooks]
log_every_steps = 1000
summary_every_steps = 0
EOF
examples=180000
# KEEL_BENCH_LOCK=0: no lock (accuracy only; the rates are then not
# comparable with other runs)
lock() {
    if [ "${KEEL_BENCH_LOCK:-1}" != 0 ] && command -v flock >/dev/null; then
        flock /tmp/keel-bench.lock "$@"
    else
        "$@"
    fi
}
printf '%-16s %9s %9s %12s\n' rule accuracy seconds examples/s
bad=0
for r in $rules; do
    # a sync round trains one global batch (64) per step, an asynchronous
    # step one replica's slice (64 / replicas: 32 for 2)
    case $r in
        sync|sagn|easgd|model_averaging) steps=$((examples / 64)) ;;
        *) steps=$((examples * replicas / 64)) ;;
    esac
    extra=$(keel_rule_rates "$r" "$replicas")
    rm -rf "$work/run"
    # timed inside the lock: waiting for another benchmark does not count
    # shellcheck disable=SC2086
    if ! lock sh -c 'date +%s.%N >"$0.t0"; "$@"; rc=$?;
                     date +%s.%N >"$0.t1"; exit $rc' "$work/$r" \
            "$keel" launch "$work/mlp.ini" --ps 1 --workers $((replicas - 1)) \
            --no-status \
            -s algorithm.name="$r" -s train.max_steps=$steps $extra \
            >"$work/$r.log" 2>&1; then
        echo "$r: training failed; last lines:" >&2
        tail -5 "$work/$r.log" >&2
        bad=1
        continue
    fi
    t0=$(cat "$work/$r.t0")
    t1=$(cat "$work/$r.t1")
    acc=$("$keel" eval "$work/run" --json 2>/dev/null |
          sed -n 's/.*"accuracy": *\([0-9.]*\).*/\1/p')
    secs=$(echo "$t1 - $t0" | bc -l)
    printf '%-16s %8.2f%% %9.1f %12.0f\n' "$r" "$(echo "${acc:-0} * 100" | bc -l)" \
        "$secs" "$(echo "$examples / $secs" | bc -l)"
    if [ -z "$acc" ] || [ "$(echo "$acc < 0.84" | bc -l)" = 1 ]; then
        bad=1
    fi
done
exit $bad
