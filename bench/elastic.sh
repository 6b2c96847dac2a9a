#!/bin/sh
# elastic.sh - the stall of an elastic sync job (cluster.elastic) at a
# membership change, beside its steady step time in the same run.
#
# One ps and workers 0..2 (worker 0 the chief), every task a `keel train`
# started with its own TF_CONFIG, log_every_steps = 1: the CNN at a global
# batch of 192 (12 leaves of 16 examples) on a small synthetic data set. The driver
# timestamps the chief's step lines as they arrive. After WARMUP steps it
# measures STEADY steps (the median gap between step lines), then ROUNDS
# times:
#   drop:  SIGKILL the newest worker; the stall is the gap between the
#          chief's last step line before the kill and its first one after
#          (the ps drops the silent worker after cluster.dead_after_ms, the
#          step is computed again by the others): about DEAD_AFTER_MS plus
#          a step; also kill -> the chief's "membership: 3 -> 2" line.
#   admit: start a worker of the next index; the stall is the gap between
#          the chief's step lines around its "membership: 2 -> 3" line
#          (the joiner's first step under the new division) against a
#          steady step; also start -> that line (process start, HELLO,
#          pull: the others train meanwhile).
#
# usage: bench/elastic.sh [BUILD_DIR]    (default _build; ROUNDS=3,
#        DEAD_AFTER_MS=1000, STEADY=20, WARMUP=5)
set -eu
BUILD=${1:-_build}
KEEL=$(cd "$BUILD" && pwd)/keel
[ -x "$KEEL" ] || { echo "elastic.sh: build keel first ($KEEL)" >&2; exit 2; }
. "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-3}
DEAD_AFTER_MS=${DEAD_AFTER_MS:-1000}
STEADY=${STEADY:-20}
WARMUP=${WARMUP:-5}
OUT=$(bench_out_dir keel-elastic)
bench_machine
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); logs in $OUT"
export KEEL ROUNDS DEAD_AFTER_MS STEADY WARMUP OUT
OPENBLAS_NUM_THREADS=1 /usr/bin/python3 - <<'EOF'
import json, os, random, re, signal, socket, statistics, struct, subprocess, threading, time

KEEL = os.environ["KEEL"]; OUT = os.environ["OUT"]
ROUNDS = int(os.environ["ROUNDS"]); DEAD = int(os.environ["DEAD_AFTER_MS"])
STEADY = int(os.environ["STEADY"]); WARMUP = int(os.environ["WARMUP"])

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

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    return p

write_idx(os.path.join(OUT, "train"), 3840, 1)
write_idx(os.path.join(OUT, "t10k"), 200, 2)
INI = os.path.join(OUT, "job.ini")
open(INI, "w").write(
    "[model]\ntype = cnn\n[data]\ndir = %s\n"
    "[optimizer]\nname = adam\nlearning_rate = 0.001\n"
    "[train]\nbatch_size = 192\nmax_steps = 100000000\nseed = 5\nthreads = 1\n"
    "model_threads = 1\n[checkpoint]\ndir = %s/ckpt\nsave_steps = 0\n"
    "[hooks]\nlog_every_steps = 1\nsummary_every_steps = 0\nprogress = off\n"
    "[cluster]\nelastic = true\ndead_after_ms = %d\nheartbeat_ms = 100\n"
    "max_wait_secs = 60\n" % (OUT, OUT, DEAD))

PS = [free_port()]
WP = [free_port() for _ in range(3 + ROUNDS)]
STEP = re.compile(r"\bstep (\d+)\b")
JOIN = re.compile(r"membership: (\d+) -> (\d+) replicas? \(worker \d+ joined")
LEFT = re.compile(r"membership: (\d+) -> (\d+) replicas? \(worker \d+ left")
lines = []; cv = threading.Condition()

def start(kind, i, n_workers, watch=False):
    tf = {"cluster": {"ps": ["127.0.0.1:%d" % p for p in PS],
                      "worker": ["127.0.0.1:%d" % p for p in WP[:n_workers]]},
          "task": {"type": kind, "index": i}}
    env = dict(os.environ, TF_CONFIG=json.dumps(tf)); env.pop("OUTPUT_DIR", None)
    log = open(os.path.join(OUT, "%s%d.log" % (kind, i)), "w")
    p = subprocess.Popen([KEEL, "train", INI], env=env, text=True, bufsize=1,
                         stdout=subprocess.PIPE if watch else log,
                         stderr=subprocess.STDOUT, start_new_session=True)
    if watch:
        def reader():
            for s in p.stdout:
                log.write(s)
                with cv:
                    lines.append((time.monotonic(), s.rstrip("\n"))); cv.notify_all()
            with cv:
                lines.append((time.monotonic(), None)); cv.notify_all()
        threading.Thread(target=reader, daemon=True).start()
    return p

def wait(i, pred, timeout=120):
    end = time.monotonic() + timeout
    with cv:
        while True:
            while i < len(lines):
                t, s = lines[i]
                if s is None:
                    raise RuntimeError("the chief ended (see %s/worker0.log)" % OUT)
                if pred(s):
                    return i, t
                i += 1
            if time.monotonic() >= end:
                raise TimeoutError("no matching chief line within %d s" % timeout)
            if procs[0].poll() is not None:
                raise RuntimeError("the ps ended (see %s/ps0.log)" % OUT)
            cv.wait(min(1.0, end - time.monotonic()))

def is_step(s):
    return STEP.search(s) and "loss" in s

procs = [start("ps", 0, 3)]
chief = start("worker", 0, 3, watch=True)
workers = {i: start("worker", i, 3) for i in (1, 2)}
procs.append(chief)
drops, admits, steady = [], [], []
try:
    i, _ = wait(0, is_step, 300)
    for _ in range(WARMUP):
        i, _ = wait(i + 1, is_step)
    ts = []
    for _ in range(STEADY + 1):
        i, t = wait(i + 1, is_step); ts.append(t)
    steady = [b - a for a, b in zip(ts, ts[1:])]
    newest = 2
    for r in range(ROUNDS):
        # drop: the newest worker killed for good
        with cv:
            before = [t for t, s in lines if s and is_step(s)][-1]
            mark = len(lines)
        k = time.monotonic()
        workers[newest].send_signal(signal.SIGKILL); workers[newest].wait()
        j, tm = wait(mark, lambda s: LEFT.search(s) is not None)
        _, after = wait(mark, is_step)
        drops.append((after - before, tm - k))
        i, _ = wait(j + 1, is_step)
        for _ in range(3):
            i, _ = wait(i + 1, is_step)
        # admit: a worker of the next index
        newest += 1
        s0 = time.monotonic()
        with cv:
            mark = len(lines)
        workers[newest] = start("worker", newest, newest + 1)
        j, tm = wait(mark, lambda s: JOIN.search(s) is not None, 300)
        with cv:
            prev = [t for t, s in lines[:j] if s and is_step(s)][-1]
        i, nxt = wait(j + 1, is_step)
        admits.append((nxt - prev, tm - s0))
        for _ in range(3):
            i, _ = wait(i + 1, is_step)
finally:
    for p in list(workers.values()) + procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in list(workers.values()) + procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL); p.wait()

med = statistics.median
st = med(steady)
print("steady step (3 replicas): median %.4f s over %d steps (min %.4f, max %.4f)"
      % (st, len(steady), min(steady), max(steady)))
print("drop  (3 -> 2, SIGKILL; dead_after_ms = %d): stall median %.3f s (%s), "
      "kill -> membership line median %.3f s"
      % (DEAD, med([d[0] for d in drops]), ", ".join("%.3f" % d[0] for d in drops),
         med([d[1] for d in drops])))
print("admit (2 -> 3, new index): stall median %.3f s (%s), start -> membership "
      "line median %.3f s" % (med([a[0] for a in admits]),
                              ", ".join("%.3f" % a[0] for a in admits),
                              med([a[1] for a in admits])))
print()
print("| what | median s | rounds | / steady step | / dead_after_ms |")
print("|---|---|---|---|---|")
print("| steady step (3 replicas) | %.4f | %d steps | 1 | |" % (st, len(steady)))
d = med([x[0] for x in drops])
print("| drop: stall step (3 -> 2, SIGKILL) | %.3f | %d | %.0f | %.2f |"
      % (d, len(drops), d / st, d * 1000 / DEAD))
print("| drop: kill -> membership line | %.3f | %d | | %.2f |"
      % (med([x[1] for x in drops]), len(drops), med([x[1] for x in drops]) * 1000 / DEAD))
a = med([x[0] for x in admits])
print("| admit: stall step (2 -> 3, new index) | %.3f | %d | %.1f | |"
      % (a, len(admits), a / st))
print("| admit: start -> membership line | %.3f | %d | | |"
      % (med([x[1] for x in admits]), len(admits)))
EOF
