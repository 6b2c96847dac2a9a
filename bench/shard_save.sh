#!/usr/bin/env bash
# bench/shard_save.sh - what a checkpoint costs a ps cluster's training,
# gathered (the chief pulls every variable and slot and writes one file)
# against sharded (checkpoint.sharded = on: each ps writes its own shard
# in parallel, the chief commits the index), on 1, 2 and 4 ps, in one run.
# The job: sync, the chief + 1 worker, an MLP 784-H-H-10 with momentum SGD
# (the slot doubles what a save writes), 1 BLAS thread a task, a save after
# every step. The chief's stall per save is the time from its "step N" line
# to its "saved checkpoint for step N" line (the chief waits for the save,
# shards included); the wall time per save is the chief's step interval
# (its "step N" line to its "step N+1" line: a step and a save, what the
# job's wall clock pays for both); the peak RSS of each task comes from
# /usr/bin/time. Checkpoint size: 2 x 4 x (784H + H^2 + 10H + 2H + 10)
# bytes (variables and the momentum slot): H=11264 about 1 GiB, 16384
# about 2 GiB, 22784 about 4 GiB; a task holds several copies of the
# model (see bench/README.md) so check `free -g` first.
# Rounds take turns over the cases; medians. Every run's newest checkpoint
# must pass `keel ckpt verify`.
#   usage: bench/shard_save.sh [BUILD_DIR]
#   env:   HIDDEN=16384 (about 1 GiB of variables; 8192: 0.3 GiB)
#          BATCH=64 (the step's compute; a save does not depend on it)
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
BATCH=${BATCH:-64}
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
batch_size = $BATCH
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
    OPENBLAS_NUM_THREADS=1 PYTHONPATH="$here" /usr/bin/python3 - "$keel" \
        "$out" "$1" "$2" "$3" "$4" "$RUN_TIMEOUT" <<'PY'
import json, re, shutil, sys, time
from cluster_tasks import Task, ports, wait_all
keel, out, n_ps, sharded, save, rnd = sys.argv[1:7]
deadline = time.monotonic() + float(sys.argv[7])
ps, ws = ports(int(n_ps)), ports(2)
shutil.rmtree(f"{out}/run", ignore_errors=True)
step_at, stalls = {}, []
def chief_line(t, ln, now):
    m = re.match(r"step (\d+) ", ln)
    if m:
        step_at[int(m.group(1))] = now
    m = re.match(r"saved checkpoint for step (\d+):", ln)
    if m and int(m.group(1)) in step_at:
        stalls.append(now - step_at[int(m.group(1))])
def start(t, i):
    return Task(["/usr/bin/time", "-f", "maxrss_kb %M", keel, "train", f"{out}/job.ini"],
                {"ps": ps, "worker": ws}, t, i,
                on_line=chief_line if (t, i) == ("worker", 0) else None,
                log=f"{out}/r{rnd}-ps{n_ps}-{sharded}-save{save}-{t}{i}.log")
tasks = [start("ps", i) for i in range(len(ps))] + [start("worker", 1), start("worker", 0)]
rcs, timed_out = wait_all(tasks, deadline)
# the chief's step lines: step N+1's line comes a step and a save after
# step N's (every step saves)
at = [step_at[k] for k in sorted(step_at)]
res = {"round": int(rnd), "ps": int(n_ps), "sharded": sharded, "rcs": rcs,
       "stalls_s": stalls, "intervals_s": [b - a for a, b in zip(at, at[1:])],
       "rss_mib": {t.key: t.rss_mib for t in tasks if t.rss_mib is not None}}
if any(rcs) or timed_out or not stalls:
    res["failed"] = {t.key: t.tail for t in tasks}
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

/usr/bin/python3 - "$out" "$HIDDEN" "$STEPS" "$BATCH" <<'PY'
import json, statistics, sys
out, hidden, steps, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
bad = [r for r in runs if "failed" in r]
if bad:
    print("FAILED runs:", json.dumps(bad[:2], indent=1)); sys.exit(1)
params = 784 * hidden + hidden + hidden * hidden + hidden + hidden * 10 + 10
print(f"MLP 784-{hidden}-{hidden}-10, batch {batch}: {params * 4 / 2**30:.2f} GiB of variables, "
      f"as much again in momentum ({2 * params * 4 / 2**30:.2f} GiB a checkpoint); {steps} steps")
def med(n, sh, key):   # median over every save of every round
    v = [t for x in runs if x["ps"] == n and x["sharded"] == sh for t in x[key]]
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
print(f"{'ps':>3} {'stall g/s (s)':>15} {'g/s':>6} {'wall step+save g/s (s)':>23} {'g/s':>6}"
      f" {'chief MiB g/s':>14} {'worker1 MiB':>12} {'largest ps MiB g/s':>19}")
for n in sorted({x["ps"] for x in runs}):
    g, s = med(n, "off", "stalls_s"), med(n, "on", "stalls_s")
    wg, ws = med(n, "off", "intervals_s"), med(n, "on", "intervals_s")
    print(f"{n:>3} {g:>7.2f}/{s:<7.2f} {g / s:>6.2f} {wg:>11.2f}/{ws:<11.2f} {wg / ws:>6.2f}"
          f" {rss(n, 'off', 'worker0'):>7.0f}/{rss(n, 'on', 'worker0'):<6.0f}"
          f" {rss(n, 'off', 'worker1'):>12.0f}"
          f" {rss(n, 'off', 'ps'):>10.0f}/{rss(n, 'on', 'ps'):<8.0f}")
print(f"logs: {out}/runs.jsonl")
PY
