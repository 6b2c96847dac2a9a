#!/usr/bin/env bash
# bench/strategy.sh - train.strategy = mirrored (2 replicas on 2 threads,
# each with one model thread) against one_device with 2 model threads, in
# one run: `keel train` on Fashion-MNIST, the MLP 784-256-256-10 (Adam) at
# batch 64 and 256 and the CNN at batch 64. Rounds alternate the two
# settings so the shared machine's noise hits both; prints the medians of
# examples/s (the training loop's, from keel train's last line) and the
# median of the per-round ratios mirrored / one_device.
# Then (PS=1) the deterministic sync reduction's cost: keel launch, 1 ps,
# the chief and 1 worker, the CNN at batch 64 (each replica one tree node)
# and 96 (6 pieces: 3 a replica, again one node), cluster.reduce_tree
# true against false: the
# chief's examples/s, and the ps's own time per sync step from its log
# (aggregate: the sum, the update and the replies, one thread), which a
# loaded machine disturbs less than the run's wall time.
#   usage: flock /tmp/keel-bench.lock bench/strategy.sh [BUILD_DIR]
#   env:   ROUNDS=5 EXAMPLES=96000 CNN_EXAMPLES=9600 PS=1 MIRRORED=1
#          BENCH_OUT=./strategy-bench
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../_build}
ROUNDS=${ROUNDS:-5}
EXAMPLES=${EXAMPLES:-96000}
CNN_EXAMPLES=${CNN_EXAMPLES:-9600}
OUT=${BENCH_OUT:-$PWD/strategy-bench}
mkdir -p "$OUT"
: > "$OUT/runs.tsv"
cat > "$OUT/job.ini" <<EOF
[data]
dir = /usr/share/datasets/fashion-mnist
[optimizer]
name = adam
learning_rate = 0.001
[train]
threads = 1
[checkpoint]
dir = $OUT/run
save_steps = 0
save_secs = 0
[hooks]
log_every_steps = 0
summary_every_steps = 0
progress = off
EOF
. "$here/common.sh"
bench_machine

run() {   # $1 model $2 batch $3 steps $4 setting: prints examples/s
    local set
    if [ "$4" = mirrored ]; then
        set="-s train.strategy=mirrored -s train.replicas=2"
    else
        set="-s train.model_threads=2"
    fi
    rm -rf "$OUT/run"
    # shellcheck disable=SC2086
    "$build/keel" train "$OUT/job.ini" -s "model.type=$1" \
        -s "train.batch_size=$2" -s "train.max_steps=$3" $set 2>/dev/null |
        sed -n 's/.* \([0-9.]*\) examples\/s).*/\1/p' | tail -1
}

cases="mlp:64 mlp:256 cnn:64"
[ "${MIRRORED:-1}" = 1 ] || cases=""
for r in $(seq "$ROUNDS"); do
    for c in $cases; do
        m=${c%%:*} b=${c##*:}
        n=$EXAMPLES
        [ "$m" = cnn ] && n=$CNN_EXAMPLES
        for s in one_device mirrored; do
            v=$(run "$m" "$b" $((n / b)) "$s")
            [ -n "$v" ] || { echo "strategy.sh: keel train failed ($m $b $s)" >&2; exit 1; }
            printf '%s\t%s\t%s\t%s\t%s\n' "$r" "$m" "$b" "$s" "$v" >> "$OUT/runs.tsv"
        done
    done
done

ps_run() {   # $1 batch $2 steps $3 reduce_tree: prints the chief's examples/s
            # and the ps's aggregate ms per step
    local log ex agg
    rm -rf "$OUT/run"
    log=$("$build/keel" launch "$OUT/job.ini" --ps 1 --workers 1 --no-status \
        -s model.type=cnn -s "train.batch_size=$1" -s "train.max_steps=$2" \
        -s "cluster.reduce_tree=$3" 2>&1) || true
    ex=$(sed -n 's/.*chief.* \([0-9.]*\) examples\/s).*/\1/p' <<<"$log" | tail -1)
    agg=$(sed -n 's/.* aggregate \([0-9.]*\) (sum.*/\1/p' <<<"$log" | tail -1)
    if [ -n "$ex" ] && [ -n "$agg" ]; then
        printf '%s\t%s\n' "$ex" "$agg"
    fi
}
: > "$OUT/ps.tsv"
if [ "${PS:-1}" = 1 ]; then
    for r in $(seq "$ROUNDS"); do
        for b in 64 96; do
            for t in true false; do
                v=$(ps_run "$b" $((CNN_EXAMPLES / b)) "$t")
                [ -n "$v" ] || { echo "strategy.sh: keel launch failed ($b $t)" >&2; exit 1; }
                printf '%s\t%s\t%s\t%s\n' "$r" "$b" "$t" "$v" >> "$OUT/ps.tsv"
            done
        done
    done
fi

/usr/bin/python3 - "$OUT/ps.tsv" <<'PY'
import statistics, sys, collections
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, b, t, v, agg = line.split()
    runs[int(b)].setdefault(int(r), {})[t] = (float(v), float(agg))
if runs:
    print(f"{'cnn ps batch':>12} {'tree ex/s':>10} {'replica order ex/s':>19} "
          f"{'ratio':>6} {'ps ms/step tree':>16} {'order':>6} {'ratio':>6}")
for b, rounds in sorted(runs.items()):
    med = lambda t, i: statistics.median(x[t][i] for x in rounds.values())
    ratio = statistics.median(x["true"][0] / x["false"][0]
                              for x in rounds.values())
    aratio = statistics.median(x["true"][1] / x["false"][1]
                               for x in rounds.values())
    print(f"{b:>12} {med('true', 0):>10.0f} {med('false', 0):>19.0f} "
          f"{ratio:>6.2f} {med('true', 1):>16.3f} {med('false', 1):>6.3f} "
          f"{aratio:>6.2f}")
PY

/usr/bin/python3 - "$OUT/runs.tsv" <<'PY'
import statistics, sys, collections
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, m, b, s, v = line.split()
    runs[(m, int(b))].setdefault(int(r), {})[s] = float(v)
print(f"{'model':>5} {'batch':>5} {'one_device m2 ex/s':>19} {'mirrored 2 ex/s':>16} {'ratio':>6}")
for (m, b), rounds in runs.items():
    one = statistics.median(x["one_device"] for x in rounds.values())
    mir = statistics.median(x["mirrored"] for x in rounds.values())
    ratio = statistics.median(x["mirrored"] / x["one_device"] for x in rounds.values())
    print(f"{m:>5} {b:>5} {one:>19.0f} {mir:>16.0f} {ratio:>6.2f}")
PY
