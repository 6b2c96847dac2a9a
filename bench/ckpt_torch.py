#!/usr/bin/python3
"""ckpt_torch.py - one round of the torch.save / torch.load baseline for
bench/ckpt.sh, on the same bytes as bench/ckpt_bench: a state dict of 8
float32 tensors totalling SIZE MiB. Save = the shared baseline's w_torch
(/work/shared/bench/py_io_bench.py: open, torch.save, flush, fsync, close);
cold load = posix_fadvise(DONTNEED) after fdatasync (what ckpt_bench does
for keel and raw; no system-wide drop_caches), then torch.load.
Prints one JSON line per op (GB/s = 1e9 bytes/s).
usage: /usr/bin/python3 ckpt_torch.py --size MIB --dir D"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.environ.get("KEEL_SHARED_BENCH", "/work/shared/bench"))
import torch  # noqa: E402
from py_io_bench import w_torch  # noqa: E402

N_VARS = 8


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    os.makedirs(a.dir, exist_ok=True)
    per = (a.size << 20) // 4 // N_VARS
    sd = {f"layer{i}/kernel": torch.arange(per, dtype=torch.float32) + i
          for i in range(N_VARS)}
    gb = N_VARS * per * 4 / 1e9
    p = os.path.join(a.dir, f"torch-{a.size}.pt")
    if os.path.exists(p):
        os.unlink(p)
    t0 = time.perf_counter()
    w_torch(p, None, sd)
    tw = time.perf_counter() - t0
    fd = os.open(p, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    t0 = time.perf_counter()
    back = torch.load(p)
    tr = time.perf_counter() - t0
    if not all(torch.equal(back[k], sd[k]) for k in sd):
        raise SystemExit("torch readback mismatch")
    os.unlink(p)
    for op, v in (("torch_save", gb / tw), ("torch_load_cold", gb / tr)):
        print(json.dumps({"bench": "ckpt", "op": op, "size_mib": a.size,
                          "median": v, "reps": 1, "unit": "GB/s"}),
              flush=True)


if __name__ == "__main__":
    main()
