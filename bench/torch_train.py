#!/usr/bin/python3
"""torch_train.py - PyTorch twin of bench/train_bench on Fashion-MNIST.

--mode throughput: per model and batch, warm up, size a segment to about
    --seg-seconds, then per repetition train one segment at every torch
    thread count of --thread-list (same step count each): examples/s.
--mode accuracy: fixed seed, fresh model, --epochs full epochs (a new
    permutation each, last partial batch dropped) at --threads; wall time
    of each epoch's training loop and test accuracy after it.
Data: in-memory tensors, batches gathered by index, no DataLoader workers.
bench/train.sh runs it beside keel; alone:
  /usr/bin/python3 bench/torch_train.py --mode throughput --models mlp --batches 64
Needs python3-torch (Debian); exits 3 with a hint when it is missing."""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402

tc.require_torch()
import torch  # noqa: E402


def ints(text):
    return [int(v) for v in text.split(",")]


def throughput(a, x, y):
    for kind in a.models:
        for batch in a.batches:
            torch.manual_seed(a.seed)
            model, opt = tc.model_and_optimizer(kind)
            perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(a.seed))
            data = tc.Batches(x, y, perm, batch)
            torch.set_num_threads(max(a.thread_list))
            tc.train(model, opt, data, 5)
            t0 = time.perf_counter()
            tc.train(model, opt, data, 10)
            steps = max(10, int(a.seg_seconds / ((time.perf_counter() - t0) / 10)))
            rate = {t: [] for t in a.thread_list}
            for _ in range(a.reps):
                for t in a.thread_list:
                    torch.set_num_threads(t)
                    tc.train(model, opt, data, 2)  # let the new pool settle
                    t0 = time.perf_counter()
                    tc.train(model, opt, data, steps)
                    rate[t].append(steps * batch / (time.perf_counter() - t0))
            for t in a.thread_list:
                tc.emit(bench="torch_train_tput", model=kind, batch=batch, threads=t,
                        steps_per_rep=steps, unit="examples/s", env=tc.thread_env(),
                        **tc.summary(rate[t]))


def accuracy(a, x, y, xte, yte):
    torch.set_num_threads(a.threads)
    for kind in a.models:
        for batch in a.batches:
            torch.manual_seed(a.seed)
            model, opt = tc.model_and_optimizer(kind)
            gen = torch.Generator().manual_seed(a.seed)
            steps = x.shape[0] // batch
            for epoch in range(1, a.epochs + 1):
                data = tc.Batches(x, y, torch.randperm(x.shape[0], generator=gen), batch)
                t0 = time.perf_counter()
                loss = tc.train(model, opt, data, steps)
                secs = time.perf_counter() - t0
                model.eval()
                with torch.no_grad():
                    right = sum(int((model(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum())
                                for i in range(0, xte.shape[0], 1000))
                model.train()
                tc.emit(bench="torch_train_epoch", model=kind, batch=batch, threads=a.threads,
                        seed=a.seed, epoch=epoch, epoch_s=secs,
                        examples_per_s=steps * batch / secs, last_batch_loss=loss,
                        test_acc=right / xte.shape[0], env=tc.thread_env())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=("throughput", "accuracy"), required=True)
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--batches", default="64,256")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seg-seconds", type=float, default=2.0)
    p.add_argument("--thread-list", default="1,2")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    a.models, a.batches = a.models.split(","), ints(a.batches)
    a.thread_list = ints(a.thread_list)
    x, y, xte, yte = tc.fashion_mnist()
    tc.emit(bench="torch_env", **tc.versions(), default_threads=torch.get_num_threads(),
            env=tc.thread_env())
    if a.mode == "throughput":
        throughput(a, x, y)
    else:
        accuracy(a, x, y, xte, yte)


if __name__ == "__main__":
    main()
