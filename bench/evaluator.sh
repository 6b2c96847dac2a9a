#!/bin/sh
# evaluator.sh - how soon the evaluator task reports a new checkpoint,
# beside running `keel eval` afresh on the same checkpoint.
#
# 1. `keel train` writes checkpoints of steps 0, 10, ..., STEPS into a
#    staging directory (MLP 784-256-256-10 on Fashion-MNIST, 10,000 test
#    examples).
# 2. An evaluator (`keel train` with TF_CONFIG task type evaluator) watches
#    an empty directory. For each checkpoint the driver commits it there the
#    way the saver does (copy to a temp name, rename the .h5, write the
#    state file to a temp name, rename it) and measures from the state
#    file's rename to the evaluator's "eval step N" line arriving on its
#    stderr pipe (restore with every checksum verified + the whole test
#    set), then waits for that line before the next commit.
# 3. `keel eval CONFIG --checkpoint FILE` on each checkpoint: process start
#    to exit (load the test set, build the model, restore, evaluate).
#
# usage: bench/evaluator.sh [BUILD_DIR]    (default _build; STEPS=100)
set -eu
BUILD=${1:-_build}
KEEL=$(cd "$BUILD" && pwd)/keel
[ -x "$KEEL" ] || { echo "evaluator.sh: build keel first ($KEEL)" >&2; exit 2; }
[ -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz ] ||
[ -f /usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte ] ||
    { echo "evaluator.sh: install dataset-fashion-mnist" >&2; exit 2; }
STEPS=${STEPS:-100}
export KEEL STEPS
OPENBLAS_NUM_THREADS=1 /usr/bin/python3 - <<'EOF'
import os, resource, shutil, statistics, subprocess, sys, tempfile, threading, time

KEEL = os.environ["KEEL"]
STEPS = int(os.environ["STEPS"])
work = tempfile.mkdtemp(prefix="keel-evalbench-")
try:
    stage, watch = os.path.join(work, "stage"), os.path.join(work, "watch")
    cfg = os.path.join(work, "job.ini")
    open(cfg, "w").write(
        "[model]\ntype = mlp\nhidden = 256,256\n"
        "[train]\nbatch_size = 64\nmax_steps = %d\nthreads = 1\n"
        "[checkpoint]\nsave_steps = 10\nmax_to_keep = 0\n"
        "[hooks]\nprogress = off\nlog_every_steps = 0\n" % STEPS)
    subprocess.run([KEEL, "train", cfg, "-s", "checkpoint.dir=" + stage],
                   check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    steps = list(range(0, STEPS + 1, 10))

    # --- the evaluator, following commits into an empty directory
    os.mkdir(watch)
    env = dict(os.environ, TF_CONFIG='{"cluster": {"chief": ["127.0.0.1:1"]}, '
               '"task": {"type": "evaluator", "index": 0}}')
    p = subprocess.Popen([KEEL, "train", cfg, "-s", "checkpoint.dir=" + watch],
                         env=env, stderr=subprocess.PIPE, text=True, bufsize=1,
                         stdout=subprocess.DEVNULL)
    seen, cv = {}, threading.Condition()
    def reader():
        for line in p.stderr:
            t = time.monotonic()
            with cv:
                if line.startswith("eval step "):
                    seen[int(line.split()[2].rstrip(":"))] = t
                elif "watching" in line:
                    seen["ready"] = t
                cv.notify_all()
    threading.Thread(target=reader, daemon=True).start()
    def wait_for(key, secs=60):
        with cv:
            if not cv.wait_for(lambda: key in seen, secs):
                sys.exit("evaluator.sh: no '%s' from the evaluator" % key)
    wait_for("ready")
    tick = os.sysconf("SC_CLK_TCK")
    def cpu_ms(pid):                # utime + stime of the evaluator
        f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) * 1000.0 / tick
    lat, lat_cpu, listed = [], [], []
    for s in steps:
        name = "model.ckpt-%d.h5" % s
        shutil.copyfile(os.path.join(stage, name),
                        os.path.join(watch, "." + name + ".tmp.1"))
        os.rename(os.path.join(watch, "." + name + ".tmp.1"),
                  os.path.join(watch, name))
        listed.append(name)
        st = 'model_checkpoint_path: "%s"\n' % name + "".join(
            'all_model_checkpoint_paths: "%s"\n' % n for n in listed)
        open(os.path.join(watch, ".checkpoint.tmp.1"), "w").write(st)
        c0 = cpu_ms(p.pid)
        t0 = time.monotonic()
        os.rename(os.path.join(watch, ".checkpoint.tmp.1"),
                  os.path.join(watch, "checkpoint"))
        wait_for(s)
        lat.append((seen[s] - t0) * 1000)
        if s != steps[-1]:          # the last one exits: no /proc entry
            time.sleep(0.05)
            lat_cpu.append(cpu_ms(p.pid) - c0)
        time.sleep(0.2)
    rc = p.wait(timeout=30)
    if rc != 0:
        sys.exit("evaluator.sh: the evaluator exited %d" % rc)

    # --- keel eval afresh, one process per checkpoint
    fresh, fresh_cpu = [], []
    for s in steps:
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        subprocess.run([KEEL, "eval", cfg, "-s", "checkpoint.dir=" + stage,
                        "--checkpoint",
                        os.path.join(stage, "model.ckpt-%d.h5" % s)],
                       check=True, stdout=subprocess.DEVNULL)
        fresh.append((time.monotonic() - t0) * 1000)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        fresh_cpu.append((r1.ru_utime + r1.ru_stime - r0.ru_utime -
                          r0.ru_stime) * 1000)

    size = os.path.getsize(os.path.join(stage, "model.ckpt-%d.h5" % STEPS))
    print("checkpoints: %d of %.1f MiB (MLP 784-256-256-10), test set 10000"
          % (len(steps), size / 2**20))
    print("load average: %.1f %.1f %.1f on %d CPUs" % (os.getloadavg() +
                                                       (os.cpu_count(),)))
    print("| path | median ms | min | max | CPU ms (median) | n |")
    print("|---|---|---|---|---|---|")
    for label, v, c in (("evaluator: state-file rename -> eval line", lat,
                         lat_cpu),
                        ("keel eval afresh: start -> exit", fresh,
                         fresh_cpu)):
        print("| %s | %.1f | %.1f | %.1f | %.1f | %d |" % (
            label, statistics.median(v), min(v), max(v),
            statistics.median(c), len(v)))
    print("ratio (afresh / evaluator, medians): %.1fx wall, %.1fx CPU"
          % (statistics.median(fresh) / statistics.median(lat),
             statistics.median(fresh_cpu) / statistics.median(lat_cpu)))
finally:
    shutil.rmtree(work, ignore_errors=True)
EOF
