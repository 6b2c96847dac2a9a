"""py_common.py - what keel's Python integration tests share (it_export.py,
it_export_any.py, ckpt_adversarial.py, ckpt_vds.py): a tally of checks,
running keel, a slice of Fashion-MNIST as IDX files, and independent readers of
safetensors files, checkpoints' variables, Keras weight attributes and
ONNX graphs (numpy only, no keel code)."""
import gzip
import json
import os
import struct
import subprocess
import sys

import numpy as np

FMNIST = "/usr/share/datasets/fashion-mnist"
BUILD = os.environ.get("KEEL_BUILDDIR", ".")
KEEL = os.path.join(BUILD, "keel")


class Tally:
    """Counts checks; a failed one prints 'FAIL: what' on stderr."""

    def __init__(self, name):
        self.name, self.passed, self.failed = name, 0, 0

    def __call__(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL: " + what, file=sys.stderr)

    def report(self):
        """Prints the counts; returns the exit status (1 on any failure)."""
        print("%s: %d passed, %d failed" % (self.name, self.passed,
                                            self.failed))
        return 1 if self.failed else 0


def run(args, ok=True, timeout=600, **kw):
    """Runs a program; ok: a non-zero exit ends the test naming it."""
    r = subprocess.run([str(a) for a in args], capture_output=True,
                       text=True, timeout=timeout, **kw)
    if ok and r.returncode != 0:
        raise SystemExit("%s failed (%d): %s%s" % (" ".join(map(str, args)),
                                                   r.returncode, r.stdout,
                                                   r.stderr))
    return r


def keel(*args, ok=True):
    return run([KEEL] + list(args), ok)


# ---- data: Fashion-MNIST slices as gzip'd IDX files ------------------------

def have_fmnist():
    return os.path.exists(os.path.join(FMNIST, "t10k-images-idx3-ubyte.gz"))


def idx(name, off):
    with gzip.open(os.path.join(FMNIST, name)) as f:
        return np.frombuffer(f.read(), np.uint8, offset=off)


def write_idx(path, arr, magic):
    hdr = struct.pack(">I", magic) + b"".join(struct.pack(">I", d)
                                              for d in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(hdr + arr.tobytes())


def write_fmnist_slice(d, n_train, n_test):
    """The first n_train/n_test examples as IDX files in d; returns the
    test images (uint8, N x 28 x 28) and labels."""
    out = None
    for kind, n in (("train", n_train), ("t10k", n_test)):
        x = idx(kind + "-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)[:n]
        y = idx(kind + "-labels-idx1-ubyte.gz", 8)[:n]
        write_idx(os.path.join(d, kind + "-images-idx3-ubyte.gz"), x, 0x803)
        write_idx(os.path.join(d, kind + "-labels-idx1-ubyte.gz"), y, 0x801)
        out = (x, y)
    return out


# ---- readers ----------------------------------------------------------------

def read_safetensors(path):
    """The format by hand: u64 LE header length, JSON header, data with no
    holes or overlaps. Returns ({name: (shape, bytes)}, metadata, offset of
    the data)."""
    with open(path, "rb") as f:
        blob = f.read()
    (hl,) = struct.unpack("<Q", blob[:8])
    assert 8 + hl <= len(blob)
    header = json.loads(blob[8:8 + hl].decode("utf8"))
    data = blob[8 + hl:]
    meta = header.pop("__metadata__", {})
    assert all(isinstance(v, str) for v in meta.values())
    spans, out = [], {}
    for name, e in header.items():
        assert e["dtype"] == "F32", e
        b, end = e["data_offsets"]
        n = int(np.prod(e["shape"])) if e["shape"] else 1
        assert end - b == 4 * n, (name, e)
        spans.append((b, end))
        out[name] = (tuple(e["shape"]), data[b:end])
    spans.sort()
    pos = 0
    for b, end in spans:
        assert b == pos, spans
        pos = end
    assert pos == len(data)
    return out, meta, 8 + hl


def ckpt_variables(path):
    """A checkpoint's /variables datasets by path, as little-endian f32."""
    import h5py
    out = {}
    with h5py.File(path, "r") as f:
        f["variables"].visititems(
            lambda n, o: out.__setitem__(n, np.asarray(o[()], "<f4"))
            if isinstance(o, h5py.Dataset) else None)
    return out


def attr_list(group, name):
    """Keras' load_attributes_from_hdf5_group: name, or name0, name1, ..."""
    if name in group.attrs:
        raw = list(group.attrs[name])
    else:
        raw, k = [], 0
        while "%s%d" % (name, k) in group.attrs:
            raw += list(group.attrs["%s%d" % (name, k)])
            k += 1
    return [n.decode("utf8") if hasattr(n, "decode") else n for n in raw]


def onnx_export_checked(check, ckpt, out, kind):
    """keel export --format onnx of ckpt into out, loaded and passed
    through onnx.checker (full check) as one tallied check; the model."""
    import onnx
    keel("export", ckpt, "--format", "onnx", "-o", out)
    model = onnx.load(out)
    try:
        onnx.checker.check_model(model, full_check=True)
        ok = True
    except Exception as e:             # the checker's own exception types
        print(e, file=sys.stderr)
        ok = False
    check(ok, "%s: onnx.checker.check_model" % kind)
    return model


# ---- numpy: NCHW layers and a small ONNX interpreter ------------------------

def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def conv_nchw(x, w, b, strides):
    kh, kw = w.shape[2:]
    sh, sw = strides
    oh, ow = (x.shape[2] - kh) // sh + 1, (x.shape[3] - kw) // sw + 1
    y = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for p in range(kh):
        for q in range(kw):
            y += np.einsum("nchw,oc->nohw",
                           x[:, :, p:p + sh * (oh - 1) + 1:sh,
                             q:q + sw * (ow - 1) + 1:sw], w[:, :, p, q])
    return y + b[None, :, None, None]


def maxpool_nchw(x, k, s):
    oh, ow = (x.shape[2] - k[0]) // s[0] + 1, (x.shape[3] - k[1]) // s[1] + 1
    y = np.full(x.shape[:2] + (oh, ow), -np.inf)
    for p in range(k[0]):
        for q in range(k[1]):
            y = np.maximum(y, x[:, :, p:p + s[0] * (oh - 1) + 1:s[0],
                                q:q + s[1] * (ow - 1) + 1:s[1]])
    return y


def onnx_run(model, x):
    """Runs the graph on x (float64) with the ops keel's exporter writes."""
    from onnx import helper, numpy_helper
    env = {i.name: numpy_helper.to_array(i).astype(np.float64)
           for i in model.graph.initializer}
    env[model.graph.input[0].name] = x
    for node in model.graph.node:
        a = {at.name: helper.get_attribute_value(at) for at in node.attribute}
        i = [env[n] for n in node.input]
        op = node.op_type
        if op == "Transpose":
            y = np.transpose(i[0], a["perm"])
        elif op == "Conv":
            assert not any(a.get("pads", [0, 0, 0, 0]))
            y = conv_nchw(i[0], i[1], i[2], a.get("strides", [1, 1]))
        elif op == "MaxPool":
            y = maxpool_nchw(i[0], a["kernel_shape"], a["strides"])
        elif op == "Relu":
            y = np.maximum(i[0], 0)
        elif op == "Tanh":
            y = np.tanh(i[0])
        elif op == "Sigmoid":
            y = 1 / (1 + np.exp(-i[0]))
        elif op == "Flatten":
            assert a.get("axis", 1) == 1
            y = i[0].reshape(i[0].shape[0], -1)
        elif op == "Gemm":
            assert not a.get("transA", 0) and not a.get("transB", 0)
            y = i[0] @ i[1] + i[2]
        elif op == "Softmax":
            assert a.get("axis", -1) in (-1, 1)
            y = softmax(i[0])
        elif op == "Identity":
            y = i[0]
        else:
            raise AssertionError("unexpected op " + op)
        env[node.output[0]] = y
    return env[model.graph.output[0].name]
