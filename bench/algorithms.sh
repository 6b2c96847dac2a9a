#!/usr/bin/env bash
# bench/algorithms.sh - every training scheme (algorithm.name) on
# Fashion-MNIST with the same example budget: the MLP with 1 ps + 2 and
# 1 ps + 4 training replicas (chief + workers), the CNN with 1 ps + 2,
# each started with `keel launch`; hogwild also in one process with as
# many threads as replicas ("hogwild-1proc"). For every run: test
# accuracy after the budget (keel eval), wall time (start-up included),
# examples/s while training (first to last checkpoint; "steady": from the
# first checkpoint after step 0 to the last) and the bytes the
# ps moved (its "bytes received R, sent T" line), in a
# Markdown table; and a PNG (gnuplot) of test accuracy against wall time
# and against examples seen, one line per scheme, from the run's
# checkpoints (POINTS of them, each evaluated with keel eval; the time
# of a point is its checkpoint's mtime less the step-0 checkpoint's, so
# start-up is not plotted). Every run trains the job of
# bench/algorithms_accuracy.sh (SGD at 0.1, batch 64; tests/common.sh)
# with the model's type replaced, at its rule's tuned rates.
#
#   usage: bench/algorithms.sh [BUILD]
#   env:   RULES="sync async hogwild downpour ..." (default: all of them;
#          a scheme the built keel does not know is skipped with a note)
#          MODELS="mlp cnn" MLP_REPLICAS="2 4" CNN_REPLICAS="2"
#          EPOCHS=3 (the budget: EPOCHS x 60000 examples, or EXAMPLES)
#          POINTS=5
#          BENCH_OUT (default a fresh mktemp -d)
#          STRAGGLER=1: straggler mode: the last worker of every cluster
#          run is slowed to SPEED (0.5) of its speed by this script
#          (SIGSTOP for (1 - SPEED) x 100 ms of every 100 ms, then
#          SIGCONT), each scheme labelled "<scheme>+straggler"; RULES
#          then defaults to "sync sync-backup1 async" (sync-backup1: sync
#          with one backup worker, cluster.replicas_to_aggregate =
#          replicas - 1) and MODELS to mlp; the PNGs are then named
#          algorithms-straggler-<model>-w<replicas>.png
#
# The budget becomes train.max_steps: a global step trains batch_size
# (64) examples in the synchronous schemes (sync sagn easgd
# model_averaging) and in one process, batch_size / replicas (one
# replica's push) in the asynchronous ones.
# Needs gnuplot (apt-get install gnuplot-nox) for the PNG; without it the
# table is still written. Run it under `flock /tmp/keel-bench.lock`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../_build}
keel="$build/keel"
. "$here/../tests/common.sh"
. "$here/common.sh"
STRAGGLER=${STRAGGLER:-0}
SPEED=${SPEED:-0.5}
if [ "$STRAGGLER" = 1 ]; then
    RULES=${RULES:-"sync sync-backup1 async"}
    MODELS=${MODELS:-mlp}
fi
RULES=${RULES:-$KEEL_ALL_RULES}
MODELS=${MODELS:-"mlp cnn"}
MLP_REPLICAS=${MLP_REPLICAS:-"2 4"}
CNN_REPLICAS=${CNN_REPLICAS:-"2"}
EPOCHS=${EPOCHS:-3}
POINTS=${POINTS:-5}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
B=64
N_TRAIN=60000
EXAMPLES=${EXAMPLES:-$((EPOCHS * N_TRAIN))}
out=$(bench_out_dir keel-algorithms)
# the rule comparisons' job (SGD at 0.1, tests/common.sh), each rule at
# its tuned rates (keel_rule_rates), as bench/algorithms_accuracy.sh
ini="$out/job.ini"
keel_rules_mlp_ini "$DATA" > "$ini"

core=$(OPENBLAS_VERBOSE=2 "$keel" --version 2>&1 | sed -n 's/^Core: //p')
{
    echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
    echo "# flags: $(grep -m1 -o -w -E 'avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    echo "# OpenBLAS kernel: ${core:-unknown}; budget $EXAMPLES examples; logs: $out"
} >&2

is_sync() { case $1 in sync|sagn|easgd|model_averaging) return 0;; esac; return 1; }
# sync-backup1 is the sync rule with one backup worker
algo_of() { case $1 in sync-backup1) echo sync;; *) echo "$1";; esac; }
known() {  # the built keel accepts algorithm.name = $1
    "$keel" config check "$ini" -s algorithm.name="$(algo_of "$1")" -s train.max_steps=1 >/dev/null 2>&1
}
# Straggler mode: worker $2 of the `keel launch` with pid $1 (its child
# whose TF_CONFIG names that task; found again after a restart) runs for
# SPEED x 100 ms of every 100 ms and is stopped for the rest, until the
# launch ends.
throttle() {
    local lp=$1 idx=$2 pid="" run stop c
    run=$(awk -v s="$SPEED" 'BEGIN {printf "%.3f", 0.1 * s}')
    stop=$(awk -v s="$SPEED" 'BEGIN {printf "%.3f", 0.1 * (1 - s)}')
    while kill -0 "$lp" 2>/dev/null; do
        if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
            pid=""
            for c in $(pgrep -P "$lp" || true); do
                if tr '\0' '\n' 2>/dev/null < "/proc/$c/environ" |
                   grep -q -E "^TF_CONFIG=.*\"type\": *\"worker\", *\"index\": *$idx *\}"; then
                    pid=$c
                fi
            done
            [ -n "$pid" ] || { sleep 0.05; continue; }
        fi
        sleep "$run"
        kill -STOP "$pid" 2>/dev/null || true
        sleep "$stop"
        kill -CONT "$pid" 2>/dev/null || true
    done
}
now() { date +%s.%N; }
acc_of() { "$keel" eval "$1" --json 2>/dev/null |
           sed -n 's/.*"accuracy": *\([0-9.]*\).*/\1/p'; }

table="$out/table.md"
echo "| model | replicas | scheme | test accuracy | wall s (with start-up) | examples/s (training) | examples/s (steady) | ps bytes in + out (MiB) |" > "$table"
echo "|---|---|---|---|---|---|---|---|" >> "$table"
skipped=""

run_one() {  # model replicas rule label
    local m=$1 w=$2 rule=$3 label=$4 eps steps every dir t0 t1 rc=0 rates
    local algo extra=() lp tp=""
    algo=$(algo_of "$rule")
    rates=$(keel_rule_rates "$algo" "$w")
    if [ "$rule" = sync-backup1 ]; then
        # a step aggregates w - 1 of the w replicas' pieces of the batch
        eps=$((B * (w - 1) / w))
        extra=(-s cluster.replicas_to_aggregate=$((w - 1)) -s cluster.reduce_tree=false)
    elif [ "$label" = hogwild-1proc ] || is_sync "$rule"; then eps=$B; else eps=$((B / w)); fi
    [ "$STRAGGLER" = 1 ] && [ "$label" != hogwild-1proc ] && label="$label+straggler"
    steps=$((EXAMPLES / eps))
    every=$((steps / POINTS))
    dir="$out/$m-w$w-$label"
    rm -rf "$dir"
    # shellcheck disable=SC2206
    local common=(-s model.type="$m" $rates -s data.dir="$DATA" -s train.batch_size=$B
                  -s train.epochs=0 -s train.max_steps=$steps -s train.seed=0
                  -s train.threads=1 -s algorithm.name="$algo"
                  -s checkpoint.dir="$dir" -s checkpoint.save_steps=$every
                  -s checkpoint.max_to_keep=$((POINTS + 2))
                  -s hooks.progress=off -s hooks.log_every_steps=1000)
    echo "== $m replicas=$w $label: $steps steps" >&2
    t0=$(now)
    if [ "$label" = hogwild-1proc ]; then
        OPENBLAS_NUM_THREADS=1 "$keel" train "$ini" "${common[@]}" \
            -s train.model_threads="$w" > "$dir.log" 2>&1 || rc=$?
    else
        OPENBLAS_NUM_THREADS=1 "$keel" launch "$ini" --ps 1 \
            --workers $((w - 1)) --no-status --max-restarts 0 \
            -s train.model_threads=1 "${common[@]}" "${extra[@]}" > "$dir.log" 2>&1 &
        lp=$!
        if [ "$STRAGGLER" = 1 ]; then
            throttle "$lp" $((w - 2)) &
            tp=$!
        fi
        wait "$lp" || rc=$?
        [ -n "$tp" ] && { wait "$tp" || true; }
    fi
    t1=$(now)
    if [ "$rc" != 0 ]; then
        echo "   failed (exit $rc): $dir.log" >&2
        echo "| $m | $w | $label | failed (exit $rc) | | | | |" >> "$table"
        return
    fi
    # one point per checkpoint: seconds since start, examples, accuracy
    : > "$dir.dat.tmp"
    for ck in "$dir"/*.h5; do
        local s mt a
        s=$(basename "$ck" .h5 | sed 's/.*-//')
        mt=$(stat -c %.3Y "$ck" 2>/dev/null || stat -c %Y "$ck")
        a=$("$keel" eval "$ck" --json 2>/dev/null | sed -n 's/.*"accuracy": *\([0-9.]*\).*/\1/p')
        echo "$(echo "$mt $t0" | awk '{printf "%.2f", $1 - $2}') $((s * eps)) $a" >> "$dir.dat.tmp"
    done
    # time from the step-0 checkpoint (the job is up): start-up is not
    # plotted
    sort -k2,2n "$dir.dat.tmp" |
        awk 'NR == 1 {t = $1} {printf "%.2f %s %s\n", $1 - t, $2, $3}' > "$dir.dat"
    rm -f "$dir.dat.tmp"
    local acc wall rate bytes
    acc=$(acc_of "$dir")
    wall=$(echo "$t1 $t0" | awk '{printf "%.1f", $1 - $2}')
    # training rate: from the first checkpoint (step 0, once the cluster
    # is up) to the last (the budget), so start-up is not counted
    rate=$(awk 'NR == 1 {t = $1; e = $2} END {if ($1 > t) printf "%.0f", ($2 - e) / ($1 - t); else print "-"}' "$dir.dat")
    # steady rate: from the first checkpoint after step 0 to the last, so
    # replicas that start late (a straggler's throttled start-up, which a
    # sync step waits for) are not counted either
    steady=$(awk 'NR == 2 {t = $1; e = $2} END {if (NR > 2 && $1 > t) printf "%.0f", ($2 - e) / ($1 - t); else print "-"}' "$dir.dat")
    bytes=$({ grep -h -o 'bytes received [0-9]*, sent [0-9]*' "$dir"/logs/ps*.log 2>/dev/null || true; } |
            awk '{s += $3 + $5} END {if (NR) printf "%.1f", s / 1048576; else print "0 (one process)"}')
    echo "| $m | $w | $label | $acc | $wall | $rate | $steady | $bytes |" >> "$table"
}

for m in $MODELS; do
    reps=$MLP_REPLICAS
    [ "$m" = cnn ] && reps=$CNN_REPLICAS
    for w in $reps; do
        for rule in $RULES; do
            if ! known "$rule"; then
                case " $skipped " in *" $rule "*) ;; *) skipped="$skipped $rule";; esac
                continue
            fi
            run_one "$m" "$w" "$rule" "$rule"
            [ "$rule" = hogwild ] && run_one "$m" "$w" hogwild hogwild-1proc
        done
    done
done
[ -n "$skipped" ] && echo "Skipped (not in this keel: \`keel config check -s algorithm.name=X\` exits 2):$skipped" >> "$table"
cat "$table"

if ! command -v gnuplot >/dev/null; then
    echo "algorithms.sh: gnuplot missing: no plot (apt-get install gnuplot-nox)" >&2
    exit 0
fi
for m in $MODELS; do
    reps=$MLP_REPLICAS
    [ "$m" = cnn ] && reps=$CNN_REPLICAS
    for w in $reps; do
        files=$(ls "$out/$m-w$w-"*.dat 2>/dev/null || true)
        [ -n "$files" ] || continue
        # straggler runs get their own names beside the plain runs' plots
        png="$out/algorithms-$m-w$w.png"
        title="$m, 1 ps + $w replicas, $EXAMPLES examples"
        if [ "$STRAGGLER" = 1 ]; then
            png="$out/algorithms-straggler-$m-w$w.png"
            title="$title, last worker at speed $SPEED"
        fi
        {
            echo "set terminal pngcairo noenhanced size 1200,500 font ',10'"
            echo "set output '$png'"
            echo "set multiplot layout 1,2 title '$title'"
            echo "set ylabel 'test accuracy'; set key bottom right; set grid"
            for axis in 1 2; do
                if [ $axis = 1 ]; then echo "set xlabel 'training time (s, from the step-0 checkpoint)'"; else echo "set xlabel 'examples seen'"; fi
                printf "plot "
                sep=""
                for f in $files; do
                    name=$(basename "$f" .dat | sed "s/^$m-w$w-//")
                    printf "%s'%s' using %d:3 with linespoints title '%s'" "$sep" "$f" "$axis" "$name"
                    sep=", "
                done
                echo
            done
            echo "unset multiplot"
        } > "$out/plot-$m-w$w.gp"
        gnuplot "$out/plot-$m-w$w.gp" && echo "plot: $png" >&2
    done
done
