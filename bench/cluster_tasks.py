# bench/cluster_tasks.py - the local ps cluster the bench scripts start:
# free loopback ports, one task per process with its TF_CONFIG, every
# output line read by a thread (stamped, logged, handed to a callback),
# and a wait with one deadline for all. Imported by bench/shard_save.sh,
# bench/ps_recovery.sh and bench/sparse_rows.sh (python3 - with
# sys.path holding bench/).
import json, os, socket, subprocess, threading, time


def ports(n):
    """n free loopback addresses "127.0.0.1:PORT"."""
    out = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        out.append(f"127.0.0.1:{s.getsockname()[1]}")
        s.close()
    return out


class Task:
    """One task: argv run with TF_CONFIG for (kind, index) of cluster;
    on_line(task, line, monotonic_time) is called for every line of its
    stdout and stderr (merged); the last 5 lines stay in tail; log, when
    given, is a path every line is copied to."""

    def __init__(self, argv, cluster, kind, index, on_line=None, log=None,
                 extra=None, env=None):
        self.key = f"{kind}{index}"
        self.tail = []
        self.rss_mib = None
        conf = {"cluster": cluster, "task": {"type": kind, "index": index}}
        conf.update(extra or {})
        e = dict(os.environ if env is None else env,
                 TF_CONFIG=json.dumps(conf))
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, env=e, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self._log = open(log, "a") if log else None
        self._on_line = on_line
        self._th = threading.Thread(target=self._read)
        self._th.start()

    def _read(self):
        for ln in self.proc.stdout:
            now = time.monotonic()
            if self._log:
                self._log.write(ln)
            self.tail = (self.tail + [ln])[-5:]
            if ln.startswith("maxrss_kb "):       # /usr/bin/time -f
                self.rss_mib = int(ln.split()[1]) / 1024
            if self._on_line:
                self._on_line(self, ln, now)
        if self._log:
            self._log.close()

    def join(self):
        self._th.join()


def wait_all(tasks, deadline):
    """Waits for every task until deadline (monotonic); past it, kills
    whatever still runs. Returns (exit codes, timed_out)."""
    rcs, timed_out = [], False
    for t in tasks:
        try:
            rcs.append(t.proc.wait(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            timed_out = True
            for u in tasks:
                if u.proc.poll() is None:
                    u.proc.kill()
            rcs.append(t.proc.wait())
    for t in tasks:
        t.join()
    return rcs, timed_out
