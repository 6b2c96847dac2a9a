#!/usr/bin/env python3
"""ckpt_vds.py - a sharded checkpoint over partitioned variables, read by
h5py alone: `keel launch` (2 ps, the chief, 1 worker) trains an MLP whose
kernels are split by rows over the ps (cluster.partition_bytes) with
sharded checkpoints; the index presents each kernel (and each slot of it)
as one virtual dataset of the whole shape, which h5py reads whole from
another working directory, equal to its parts in the shards; keel reads
it (ckpt verify, eval, export) and refuses the index when a virtual
source leaves the index's shards or leaves rows out (tests/ckpt_mutate.py
virtual-shard-outside, virtual-shard-gap)."""
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from py_common import KEEL, Tally, have_fmnist, write_fmnist_slice

SRC = os.environ.get("KEEL_SRCDIR", ".")
MUTATE = os.path.join(SRC, "tests", "ckpt_mutate.py")
check = Tally("ckpt_vds")


def run(args, env=None, timeout=120):
    return subprocess.run([str(a) for a in args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def train(work, data):
    ini = os.path.join(work, "job.ini")
    with open(ini, "w") as f:
        f.write("[model]\ntype = mlp\nhidden = 64\n[data]\ndir = %s\n"
                "[optimizer]\nname = adam\n"
                "[train]\nbatch_size = 32\nmax_steps = 4\nthreads = 1\n"
                "[checkpoint]\nsave_steps = 2\nsharded = on\n"
                "[hooks]\nprogress = off\n"
                "[cluster]\nmax_wait_secs = 30\npartition_bytes = 4096\n"
                % data)
    env = dict(os.environ, OUTPUT_DIR=os.path.join(work, "out"))
    return run([KEEL, "launch", ini, "--ps", "2", "--workers", "1",
                "--no-status"], env=env, timeout=180)


def parts_of(ck, index, name):
    """The rows of name's parts, read from the shards, in part order."""
    stem = os.path.basename(index)[:-3]
    got = {}
    for n in sorted(os.listdir(ck)):
        if not n.startswith(stem + ".shard-"):
            continue
        with h5py.File(os.path.join(ck, n), "r") as s:
            g = s.get(name)
            for k in (g.keys() if isinstance(g, h5py.Group) else ()):
                got[int(k[len("part_"):])] = g[k][()]
    return [got[k] for k in sorted(got)]


def main():
    if not have_fmnist():
        print("SKIP: no Fashion-MNIST")
        return 77
    work = tempfile.mkdtemp(prefix="keel-vds-")
    cwd = os.getcwd()
    try:
        data = os.path.join(work, "data")
        os.mkdir(data)
        write_fmnist_slice(data, 256, 64)
        r = train(work, data)
        if r.returncode != 0:
            print("keel launch failed (%d): %s%s" % (r.returncode,
                  r.stdout[-2000:], r.stderr[-2000:]), file=sys.stderr)
            return 1
        ck = os.path.join(work, "out")
        index = os.path.join(ck, "model.ckpt-4.h5")
        check(os.path.exists(index), "no index %s" % index)
        # h5py alone, from another directory: each kernel whole
        os.chdir("/")
        virt = []
        with h5py.File(index, "r") as f:
            f.visititems(lambda n, o: virt.append(n)
                         if isinstance(o, h5py.Dataset) and o.is_virtual
                         else None)
            check(any(n.startswith("variables/") for n in virt) and
                  any(n.startswith("slots/") for n in virt),
                  "no virtual variable and slot in the index: %s" % virt)
            check(all("part_" not in n for n in virt), "a part: %s" % virt)
            for n in virt:
                whole = f[n][()]
                parts = parts_of(ck, index, n)
                check(len(parts) >= 2 and whole.shape[0] ==
                      sum(p.shape[0] for p in parts),
                      "%s: %d parts, shape %s" % (n, len(parts),
                                                  whole.shape))
                check(len(parts) >= 2 and
                      np.array_equal(whole, np.concatenate(parts)),
                      "%s: not its parts' rows" % n)
                check(np.any(whole != 0), "%s reads as zeros" % n)
        check(any(n.endswith("kernel") for n in virt),
              "no kernel is virtual: %s" % virt)
        os.chdir(cwd)
        r = run([KEEL, "ckpt", "verify", index])
        check(r.returncode == 0, "ckpt verify: %s" % r.stderr)
        r = run([KEEL, "ckpt", "show", index])
        check(r.returncode == 0 and "part_" not in r.stdout,
              "ckpt show: %s%s" % (r.stdout, r.stderr))
        r = run([KEEL, "eval", index, "--json"])
        check(r.returncode == 0, "eval: %s" % r.stderr)
        r = run([KEEL, "export", index, "--format", "safetensors", "-o",
                 os.path.join(work, "out.safetensors")])
        check(r.returncode == 0, "export: %s" % r.stderr)
        # a virtual source outside the index's shards, or a gap: refused
        for m in ("virtual-shard-outside", "virtual-shard-gap"):
            dst = os.path.join(work, m)
            r = run([sys.executable, MUTATE, ck, dst, m])
            check(r.returncode == 0, "mutate %s: %s" % (m, r.stderr))
            bad = os.path.join(dst, "model.ckpt-4.h5")
            v = run([KEEL, "ckpt", "verify", bad])
            check(v.returncode == 1 and "refused" in v.stderr and
                  "model.ckpt-4.h5" in v.stderr,
                  "%s: ckpt verify exits %d: %s" % (m, v.returncode,
                                                    v.stderr.strip()))
            e = run([KEEL, "eval", bad, "--json"])
            check(e.returncode != 0 and "keel:" in e.stderr,
                  "%s: eval exits %d: %s" % (m, e.returncode, e.stderr))
    finally:
        os.chdir(cwd)
        shutil.rmtree(work, ignore_errors=True)
    return check.report()


if __name__ == "__main__":
    sys.exit(main())
