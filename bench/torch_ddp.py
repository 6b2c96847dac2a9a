#!/usr/bin/python3
"""torch_ddp.py - PyTorch DistributedDataParallel (gloo, 2 local ranks) on
the MLP 784-256-256-10 with momentum SGD, the peer of keel's 1 ps + 2
workers, plus gloo all_reduce bandwidth.

Per global batch G each rank trains on its half of one permutation with
batch G/2 and 1 torch thread; a repetition is --examples examples between
two barriers: examples/s (global). all_reduce: SUM of float32 tensors of
--ar-sizes-mib MiB, algbw = bytes / seconds per op (= busbw for 2 ranks).
--blas-threads N sets OPENBLAS_NUM_THREADS before torch loads ('default'
leaves it alone). bench/cluster_train.sh and bench/cluster_bench.sh run it.
  /usr/bin/python3 bench/torch_ddp.py --reps 3 --batches 64,256
Needs python3-torch (Debian); exits 3 with a hint when it is missing."""
import argparse
import os
import sys
import time

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--reps", type=int, default=7)
p.add_argument("--batches", default="64,256", help="global batch sizes")
p.add_argument("--examples", type=int, default=38400, help="examples per repetition")
p.add_argument("--blas-threads", default="1")
p.add_argument("--port", type=int, default=0, help="rendezvous port (0: a free one)")
p.add_argument("--ar-sizes-mib", default="1,16,64")
p.add_argument("--model", default="mlp", choices=["mlp", "cnn"],
               help="mlp: momentum SGD 0.01/0.9; cnn: Adam 1e-3 (keel's twins)")
ARGS = p.parse_args()
if ARGS.blas_threads != "default":
    os.environ["OPENBLAS_NUM_THREADS"] = ARGS.blas_threads

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402

tc.require_torch()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WORLD = 2


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(reps, body):
    """Seconds of body() per repetition, each between two barriers."""
    out = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        body()
        dist.barrier()
        out.append(time.perf_counter() - t0)
    return out


def rank_main(rank, a, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    x, y, _, _ = tc.fashion_mnist()
    out = {}
    for G in a.batches:
        torch.manual_seed(0)
        model, _ = tc.model_and_optimizer(a.model)
        model = torch.nn.parallel.DistributedDataParallel(model)
        if a.model == "mlp":
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        else:
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
        data = tc.Batches(x, y, perm[rank::WORLD].contiguous(), G // WORLD)
        steps = a.examples // G
        tc.train(model, opt, data, 20)
        secs = timed(a.reps, lambda: tc.train(model, opt, data, steps))
        out[("ddp", G)] = [steps * G / s for s in secs]
    for mib in a.ar_sizes:
        t = torch.ones((mib << 20) // 4, dtype=torch.float32)
        ops = max(3, 64 // mib)
        for _ in range(3):
            dist.all_reduce(t)

        def burst():
            for _ in range(ops):
                dist.all_reduce(t)
        out[("allreduce", mib)] = [(mib << 20) / (s / ops) / 1e9 for s in timed(a.reps, burst)]
    if rank == 0:
        results.put(out)
    dist.barrier()
    dist.destroy_process_group()


def main():
    a = ARGS
    a.batches = [int(b) for b in a.batches.split(",")]
    a.ar_sizes = [int(s) for s in a.ar_sizes_mib.split(",") if s]
    tc.emit(bench="torch_ddp_env", **tc.versions(), backend="gloo", world=WORLD,
            env=tc.thread_env())
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, args=(a, a.port or free_port(), results), nprocs=WORLD, join=True)
    out = results.get()
    for G in a.batches:
        tc.emit(bench="torch_ddp_tput", model=a.model, global_batch=G, per_rank_batch=G // WORLD,
                world=WORLD, threads_per_rank=1, unit="examples/s (global)",
                **tc.summary(out[("ddp", G)]))
    for mib in a.ar_sizes:
        tc.emit(bench="gloo_allreduce", mib=mib, world=WORLD, unit="GB/s algbw",
                **tc.summary(out[("allreduce", mib)]))


if __name__ == "__main__":
    main()
