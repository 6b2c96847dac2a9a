#!/bin/sh
# bench/hogwild.sh - Hogwild in one process (algorithm.name = hogwild) on
# Fashion-MNIST's MLP at batch 64, measured with `keel train` itself.
#
#   bench/hogwild.sh speed [BUILD]     examples/s of 1 thread, 2 threads
#                                      (racy stores) and 2 threads (CAS),
#                                      ROUNDS rounds interleaved, STEPS
#                                      global steps each; medians and the
#                                      ratios to 1 thread
#   bench/hogwild.sh accuracy [BUILD]  test accuracy (keel eval) after
#                                      EPOCHS epochs for the same three
#
# Run it under `flock /tmp/keel-bench.lock` so benchmarks never overlap.
# BUILD is the build directory (default _build). Logs in $BENCH_OUT
# (default a fresh mktemp -d). Prints a Markdown table on stdout.
set -eu
mode=${1:-speed}
build=${2:-_build}
ROUNDS=${ROUNDS:-5}
STEPS=${STEPS:-1500}
EPOCHS=${EPOCHS:-3}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
out=$(bench_out_dir keel-hogwild-bench)
keel="$build/keel"
ini="$here/../examples/fashion_mnist.ini"

core=$(OPENBLAS_VERBOSE=2 "$keel" --version 2>&1 | sed -n 's/^Core: //p')
echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores" >&2
echo "# flags: $(grep -m1 -o -w -E 'avx512f|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')" >&2
echo "# OpenBLAS kernel: ${core:-unknown}; logs: $out" >&2

# name threads cas
configs="t1 1 false
t2 2 false
t2cas 2 true"

run() {  # name threads cas round extra...
    name=$1 threads=$2 cas=$3 r=$4
    shift 4
    rm -rf "$out/$name-$r"
    # shellcheck disable=SC2086
    OPENBLAS_NUM_THREADS=1 "$keel" train "$ini" -s model.type=mlp \
        -s data.dir="$DATA" -s train.batch_size=64 -s train.seed=0 \
        -s train.threads=1 -s train.model_threads="$threads" \
        -s algorithm.name=hogwild -s algorithm.hogwild_cas="$cas" \
        -s hooks.progress=off -s hooks.log_every_steps=100000 \
        -s checkpoint.save_steps=0 -s checkpoint.dir="$out/$name-$r" "$@" \
        >"$out/$name-$r.log" 2>&1
}
# examples/s keel train reports at the end ("trained steps a..b (N
# examples, T s, R examples/s)")
rate_of() { sed -n 's/^trained steps .* s, \([0-9.]*\) examples\/s).*/\1/p' "$1" | tail -1; }
acc_of() { "$keel" eval "$1" --json 2>/dev/null |
           sed -n 's/.*"accuracy": *\([0-9.]*\).*/\1/p'; }
median() { sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

case $mode in
speed)
    for r in $(seq "$ROUNDS"); do
        echo "$configs" | while read -r name threads cas; do
            run "$name" "$threads" "$cas" "$r" -s train.max_steps="$STEPS" \
                -s train.epochs=0
            echo "$name $(rate_of "$out/$name-$r.log") $(cut -d' ' -f1 /proc/loadavg)" \
                >> "$out/rates"
            rm -rf "${out:?}/$name-$r"
        done
    done
    base=$(awk '$1=="t1"{print $2}' "$out/rates" | median)
    echo "| setting | examples/s (median of $ROUNDS) | runs | vs 1 thread | load avg (min-max) |"
    echo "|---|---|---|---|---|"
    echo "$configs" | while read -r name threads cas; do
        med=$(awk -v n="$name" '$1==n{print $2}' "$out/rates" | median)
        runs=$(awk -v n="$name" '$1==n{printf "%s%d", s, $2; s=", "}' "$out/rates")
        load=$(awk -v n="$name" '$1==n{print $3}' "$out/rates" | sort -g | sed -n '1p;$p' | tr '\n' '-' | sed 's/-$//')
        printf '| %s thread(s), %s | %.0f | %s | %.2fx | %s |\n' "$threads" \
            "$([ "$cas" = true ] && echo CAS || echo racy)" "$med" "$runs" \
            "$(echo "$med $base" | awk '{print $1/$2}')" "$load"
    done
    ;;
accuracy)
    echo "| setting | test accuracy after $EPOCHS epochs | examples/s |"
    echo "|---|---|---|"
    echo "$configs" | while read -r name threads cas; do
        run "$name" "$threads" "$cas" acc -s train.epochs="$EPOCHS" \
            -s train.max_steps=0
        printf '| %s thread(s), %s | %s | %s |\n' "$threads" \
            "$([ "$cas" = true ] && echo CAS || echo racy)" \
            "$(acc_of "$out/$name-acc")" "$(rate_of "$out/$name-acc.log")"
    done
    ;;
*)
    echo "usage: bench/hogwild.sh speed|accuracy [BUILD]" >&2
    exit 2
    ;;
esac
