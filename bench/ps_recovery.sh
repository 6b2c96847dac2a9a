#!/usr/bin/env bash
# bench/ps_recovery.sh - how long a SIGKILLed ps takes to come back,
# against the size of its shard: 1, 2 and 4 ps, the chief alone (sync, 1
# worker), an MLP 784-H-H-10 with momentum SGD for each H in SIZES, a
# checkpoint every SAVE_STEPS steps. Once the chief has saved at step
# SAVE_STEPS and logged two more steps, ps 0 gets SIGKILL and is started
# again at once on its port; measured from that restart:
#   ps line:   to the restarted ps's "read N variables ... (no values
#              through the chief)" (checkpoint.sharded = on: the ps reads
#              its own shard) or "initialized by the chief" (off: the
#              chief restores the gathered file and sends the ps its
#              values, the INIT-through-chief path);
#   next step: to the chief's next "step N" line (it rolls back to the
#              checkpoint and trains again).
# Shard size: the bytes of ps 0's shard file (sharded runs; the same
# placement holds ps 0's part in the gathered runs). Rounds take turns
# over the cases; medians.
#   usage: flock /tmp/keel-bench.lock bench/ps_recovery.sh [BUILD_DIR]
#   env:   SIZES="1024 4096" PS="1 2 4" ROUNDS=1 SAVE_STEPS=5
#          RUN_TIMEOUT=300 BENCH_OUT=<fresh dir in /tmp>
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../_build}
. "$here/common.sh"
SIZES=${SIZES:-"1024 4096"}
PS=${PS:-"1 2 4"}
ROUNDS=${ROUNDS:-1}
SAVE_STEPS=${SAVE_STEPS:-5}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
keel="$build/keel"
[ -x "$keel" ] || { echo "ps_recovery.sh: no $keel (build keel first)" >&2; exit 3; }
out=$(bench_out_dir keel-ps-recovery)
bench_machine
: > "$out/runs.jsonl"

ini() {   # ini HIDDEN SHARDED
    bench_mlp_momentum_ini | sed "s/^hidden = .*/hidden = $1,$1/"
    cat <<INI
[train]
batch_size = 64
max_steps = $((SAVE_STEPS * 4))
threads = 1
[checkpoint]
dir = $out/run
sharded = $2
save_steps = $SAVE_STEPS
max_to_keep = 2
[hooks]
log_every_steps = 1
summary_every_steps = 0
progress = off
INI
}

run() {   # run HIDDEN N_PS SHARDED ROUND: one JSON line
    ini "$1" "$3" > "$out/job.ini"
    OPENBLAS_NUM_THREADS=1 PYTHONPATH="$here" /usr/bin/python3 - "$keel" \
        "$out" "$1" "$2" "$3" "$4" "$SAVE_STEPS" "$RUN_TIMEOUT" <<'PY'
import json, os, re, shutil, signal, sys, threading, time
from cluster_tasks import Task, ports, wait_all
keel, out, hidden, n_ps, sharded, rnd, save_steps = sys.argv[1:8]
n_ps, save_steps = int(n_ps), int(save_steps)
deadline = time.monotonic() + float(sys.argv[8])
ps, ws = ports(n_ps), ports(1)
cluster = {"ps": ps, "worker": ws}
shutil.rmtree(f"{out}/run", ignore_errors=True)
tag = f"r{rnd}-h{hidden}-ps{n_ps}-{sharded}"
ev = {"shard_bytes": None, "restart": None, "ps_line": None, "step": None}
kill_now = threading.Event()
saved = [False]
def chief_line(t, ln, now):
    m = re.match(r"step (\d+) ", ln)
    if m:
        n = int(m.group(1))
        if ev["restart"] is not None and ev["step"] is None:
            ev["step"] = now
            ev["step_n"] = n
        elif saved[0] and n >= save_steps + 2:
            kill_now.set()
    if ln.startswith(f"saved checkpoint for step {save_steps}:"):
        saved[0] = True
def ps0_line(t, ln, now):
    m = re.search(r"ps 0: wrote shard \d+ of \d+ of step \d+: (\S+)", ln)
    if m and ev["shard_bytes"] is None:
        try:
            ev["shard_bytes"] = os.path.getsize(m.group(1))
        except OSError:
            pass
    if ev["restart"] is not None and ev["ps_line"] is None and (
            "(no values through the chief)" in ln or "initialized by the chief" in ln):
        ev["ps_line"] = now
        ev["how"] = "own shard" if "no values" in ln else "chief INIT"
def start_ps(i, gen):
    return Task([keel, "train", f"{out}/job.ini"], cluster, "ps", i,
                on_line=ps0_line if i == 0 else None, log=f"{out}/{tag}-ps{i}.{gen}.log")
tasks = [start_ps(i, 0) for i in range(n_ps)]
chief = Task([keel, "train", f"{out}/job.ini"], cluster, "worker", 0,
             on_line=chief_line, log=f"{out}/{tag}-chief.log")
ok = kill_now.wait(timeout=max(0.0, deadline - time.monotonic()))
if ok:
    tasks[0].proc.send_signal(signal.SIGKILL)
    tasks[0].proc.wait()
    tasks[0].join()
    ev["restart"] = time.monotonic()
    tasks[0] = start_ps(0, 1)
rcs, timed_out = wait_all(tasks + [chief], deadline)
res = {"round": int(rnd), "hidden": int(hidden), "ps": n_ps, "sharded": sharded,
       "rcs": rcs, "shard_bytes": ev["shard_bytes"], "how": ev.get("how")}
if ev["restart"] is not None and ev["ps_line"] is not None:
    res["ps_line_s"] = ev["ps_line"] - ev["restart"]
if ev["restart"] is not None and ev["step"] is not None:
    res["next_step_s"] = ev["step"] - ev["restart"]
    res["next_step_n"] = ev["step_n"]
if any(rcs) or timed_out or "next_step_s" not in res or "ps_line_s" not in res:
    res["failed"] = {t.key: t.tail for t in tasks + [chief]}
print(json.dumps(res), flush=True)
PY
}

for r in $(seq 1 "$ROUNDS"); do
    for h in $SIZES; do
        for n in $PS; do
            for sh in on off; do
                echo "== round $r/$ROUNDS: hidden $h, $n ps, sharded $sh" >&2
                run "$h" "$n" "$sh" "$r" >> "$out/runs.jsonl"
            done
        done
    done
done

/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
for r in runs:
    if "failed" in r:
        print("FAILED run:", json.dumps(r))
def med(h, n, sh, key):
    v = [x[key] for x in runs if x["hidden"] == h and x["ps"] == n
         and x["sharded"] == sh and x.get(key) is not None]
    return statistics.median(v) if v else float("nan")
print(f"{'hidden':>6} {'ps':>3} {'ps0 shard MiB':>13} {'own shard: ps line s':>21} {'next step s':>12}"
      f" {'chief INIT: ps line s':>22} {'next step s':>12}")
for h in sorted({x["hidden"] for x in runs}):
    for n in sorted({x["ps"] for x in runs}):
        b = med(h, n, "on", "shard_bytes")
        print(f"{h:>6} {n:>3} {b / 2**20:>13.1f} {med(h, n, 'on', 'ps_line_s'):>21.2f}"
              f" {med(h, n, 'on', 'next_step_s'):>12.2f} {med(h, n, 'off', 'ps_line_s'):>22.2f}"
              f" {med(h, n, 'off', 'next_step_s'):>12.2f}")
print(f"logs: {out}/runs.jsonl")
PY
