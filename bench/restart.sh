#!/bin/sh
# restart.sh - recovery time of `keel launch` after a SIGKILL, beside
# torchrun (torch.distributed.elastic) in the same script.
#
# For each scenario keel launch runs a job with log_every_steps = 1; the
# driver timestamps every line as it arrives, SIGKILLs one task (pid from
# the launcher's "started/restarted X (pid N)" lines) and measures
#   kill -> "restarted X" (detection + backoff + fork/exec), and
#   kill -> victim back (the chief's first step line after its restore, a
#           worker's "model ready", a ps's "initialized" line), and
#   kill -> the first chief step line after that (the next applied global
#           step with the victim back), and of that the chief's checkpoint
#           restore (its "restored ... in X s" line: a killed chief restores,
#           a killed ps is reloaded by the chief; plus, for a new ps, the
#           INIT that sends it the restored state) and one normal step (the
#           median gap between the chief's step lines before the kill: the
#           first step after a recovery is a whole step too), so the target
#           "< 0.3 s plus the restore" reads off the "next step minus
#           restore and one step" column. Also shown: of the restore, the
#           ps INIT, and the slowest worker's pull before its first step
#           ("pulled N MiB ... in X s": the new worker's; every worker's
#           after a ps restart). Kills land just after a checkpoint (the
#           step after a save step), never inside the chief's save.
# TRACE=1 prints each recovery's lines with times since the kill (stderr).
# Scenarios: chief-only (kill the chief), 1 ps + 2 workers (kill a worker),
# for models of 1 MiB and 100 MiB of variables, with the default
# backoff (0.1 s) and --backoff 0. Then bench/torch_restart.py (torchrun;
# skipped with a message when python3-torch is missing).
#
# usage: bench/restart.sh [BUILD_DIR]     (default _build; KILLS=5,
#        TORCH=0 skips torchrun, SCENARIOS="chief worker ps",
#        MODELS=1mib,100mib,small,larger, BACKOFFS=0.1,0,
#        DEAD_AFTER_MS=N sets cluster.dead_after_ms for every task;
#        SEND_BUFFER_KIB=N sets cluster.send_buffer_kib)
set -eu
BUILD=${1:-_build}
KEEL=$(cd "$BUILD" && pwd)/keel
[ -x "$KEEL" ] || { echo "restart.sh: build keel first ($KEEL)" >&2; exit 2; }
KILLS=${KILLS:-5}
SCENARIOS=${SCENARIOS:-"chief worker ps"}
TORCH=${TORCH:-1}
DEAD_AFTER_MS=${DEAD_AFTER_MS:-}
MODELS=${MODELS:-1mib,100mib}
BACKOFFS=${BACKOFFS:-0.1,0}
export KEEL KILLS SCENARIOS DEAD_AFTER_MS MODELS BACKOFFS
OPENBLAS_NUM_THREADS=1 /usr/bin/python3 - <<'EOF'
import os, re, signal, statistics, struct, subprocess, sys, tempfile, threading, time, random

KEEL = os.environ["KEEL"]
KILLS = int(os.environ["KILLS"])
SCEN = os.environ["SCENARIOS"].split()

def write_idx(prefix, n, seed):
    r = random.Random(seed)
    img = bytearray(struct.pack(">IIII", 0x803, n, 28, 28))
    lab = bytearray(struct.pack(">II", 0x801, n))
    for i in range(n):
        c = i % 10; r0 = 2 + (c // 5) * 12; c0 = 2 + (c % 5) * 5
        x = bytearray(r.getrandbits(5) for _ in range(784))
        for rr in range(r0, r0 + 6):
            for q in range(c0, min(c0 + 6, 28)):
                x[rr * 28 + q] = 230
        img += x; lab.append(c)
    open(prefix + "-images-idx3-ubyte", "wb").write(img)
    open(prefix + "-labels-idx1-ubyte", "wb").write(lab)

class Run:
    def __init__(self, args, env):
        self.lines = []            # (t, text)
        self.cv = threading.Condition()
        self.p = subprocess.Popen([KEEL, "launch"] + args, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, env=env, text=True,
                                  bufsize=1, start_new_session=True)
        threading.Thread(target=self.reader, daemon=True).start()
    def reader(self):
        for line in self.p.stdout:
            with self.cv:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.cv.notify_all()
        with self.cv:
            self.lines.append((time.monotonic(), None)); self.cv.notify_all()
    def wait(self, start, pred, timeout=60):
        end = time.monotonic() + timeout
        with self.cv:
            i = start
            while True:
                while i < len(self.lines):
                    t, s = self.lines[i]
                    if s is None:
                        raise RuntimeError("launcher ended")
                    m = pred(s)
                    if m:
                        return i, t, m
                    i += 1
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no matching line")
                self.cv.wait(left)
    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL); self.p.wait()

def pid_of(run, task):
    pid = None
    with run.cv:
        for _, s in run.lines:
            if s is None: continue
            m = re.match(r"launch \| (?:re)?started (\S+) \(pid (\d+)\)", s)
            if m and m.group(1) == task:
                pid = int(m.group(2))
    return pid

STEP = re.compile(r"chief \| step (\d+) ")
RESTORED = re.compile(r"chief \| .*restored .* in ([0-9.]+) s\)")
# a new ps gets the restored state from the chief (INIT): restore work too
INITED = re.compile(r"chief \| .*initialized at step .*INIT of [0-9.]+ MiB in ([0-9.]+) s\)")
# a worker's pull of the variables before its first step (a new worker;
# every worker after a ps restart)
PULLED = re.compile(r"^(?:worker\.\d+|chief) \| .*pulled [0-9.]+ MiB at step \d+ from \d+ ps in ([0-9.]+) s")
# the victim is back in the job: the chief's first step line; a worker's
# "model ready"; a ps's "initialized" (by the chief, from its checkpoint)
READY = {"chief": STEP, "worker": re.compile(r"^worker\.1 \| model ready"),
         "ps": re.compile(r"^ps\.0 \| .*initialized")}

def scenario(d, victim, hidden, backoff, gap=30, timeout=60):
    ps, workers = (0, 0) if victim == "chief" else (1, 2)
    name = {"chief": "chief", "worker": "worker.1", "ps": "ps.0"}[victim]
    out = tempfile.mkdtemp(prefix="run-", dir=d)
    save = max(1, gap * 2 // 3)
    args = [os.path.join(d, "job.ini"), "--ps", str(ps), "--workers", str(workers),
            "--backoff", str(backoff), "--max-restarts", str(KILLS + 2),
            "-s", "model.hidden=" + hidden, "-s", "checkpoint.dir=" + out,
            "-s", "checkpoint.save_steps=%d" % save]
    if os.environ.get("DEAD_AFTER_MS"):
        args += ["-s", "cluster.dead_after_ms=" + os.environ["DEAD_AFTER_MS"]]
    if os.environ.get("SEND_BUFFER_KIB"):
        args += ["-s", "cluster.send_buffer_kib=" + os.environ["SEND_BUFFER_KIB"]]
    env = dict(os.environ); env.pop("OUTPUT_DIR", None)
    run = Run(args, env)
    res = []
    try:
        i, _, _ = run.wait(0, STEP.search, 120 + timeout)
        for k in range(KILLS):
            # let it train a little (and checkpoint) between kills
            i, _, m = run.wait(i + 1, STEP.search, timeout)
            target = int(m.group(1)) + gap
            # kill just after a checkpoint (the step after a save step),
            # not just before one: the chief's save (a pull of the whole
            # model and its slots, then the HDF5 write: ~2 s at 100 MiB)
            # must not sit inside the measured recovery
            def due(s):
                m = STEP.search(s)
                return m and int(m.group(1)) >= target and int(m.group(1)) % save == 1 % save
            i, _, _ = run.wait(i, due, timeout)
            pid = pid_of(run, name)
            t_kill = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            with run.cv:
                j0 = len(run.lines)
            j, t_re, _ = run.wait(j0, lambda s: s.startswith("launch | restarted %s " % name),
                                  timeout)
            ready = READY[victim]
            j, t_ready, _ = run.wait(j + 1, ready.search, timeout)
            i, t_step, m = (j, t_ready, None) if victim == "chief" else run.wait(j + 1, STEP.search,
                                                                                  timeout)
            # the chief's checkpoint restore in this recovery, if any (a
            # killed chief restores; a killed ps is reloaded by the chief)
            restore = init = pull = 0.0
            with run.cv:
                for _, s in run.lines[j0:i + 1]:
                    rm = s and (RESTORED.search(s) or INITED.search(s))
                    if rm:
                        restore += float(rm.group(1))
                    if s and INITED.search(s):
                        init += float(INITED.search(s).group(1))
                    if s and PULLED.search(s):   # the slowest worker's
                        pull = max(pull, float(PULLED.search(s).group(1)))
            if os.environ.get("TRACE"):   # the lines of this recovery
                with run.cv:
                    for t, s in run.lines[max(0, j0 - 2):i + 1]:
                        print("  %+.3f %s" % (t - t_kill, s), file=sys.stderr)
            # a normal step here: the gap between the chief's step lines
            # just before the kill
            with run.cv:
                ts = [t for t, s in run.lines[:j0] if s and STEP.search(s)][-6:]
            step_s = statistics.median([b - a for a, b in zip(ts, ts[1:])]) if len(ts) > 1 else 0.0
            res.append((t_re - t_kill, t_ready - t_kill, t_step - t_kill, restore, step_s,
                        init, pull))
    finally:
        run.stop()
    return res

def med(v):
    return statistics.median(v) if v else float("nan")

d = tempfile.mkdtemp(prefix="keel-restart-")
write_idx(os.path.join(d, "train"), 6400, 1)
write_idx(os.path.join(d, "t10k"), 200, 2)
open(os.path.join(d, "job.ini"), "w").write(
    "[model]\ntype = mlp\nhidden = 32\n[data]\ndir = %s\n"
    "[optimizer]\nname = adam\nlearning_rate = 0.001\n"
    "[train]\nbatch_size = 32\nmax_steps = 100000000\nseed = 5\nthreads = 1\n"
    "[checkpoint]\nsave_steps = 20\n"
    "[hooks]\nlog_every_steps = 1\nsummary_every_steps = 100\nprogress = off\n" % d)
# 1 MiB and 100 MiB of variables (float32; the ps also holds Adam's two
# slots); MODELS=small,large picks, default both.
# (hidden, label, steps between kills, seconds a wait may take)
ALL_MODELS = {"1mib": ("320", "1 MiB mlp 784-320-10", 30, 60),
              "100mib": ("5000,4200", "100 MiB mlp 784-5000-4200-10", 6, 600),
              "small": ("32", "small mlp 784-32-10", 30, 60),
              "larger": ("1024,1024", "larger mlp 784-1024-1024-10", 30, 60)}
MODELS = [ALL_MODELS[m] for m in os.environ.get("MODELS", "1mib,100mib").split(",")]
BACKOFFS = [float(b) for b in os.environ.get("BACKOFFS", "0.1,0").split(",")]
rows = []
for victim in SCEN:
    for hidden, label, gap, timeout in MODELS:
        for backoff in BACKOFFS:
            try:
                r = scenario(d, victim, hidden, backoff, gap, timeout)
            except Exception as e:  # report and go on
                print("scenario %s/%s/backoff %g failed: %s" % (victim, label, backoff, e), file=sys.stderr)
                continue
            rows.append((victim, label, backoff, med([x[0] for x in r]), med([x[1] for x in r]),
                         med([x[2] for x in r]), med([x[3] for x in r]),
                         med([x[4] for x in r]),
                         med([x[2] - x[3] - x[4] for x in r]), len(r),
                         med([x[5] for x in r]), med([x[6] for x in r])))
            print("keel %-6s %-28s backoff %.1f: kill->restarted %.3f s, kill->victim back %.3f s, "
                  "kill->next chief step %.3f s, of which checkpoint restore %.3f s "
                  "(ps INIT %.3f s) and one normal step %.3f s; workers' pull %.3f s "
                  "(median of %d; back: %s; remainder: %s)"
                  % (victim, label, backoff, rows[-1][3], rows[-1][4], rows[-1][5], rows[-1][6],
                     rows[-1][10], rows[-1][7], rows[-1][11], len(r),
                     ", ".join("%.3f" % x[1] for x in r),
                     ", ".join("%.3f" % (x[2] - x[3] - x[4]) for x in r)), flush=True)
print()
print("| killed | model | backoff s | kill -> restarted s | kill -> victim back s | kill -> next global step s "
      "| checkpoint restore s | a normal step s | next step minus restore and one step s | kills "
      "| of the restore: ps INIT s | workers' pull s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print("| %s | %s | %.1f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %d | %.3f | %.3f |" % r)
EOF
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "$TORCH" = 1 ] && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "restart.sh: PyTorch missing: torchrun is skipped (apt-get install python3-torch)" >&2
elif [ "$TORCH" = 1 ]; then
    echo
    echo "torchrun (2-worker DDP, SIGKILL rank 1, 3 kills, --monitor_interval 0.5):"
    /usr/bin/python3 "$HERE/torch_restart.py" \
        --monitor-intervals 0.5 --runs 1 | grep -E '"bench": "torchrun_restart"' |
        grep -E 'first_step|new_proc' || true
fi
