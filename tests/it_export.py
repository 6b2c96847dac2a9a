#!/usr/bin/env python3
"""it_export.py - models that leave keel, checked by readers that share no
code with keel (h5py, numpy, onnx and the standard library only):

* the keras-h5 export read by the Keras weight-layout rules (layer_names,
  weight_names, datasets) rebuilds the MLP and the CNN in numpy and gives
  keel eval's test accuracy to 1e-4;
* the safetensors export parsed by hand equals the checkpoint's tensors bit
  for bit;
* the ONNX export passes onnx.checker, its initializers equal the
  checkpoint's tensors, and its graph run by a small numpy interpreter
  gives the same accuracy;
* `keel eval CKPT.h5` and `keel predict CKPT.h5 IMAGES --json` need no INI
  and agree with `keel eval CONFIG`; .npy and HDF5 inputs predict the same;
* the per-epoch workflow: epoch-named checkpoints kept by max_to_keep, the
  learning rate following a per-epoch step decay in scalars.csv and the event
  file, a validation line per epoch.
Run by tests/it_export.sh with KEEL_BUILDDIR and KEEL_SRCDIR set."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from py_common import (onnx_export_checked, FMNIST, Tally, attr_list, ckpt_variables, keel,
                       onnx_run, read_safetensors, write_fmnist_slice)

SRC = os.environ.get("KEEL_SRCDIR", ".")
check = Tally("it_export")



def keel_name(keras):
    """The checkpoint variable of a tf.keras weight name: keel numbers each
    layer kind from 1 ("dense_1/kernel"), tf.keras from none
    ("dense/kernel", then "dense_1/kernel")."""
    layer, weight = keras.split("/", 1)
    base, _, n = layer.rpartition("_")
    if base and n.isdigit():
        return "%s_%d/%s" % (base, int(n) + 1, weight)
    return "%s_1/%s" % (layer, weight)

# ---- data: a small slice of Fashion-MNIST, as IDX (gz), .npy and HDF5 ----

def make_data(d):
    xte, yte = write_fmnist_slice(d, 640, 500)
    np.save(os.path.join(d, "test.npy"), xte)
    with h5py.File(os.path.join(d, "test.h5"), "w") as f:
        f["x"] = xte.astype(np.float32) / np.float32(255)
    return xte.astype(np.float64) / 255.0, yte.astype(np.int64)


# ---- the Keras weight layout, read by its rules ---------------------------

def relu(x):
    return np.maximum(x, 0)


def conv_valid(x, k, b):
    """NHWC input, Keras kernel (kh, kw, in, out), stride 1, valid."""
    kh, kw = k.shape[:2]
    oh, ow = x.shape[1] - kh + 1, x.shape[2] - kw + 1
    y = np.zeros((x.shape[0], oh, ow, k.shape[3]))
    for i in range(kh):
        for j in range(kw):
            y += np.einsum("nhwc,co->nhwo", x[:, i:i + oh, j:j + ow, :],
                           k[i, j])
    return y + b


def maxpool2(x):
    n, h, w, c = x.shape
    return x[:, :h // 2 * 2, :w // 2 * 2, :].reshape(
        n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


def keras_h5_logits(path, x):
    """Rebuild the network from a save_weights file: Keras class by layer
    name (conv2d_*, max_pooling2d_*, flatten_*, dense_*), weights by
    weight_names; ReLU on every weighted layer but the last."""
    with h5py.File(path, "r") as f:
        names = attr_list(f, "layer_names")
        weighted = [n for n in names if attr_list(f[n], "weight_names")]
        assert f.attrs["backend"] in (b"tensorflow", "tensorflow")
        assert not str(f.attrs["keras_version"]).startswith("1")
        h = x[..., None]
        for n in names:
            wn = attr_list(f[n], "weight_names")
            w = [np.asarray(f[n][v], dtype=np.float64) for v in wn]
            for v in wn:
                assert v.startswith(n + "/"), (n, v)
            last = n == weighted[-1]
            if n.startswith("conv2d"):
                assert w[0].ndim == 4 and w[1].shape == (w[0].shape[3],)
                h = relu(conv_valid(h, w[0], w[1]))
            elif n.startswith("max_pooling2d"):
                h = maxpool2(h)
            elif n.startswith("flatten"):
                h = h.reshape(h.shape[0], -1)
            elif n.startswith("dense"):
                assert w[0].ndim == 2 and w[1].shape == (w[0].shape[1],)
                h = h @ w[0] + w[1]
                if not last:
                    h = relu(h)
            else:
                raise AssertionError("unexpected layer " + n)
        return h


# ---- the checks -------------------------------------------------------------

def accuracy_of(out):
    m = re.search(r"accuracy ([0-9.]+)", out)
    return float(m.group(1)) if m else None


def export_checks(d, kind, x, y):
    ini = os.path.join(d, kind + ".ini")
    out = os.path.join(d, kind)
    with open(ini, "w") as f:
        f.write("[model]\ntype = %s\n%s[data]\ndir = %s\n"
                "[optimizer]\nname = adam\nlearning_rate = 0.003\n"
                "[train]\nbatch_size = 64\nmax_steps = %d\n"
                "eval_batch_size = 128\n[checkpoint]\ndir = %s\n"
                "save_secs = 0\n[hooks]\nlog_every_steps = 0\n"
                % (kind, "hidden = 32,16\n" if kind == "mlp" else "", d,
                   40 if kind == "mlp" else 20, out))
    keel("train", ini)
    ckpt = os.path.join(out, "model.ckpt-%d.h5" % (40 if kind == "mlp"
                                                    else 20))
    acc = accuracy_of(keel("eval", ini).stdout)
    check(acc is not None and acc > 0.3, "%s: keel eval CONFIG works (%s)"
          % (kind, acc))
    # no INI: the checkpoint describes its model
    r = keel("eval", ckpt, "--json")
    check(abs(json.loads(r.stdout)["accuracy"] - acc) < 1e-4,
          "%s: keel eval CKPT.h5 = keel eval CONFIG" % kind)
    with h5py.File(ckpt, "r") as f:
        arch = json.loads(f["meta"].attrs["architecture"])
    check(arch["model"] == kind and arch["input_shape"] == [28, 28, 1]
          and arch["classes"] == 10 and arch["optimizer"]["name"] == "adam",
          "%s: /meta architecture %s" % (kind, arch))

    images = os.path.join(d, "t10k-images-idx3-ubyte.gz")
    r = keel("predict", ckpt, images, "--json")
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    pred = np.array([row["class"] for row in rows])
    check(len(rows) == len(y) and abs((pred == y).mean() - acc) < 1e-4,
          "%s: keel predict --json accuracy = keel eval" % kind)
    probs = np.array([row["probabilities"] for row in rows])
    check(np.allclose(probs.sum(axis=1), 1, atol=1e-5),
          "%s: predict probabilities sum to 1" % kind)
    for other in ("test.npy", "test.h5"):
        r = keel("predict", ckpt, os.path.join(d, other), "--json")
        p2 = np.array([json.loads(line)["class"]
                       for line in r.stdout.splitlines()])
        check(np.array_equal(p2, pred), "%s: predict %s = IDX" % (kind, other))
    r = keel("predict", ckpt, images, "--labels",
             os.path.join(d, "t10k-labels-idx1-ubyte.gz"))
    check(abs(accuracy_of(r.stdout.splitlines()[-1]) - acc) < 1e-4,
          "%s: predict --labels accuracy" % kind)

    # a checkpoint of older keel: no architecture (and no config) in /meta
    old = os.path.join(d, kind + "-old.h5")
    shutil.copy(ckpt, old)
    with h5py.File(old, "r+") as f:
        del f["meta"].attrs["architecture"]
    r = keel("predict", old, images, "--json")
    check([json.loads(l)["class"] for l in r.stdout.splitlines()] ==
          list(pred), "%s: no architecture: the stored config" % kind)
    with h5py.File(old, "r+") as f:
        del f["meta"].attrs["config"]
    r = keel("predict", old, images, "--json", ok=False)
    check(r.returncode == 2 and "CONFIG" in r.stderr,
          "%s: neither architecture nor config: asks for CONFIG (%d %s)"
          % (kind, r.returncode, r.stderr.strip()))
    r = keel("predict", old, images, "--json", "--config", ini)
    check([json.loads(l)["class"] for l in r.stdout.splitlines()] ==
          list(pred), "%s: no architecture: --config INI" % kind)
    r = keel("export", old, "--format", "safetensors", "--config", ini,
             "-o", os.path.join(d, "old.safetensors"))
    check(r.returncode == 0, "%s: export of an old checkpoint with --config"
          % kind)

    # keras-h5
    kh5 = os.path.join(d, kind + ".keras.h5")
    keel("export", ckpt, "--format", "keras-h5", "-o", kh5)
    logits = keras_h5_logits(kh5, x)
    kacc = (logits.argmax(axis=1) == y).mean()
    check(abs(kacc - acc) < 1e-4, "%s: keras-h5 numpy accuracy %.6f vs "
          "keel %.6f" % (kind, kacc, acc))
    variables = ckpt_variables(ckpt)
    with h5py.File(kh5, "r") as f:
        names = attr_list(f, "layer_names")
        # tf.keras's default names: the first of a kind has no number
        want = (["flatten", "dense", "dense_1", "dense_2"]
                if kind == "mlp" else
                ["conv2d", "max_pooling2d", "conv2d_1",
                 "max_pooling2d_1", "flatten", "dense", "dense_1"])
        check(names == want, "%s: layer_names %s" % (kind, names))
        same = all(np.array_equal(
            np.asarray(f[n][w]).view("<u4"),
            variables[keel_name(w[:-2])].view("<u4"))
            for n in names for w in attr_list(f[n], "weight_names"))
        check(same, "%s: keras-h5 weights are the checkpoint's bits" % kind)

    # safetensors
    st = os.path.join(d, kind + ".safetensors")
    keel("export", ckpt, "--format", "safetensors", "-o", st)
    tensors, meta, _ = read_safetensors(st)
    check(set(tensors) == set(variables),
          "%s: safetensors names %s" % (kind, sorted(tensors)))
    check(all(tensors[n][0] == variables[n].shape and
              tensors[n][1] == variables[n].astype("<f4").tobytes()
              for n in tensors), "%s: safetensors bit for bit" % kind)
    check(json.loads(meta["architecture"])["model"] == kind,
          "%s: safetensors metadata" % kind)

    # onnx
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        check(False, "python3-onnx is not installed (quickstart.sh installs "
              "it)")
        return
    ox = os.path.join(d, kind + ".onnx")
    model = onnx_export_checked(check, ckpt, ox, kind)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    check(set(inits) == set(variables) and all(
        inits[n].dtype == np.float32 and
        np.array_equal(inits[n].view("<u4"), variables[n].view("<u4"))
        for n in inits), "%s: onnx initializers = checkpoint" % kind)
    oacc = (onnx_run(model, x[..., None]).argmax(axis=1) == y).mean()
    check(abs(oacc - acc) < 1e-4, "%s: onnx graph accuracy %.6f vs keel "
          "%.6f" % (kind, oacc, acc))


def epoch_checks(d):
    ini = os.path.join(d, "epochs.ini")
    out = os.path.join(d, "epochs")
    with open(ini, "w") as f:
        f.write("[model]\ntype = mlp\nhidden = 16\n[data]\ndir = %s\n"
                "[optimizer]\nname = adam\nschedule = piecewise\n"
                "schedule_unit = epochs\nboundaries = 3,7\n"
                "values = 1e-3,1e-4,1e-5\n[train]\nbatch_size = 64\n"
                "epochs = 9\nvalidate_every_epochs = 1\n"
                "[checkpoint]\ndir = %s\nsave_epochs = 1\nmax_to_keep = 5\n"
                "[hooks]\nlog_every_steps = 5\nsummary_every_steps = 1\n"
                % (d, out))
    r = keel("train", ini)
    files = sorted(f for f in os.listdir(out) if f.endswith(".h5"))
    want = sorted("model.ckpt-epoch%d-%d.h5" % (e, 10 * e)
                  for e in range(5, 10))
    check(files == want, "epochs: kept %s, want %s" % (files, want))
    with h5py.File(os.path.join(out, want[-1]), "r") as f:
        check(int(f["meta"].attrs["epoch"]) == 9 and
              int(f["meta"].attrs["global_step"]) == 90, "epochs: /meta epoch")
    vals = [l for l in r.stdout.splitlines() if "validation loss" in l]
    check(len(vals) == 9, "epochs: %d validation lines" % len(vals))

    def decay(epoch):                   # a Keras LearningRateScheduler's steps
        return 1e-3 if epoch < 3 else 1e-4 if epoch < 7 else 1e-5

    rows = [l.split(",") for l in open(os.path.join(out, "scalars.csv"))]
    lr = {int(s): float(v) for _, s, t, v in rows[1:] if t == "learning_rate"}
    # the row of step s is the step that made global step s (epoch (s-1)/10)
    check(len(lr) == 90 and all(abs(v - decay((s - 1) // 10)) <=
                                 1e-7 * decay((s - 1) // 10)
                                 for s, v in lr.items()),
          "epochs: scalars.csv learning_rate follows the decay")
    ev = [f for f in os.listdir(out) if f.startswith("events.out")]
    r2 = subprocess.run([sys.executable,
                         os.path.join(SRC, "tests", "read_tfevents.py"),
                         os.path.join(out, ev[0])], capture_output=True,
                        text=True)
    evlr = {int(p[1]): float(p[3]) for p in
            (l.split() for l in r2.stdout.splitlines())
            if p[0] == "scalar" and p[2] == "learning_rate"}
    check(r2.returncode == 0 and len(evlr) == 90 and
          all(abs(v - decay((s - 1) // 10)) <= 1e-7 * decay((s - 1) // 10)
              for s, v in evlr.items()),
          "epochs: event file learning_rate follows the decay")
    lines = [l for l in r.stdout.splitlines() if l.startswith("step ")]
    check(lines and all(" lr " in l for l in lines), "epochs: lr in step lines")
    vdir = os.path.join(out, "validation")
    vev = [f for f in os.listdir(vdir) if f.startswith("events.out")]
    r3 = subprocess.run([sys.executable,
                         os.path.join(SRC, "tests", "read_tfevents.py"),
                         os.path.join(vdir, vev[0])], capture_output=True,
                        text=True)
    check(r3.stdout.count("validation/accuracy") == 9,
          "epochs: validation events")


def predict_input_checks(d):
    """keel predict refuses HDF5 labels outside the model's classes, as eval
    does; huge finite inputs give finite probabilities; an output that is
    not finite (a layer overflowed float32) is an error naming the row."""
    ckpt = os.path.join(d, "mlp")
    x = np.full((3, 28, 28), 0.5, np.float32)
    for label in (10, 255, 1000000):
        p = os.path.join(d, "label%d.h5" % label)
        with h5py.File(p, "w") as f:
            f["x"] = x
            f["y"] = np.array([0, label, 1], np.int64)
        r = keel("predict", ckpt, p, "--json", ok=False)
        check(r.returncode == 1 and r.stderr.startswith("keel: predict: ")
              and "label %d of example 1" % label in r.stderr
              and "[0, 10)" in r.stderr and r.stdout == "",
              "predict: HDF5 label %d refused (%d %s)"
              % (label, r.returncode, r.stderr.strip()))
    p = os.path.join(d, "huge.h5")
    with h5py.File(p, "w") as f:
        f["x"] = x * np.float32(1e30)
    r = keel("predict", ckpt, p, "--json", ok=False)
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    probs = np.array([row["probabilities"] for row in rows])
    check(r.returncode == 0 and len(rows) == 3 and np.isfinite(probs).all()
          and np.allclose(probs.sum(axis=1), 1, atol=1e-5),
          "predict: inputs of 1e30 give finite probabilities (%d %s)"
          % (r.returncode, r.stderr.strip()))
    # rows whose pixels follow the signs of a first-layer unit's weights,
    # at float32's largest: that unit's sum overflows to +inf
    with h5py.File(os.path.join(ckpt, "model.ckpt-40.h5"), "r") as f:
        w = np.asarray(f["variables/dense_1/kernel"]).reshape(28, 28, -1)
    big = np.zeros((1 + w.shape[2], 28, 28), np.float32)
    big[0] = x[0]
    for u in range(w.shape[2]):
        big[1 + u] = np.where(w[:, :, u] >= 0, 1, -1) * np.finfo("<f4").max
    with h5py.File(p, "w") as f:
        f["x"] = big
    r = keel("predict", ckpt, p, "--json", ok=False)
    check(r.returncode == 1 and re.search(r"example [1-9][0-9]* of", r.stderr)
          and "not finite" in r.stderr and r.stdout == "",
          "predict: a non-finite output names the row (%d %s)"
          % (r.returncode, r.stderr.strip()))


def main():
    if not os.path.exists(os.path.join(FMNIST, "t10k-images-idx3-ubyte.gz")):
        print("SKIP: Debian's dataset-fashion-mnist is not installed")
        return 77
    d = tempfile.mkdtemp(prefix="keel-export-")
    try:
        x, y = make_data(d)
        export_checks(d, "mlp", x, y)
        predict_input_checks(d)
        export_checks(d, "cnn", x, y)
        epoch_checks(d)
        r = keel("export", os.path.join(d, "nothing.h5"), "--format", "onnx",
                 ok=False)
        check(r.returncode == 1 and r.stderr.startswith("keel: "),
              "export of a missing checkpoint fails with a message")
        r = keel("export", os.path.join(d, "mlp"), "--format", "tflite",
                 ok=False)
        check(r.returncode == 2 and "keras-h5" in r.stderr,
              "unknown export format is a usage error")
    finally:
        shutil.rmtree(d)
    return check.report()


if __name__ == "__main__":
    sys.exit(main())
