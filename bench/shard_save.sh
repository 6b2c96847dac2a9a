#!/usr/bin/env bash
# bench/shard_save.sh - what a checkpoint costs a ps cluster's training,
# gathered (the chief pulls every variable and slot and writes one file)
# against sharded (checkpoint.sharded = on: each ps writes its own shard
# in parallel, the chief commits the index), on 1, 2 and 4 ps, in one run.
# The job: sync, the chief + 1 worker, an MLP 784-H-H-10 with momentum SGD
# (the slot doubles what a save writes), 1 BLAS thread a task, a save after
# every step. The chief's stall per save is the time from its "step N" line
# to its "saved checkpoint for step N" line (the chief waits for the save,
# shards included); the peak RSS of each task comes from /usr/bin/time.
# Rounds take turns over the cases; medians. Every run's newest checkpoint
# must pass `keel ckpt verify`.
#   usage: bench/shard_save.sh [BUILD_DIR]
#   env:   HIDDEN=16384 (about 1 GiB of variables; 8192: 0.3 GiB)
#          PS="1 2 4" STEPS=4 ROUNDS=3 RUN_TIMEOUT=1200
#          BENCH_OUT=<fresh dir in /tmp>: checkpoints go there, so it
#          needs about 4x the model's size free
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../_build}
. "$here/common.sh"
HIDDEN=${HIDDEN:-16384}
PS=${PS:-"1 2 4"}
STEPS=${STEPS:-4}
ROUNDS=${ROUNDS:-3}
RUN_TIMEOUT=${RUN_TIMEOUT:-1200}
keel="$build/keel"
[ -x "$keel" ] || { echo "shard_save.sh: no $keel (build keel first)" >&2; exit 3; }
out=$(bench_out_dir keel-shard-save)
bench_machine >&2
: > "$out/runs.jsonl"

ini() {   # ini SHARDED SAVE_STEPS
    cat <<INI
[model]
type = mlp
hidden = $HIDDEN,$HIDDEN
[data]
dir = /usr/share/datasets/fashion-mnist
[optimizer]
name = momentum
learning_rate = 0.01
momentum = 0.9
[train]
batch_size = 64
max_steps = $STEPS
threads = 1
[checkpoint]
dir = $out/run
sharded = $1
save_steps = $2
max_to_keep = 1
[hooks]
log_every_steps = 1
summary_every_steps = 0
progress = off
INI
}

run() {   # run N_PS SHARDED SAVE(1) ROUND: one JSON line
    ini "$2" 1 > "$out/job.ini"
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 - "$keel" "$out" "$1" "$2" "$3" \
        "$4" "$RUN_TIMEOUT" <<'PY'
import json, os, re, shutil, socket, subprocess, sys, threading, time
keel, out, n_ps, sharded, save, rnd = sys.argv[1:7]
deadline = time.monotonic() + float(sys.argv[7])
def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
ps = [f"127.0.0.1:{port()}" for _ in range(int(n_ps))]
ws = [f"127.0.0.1:{port()}" for _ in range(2)]
shutil.rmtree(f"{out}/run", ignore_errors=True)
tails, rss, step_at, stalls = {}, {}, {}, []
def start(t, i):
    env = dict(os.environ, TF_CONFIG=json.dumps(
        {"cluster": {"ps": ps, "worker": ws}, "task": {"type": t, "index": i}}))
    p = subprocess.Popen(["/usr/bin/time", "-f", "maxrss_kb %M", keel, "train", f"{out}/job.ini"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    key = f"{t}{i}"; tails[key] = []
    log = open(f"{out}/r{rnd}-ps{n_ps}-{sharded}-save{save}-{key}.log", "w")
    def rd():
        for ln in p.stdout:
            now = time.monotonic()
            log.write(ln)
            tails[key] = (tails[key] + [ln])[-5:]
            if ln.startswith("maxrss_kb "):
                rss[key] = int(ln.split()[1]) / 1024
            if key != "worker0":
                continue
            m = re.match(r"step (\d+) ", ln)
            if m:
                step_at[int(m.group(1))] = now
            m = re.match(r"saved checkpoint for step (\d+):", ln)
            if m and int(m.group(1)) in step_at:
                stalls.append(now - step_at[int(m.group(1))])
    th = threading.Thread(target=rd); th.start()
    return p, th
procs = [start("ps", i) for i in range(len(ps))] + [start("worker", 1), start("worker", 0)]
rcs, timed_out = [], False
for p, _ in procs:
    try:
        rcs.append(p.wait(timeout=max(0.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        timed_out = True
        for q, _ in procs:
            if q.poll() is None: q.kill()
        rcs.append(p.wait())
for _, th in procs: th.join()
res = {"round": int(rnd), "ps": int(n_ps), "sharded": sharded, "rcs": rcs,
       "stalls_s": stalls, "rss_mib": rss}
if any(rcs) or timed_out or not stalls:
    res["failed"] = {k: v for k, v in tails.items()}
print(json.dumps(res), flush=True)
PY
    "$keel" ckpt verify "$out/run" > "$out/verify.log" 2>&1 || {
        echo "shard_save.sh: ckpt verify failed ($1 ps, sharded=$2):" >&2
        cat "$out/verify.log" >&2; exit 1; }
}

for r in $(seq 1 "$ROUNDS"); do
    for n in $PS; do
        for sh in off on; do
            echo "== round $r/$ROUNDS: $n ps, sharded $sh" >&2
            run "$n" "$sh" 1 "$r" >> "$out/runs.jsonl"
        done
    done
done

/usr/bin/python3 - "$out" "$HIDDEN" "$STEPS" <<'PY'
import json, statistics, sys
out, hidden, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
bad = [r for r in runs if "failed" in r]
if bad:
    print("FAILED runs:", json.dumps(bad[:2], indent=1)); sys.exit(1)
params = 784 * hidden + hidden + hidden * hidden + hidden + hidden * 10 + 10
print(f"MLP 784-{hidden}-{hidden}-10: {params * 4 / 2**30:.2f} GiB of variables, "
      f"as much again in momentum; {steps} steps")
def stall(n, sh):   # median over every save of every round
    v = [t for x in runs if x["ps"] == n and x["sharded"] == sh for t in x["stalls_s"]]
    return statistics.median(v) if v else float("nan")
def rss(n, sh, role):   # median peak RSS of a role (MiB); ps: the largest
    v = []
    for x in runs:
        if x["ps"] != n or x["sharded"] != sh:
            continue
        r = [m for k, m in x["rss_mib"].items() if k.startswith(role)]
        if r:
            v.append(max(r))
    return statistics.median(v) if v else float("nan")
print(f"{'ps':>3} {'gathered s/save':>16} {'sharded s/save':>15} {'gathered/sharded':>17}"
      f" {'chief MiB g/s':>14} {'largest ps MiB g/s':>19}")
for n in sorted({x["ps"] for x in runs}):
    g, s = stall(n, "off"), stall(n, "on")
    print(f"{n:>3} {g:>16.2f} {s:>15.2f} {g / s:>17.2f}"
          f" {rss(n, 'off', 'worker0'):>7.0f}/{rss(n, 'on', 'worker0'):<6.0f}"
          f" {rss(n, 'off', 'ps'):>10.0f}/{rss(n, 'on', 'ps'):<8.0f}")
print(f"logs: {out}/runs.jsonl")
PY
