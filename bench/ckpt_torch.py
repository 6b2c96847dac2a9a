#!/usr/bin/python3
"""ckpt_torch.py - one round of the torch.save / torch.load baseline for
bench/ckpt.sh, on the same bytes as bench/ckpt_bench: a state dict of 8
float32 tensors totalling SIZE MiB. Save = the same crash-safe commit as
keel's: torch.save into a temporary file beside the target, flush, fsync,
close, rename over the target, fsync of the directory (keel's save adds
its own state file update, fsynced and renamed the same way); cold load = fdatasync and
posix_fadvise(DONTNEED) on the file (what ckpt_bench does for keel and raw),
then torch.load. One JSON line per op (GB/s = 1e9 bytes/s).
  /usr/bin/python3 bench/ckpt_torch.py --size MIB --dir D
Needs python3-torch (Debian); exits 3 with a hint when it is missing."""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402

tc.require_torch()
import torch  # noqa: E402

N_VARS = 8


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.dir, exist_ok=True)
    per = (a.size << 20) // 4 // N_VARS
    state = {"layer%d/kernel" % i: torch.arange(per, dtype=torch.float32) + i
             for i in range(N_VARS)}
    gb = N_VARS * per * 4 / 1e9
    path = os.path.join(a.dir, "torch-%d.pt" % a.size)
    tmp = os.path.join(a.dir, ".torch-%d.pt.tmp" % a.size)
    t0 = time.perf_counter()
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    dfd = os.open(a.dir, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    t_save = time.perf_counter() - t0
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    t0 = time.perf_counter()
    back = torch.load(path)
    t_load = time.perf_counter() - t0
    if not all(torch.equal(back[k], v) for k, v in state.items()):
        raise SystemExit("ckpt_torch: torch.load returned other values than were saved")
    os.unlink(path)
    for op, v in (("torch_save", gb / t_save), ("torch_load_cold", gb / t_load)):
        tc.emit(bench="ckpt", op=op, size_mib=a.size, median=v, reps=1, unit="GB/s")


if __name__ == "__main__":
    main()
