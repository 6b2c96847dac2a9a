#!/usr/bin/env bash
# bench/sparse_rows.sh - the sparse step of examples/embedding (a click
# model whose embedding table's gradient is rows) on N_PS ps with the
# chief alone: bytes per step against the dense table, and examples/s.
#   push: the chief's own counter ("bytes pushed" of its per-step line at
#         its end: the payload a step pushes, all ps together);
#   pull: its "bytes pulled" counter, when the per-step line has one;
#   dense: the model's bytes (VOCAB x 8 floats of the table, the 8 + 1 of
#         the click layer): what a dense push or pull of it moves.
# (The tasks of one machine talk over Unix sockets, which keep no byte
# counts of their own: the counters are keel's.) examples/s: global
# batch 128 between the chief's "step S/10" and "step S" lines (S =
# STEPS; examples/embedding prints every S/10 steps). Rounds; medians.
#   usage: flock /tmp/keel-bench.lock bench/sparse_rows.sh [BUILD_DIR]
#   env:   N_PS=4 VOCAB=4096 STEPS=300 N=20000 ROUNDS=3 RUN_TIMEOUT=300
#          BENCH_OUT=<fresh dir in /tmp>
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../_build}
. "$here/common.sh"
N_PS=${N_PS:-4}
VOCAB=${VOCAB:-4096}
STEPS=${STEPS:-300}
N=${N:-20000}
ROUNDS=${ROUNDS:-3}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
bin="$build/examples/embedding"
[ -x "$bin" ] || { echo "sparse_rows.sh: no $bin (make examples/embedding)" >&2; exit 3; }
/usr/bin/python3 -c 'import h5py, numpy' 2>/dev/null || {
    echo "sparse_rows.sh: python3 has no h5py or numpy (apt-get install python3-h5py)" >&2; exit 3; }
out=$(bench_out_dir keel-sparse-rows)
bench_machine
: > "$out/runs.jsonl"
/usr/bin/python3 "$here/../examples/make_clicks.py" "$out/clicks.h5" --n "$N" \
    --vocab "$VOCAB" --seed 1 > /dev/null

for r in $(seq 1 "$ROUNDS"); do
    echo "== round $r/$ROUNDS: $N_PS ps, vocab $VOCAB, $STEPS steps" >&2
    rm -rf "$out/run"
    OPENBLAS_NUM_THREADS=1 PYTHONPATH="$here" /usr/bin/python3 - "$bin" "$out" \
        "$N_PS" "$VOCAB" "$STEPS" "$r" "$RUN_TIMEOUT" <<'PY' >> "$out/runs.jsonl"
import json, re, sys, time
from cluster_tasks import Task, ports, wait_all
bin_, out, n_ps, vocab, steps, rnd = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
deadline = time.monotonic() + float(sys.argv[7])
cluster = {"ps": ports(n_ps), "worker": ports(1)}
argv = [bin_, f"{out}/clicks.h5", f"{out}/run", str(steps), str(vocab)]
first = steps // 10 if steps >= 10 else 1
ps_tasks, marks, per_step = [], {}, {}
def chief_line(t, ln, now):
    m = re.match(r"step (\d+): loss", ln)
    if m and int(m.group(1)) in (first, steps):
        marks[int(m.group(1))] = now
    m = re.search(r"per step \((\d+) steps.*bytes pushed (\d+)", ln)
    if m:
        per_step["pushed"] = int(m.group(2))
        m2 = re.search(r"bytes pulled (\d+)", ln)
        if m2:
            per_step["pulled"] = int(m2.group(1))
ps_tasks.extend(Task(argv, cluster, "ps", i, log=f"{out}/r{rnd}-ps{i}.log") for i in range(n_ps))
chief = Task(argv, cluster, "worker", 0, on_line=chief_line, log=f"{out}/r{rnd}-chief.log")
rcs, timed_out = wait_all(ps_tasks + [chief], deadline)
res = {"round": int(rnd), "ps": n_ps, "vocab": vocab, "steps": steps, "rcs": rcs}
res.update({f"chief_{k}": v for k, v in per_step.items()})
if first in marks and steps in marks:
    res["examples_per_s"] = 128 * (steps - first) / (marks[steps] - marks[first])
if any(rcs) or timed_out or "examples_per_s" not in res or "chief_pushed" not in res:
    res["failed"] = {t.key: t.tail for t in ps_tasks + [chief]}
print(json.dumps(res), flush=True)
PY
done

/usr/bin/python3 - "$out" "$VOCAB" <<'PY'
import json, statistics, sys
out, vocab = sys.argv[1], int(sys.argv[2])
runs = [json.loads(l) for l in open(f"{out}/runs.jsonl")]
bad = [r for r in runs if "failed" in r]
for r in bad:
    print("FAILED run:", json.dumps(r))
ok = [r for r in runs if "failed" not in r]
if not ok:
    sys.exit(1)
def med(k):
    v = [r[k] for r in ok if r.get(k) is not None]
    return statistics.median(v) if v else float("nan")
dense = vocab * 8 * 4 + 8 * 4 + 4
print(f"examples/embedding, {ok[0]['ps']} ps, vocab {vocab}, batch 128, {ok[0]['steps']} steps;"
      f" medians of {len(ok)} runs; dense model {dense} bytes")
print(f"{'':>28} {'bytes/step':>11} {'/ dense':>8}")
for label, k in (("push (chief's counter)", "chief_pushed"), ("pull (chief's counter)", "chief_pulled")):
    v = med(k)
    print(f"{label:>28} {v:>11.0f} {v / dense:>8.3f}" if v == v else
          f"{label:>28} {'n/a':>11}  (this build logs no pull counter)")
print(f"{'examples/s':>28} {med('examples_per_s'):>11.0f}")
print(f"logs: {out}/runs.jsonl")
PY
