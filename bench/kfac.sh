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
#   bench/kfac.sh accuracy [BUILD]   for MODELS (mlp cnn): Adam for 5
#                                    epochs at every run of ADAM_RUNS, its
#                                    best test accuracy the target; then
#                                    every run of KFAC_RUNS until it reaches
#                                    the target (resumed in chunks of
#                                    CHUNK_EXAMPLES examples, each chunk's
#                                    checkpoint evaluated with keel eval)
#                                    or MAX_KFAC_EPOCHS; training seconds
#                                    of each, and the best K-FAC over the
#                                    best Adam. A run is "BATCH LR
#                                    [key=value]...", runs separated by ';'
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
CHUNK_EXAMPLES=${CHUNK_EXAMPLES:-12000}
KFAC_LR=${KFAC_LR:-0.0003}
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
    # (N examples, T s, ...)"): evaluation and start-up are not in them
    train_secs() { sed -n 's/^trained steps .*examples, \([0-9.]*\) s,.*/\1/p' "$1" | tail -1; }
    acc_of() { "$keel" eval "$1" --json 2>/dev/null </dev/null |
               sed -n 's/.*"accuracy": *\([0-9.]*\).*/\1/p'; }
    # ADAM_RUNS, KFAC_RUNS: runs separated by ';', each "BATCH LR
    # [key=value]..." (extra keel config keys, e.g. a schedule)
    ADAM_RUNS=${ADAM_RUNS:-"64 0.001; 128 0.001; 256 0.002"}
    kf="kfac.cov_update_every=5 kfac.invert_every=5"
    KFAC_RUNS=${KFAC_RUNS:-"256 0.001 $kf; 512 0.002 $kf; 1024 0.003 $kf"}
    # K-FAC is evaluated every CHUNK_EXAMPLES training examples (rounded
    # up to whole steps)
    # one optimizer's runs of RUNS, one per line: "batch lr extra..."
    runs_of() { echo "$1" | tr ';' '\n' | sed 's/^ *//; s/ *$//' | grep -v '^$'; }
    # shellcheck disable=SC2086,SC2046
    sets_of() { for kv in $1; do printf ' -s %s' "$kv"; done; }
    for m in $MODELS; do
        common="-s model.type=$m -s data.dir=$DATA
                -s train.seed=0 -s train.threads=1 -s train.model_threads=1
                -s hooks.progress=off -s hooks.log_every_steps=1000
                -s checkpoint.save_steps=0"
        # Adam: 5 epochs at every batch; its best is the highest test
        # accuracy (the faster one on a tie); that accuracy is the target
        target=0 asecs=0 abest=
        runs_of "$ADAM_RUNS" >"$out/adam-runs"
        while read -r b lr extra; do
            d=$out/adam-$m-b$b-lr$lr
            rm -rf "$d"
            echo "# $m adam batch $b lr $lr $extra load $(cut -d' ' -f1 /proc/loadavg)" >&2
            # shellcheck disable=SC2086,SC2046
            OPENBLAS_NUM_THREADS=1 "$keel" train examples/fashion_mnist.ini $common \
                -s train.batch_size="$b" -s optimizer.name=adam \
                -s optimizer.learning_rate="$lr" $(sets_of "$extra") \
                -s train.epochs=5 -s checkpoint.dir="$d" \
                >"$d.log" 2>&1 </dev/null
            acc=$(acc_of "$d")
            secs=$(train_secs "$d.log")
            # shellcheck disable=SC2012
            steps=$(ls "$d"/model.ckpt-*.h5 | sed 's/.*ckpt-\([0-9]*\)\.h5/\1/' | sort -n | tail -1)
            echo "{\"model\": \"$m\", \"optimizer\": \"adam\", \"batch\": $b, \"lr\": $lr, \"extra\": \"$extra\", \"epochs\": 5, \"steps\": $steps, \"train_secs\": $secs, \"test_accuracy\": $acc}"
            if [ "$(echo "$acc > $target || ($acc == $target && $secs < $asecs)" | bc -l)" = 1 ]; then
                target=$acc asecs=$secs abest="$b $lr $extra"
            fi
        done <"$out/adam-runs"
        # K-FAC: every run until it reaches the target or MAX_KFAC_EPOCHS,
        # resumed in chunks, each chunk's checkpoint evaluated
        kbest='' ksecs=''
        runs_of "$KFAC_RUNS" >"$out/kfac-runs"
        while read -r b lr extra; do
            tag=$(echo "b$b-lr$lr-$extra" | tr ' =,' '_:.')
            d=$out/kfac-$m-$tag
            rm -rf "$d"
            echo "# $m kfac batch $b lr $lr $extra load $(cut -d' ' -f1 /proc/loadavg)" >&2
            chunk=$(( (CHUNK_EXAMPLES + b - 1) / b ))
            maxsteps=$((MAX_KFAC_EPOCHS * 60000 / b))
            steps=0 total=0 reached=0 acc=0
            while [ "$steps" -lt "$maxsteps" ]; do
                steps=$((steps + chunk))
                # shellcheck disable=SC2086,SC2046
                OPENBLAS_NUM_THREADS=1 "$keel" train examples/fashion_mnist.ini $common \
                    -s train.batch_size="$b" -s optimizer.name=kfac \
                    -s optimizer.learning_rate="$lr" \
                    -s kfac.damping="$KFAC_DAMPING" $(sets_of "$extra") \
                    -s train.epochs=0 -s train.max_steps=$steps \
                    -s checkpoint.dir="$d" >"$d-$steps.log" 2>&1 </dev/null ||
                    { echo "# failed: $d-$steps.log" >&2; tail -3 "$d-$steps.log" >&2; break; }
                total=$(echo "$total + $(train_secs "$d-$steps.log")" | bc -l)
                acc=$(acc_of "$d")
                echo "{\"model\": \"$m\", \"optimizer\": \"kfac\", \"batch\": $b, \"lr\": $lr, \"extra\": \"$extra\", \"steps\": $steps, \"train_secs\": $total, \"test_accuracy\": $acc}"
                if [ "$(echo "$acc >= $target" | bc -l)" = 1 ]; then
                    reached=1
                    break
                fi
            done
            echo "{\"model\": \"$m\", \"optimizer\": \"kfac\", \"batch\": $b, \"lr\": $lr, \"extra\": \"$extra\", \"damping\": $KFAC_DAMPING, \"reached\": $reached, \"steps\": $steps, \"train_secs\": $total, \"test_accuracy\": $acc, \"target\": $target}"
            if [ "$reached" = 1 ] && { [ -z "$ksecs" ] || [ "$(echo "$total < $ksecs" | bc -l)" = 1 ]; }; then
                ksecs=$total kbest="$b $lr $extra"
            fi
        done <"$out/kfac-runs"
        ratio=null
        [ -n "$ksecs" ] && ratio=$(printf '%.2f' "$(echo "$ksecs / $asecs" | bc -l)")
        echo "{\"model\": \"$m\", \"target\": $target, \"adam_best\": \"$abest\", \"adam_train_secs\": $asecs, \"kfac_best\": \"$kbest\", \"kfac_train_secs\": ${ksecs:-null}, \"time_ratio\": $ratio}"
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
