#!/usr/bin/env bash
# bench/mwm_train.sh - keel's multi_worker_mirrored strategy (2 MPI ranks
# under mpirun, shared memory) beside PyTorch DDP (2 ranks, gloo:
# bench/torch_ddp.py) in one run: the MLP 784-256-256-10 with momentum SGD
# at global batch 64 and 256, and the small CNN with Adam at 64, on
# Fashion-MNIST, 1 BLAS thread per rank on both sides. Rounds alternate
# keel and DDP so the shared machine's noise hits both; medians.
# keel's examples/s: global batch x steps over the slower rank's training
# loop (its first and final checkpoint included); DDP's: between barriers
# after 20 warm-up steps (bench/torch_ddp.py).
#   usage: flock /tmp/keel-bench.lock bench/mwm_train.sh [BUILD_DIR]
#   env:   ROUNDS=3 EXAMPLES=38400 CNN_EXAMPLES=6400 DDP=1
#          BENCH_OUT=./mwm-bench
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../_build}
ROUNDS=${ROUNDS:-3}
EXAMPLES=${EXAMPLES:-38400}
CNN_EXAMPLES=${CNN_EXAMPLES:-6400}
OUT=${BENCH_OUT:-$PWD/mwm-bench}
. "$here/common.sh"
bench_mpirun mwm_train.sh
if [ "${DDP:-1}" = 1 ] && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "mwm_train.sh: PyTorch missing: the DDP column is skipped (apt-get install python3-torch)" >&2
    DDP=0
fi
mkdir -p "$OUT"
: > "$OUT/keel.jsonl"
: > "$OUT/ddp.jsonl"
bench_machine

bench_mwm_ini "$OUT" > "$OUT/mlp.ini"
sed -e 's/^type = mlp/type = cnn/' -e '/^hidden/d' \
    -e 's/^name = momentum/name = adam/' -e 's/^learning_rate = .*/learning_rate = 0.001/' \
    -e '/^momentum/d' "$OUT/mlp.ini" > "$OUT/cnn.ini"

run_keel() {   # $1 model, $2 global batch, $3 examples
    local steps=$(( $3 / $2 )) log="$OUT/keel-$1-$2.log"
    rm -rf "$OUT/run"
    if ! OPENBLAS_NUM_THREADS=1 "$MPIRUN" -n 2 --oversubscribe \
            --bind-to none --mca btl self,vader --mca oob_tcp_if_include lo \
            "$build/keel" train "$OUT/$1.ini" -s "train.batch_size=$2" \
            -s "train.max_steps=$steps" > "$log" 2>&1; then
        echo "mwm_train.sh: keel failed:" >&2; tail -20 "$log" >&2; exit 1
    fi
    /usr/bin/python3 - "$log" "$1" "$2" "$steps" <<'PY'
import json, re, sys
log, model, G, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
secs = [float(m.group(1)) for m in re.finditer(r"trained steps \d+\.\.\d+ \(\d+ examples, ([0-9.]+) s", open(log).read())]
assert len(secs) == 2, secs
print(json.dumps({"model": model, "global_batch": G, "steps": steps,
                  "secs": max(secs), "examples_per_s": G * steps / max(secs)}))
PY
}

for r in $(seq "$ROUNDS"); do
    echo "== round $r/$ROUNDS keel" >&2
    for job in mlp:64:$EXAMPLES mlp:256:$EXAMPLES cnn:64:$CNN_EXAMPLES; do
        IFS=: read -r m G n <<<"$job"
        run_keel "$m" "$G" "$n" | sed "s/^{/{\"round\": $r, /" >> "$OUT/keel.jsonl"
    done
    [ "${DDP:-1}" = 1 ] || continue
    echo "== round $r/$ROUNDS torch DDP" >&2
    /usr/bin/python3 "$here/torch_ddp.py" --reps 1 --batches 64,256 \
        --examples "$EXAMPLES" --ar-sizes-mib "" --model mlp \
        | sed "s/^{/{\"round\": $r, /" >> "$OUT/ddp.jsonl"
    /usr/bin/python3 "$here/torch_ddp.py" --reps 1 --batches 64 \
        --examples "$CNN_EXAMPLES" --ar-sizes-mib "" --model cnn \
        | sed "s/^{/{\"round\": $r, /" >> "$OUT/ddp.jsonl"
done

/usr/bin/python3 - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
keel = [json.loads(l) for l in open(f"{out}/keel.jsonl")]
ddp = [json.loads(l) for l in open(f"{out}/ddp.jsonl")]
print(f"{'model':>5} {'batch':>5} {'keel ex/s':>10} {'DDP ex/s':>10} {'ratio':>6}  (2 ranks each; medians of {len(keel)//3} rounds)")
for m, G in (("mlp", 64), ("mlp", 256), ("cnn", 64)):
    k = statistics.median(x["examples_per_s"] for x in keel
                          if x["model"] == m and x["global_batch"] == G)
    d = [x.get("median", x.get("value")) for x in ddp
         if x.get("bench") == "torch_ddp_tput" and x.get("model") == m
         and x.get("global_batch") == G]
    dm = statistics.median(d) if d else float("nan")
    print(f"{m:>5} {G:>5} {k:>10.0f} {dm:>10.0f} {k / dm:>6.2f}")
PY
