#!/bin/sh
# cluster_bench.sh - keel's wire protocol (push + pull of 1, 16, 64 MiB of
# variables through a variable server) against, in the same run: a raw
# ZeroMQ zero-copy transfer of the same bytes (cluster_bench --mode raw)
# and gloo all_reduce (bench/torch_ddp.py, when /usr/bin/python3 has
# torch: apt-get install python3-torch; else that column is skipped).
# Reps are interleaved, gloo's too (one torch_ddp.py --reps 1 per rep,
# about 10 s); medians and per-rep ratios.
# Rows say their allocator: "glibc default" is what a program of the
# user's gets without tuning; "keel train" is the setting keel train
# applies to cluster tasks (cluster_bench --mallopt, the same calls).
# usage: bench/cluster_bench.sh [BUILD_DIR] [REPS]
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$SRC/_build}
REPS=${2:-5}
OUT=${BENCH_OUT:-/tmp/keel-cluster-bench}
mkdir -p "$OUT"
make -C "$BUILD" bench/cluster_bench >/dev/null
: > "$OUT/raw.jsonl"
: > "$OUT/keel.jsonl"
: > "$OUT/gloo.jsonl"
GLOO_SRC=measured
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "cluster_bench.sh: PyTorch missing: the gloo column is skipped (apt-get install python3-torch)" >&2
    GLOO_SRC=skipped
fi
for r in $(seq "$REPS"); do
    echo "rep $r/$REPS" >&2
    "$BUILD/bench/cluster_bench" --reps 1 --total-mib 128 \
        --mode raw >> "$OUT/raw.jsonl"
    "$BUILD/bench/cluster_bench" --reps 1 --total-mib 128 \
        --mode pushpull >> "$OUT/keel.jsonl"
    "$BUILD/bench/cluster_bench" --reps 1 --total-mib 128 \
        --mode fused >> "$OUT/keel.jsonl"
    "$BUILD/bench/cluster_bench" --reps 1 --total-mib 128 \
        --mode fused --mallopt | sed 's/keel_pushpull_fused/keel_fused_mallopt/' \
        >> "$OUT/keel.jsonl"
    "$BUILD/bench/cluster_bench" --reps 1 --total-mib 128 \
        --mode pipelined >> "$OUT/keel.jsonl"
    "$BUILD/bench/cluster_bench" --reps 1 --total-mib 128 \
        --mode pipelined --mallopt |
        sed 's/keel_pushpull_pipelined/keel_pipelined_mallopt/' \
        >> "$OUT/keel.jsonl"
    if [ "$GLOO_SRC" = measured ]; then
        /usr/bin/python3 "$SRC/bench/torch_ddp.py" --reps 1 \
            --batches 256 --examples 2560 --blas-threads 1 \
            >> "$OUT/gloo.jsonl" || GLOO_SRC=failed
    fi
done
python3 - "$OUT" "$GLOO_SRC" <<'PYEOF'
import json, statistics, sys
out, gloo_src = sys.argv[1], sys.argv[2]
def rows(name):
    with open(f"{out}/{name}") as f:
        return [json.loads(l) for l in f if l.startswith("{")]
raw = [d for d in rows("raw.jsonl") if d.get("bench") == "raw_zmq"]
keel = rows("keel.jsonl")
gloo = {}
for d in rows("gloo.jsonl"):
    if d.get("bench") == "gloo_allreduce":
        gloo.setdefault(d["mib"], []).append(d["median"])
med = statistics.median
label = {"pushpull": "pushpull (glibc default)",
         "pushpull_fused": "fused (glibc default)",
         "fused_mallopt": "fused (keel train)",
         "pushpull_pipelined": "pipelined (glibc default)",
         "pipelined_mallopt": "pipelined (keel train)"}
print(f"| size | raw zmq GB/s | mode (allocator) | keel wire GB/s | keel/raw | keel algbw GB/s | gloo algbw GB/s ({gloo_src}) | keel/gloo |")
print("|---|---|---|---|---|---|---|---|")
for mib in (1, 16, 64):
    r = [d["median"] for d in raw if d["msg_bytes"] == mib << 20]
    for mode in ("pushpull", "pushpull_fused", "fused_mallopt",
                 "pushpull_pipelined", "pipelined_mallopt"):
        k = [d for d in keel if d["mib"] == mib and d["bench"] == "keel_" + mode]
        n = min(len(r), len(k))
        ratio = [k[i]["wire_median"] / r[i] for i in range(n)]
        alg = med([d["algbw_median"] for d in k])
        g = gloo.get(mib, [])
        # per-rep ratio when gloo ran in every rep, else against the median
        gr = ([k[i]["algbw_median"] / g[i] for i in range(min(n, len(g)))]
              if len(g) == len(k) else [alg / med(g)] if g else [])
        print(f"| {mib} MiB | {med(r):.2f} | {label[mode]} | {med([d['wire_median'] for d in k]):.2f} "
              f"| {med(ratio):.2f} (min {min(ratio):.2f}) | {alg:.2f} | "
              + (f"{med(g):.2f} | {med(gr):.2f} (min {min(gr):.2f}) |" if g
                 else "- | - |"))
print(f"\n{len(r)} interleaved reps; medians; other jobs share the 2 CPUs.")
PYEOF
