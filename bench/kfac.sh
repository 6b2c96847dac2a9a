#!/bin/sh
# bench/kfac.sh - K-FAC against Adam on Fashion-MNIST, in one process.
#
#   bench/kfac.sh overhead [BUILD]   per-step time of K-FAC over Adam (MLP and
#                                    CNN, batch 64, invert_every 10) with
#                                    K-FAC's split, ROUNDS rounds (median of
#                                    10-step blocks in each); K-FAC with
#                                    cov_update_every COV_EVERY (default 1:
#                                    factors every step; a list runs each),
#                                    under each OpenBLAS kernel of CORETYPES
#                                    ("default": OpenBLAS's own choice; by
#                                    default also SkylakeX where the CPU has
#                                    AVX-512)
#   bench/kfac.sh accuracy [BUILD]   for MODELS (mlp cnn): the test accuracy
#                                    Adam reaches after 5 epochs, then the
#                                    K-FAC steps and training seconds to
#                                    reach it (K-FAC resumed in chunks of
#                                    CHUNK steps, each chunk's checkpoint
#                                    evaluated with keel eval)
#   bench/kfac.sh distributed [BUILD]  the CNN (MODEL) with K-FAC on STEPS
#                                    steps of 64 examples' gradient each
#                                    (default 937: one epoch), in one
#                                    process, then with keel launch on
#                                    1 ps + 3 replicas in chief mode and
#                                    in roles mode (1/1/1), and on 1 ps +
#                                    5 replicas in roles mode (3/1/1);
#                                    test accuracy, wall seconds and the
#                                    CPU seconds of every process, and a
#                                    markdown table (RUNS picks the runs,
#                                    SEED the train.seed, default 1)
#   bench/kfac.sh rolespeed [BUILD]  examples/s of a gradient worker (the
#                                    chief) in roles mode against a replica
#                                    of plain sync SGD on the same tasks
#                                    (1 ps + 3 replicas, 64 examples per
#                                    replica and step, MODEL), STEPS steps,
#                                    ROUNDS rounds alternating, medians
#
# Run it under `flock /tmp/keel-bench.lock` so benchmarks never overlap.
# BUILD is the build directory (default _build). Output: JSON lines on
# stdout; logs in $BENCH_OUT (default a fresh mktemp -d).
set -eu
mode=${1:-overhead}
build=${2:-_build}
ROUNDS=${ROUNDS:-3}
COV_EVERY=${COV_EVERY:-1}
MODELS=${MODELS:-"mlp cnn"}
CHUNK=${CHUNK:-250}
KFAC_LR=${KFAC_LR:-$( [ "$mode" = accuracy ] && echo 0.001 || echo 0.0003)}
KFAC_DAMPING=${KFAC_DAMPING:-0.001}
MAX_KFAC_EPOCHS=${MAX_KFAC_EPOCHS:-5}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
. "$(dirname "$0")/common.sh"
out=$(bench_out_dir keel-kfac-bench)
keel="$build/keel"
[ "$mode" = overhead ] && make -s -C "$build" bench/kfac_bench >&2
echo "# $(bench_machine)" >&2
echo "# logs: $out" >&2
if [ -z "${CORETYPES:-}" ]; then
    CORETYPES=default
    bench_has_avx512 && CORETYPES="default SkylakeX"
fi

case $mode in
overhead)
    for m in $MODELS; do
        for core in $CORETYPES; do
            for ce in $COV_EVERY; do
                echo "# $m cov_update_every $ce kernel $core load" \
                     "$(cut -d' ' -f1 /proc/loadavg)" >&2
                if [ "$core" = default ]; then
                    set -- env
                else
                    set -- env OPENBLAS_CORETYPE="$core"
                fi
                "$@" OPENBLAS_NUM_THREADS=1 "$build/bench/kfac_bench" \
                    --model "$m" --batch 64 --invert-every 10 \
                    --cov-update-every "$ce" --rounds "$ROUNDS" --steps 300 \
                    --data "$DATA"
            done
        done
    done
    ;;
accuracy)
    # seconds of training reported by `keel train` ("trained steps a..b
    # (N examples, T s, ...)")
    train_secs() { sed -n 's/^trained steps .*examples, \([0-9.]*\) s,.*/\1/p' "$1" | tail -1; }
    acc_of() { "$keel" eval "$1" --json 2>/dev/null |
               sed -n 's/.*"accuracy": *\([0-9.]*\).*/\1/p'; }
    for m in $MODELS; do
        common="-s model.type=$m -s data.dir=$DATA -s train.batch_size=64
                -s train.seed=0 -s train.threads=1 -s train.model_threads=1
                -s hooks.progress=off -s hooks.log_every_steps=1000
                -s checkpoint.save_steps=0"
        rm -rf "$out/adam-$m"
        # shellcheck disable=SC2086
        OPENBLAS_NUM_THREADS=1 "$keel" train examples/fashion_mnist.ini $common \
            -s optimizer.name=adam -s optimizer.learning_rate=0.001 \
            -s train.epochs=5 -s checkpoint.dir="$out/adam-$m" \
            >"$out/adam-$m.log" 2>&1
        target=$(acc_of "$out/adam-$m")
        asecs=$(train_secs "$out/adam-$m.log")
        asteps=$(ls "$out/adam-$m"/model.ckpt-*.h5 | sed 's/.*ckpt-\([0-9]*\)\.h5/\1/' | sort -n | tail -1)
        echo "{\"model\": \"$m\", \"optimizer\": \"adam\", \"epochs\": 5, \"steps\": $asteps, \"train_secs\": $asecs, \"test_accuracy\": $target}"
        rm -rf "$out/kfac-$m"
        steps=0
        total=0
        reached=0
        maxsteps=$((MAX_KFAC_EPOCHS * 60000 / 64))
        while [ "$steps" -lt "$maxsteps" ]; do
            steps=$((steps + CHUNK))
            # shellcheck disable=SC2086
            OPENBLAS_NUM_THREADS=1 "$keel" train examples/fashion_mnist.ini $common \
                -s optimizer.name=kfac -s optimizer.learning_rate="$KFAC_LR" \
                -s kfac.damping="$KFAC_DAMPING" -s train.epochs=0 \
                -s train.max_steps=$steps -s checkpoint.dir="$out/kfac-$m" \
                >"$out/kfac-$m-$steps.log" 2>&1
            total=$(echo "$total + $(train_secs "$out/kfac-$m-$steps.log")" | bc -l)
            acc=$(acc_of "$out/kfac-$m")
            echo "{\"model\": \"$m\", \"optimizer\": \"kfac\", \"steps\": $steps, \"train_secs\": $total, \"test_accuracy\": $acc}"
            if [ "$(echo "$acc >= $target" | bc -l)" = 1 ]; then
                reached=1
                break
            fi
        done
        echo "{\"model\": \"$m\", \"kfac_reached_adam_5_epochs\": $reached, \"kfac_steps\": $steps, \"kfac_train_secs\": $total, \"adam_steps\": $asteps, \"adam_train_secs\": $asecs, \"target\": $target, \"kfac_lr\": $KFAC_LR, \"kfac_damping\": $KFAC_DAMPING}"
    done
    ;;
distributed|rolespeed)
    MODEL=${MODEL:-cnn}
    STEPS=${STEPS:-937}
    # one run: NAME WORKERS BATCH [-s key=value]...; WORKERS -1 is one
    # process. Prints "wall_s cpu_s chief_examples_per_s accuracy load".
    run() {
        name=$1 workers=$2 batch=$3
        shift 3
        d=$out/$name
        rm -rf "$d"
        mkdir -p "$d"
        load0=$(cut -d' ' -f1 /proc/loadavg)
        # [kfac] keys only where the optimizer is K-FAC
        case " $* " in
            *" optimizer.name=sgd "*) ;;
            *) set -- "$@" -s kfac.damping="$KFAC_DAMPING" ;;
        esac
        if [ "$workers" -lt 0 ]; then
            set -- "$keel" train "$out/job.ini" "$@"
        else
            set -- "$keel" launch "$out/job.ini" --ps 1 --workers "$workers" \
                --no-status --max-restarts 0 "$@"
        fi
        t0=$(date +%s.%N)
        OUTPUT_DIR=$d OPENBLAS_NUM_THREADS=1 /usr/bin/time -f '%U %S' \
            -o "$d.time" "$@" -s train.batch_size="$batch" \
            -s checkpoint.dir="$d" >"$d.log" 2>&1 ||
            { echo "# $name failed: see $d.log" >&2; tail -5 "$d.log" >&2; return 1; }
        wall=$(echo "$(date +%s.%N) - $t0" | bc -l)
        cpu=$(awk '{ print $1 + $2 }' "$d.time")
        eps=$(sed -n 's/^\(chief | \)\{0,1\}trained steps .*, \([0-9.]*\) examples\/s.*/\2/p' "$d.log" | tail -1)
        acc=$("$keel" eval "$d" --json 2>/dev/null |
              sed -n 's/.*"accuracy": *\([0-9.]*\).*/\1/p')
        printf '%.1f %.1f %s %s %s-%s\n' "$wall" "$cpu" "${eps:-0}" \
            "${acc:-0}" "$load0" "$(cut -d' ' -f1 /proc/loadavg)"
    }
    cat >"$out/job.ini" <<INI
[model]
type = $MODEL
$( [ "$MODEL" = mlp ] && echo "hidden = 256,256")
[data]
dir = $DATA
[optimizer]
name = kfac
learning_rate = $KFAC_LR
[train]
epochs = 0
max_steps = $STEPS
seed = ${SEED:-1}
threads = 1
model_threads = 1
[checkpoint]
save_steps = 0
save_secs = 0
max_to_keep = 2
[hooks]
progress = off
log_every_steps = 100
summary_every_steps = 0
[cluster]
mode = sync
step_timeout_secs = 600
INI
    echo "# $MODEL, $STEPS steps, K-FAC learning_rate $KFAC_LR, damping $KFAC_DAMPING" >&2
    if [ "$mode" = distributed ]; then
        RUNS=${RUNS:-"one chief roles3 roles5"}
        table="| run | replicas (roles) | global batch | test accuracy | vs one process | wall s | CPU s | load |
|---|---|---|---|---|---|---|---|"
        base=
        for r in $RUNS; do
            case $r in
                one) res=$(run one -1 64) desc="1 process" b=64 ;;
                chief) res=$(run chief 2 64 -s kfac.distributed=chief) desc="3 (chief mode)" b=64 ;;
                roles3) res=$(run roles3 2 192 -s kfac.distributed=roles) desc="3 (1/1/1)" b=192 ;;
                roles5) res=$(run roles5 4 105 -s kfac.distributed=roles) desc="5 (3/1/1)" b=105 ;;
                *) echo "# unknown run '$r'" >&2; continue ;;
            esac || continue
            set -- $res
            [ "$r" = one ] && base=$4
            diff=-
            [ -n "$base" ] && diff=$(printf '%+.2f' "$(echo "($4 - $base) * 100" | bc -l)")
            echo "{\"model\": \"$MODEL\", \"run\": \"$r\", \"steps\": $STEPS, \"batch\": $b, \"test_accuracy\": $4, \"wall_secs\": $1, \"cpu_secs\": $2, \"load\": \"$5\"}"
            table="$table
| $r | $desc | $b | $4 | $diff | $1 | $2 | $5 |"
        done
        echo "$table" >&2
    else
        # examples/s of the chief: roles (a gradient worker) and plain
        # sync SGD (optimizer.name = sgd), alternating
        ROUNDS=${ROUNDS:-3}
        k=0
        : >"$out/speed"
        while [ "$k" -lt "$ROUNDS" ]; do
            k=$((k + 1))
            for r in sgd roles; do
                if [ $r = sgd ]; then
                    res=$(run "sgd$k" 2 192 -s optimizer.name=sgd -s optimizer.learning_rate=0.01)
                else
                    res=$(run "roles$k" 2 192 -s kfac.distributed=roles)
                fi || exit 1
                set -- $res
                echo "{\"model\": \"$MODEL\", \"run\": \"$r\", \"round\": $k, \"chief_examples_per_sec\": $3, \"wall_secs\": $1, \"cpu_secs\": $2, \"load\": \"$5\"}"
                echo "$r $3 $2 $5" >>"$out/speed"
            done
        done
        med() { awk -v r="$1" -v c="$2" '$1 == r { print $c }' "$out/speed" | sort -n |
                awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
        se=$(med sgd 2) re=$(med roles 2) sc=$(med sgd 3) rc=$(med roles 3)
        echo "{\"model\": \"$MODEL\", \"rounds\": $ROUNDS, \"sgd_examples_per_sec\": $se, \"roles_examples_per_sec\": $re, \"ratio\": $(printf '%.3f' "$(echo "$re / $se" | bc -l)"), \"sgd_cpu_secs\": $sc, \"roles_cpu_secs\": $rc, \"cpu_ratio\": $(printf '%.3f' "$(echo "$sc / $rc" | bc -l)")}"
    fi
    ;;
*)
    echo "usage: bench/kfac.sh overhead|accuracy|distributed|rolespeed [BUILD]" >&2
    exit 2
    ;;
esac
