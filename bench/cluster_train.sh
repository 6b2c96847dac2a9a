#!/usr/bin/env bash
# bench/cluster_train.sh - keel parameter-server training (1 ps + 2 workers,
# sync, the MLP 784-256-256-10 with momentum SGD on Fashion-MNIST) beside
# PyTorch DDP (2 ranks, gloo: bench/torch_ddp.py) in one run,
# at global batch 64 and 256; plus the latency from the chief's "cluster
# ready" to a waiting worker's "model ready" (its first step follows).
# Rounds alternate keel and DDP so the shared machine's noise hits both.
# MODES="sync async" also runs the async scheme (cluster.mode = async: a
# global step is one replica's push of half the global batch, so an async
# run has twice the steps of a sync one for the same examples).
# KEEL_BEFORE_BIN=path/to/another/build/keel runs an older keel in the
# same rounds (the two alternate which goes first) and adds before/after
# columns; bench/before_after.sh builds one and sets it.
#   usage: bench/cluster_train.sh [BUILD_DIR]
#   env:   ROUNDS=3 BATCHES="64 256" EXAMPLES=38400 LAT_REPS=5 DDP=1
#          MODES=sync (or MODE=sync|async) KEEL_BEFORE_BIN=<unset>
#          RUN_TIMEOUT=600 (seconds one cluster run may take; then its
#          tasks are killed and the run counts as failed)
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
MODES=${MODES:-${MODE:-sync}}
KEEL_BEFORE_BIN=${KEEL_BEFORE_BIN:-}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
for m in $MODES; do
    case $m in sync|async) ;; *)
        echo "cluster_train.sh: MODES: '$m' is neither sync nor async" >&2; exit 2 ;;
    esac
done
if [ -n "$KEEL_BEFORE_BIN" ] && [ ! -x "$KEEL_BEFORE_BIN" ]; then
    echo "cluster_train.sh: KEEL_BEFORE_BIN=$KEEL_BEFORE_BIN is not an executable keel" >&2
    exit 2
fi
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
run_cluster() {   # $1 keel, $2 mode, $3 global batch, $4 steps, $5 chief delay (s)
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 - "$1" "$OUT" "$3" "$4" \
        "$5" "$2" "$RUN_TIMEOUT" <<'PY'
import json, os, socket, subprocess, sys, threading, time, shutil
keel, out, G, steps, delay = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
mode, deadline = sys.argv[6], time.monotonic() + float(sys.argv[7])
def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
ps, ws = [f"127.0.0.1:{port()}"], [f"127.0.0.1:{port()}" for _ in range(2)]
shutil.rmtree(f"{out}/run", ignore_errors=True)
stamps, lines, chief_line = {}, {}, []
def start(t, i):
    env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": {"ps": ps, "worker": ws}, "task": {"type": t, "index": i}, "mode": mode}))
    p = subprocess.Popen([keel, "train", f"{out}/job.ini", "-s", f"train.batch_size={G}", "-s", f"train.max_steps={steps}"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    key = f"{t}{i}"; lines[key] = []
    def rd():
        for ln in p.stdout:
            lines[key].append(ln)
            for needle in ("cluster ready", "model ready", "trained steps"):
                if needle in ln and (key, needle) not in stamps:
                    stamps[(key, needle)] = time.monotonic()
                    if needle == "trained steps" and key == "worker0":
                        chief_line.append(ln.strip())
    th = threading.Thread(target=rd); th.start()
    return p, th
procs = [start("ps", 0), start("worker", 1)]
time.sleep(delay)             # worker 1 waits for readiness first
t0 = time.monotonic()
procs.append(start("worker", 0))
timed_out = False
rcs = []
for p, _ in procs:
    try:
        rcs.append(p.wait(timeout=max(0.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        timed_out = True
        for q, _ in procs:
            if q.poll() is None: q.kill()
        rcs.append(p.wait())
for _, th in procs: th.join()
wall = time.monotonic() - t0
res = {"bin": keel, "mode": mode, "rcs": rcs, "global_batch": G, "steps": steps, "wall_s": wall}
if chief_line:
    res["chief"] = chief_line[0]
if timed_out:
    res["timeout_s"] = float(sys.argv[7])
# from the chief's "cluster ready" to its "trained steps" line: every
# step, the first and the final checkpoint (conservative for keel); an
# async step trains one replica's part of the global batch
c, e = stamps.get(("worker0", "cluster ready")), stamps.get(("worker0", "trained steps"))
if c and e:
    res["train_s"] = e - c
    res["examples_per_s"] = (G if mode == "sync" else G / len(ws)) * steps / (e - c)
r, c = stamps.get(("worker1", "model ready")), stamps.get(("worker0", "cluster ready"))
if r and c:
    res["ready_latency_ms"] = (r - c) * 1000
if any(rcs) or timed_out:
    res["log"] = {k: v[-5:] for k, v in lines.items()}
print(json.dumps(res), flush=True)
PY
}

# keel (after) and KEEL_BEFORE_BIN (before) take turns going first
for r in $(seq "$ROUNDS"); do
    kinds=after
    if [ -n "$KEEL_BEFORE_BIN" ]; then
        if [ $((r % 2)) = 1 ]; then kinds="after before"; else kinds="before after"; fi
    fi
    for mode in $MODES; do
        for G in $BATCHES; do
            steps=$((EXAMPLES / G))
            [ "$mode" = sync ] || steps=$((2 * EXAMPLES / G))
            for kind in $kinds; do
                bin=$build/keel
                [ "$kind" = after ] || bin=$KEEL_BEFORE_BIN
                echo "== round $r/$ROUNDS keel ($kind) $mode batch $G" >&2
                GLIBC_TUNABLES=$KEEL_TUNABLES run_cluster "$bin" "$mode" "$G" \
                    "$steps" 0.2 \
                    | sed "s/^{/{\"round\": $r, \"kind\": \"$kind\", /" \
                    >> "$OUT/keel.jsonl"
            done
        done
    done
    [ "${DDP:-1}" = 1 ] || continue
    echo "== round $r/$ROUNDS torch DDP" >&2
    GLIBC_TUNABLES=$DDP_TUNABLES /usr/bin/python3 "$here/torch_ddp.py" \
        --reps 1 \
        --batches "$(echo $BATCHES | tr ' ' ,)" --examples "$EXAMPLES" \
        --ar-sizes-mib 1 | sed "s/^{/{\"round\": $r, /" >> "$OUT/ddp.jsonl"
done
for i in $(seq "$LAT_REPS"); do
    GLIBC_TUNABLES=$KEEL_TUNABLES run_cluster "$build/keel" sync 64 20 1.0 \
        >> "$OUT/latency.jsonl"
done

/usr/bin/python3 - "$OUT" "$BATCHES" <<'PY'
import json, statistics, sys
out, batches = sys.argv[1], [int(b) for b in sys.argv[2].split()]
keel = [json.loads(l) for l in open(f"{out}/keel.jsonl")]
ddp = [json.loads(l) for l in open(f"{out}/ddp.jsonl")]
lat = [json.loads(l) for l in open(f"{out}/latency.jsonl")]
bad = [k for k in keel + lat if any(k["rcs"]) or "timeout_s" in k]
if bad:
    print("FAILED runs:", json.dumps(bad[:2], indent=1)); sys.exit(1)
def med(kind, mode, G):
    v = [x["examples_per_s"] for x in keel
         if x.get("kind", "after") == kind and x.get("mode", "sync") == mode
         and x["global_batch"] == G]
    return (statistics.median(v), len(v)) if v else (float("nan"), 0)
before = any(x.get("kind") == "before" for x in keel)
print(f"{'mode':>5} {'global batch':>12} {'keel ex/s':>10}"
      + (f" {'before ex/s':>11} {'after/before':>12}" if before else "")
      + f" {'DDP ex/s':>10} {'ratio':>6}  (medians over rounds)")
for mode in dict.fromkeys(x.get("mode", "sync") for x in keel):
    for G in batches:
        k, n = med("after", mode, G)
        line = f"{mode:>5} {G:>12} {k:>10.0f}"
        if before:
            b, _ = med("before", mode, G)
            line += f" {b:>11.0f} {k / b:>12.2f}"
        d = [x["value"] if "value" in x else x.get("median") for x in ddp
             if x.get("bench") == "torch_ddp_tput" and x.get("global_batch") == G]
        d = [v if not isinstance(v, dict) else v["median"] for v in d]
        dm = statistics.median(d) if d and mode == "sync" else float("nan")
        print(line + f" {dm:>10.0f} {k / dm:>6.2f}  ({n} rounds)")
ls = sorted(x["ready_latency_ms"] for x in lat if "ready_latency_ms" in x)
if ls:
    print(f"worker ready after chief's 'cluster ready': median {statistics.median(ls):.1f} ms, max {max(ls):.1f} ms ({len(ls)} runs)")
PY
