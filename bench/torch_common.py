"""torch_common.py - what keel's PyTorch twin scripts share: Fashion-MNIST
from its IDX files, the two models bench/train_bench trains (the MLP
784-256-256-10 with momentum SGD, the small CNN with Adam), median/min/max
statistics and one JSON object per output line.

PyTorch comes from Debian: `apt-get install python3-torch` (1.13, CPU), run
with /usr/bin/python3. require_torch() exits 3 with that hint when it is
missing, so the bench/*.sh drivers can skip the PyTorch column."""
import gzip
import json
import os
import statistics
import struct
import sys

import numpy as np

FMNIST_DIR = os.environ.get("FMNIST_DIR", "/usr/share/datasets/fashion-mnist")
NO_TORCH_EXIT = 3
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OMP_WAIT_POLICY",
               "OMP_NUM_THREADS")


def require_torch():
    """Imports torch or exits NO_TORCH_EXIT with the install command."""
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.stderr.write("bench: PyTorch is not installed; the PyTorch column is "
                         "skipped (install: apt-get install python3-torch)\n")
        sys.exit(NO_TORCH_EXIT)


def thread_env():
    """The thread-related environment a figure was measured under."""
    return ",".join("%s=%s" % (k, os.environ.get(k, "-")) for k in THREAD_VARS)


def emit(**fields):
    print(json.dumps(fields), flush=True)


def summary(values):
    v = list(values)
    return {"median": statistics.median(v), "min": min(v), "max": max(v),
            "reps": len(v)}


def _idx(name):
    """One IDX file (gzip): big-endian magic 0x000008NN, NN dimensions."""
    with gzip.open(os.path.join(FMNIST_DIR, name), "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] or raw[1] or raw[2] != 0x08:
        raise SystemExit("bench: %s: not an unsigned-byte IDX file" % name)
    ndim = raw[3]
    dims = struct.unpack(">%dI" % ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise SystemExit("bench: %s: %d bytes of data for dimensions %s"
                         % (name, data.size, dims))
    return data.reshape(dims)


def fashion_mnist():
    """(train images, train labels, test images, test labels) as tensors:
    float32 in [0, 1] shaped [N, 1, 28, 28] and int64 labels."""
    import torch

    def images(name):
        return torch.from_numpy((_idx(name).astype(np.float32) / 255.0)
                                .reshape(-1, 1, 28, 28))

    def labels(name):
        return torch.from_numpy(_idx(name).astype(np.int64))

    return (images("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz"),
            images("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz"))


def model_and_optimizer(kind):
    """The twin of keel's [model] type = mlp | cnn and its optimizer."""
    import torch
    from torch import nn
    if kind == "mlp":
        m = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(),
                          nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        return m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    if kind == "cnn":
        m = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(64 * 5 * 5, 64), nn.ReLU(),
                          nn.Linear(64, 10))
        return m, torch.optim.Adam(m.parameters(), lr=1e-3)
    raise SystemExit("bench: unknown model %r (mlp or cnn)" % kind)


class Batches:
    """Batches of a fixed permutation, wrapping to its start when fewer
    than a batch remain (the last partial batch is dropped)."""

    def __init__(self, x, y, perm, batch):
        self.x, self.y, self.perm, self.batch, self.pos = x, y, perm, batch, 0

    def next(self):
        if self.pos + self.batch > self.perm.shape[0]:
            self.pos = 0
        idx = self.perm[self.pos:self.pos + self.batch]
        self.pos += self.batch
        return self.x[idx], self.y[idx]


def train(model, opt, batches, steps):
    """steps optimizer steps of softmax cross-entropy; returns the last loss."""
    import torch.nn.functional as F
    loss = None
    for _ in range(steps):
        xb, yb = batches.next()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
    return float(loss) if loss is not None else float("nan")


def versions():
    import torch
    return {"python": sys.version.split()[0], "torch": torch.__version__,
            "numpy": np.__version__}
