#!/usr/bin/env bash
# bench/allreduce.sh - multi_worker_mirrored's gradient exchange
# (cluster/allreduce_mpi.c), two measurements in one run:
#  1. bytes a rank sends to and receives from the other ranks per step, at
#     2, 4 and 8 ranks (oversubscribed: the counts, not the speed), from
#     the counters each rank logs at its end; in gradients (the model's
#     gradient bytes) they stay flat in the rank count;
#  2. examples/s at 2 ranks of this build and, when BASE_BUILD_DIR is
#     given, of another build (the previous commit's, built in a temp dir),
#     rounds alternating the two; medians.
# The MLP 784-256-256-10 with momentum SGD on Fashion-MNIST, global batch
# 64, train.leaves = 8, 1 BLAS thread per rank.
#   usage: flock /tmp/keel-bench.lock bench/allreduce.sh [BUILD_DIR [BASE_BUILD_DIR]]
#   env:   ROUNDS=3 EXAMPLES=38400 BYTES_STEPS=20 BENCH_OUT=./allreduce-bench
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../_build}
base=${2:-}
ROUNDS=${ROUNDS:-3}
EXAMPLES=${EXAMPLES:-38400}
BYTES_STEPS=${BYTES_STEPS:-20}
OUT=${BENCH_OUT:-$PWD/allreduce-bench}
. "$here/common.sh"
bench_mpirun allreduce.sh
mkdir -p "$OUT"
: > "$OUT/bytes.jsonl"
: > "$OUT/speed.jsonl"
bench_machine

bench_mwm_ini "$OUT" 'batch_size = 64\nleaves = 8\n' > "$OUT/mlp.ini"

run() {   # $1 build dir, $2 ranks, $3 steps, $4 log
    rm -rf "$OUT/run"
    if ! OPENBLAS_NUM_THREADS=1 "$MPIRUN" -n "$2" --oversubscribe \
            --bind-to none --mca btl self,vader --mca oob_tcp_if_include lo \
            "$1/keel" train "$OUT/mlp.ini" -s "train.max_steps=$3" \
            > "$4" 2>&1; then
        echo "allreduce.sh: keel failed:" >&2; tail -20 "$4" >&2; exit 1
    fi
}

for R in 2 4 8; do
    echo "== bytes: $R ranks" >&2
    run "$build" "$R" "$BYTES_STEPS" "$OUT/bytes-$R.log"
    /usr/bin/python3 - "$OUT/bytes-$R.log" "$R" >> "$OUT/bytes.jsonl" <<'PY'
import json, re, sys
text, R = open(sys.argv[1]).read(), int(sys.argv[2])
floats = int(re.search(r"collective: rank \d+ of \d+(?: on \S+)?, (\d+) gradient floats", text).group(1))
c = [(float(a), float(b)) for a, b in re.findall(
    r"collective: rank \d+: .*per step (\d+) bytes sent to and (\d+) received", text)]
assert len(c) == R, c
print(json.dumps({"ranks": R, "gradient_bytes": 4 * floats,
                  "sent_max": max(s for s, _ in c), "recv_max": max(r for _, r in c),
                  "sent_mean": sum(s for s, _ in c) / R, "recv_mean": sum(r for _, r in c) / R}))
PY
done

speed() {   # $1 build dir, $2 label
    local steps=$(( EXAMPLES / 64 )) log="$OUT/speed-$2.log"
    run "$1" 2 "$steps" "$log"
    /usr/bin/python3 - "$log" "$2" "$steps" <<'PY'
import json, re, sys
log, label, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
secs = [float(m.group(1)) for m in re.finditer(r"trained steps \d+\.\.\d+ \(\d+ examples, ([0-9.]+) s", open(log).read())]
assert len(secs) == 2, secs
print(json.dumps({"build": label, "steps": steps, "secs": max(secs),
                  "examples_per_s": 64 * steps / max(secs)}))
PY
}

for r in $(seq "$ROUNDS"); do
    echo "== round $r/$ROUNDS: examples/s at 2 ranks" >&2
    speed "$build" this | sed "s/^{/{\"round\": $r, /" >> "$OUT/speed.jsonl"
    [ -z "$base" ] || speed "$base" base | sed "s/^{/{\"round\": $r, /" >> "$OUT/speed.jsonl"
done

/usr/bin/python3 - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/bytes.jsonl")]
print(f"{'ranks':>5} {'sent B/step':>12} {'recv B/step':>12} {'sent grads':>10} {'recv grads':>10}  (per rank, the busiest; gradient = {rows[0]['gradient_bytes']} B)")
for x in rows:
    g = x["gradient_bytes"]
    print(f"{x['ranks']:>5} {x['sent_max']:>12.0f} {x['recv_max']:>12.0f} {x['sent_max'] / g:>10.2f} {x['recv_max'] / g:>10.2f}")
sp = [json.loads(l) for l in open(f"{out}/speed.jsonl")]
med = {b: statistics.median(x["examples_per_s"] for x in sp if x["build"] == b)
       for b in sorted({x["build"] for x in sp})}
line = "2 ranks, examples/s (median of %d rounds): this build %.0f" % (
    len([x for x in sp if x["build"] == "this"]), med["this"])
if "base" in med:
    line += ", base build %.0f, ratio %.2f" % (med["base"], med["this"] / med["base"])
print(line)
PY
