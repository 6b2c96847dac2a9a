#!/usr/bin/env bash
# bench/stream.sh - `keel train` on an HDF5 set read in blocks while
# training (data.stream = on) against the same set read into memory first
# (data.stream = off), in one run: ROUNDS rounds, the two taking turns
# going first, wall time of the whole `keel train` (the in-memory run pays
# its read up front, the streamed one during the steps). Prints medians
# and the streamed/in-memory ratio. Both runs train the same batches, so
# their final checkpoints must be equal: the script checks that too.
#   usage: bench/stream.sh [BUILD_DIR]
#   env:   ROUNDS=5 EPOCHS=2 BLOCK=4096 (data.shuffle_block)
#          MODEL=mlp (softmax|mlp) BENCH_OUT=<fresh dir in /tmp>
#          FMNIST=/usr/share/datasets/fashion-mnist (the IDX files the
#          HDF5 set is made from)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../_build}
. "$here/common.sh"
ROUNDS=${ROUNDS:-5}
EPOCHS=${EPOCHS:-2}
BLOCK=${BLOCK:-4096}
MODEL=${MODEL:-mlp}
FMNIST=${FMNIST:-/usr/share/datasets/fashion-mnist}
PY=${PYTHON:-/usr/bin/python3}
keel="$build/keel"
[ -x "$keel" ] || { echo "stream.sh: no $keel (build keel first)" >&2; exit 3; }
[ -r "$FMNIST/train-images-idx3-ubyte.gz" ] || {
    echo "stream.sh: no Fashion-MNIST in $FMNIST (apt-get install dataset-fashion-mnist)" >&2
    exit 3
}
out=$(bench_out_dir keel-stream)
bench_machine >&2

# The training set as HDF5: x uint8 [N,28,28], y uint8 [N].
"$PY" - "$FMNIST" "$out/train.h5" <<'PY'
import gzip, sys
import h5py, numpy as np
src, dst = sys.argv[1], sys.argv[2]
with gzip.open(src + "/train-images-idx3-ubyte.gz") as f:
    x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
with gzip.open(src + "/train-labels-idx1-ubyte.gz") as f:
    y = np.frombuffer(f.read(), np.uint8, offset=8)
with h5py.File(dst, "w") as h:
    h["x"] = x
    h["y"] = y
PY

ini() {   # ini MODE DIR
    cat <<INI
[model]
type = $MODEL
[data]
format = hdf5
train_file = $out/train.h5
stream = $1
shuffle_block = $BLOCK
[optimizer]
name = sgd
learning_rate = 0.05
[train]
batch_size = 64
epochs = $EPOCHS
seed = 1
threads = 1
[checkpoint]
dir = $2
save_secs = 0
[hooks]
log_every_steps = 0
summary_every_steps = 0
progress = off
INI
}

run() {   # run MODE ROUND: wall seconds on stdout
    local d="$out/$1-$2"
    rm -rf "$d"
    ini "$1" "$d" > "$out/$1.ini"
    local t0 t1
    t0=$(date +%s.%N)
    OPENBLAS_NUM_THREADS=1 "$keel" train "$out/$1.ini" > "$out/$1-$2.log" 2>&1 || {
        echo "stream.sh: keel train ($1) failed: $out/$1-$2.log" >&2; exit 1; }
    t1=$(date +%s.%N)
    echo "$t0 $t1" | awk '{printf "%.3f\n", $2 - $1}'
}

: > "$out/times"
for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then order="on off"; else order="off on"; fi
    for m in $order; do
        echo "$m $(run "$m" "$r")" >> "$out/times"
    done
    newest() { ls "$1"/model.ckpt-*.h5 | sort -V | tail -1; }
    "$keel" ckpt diff "$(newest "$out/on-$r")" "$(newest "$out/off-$r")" \
        > "$out/diff-$r.log" 2>&1 || {
        echo "stream.sh: round $r: streamed and in-memory checkpoints differ ($out/diff-$r.log)" >&2
        exit 1; }
done

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
on=$(awk '$1=="on"{print $2}' "$out/times" | median)
off=$(awk '$1=="off"{print $2}' "$out/times" | median)
# each round's streamed/in-memory ratio (the two ran back to back)
ratio=$(awk '$1=="on"{on[++i]=$2} $1=="off"{off[++j]=$2}
             END {for (r = 1; r <= i; r++) printf "%.4f\n", on[r] / off[r]}' \
        "$out/times" | median)
echo "stream.sh: $MODEL, $EPOCHS epochs of Fashion-MNIST as HDF5, block $BLOCK, $ROUNDS rounds (medians)"
printf '%-10s %8s\n' reader seconds
printf '%-10s %8.3f\n' in-memory "$off" streamed "$on"
echo "streamed/in-memory, median of the rounds' ratios: $ratio"
echo "logs: $out"
