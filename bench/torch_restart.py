#!/usr/bin/python3
"""torch_restart.py - how long torchrun (torch.distributed.elastic) takes to
bring a 2-rank DDP job back after one rank is SIGKILLed: the peer of
bench/restart.sh's keel launch figures.

Runs  torchrun --standalone --nnodes=1 --nproc_per_node=2 --max_restarts=K
      --monitor_interval=S torch_restart.py --worker
Each worker (DDP MLP on Fashion-MNIST, batch 32 per rank, ~100 steps/s)
appends "<time> <generation> <rank> <pid> <phase> [step]" lines to a log;
phases: start (before torch loads), imported, pg_ready, data_ready, step.
The driver waits until both ranks of generation g stepped 20 times, kills
rank 1 and reports seconds from the kill to the new generation's first
process start and first step (any rank, all ranks). K = --kills (3).
torchrun 1.13 on Python 3.11 needs --redirects=1 --tee=1 (the default 0
crashes at start).
  /usr/bin/python3 bench/torch_restart.py --monitor-intervals 0.5
Needs python3-torch (Debian); exits 3 with a hint when it is missing."""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402


def worker():
    t_start = time.time()
    log_path = os.environ["KEEL_RESTART_LOG"]
    gen = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    rank = int(os.environ.get("RANK", "0"))
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(phase, t=None):
        os.write(fd, ("%.6f %s %d %d %s\n" % (t or time.time(), gen, rank, os.getpid(),
                                                phase)).encode())
    log("start", t_start)
    import torch
    import torch.distributed as dist
    log("imported")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    log("pg_ready")
    x, y, _, _ = tc.fashion_mnist()
    torch.manual_seed(0)
    model, _ = tc.model_and_optimizer("mlp")
    model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    world = dist.get_world_size()
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    data = tc.Batches(x, y, perm[rank::world].contiguous(), 32)
    log("data_ready")
    step = 0
    while True:
        tc.train(model, opt, data, 1)
        step += 1
        log("step %d" % step)
        if step % 10 == 0:
            stop = torch.tensor([int(os.path.exists(log_path + ".stop"))])
            dist.all_reduce(stop)
            if int(stop):
                break
        time.sleep(0.01)
    dist.destroy_process_group()


def read_log(path):
    events = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                p = line.split()
                if len(p) >= 5:
                    events.append((float(p[0]), int(p[1]), int(p[2]), int(p[3]), p[4],
                                   int(p[5]) if len(p) > 5 else 0))
    return events


def wait_steps(path, gen, steps, timeout):
    """Events once both ranks of generation gen reached step `steps`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ev = read_log(path)
        if all(any(e[1] == gen and e[2] == r and e[4] == "step" and e[5] >= steps for e in ev)
               for r in (0, 1)):
            return ev
        time.sleep(0.02)
    raise SystemExit("torch_restart: generation %d did not reach step %d in %d s; see %s"
                     % (gen, steps, timeout, path))


def one_run(interval, kills):
    d = tempfile.mkdtemp(prefix="keel_torchrun_")
    log = os.path.join(d, "events.log")
    cmd = ["torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=2",
           "--max_restarts=%d" % kills, "--monitor_interval=%g" % interval,
           "--redirects=1", "--tee=1", os.path.abspath(__file__), "--worker"]
    env = dict(os.environ, KEEL_RESTART_LOG=log, OPENBLAS_NUM_THREADS="1")
    with open(os.path.join(d, "torchrun.out"), "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    samples = []
    try:
        for g in range(kills):
            ev = wait_steps(log, g, 20, 120)
            victim = next(e[3] for e in ev if e[1] == g and e[2] == 1)
            t_kill = time.time()
            os.kill(victim, signal.SIGKILL)
            ev = [e for e in wait_steps(log, g + 1, 1, 180) if e[1] == g + 1]

            def since_kill(phase, agg):
                return agg(min(e[0] for e in ev if e[2] == r and e[4] == phase)
                           for r in (0, 1)) - t_kill
            s = {"kill_to_new_proc_s": since_kill("start", min),
                 "kill_to_first_step_any_rank_s": since_kill("step", min),
                 "kill_to_first_step_all_ranks_s": since_kill("step", max)}
            tc.emit(bench="torchrun_restart_sample", monitor_interval=interval, kill=g + 1, **s)
            samples.append(s)
        wait_steps(log, kills, 20, 120)
        open(log + ".stop", "w").close()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return samples


def main():
    if "--worker" in sys.argv[1:]:
        worker()
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--monitor-intervals", default="5,0.5")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--kills", type=int, default=3)
    a = p.parse_args()
    tc.require_torch()
    tc.emit(bench="torchrun_env", **tc.versions())
    for interval in (float(v) for v in a.monitor_intervals.split(",")):
        samples = []
        for _ in range(a.runs):
            samples += one_run(interval, a.kills)
        for key in samples[0]:
            tc.emit(bench="torchrun_restart", monitor_interval=interval, metric=key, unit="s",
                    **tc.summary(s[key] for s in samples))


if __name__ == "__main__":
    main()
