#!/usr/bin/env bash
# bench/cluster_train.sh - keel parameter-server training (1 ps + 2 workers,
# sync, the MLP 784-256-256-10 with momentum SGD on Fashion-MNIST) beside
# PyTorch DDP (2 ranks, gloo: bench/torch_ddp.py) in one run,
# at global batch 64 and 256; plus the latency from the chief's "cluster
# ready" to a waiting worker's "model ready" (its first step follows).
# Rounds alternate keel and DDP so the shared machine's noise hits both.
#   usage: bench/cluster_train.sh [BUILD_DIR]
#   env:   ROUNDS=3 BATCHES="64 256" EXAMPLES=38400 LAT_REPS=5 DDP=1
#          KEEL_TUNABLES=<GLIBC_TUNABLES for keel; default none: keel
#          train's own allocator setting for cluster tasks applies>
#          TUNABLES=<GLIBC_TUNABLES for DDP; default the mmap/trim pair
#          docs/cluster.md once recommended>
#          BENCH_OUT=./cluster-bench
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../_build}
ROUNDS=${ROUNDS:-3}
BATCHES=${BATCHES:-"64 256"}
EXAMPLES=${EXAMPLES:-38400}
LAT_REPS=${LAT_REPS:-5}
if [ "${DDP:-1}" = 1 ] && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "cluster_train.sh: PyTorch missing: the DDP column is skipped (apt-get install python3-torch)" >&2
    DDP=0
fi
OUT=${BENCH_OUT:-$PWD/cluster-bench}
# keel runs as a user runs it: keel train sets its allocator for cluster
# tasks itself (docs/cluster.md "Performance note"), unless GLIBC_TUNABLES
# names malloc settings. DDP keeps freed buffers too (as before), so
# neither side pays page faults per message.
KEEL_TUNABLES=${KEEL_TUNABLES-}
DDP_TUNABLES=${TUNABLES-glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=1073741824}
mkdir -p "$OUT"
: > "$OUT/keel.jsonl"
: > "$OUT/ddp.jsonl"
: > "$OUT/latency.jsonl"

. "$here/common.sh"
bench_machine

{ bench_mlp_momentum_ini; cat <<EOF
[train]
batch_size = 64
max_steps = 100
threads = 1
[checkpoint]
dir = $OUT/run
save_steps = 1000000
[hooks]
log_every_steps = 0
summary_every_steps = 0
progress = off
EOF
} > "$OUT/job.ini"

# One cluster run: prints a JSON line. Timestamps every stderr line of
# every task (python), so the same run also gives the start latency.
run_cluster() {   # $1 global batch, $2 steps, $3 chief delay (s)
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 - "$build/keel" "$OUT" "$1" "$2" \
        "$3" <<'PY'
import json, os, socket, subprocess, sys, threading, time, shutil
keel, out, G, steps, delay = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
ps, ws = [f"127.0.0.1:{port()}"], [f"127.0.0.1:{port()}" for _ in range(2)]
shutil.rmtree(f"{out}/run", ignore_errors=True)
stamps, lines = {}, {}
def start(t, i):
    env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": {"ps": ps, "worker": ws}, "task": {"type": t, "index": i}}))
    p = subprocess.Popen([keel, "train", f"{out}/job.ini", "-s", f"train.batch_size={G}", "-s", f"train.max_steps={steps}"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    key = f"{t}{i}"; lines[key] = []
    def rd():
        for ln in p.stdout:
            lines[key].append(ln)
            for needle in ("cluster ready", "model ready", "trained steps"):
                if needle in ln and (key, needle) not in stamps:
                    stamps[(key, needle)] = time.monotonic()
    th = threading.Thread(target=rd); th.start()
    return p, th
procs = [start("ps", 0), start("worker", 1)]
time.sleep(delay)             # worker 1 waits for readiness first
t0 = time.monotonic()
procs.append(start("worker", 0))
rcs = [p.wait(timeout=600) for p, _ in procs]
for _, th in procs: th.join()
wall = time.monotonic() - t0
res = {"rcs": rcs, "global_batch": G, "steps": steps, "wall_s": wall}
# from the chief's "cluster ready" to its "trained steps" line: every
# step, the first and the final checkpoint (conservative for keel)
c, e = stamps.get(("worker0", "cluster ready")), stamps.get(("worker0", "trained steps"))
if c and e:
    res["train_s"] = e - c
    res["examples_per_s"] = G * steps / (e - c)
r, c = stamps.get(("worker1", "model ready")), stamps.get(("worker0", "cluster ready"))
if r and c:
    res["ready_latency_ms"] = (r - c) * 1000
if any(rcs):
    res["log"] = {k: v[-5:] for k, v in lines.items()}
print(json.dumps(res), flush=True)
PY
}

for r in $(seq "$ROUNDS"); do
    for G in $BATCHES; do
        echo "== round $r/$ROUNDS keel batch $G" >&2
        GLIBC_TUNABLES=$KEEL_TUNABLES run_cluster "$G" $((EXAMPLES / G)) \
            0.2 | sed "s/^{/{\"round\": $r, /" \
            >> "$OUT/keel.jsonl"
    done
    [ "${DDP:-1}" = 1 ] || continue
    echo "== round $r/$ROUNDS torch DDP" >&2
    GLIBC_TUNABLES=$DDP_TUNABLES /usr/bin/python3 "$here/torch_ddp.py" \
        --reps 1 \
        --batches "$(echo $BATCHES | tr ' ' ,)" --examples "$EXAMPLES" \
        --ar-sizes-mib 1 | sed "s/^{/{\"round\": $r, /" >> "$OUT/ddp.jsonl"
done
for i in $(seq "$LAT_REPS"); do
    GLIBC_TUNABLES=$KEEL_TUNABLES run_cluster 64 20 1.0 \
        >> "$OUT/latency.jsonl"
done

/usr/bin/python3 - "$OUT" "$BATCHES" <<'PY'
import json, statistics, sys
out, batches = sys.argv[1], [int(b) for b in sys.argv[2].split()]
keel = [json.loads(l) for l in open(f"{out}/keel.jsonl")]
ddp = [json.loads(l) for l in open(f"{out}/ddp.jsonl")]
lat = [json.loads(l) for l in open(f"{out}/latency.jsonl")]
bad = [k for k in keel + lat if any(k["rcs"])]
if bad:
    print("FAILED runs:", json.dumps(bad[:2], indent=1)); sys.exit(1)
print(f"{'global batch':>12} {'keel ex/s':>10} {'DDP ex/s':>10} {'ratio':>6}  (medians of {len(keel)//len(batches)} rounds)")
for G in batches:
    k = statistics.median(x["examples_per_s"] for x in keel if x["global_batch"] == G)
    d = [x["value"] if "value" in x else x.get("median") for x in ddp
         if x.get("bench") == "torch_ddp_tput" and x.get("global_batch") == G]
    d = [v if not isinstance(v, dict) else v["median"] for v in d]
    dm = statistics.median(d) if d else float("nan")
    print(f"{G:>12} {k:>10.0f} {dm:>10.0f} {k / dm:>6.2f}")
ls = sorted(x["ready_latency_ms"] for x in lat if "ready_latency_ms" in x)
if ls:
    print(f"worker ready after chief's 'cluster ready': median {statistics.median(ls):.1f} ms, max {max(ls):.1f} ms ({len(ls)} runs)")
PY
