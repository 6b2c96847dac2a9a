#!/usr/bin/env python3
"""ckpt_adversarial.py - every checkpoint reader against damaged and hostile
checkpoints (tests/ckpt_mutate.py): `keel ckpt verify` (file and
directory), `keel ckpt ls`, `keel ckpt show`, `keel eval`, `keel export`,
`keel predict` and `keel train` resuming from the directory. Each must end
with exit 0 (a correct result) or exit 1/2 with a `keel:` line on stderr:
never a signal, never a hang, and never a lost checkpoint (every file that
verified before a run and that the state file lists still exists after it).
Readers run under an address-space limit (RLIMIT_AS), so a reader that
believes a file's size claims fails here; not under the sanitizers, whose
shadow memory needs more (ASAN_OPTIONS set, as make check sets it in a
--enable-sanitizers build, skips the limit).

    ckpt_adversarial.py [--long]

--long (make check-long) runs every mutation with several seeds; the
default (make check) one mutation of each kind (QUICK), one seed. Run with KEEL_BUILDDIR and
KEEL_SRCDIR set."""
import os
import resource
import shutil
import subprocess
import sys
import tempfile

from py_common import KEEL, Tally, write_fmnist_slice

SRC = os.environ.get("KEEL_SRCDIR", ".")
MUTATE = os.path.join(SRC, "tests", "ckpt_mutate.py")
AS_LIMIT = 1 << 30
check = Tally("ckpt_adversarial")


def limit():
    if "ASAN_OPTIONS" not in os.environ:
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def run(args, timeout=120):
    try:
        return subprocess.run([KEEL] + [str(a) for a in args],
                              capture_output=True, text=True,
                              timeout=timeout, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        return None


def config(d, ckdir, steps):
    ini = os.path.join(d, "job.ini")
    with open(ini, "w") as f:
        f.write("[model]\ntype = mlp\nhidden = 8\n[data]\ndir = %s\n"
                "[train]\nbatch_size = 32\nmax_steps = %d\n"
                "[checkpoint]\ndir = %s\nsave_secs = 0\nsave_steps = 2\n"
                "[hooks]\nlog_every_steps = 0\n" % (d, steps, ckdir))
    return ini


def valid_files(ck):
    """The .h5 files of ck that verify now."""
    out = set()
    for n in os.listdir(ck):
        p = os.path.join(ck, n)
        if n.endswith(".h5") and os.path.isfile(p):
            r = run(["ckpt", "verify", p])
            if r is not None and r.returncode == 0:
                out.add(n)
    return out


def listed(ck):
    try:
        with open(os.path.join(ck, "checkpoint")) as f:
            text = f.read()
    except FileNotFoundError:
        return []
    import re
    return re.findall(r'all_model_checkpoint_paths: "([^"]*)"', text)


def judge(what, r):
    if r is None:
        check(False, "%s: timed out" % what)
        return
    check(r.returncode in (0, 1, 2),
          "%s: exit %d (a signal or crash?) stderr: %s"
          % (what, r.returncode, r.stderr[-400:]))
    if r.returncode != 0:
        check("keel:" in r.stderr,
              "%s: exit %d without a keel: line: %r"
              % (what, r.returncode, r.stderr[-400:]))
    for bad in ("AddressSanitizer", "runtime error", "Segmentation",
                "HDF5-DIAG"):
        check(bad not in r.stderr, "%s: %s in stderr" % (what, bad))


def newest(ck):
    import re
    try:
        with open(os.path.join(ck, "checkpoint")) as f:
            m = re.search(r'model_checkpoint_path: "([^"]*)"', f.read())
    except FileNotFoundError:
        m = None
    return os.path.join(ck, m.group(1)) if m else None


# make check's mutations: one of each kind (--long runs every one)
QUICK = ("truncate-half", "bitflip-16", "zero-metadata", "swap",
         "huge-compressed", "huge-blob", "external-storage", "external-link",
         "dangling-link", "virtual-foreign", "virtual-own", "wrong-type",
         "no-meta", "state-duplicates", "state-foreign",
         "state-missing-newest", "state-dangling-symlink")
QUICK_TRAIN = ("state-", "huge-compressed", "external-link", "swap",
               "truncate-half", "virtual-foreign")


def attack(base, work, data, mutation, seed, long):
    ck = os.path.join(work, "%s-%d" % (mutation, seed))
    r = subprocess.run([sys.executable, MUTATE, base, ck, mutation,
                        str(seed)], capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        check(False, "mutate %s: %s" % (mutation, r.stderr[-400:]))
        return
    f = newest(ck)
    tag = "%s (seed %d)" % (mutation, seed)
    vd = run(["ckpt", "verify", ck])
    ls = run(["ckpt", "ls", ck])
    judge(tag + ": ckpt verify DIR", vd)
    judge(tag + ": ckpt ls", ls)
    if mutation.startswith("state-missing") or \
            mutation.startswith("state-dangling"):
        check(vd is not None and vd.returncode == 1,
              tag + ": ckpt verify DIR exits 1")
        check(ls is not None and ls.returncode == 1,
              tag + ": ckpt ls exits 1")
    if f is not None and os.path.lexists(f):
        v = run(["ckpt", "verify", f])
        judge(tag + ": ckpt verify FILE", v)
        if mutation.split("-")[0] in ("external", "virtual", "huge",
                                      "dangling") and mutation != \
                "virtual-own":
            check(v.returncode == 1 and os.path.basename(f) in v.stderr,
                  tag + ": ckpt verify refuses it naming the file (%s)"
                  % v.stderr.strip())
        judge(tag + ": ckpt show", run(["ckpt", "show", f]))
        judge(tag + ": eval FILE", run(["eval", f, "--json"]))
        judge(tag + ": export FILE",
              run(["export", f, "--format", "safetensors", "-o",
                   os.path.join(work, "out.safetensors")]))
        judge(tag + ": predict FILE",
              run(["predict", f, os.path.join(data,
                                               "t10k-images-idx3-ubyte.gz")]))
    judge(tag + ": eval DIR", run(["eval", ck, "--json"]))
    judge(tag + ": export DIR",
          run(["export", ck, "--format", "safetensors", "-o",
               os.path.join(work, "out.safetensors")]))
    # keel train resuming from the directory loses no checkpoint (the
    # quick run resumes from the mutations that reach restore or retention)
    if not long and not mutation.startswith(QUICK_TRAIN):
        return
    before = valid_files(ck)
    r = run(["train", config(work, ck, 6)], timeout=300)
    judge(tag + ": train resuming", r)
    after = set(os.listdir(ck))
    names = [os.path.basename(n) for n in listed(ck)]
    lost = [n for n in before if n not in after and n in names]
    check(not lost, tag + ": train lost %s the state file lists" % lost)
    missing = [n for n in names if n.endswith(".h5") and "/" not in n and
               n in before and n not in after]
    check(not missing, tag + ": state file lists deleted %s" % missing)


def main():
    long = "--long" in sys.argv[1:]
    work = tempfile.mkdtemp(prefix="keel-adv-")
    try:
        data = os.path.join(work, "data")
        os.mkdir(data)
        write_fmnist_slice(data, 256, 64)
        base = os.path.join(work, "base")
        r = run(["train", config(data, base, 4)], timeout=300)
        if r is None or r.returncode != 0:
            print("cannot train the base checkpoint: %s"
                  % (r.stderr if r else "timeout"), file=sys.stderr)
            return 1
        muts = subprocess.run([sys.executable, MUTATE, "--list"],
                              capture_output=True, text=True,
                              check=True).stdout.split()
        seeds = range(1, 9) if long else (1,)
        for m in muts if long else [m for m in muts if m in QUICK]:
            for s in seeds if m.startswith(("bitflip", "truncate")) \
                    else (1,):
                attack(base, work, data, m, s, long)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return check.report()


if __name__ == "__main__":
    sys.exit(main())
