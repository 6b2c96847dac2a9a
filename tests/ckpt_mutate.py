#!/usr/bin/env python3
"""ckpt_mutate.py - damaged and hostile variants of a keel checkpoint
directory, for tests/ckpt_adversarial.py.

    ckpt_mutate.py SRC_DIR DST_DIR MUTATION [SEED]

copies the checkpoint directory SRC_DIR (a `checkpoint` state file and
<base>-<step>.h5 files, as keel train leaves it) to DST_DIR and applies
MUTATION to the newest checkpoint (the state file's model_checkpoint_path)
or to the state file. `ckpt_mutate.py --list` prints the mutations, one a
line. Every mutation is deterministic for a given SEED (default 1).
h5py and numpy only."""
import os
import random
import re
import shutil
import sys

import h5py
import numpy as np


def newest(d):
    with open(os.path.join(d, "checkpoint")) as f:
        m = re.search(r'model_checkpoint_path: "([^"]*)"', f.read())
    return os.path.join(d, m.group(1))


def datasets(path):
    out = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.append(n)
                     if isinstance(o, h5py.Dataset) else None)
    return out


def variables(path):
    return [n for n in datasets(path) if n.startswith("variables/")]


def replace(f, name, make):
    """Replace dataset name of the open file f by make(f, name, old
    checksum), keeping the xxh64 attribute."""
    h = f[name].attrs.get("xxh64", np.uint64(0))
    del f[name]
    make(f, name)
    if isinstance(f.get(name, getlink=True), h5py.HardLink):
        f[name].attrs["xxh64"] = np.uint64(h)


# ---- byte-level damage -----------------------------------------------------

def truncate(p, rng, frac):
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.truncate(int(size * frac))


def bitflips(p, rng, n):
    data = bytearray(open(p, "rb").read())
    for _ in range(n):
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
    open(p, "wb").write(bytes(data))


def zero_block(p, rng, off):
    with open(p, "r+b") as f:
        f.seek(off)
        f.write(b"\0" * 512)


# ---- structural damage (h5py) ----------------------------------------------

def swap(p, rng):
    """Two variables trade names (and so shapes)."""
    v = variables(p)
    a, b = v[0], v[-1]
    with h5py.File(p, "r+") as f:
        f.move(a, a + ".tmp")
        f.move(b, a)
        f.move(a + ".tmp", b)


def huge(p, rng, compressed, shape):
    """A variable declaring a huge chunked dataset the file cannot hold."""
    name = variables(p)[0]
    with h5py.File(p, "r+") as f:
        def make(f, n):
            kw = {"compression": "gzip"} if compressed else {}
            d = f.create_dataset(n, shape=shape, dtype="<f4",
                                 chunks=(1,) * (len(shape) - 1) + (1024,),
                                 **kw)
            d[(0,) * len(shape)] = 1.0
        replace(f, name, make)


def huge_blob(p, rng):
    with h5py.File(p, "r+") as f:
        g = f.require_group("meta/blobs")
        if "data_iterator" in g:
            del g["data_iterator"]
        d = g.create_dataset("data_iterator", shape=(1 << 32,), dtype="u1",
                             chunks=(1 << 16,), compression="gzip")
        d.attrs["xxh64"] = np.uint64(0)


def external_storage(p, rng):
    """A variable whose bytes live in another file (the state file)."""
    name = variables(p)[0]
    other = os.path.join(os.path.dirname(p), "checkpoint")
    with h5py.File(p, "r+") as f:
        shape = f[name].shape
        replace(f, name, lambda f, n: f.create_dataset(
            n, shape=shape, dtype="<f4",
            external=[(other, 0, h5py.h5f.UNLIMITED)]))


def external_link(p, rng):
    """A variable that is an external link into another HDF5 file."""
    name = variables(p)[0]
    d = os.path.dirname(p)
    other = os.path.join(d, "other.h5")
    with h5py.File(p, "r") as f:
        data = f[name][()]
    with h5py.File(other, "w") as o:
        o["x"] = data
    with h5py.File(p, "r+") as f:
        replace(f, name, lambda f, n: f.__setitem__(
            n, h5py.ExternalLink("other.h5", "/x")))


def dangling_link(p, rng):
    name = variables(p)[0]
    with h5py.File(p, "r+") as f:
        replace(f, name, lambda f, n: f.__setitem__(
            n, h5py.SoftLink("/nowhere/at/all")))


def virtual(p, rng, own):
    """A variable that is a virtual dataset mapping another file (or, own,
    a second copy of itself in the same file)."""
    name = variables(p)[0]
    d = os.path.dirname(p)
    with h5py.File(p, "r") as f:
        data = f[name][()]
    src = "." if own else os.path.join(d, "other.h5")
    if not own:
        with h5py.File(src, "w") as o:
            o["x"] = data
    with h5py.File(p, "r+") as f:
        if own:
            f["copy_of_x"] = data
        layout = h5py.VirtualLayout(shape=data.shape, dtype="<f4")
        layout[...] = h5py.VirtualSource(src, "copy_of_x" if own else "x",
                                         shape=data.shape)
        replace(f, name, lambda f, n: f.create_virtual_dataset(n, layout))


def virtual_datasets(path):
    out = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.append(n)
                     if isinstance(o, h5py.Dataset) and o.is_virtual
                     else None)
    return out


def virtual_shard(p, rng, how):
    """A partitioned variable of a sharded index (a virtual dataset over
    its parts in the shards) remapped: "outside", part 0 from a copy of
    its shard under another name; "gap", the last part left out. A
    checkpoint without one gets a virtual dataset of another file."""
    names = virtual_datasets(p)
    if not names:
        virtual(p, rng, False)
        return
    name = names[0]
    d = os.path.dirname(p)
    with h5py.File(p, "r") as f:
        ds = f[name]
        shape, maps = ds.shape, ds.virtual_sources()
        h = ds.attrs["xxh64"]
    if how == "outside":
        shutil.copyfile(os.path.join(d, maps[0].file_name),
                        os.path.join(d, "other.h5"))
    layout = h5py.VirtualLayout(shape=shape, dtype="<f4")
    for i, m in enumerate(maps):
        if how == "gap" and i == len(maps) - 1:
            continue
        file = "other.h5" if how == "outside" and i == 0 else m.file_name
        lo, hi = m.vspace.get_select_bounds()
        rows = hi[0] - lo[0] + 1
        layout[lo[0]:hi[0] + 1] = h5py.VirtualSource(
            file, m.dset_name, shape=(rows,) + tuple(shape[1:]))
    with h5py.File(p, "r+") as f:
        del f[name]
        f.create_virtual_dataset(name, layout)
        f[name].attrs["xxh64"] = np.uint64(h)


def wrong_type(p, rng):
    name = variables(p)[0]
    with h5py.File(p, "r+") as f:
        data = f[name][()]
        replace(f, name, lambda f, n: f.create_dataset(
            n, data=data.astype("<f8")))


def no_meta(p, rng):
    with h5py.File(p, "r+") as f:
        del f["meta"]


# ---- state file damage -----------------------------------------------------

def state_lines(d):
    with open(os.path.join(d, "checkpoint")) as f:
        return f.read()


def write_state(d, names):
    with open(os.path.join(d, "checkpoint"), "w") as f:
        f.write('model_checkpoint_path: "%s"\n' % names[-1])
        for n in names:
            f.write('all_model_checkpoint_paths: "%s"\n' % n)


def listed(d):
    return re.findall(r'all_model_checkpoint_paths: "([^"]*)"',
                      state_lines(d))


def state_duplicates(p, rng):
    d = os.path.dirname(p)
    names = listed(d)
    write_state(d, names + [os.path.basename(p)] * 6)


def state_foreign(p, rng):
    d = os.path.dirname(p)
    names = listed(d)
    write_state(d, ["../outside.h5", "/etc/passwd", "model.ckpt-x.h5"] +
                names)


def state_missing_newest(p, rng):
    os.unlink(p)


def state_dangling_symlink(p, rng):
    os.unlink(p)
    os.symlink(os.path.join(os.path.dirname(p), "gone.h5"), p)


MUTATIONS = {
    "truncate-half": lambda p, r: truncate(p, r, 0.5),
    "truncate-head": lambda p, r: truncate(p, r, 0.02),
    "truncate-tail": lambda p, r: truncate(p, r, 0.999),
    "bitflip-1": lambda p, r: bitflips(p, r, 1),
    "bitflip-16": lambda p, r: bitflips(p, r, 16),
    "zero-superblock": lambda p, r: zero_block(p, r, 0),
    "zero-metadata": lambda p, r: zero_block(p, r, 2048),
    "swap": swap,
    "huge-chunked": lambda p, r: huge(p, r, False, (1 << 20, 1 << 12)),
    "huge-compressed": lambda p, r: huge(p, r, True, (1 << 20, 1 << 12)),
    "huge-1d": lambda p, r: huge(p, r, True, (1 << 31,)),
    "huge-blob": huge_blob,
    "external-storage": external_storage,
    "external-link": external_link,
    "dangling-link": dangling_link,
    "virtual-foreign": lambda p, r: virtual(p, r, False),
    "virtual-own": lambda p, r: virtual(p, r, True),
    "virtual-shard-outside": lambda p, r: virtual_shard(p, r, "outside"),
    "virtual-shard-gap": lambda p, r: virtual_shard(p, r, "gap"),
    "wrong-type": wrong_type,
    "no-meta": no_meta,
    "state-duplicates": state_duplicates,
    "state-foreign": state_foreign,
    "state-missing-newest": state_missing_newest,
    "state-dangling-symlink": state_dangling_symlink,
}


def main(argv):
    if len(argv) == 2 and argv[1] == "--list":
        print("\n".join(MUTATIONS))
        return 0
    if len(argv) not in (4, 5) or argv[3] not in MUTATIONS:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst, what = argv[1:4]
    rng = random.Random(int(argv[4]) if len(argv) == 5 else 1)
    if os.path.exists(dst):
        shutil.rmtree(dst)
    shutil.copytree(src, dst, symlinks=True)
    MUTATIONS[what](newest(dst), rng)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
