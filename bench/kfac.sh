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
KFAC_LR=${KFAC_LR:-0.001}
KFAC_DAMPING=${KFAC_DAMPING:-0.001}
MAX_KFAC_EPOCHS=${MAX_KFAC_EPOCHS:-5}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
out=${BENCH_OUT:-$(mktemp -d /tmp/keel-kfac-bench.XXXXXX)}
mkdir -p "$out"
keel="$build/keel"

. "$(dirname "$0")/common.sh"
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
*)
    echo "usage: bench/kfac.sh overhead|accuracy [BUILD]" >&2
    exit 2
    ;;
esac
