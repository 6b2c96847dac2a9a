#!/usr/bin/env python3
"""it_export_any.py - keel export of checkpoints keel train did not write,
checked by readers that share no code with keel (h5py, numpy, onnx):

* examples/custom_step's checkpoint (a program's own model, no layer
  description): safetensors holds every variable of the checkpoint bit for
  bit, with the global step and keel version in __metadata__, the data
  8-byte aligned; keras-h5 and onnx fail saying what is missing and which
  format works, and write nothing;
* tests/export_desc (a program that stores a description built with
  keel_model_desc_*), an MLP on vectors and a CNN on images: the builder
  refuses descriptions that do not fit the variables; onnx passes
  onnx.checker and its graph, run by a small numpy interpreter, gives what
  numpy computes from the checkpoint's variables; keras-h5 has the Keras
  weight layout with the program's layer names and the checkpoint's bits;
* a description edited in the file to name a variable of the wrong shape
  is refused naming the layer.
Run by tests/it_export_any.sh with KEEL_BUILDDIR and KEEL_SRCDIR set."""
import json
import os
import shutil
import sys
import tempfile

import h5py
import numpy as np

from py_common import (onnx_export_checked, BUILD, Tally, attr_list, ckpt_variables,
                       conv_nchw, keel, maxpool_nchw, onnx_run,
                       read_safetensors, run, softmax)

check = Tally("it_export_any")


def same_bits(a, b):
    a, b = np.asarray(a, "<f4"), np.asarray(b, "<f4")
    return a.shape == b.shape and np.array_equal(a.view("<u4"), b.view("<u4"))


# ---- numpy: the reference forward pass --------------------------------------

def reference(kind, v, x):
    """What the program's model computes, from its variables."""
    v = {k: a.astype(np.float64) for k, a in v.items()}
    if kind == "mlp":
        h = np.tanh(x @ v["hidden/kernel"] + v["hidden/bias"])
        return softmax(h @ v["out/w"] + v["out/b"])
    # NHWC valid convolution, ReLU, 2x2 max pool, flatten (h, w, c), dense
    h = conv_nchw(x.transpose(0, 3, 1, 2),
                  v["conv/kernel"].transpose(3, 2, 0, 1), v["conv/bias"],
                  (1, 1))
    h = maxpool_nchw(np.maximum(h, 0), (2, 2), (2, 2)).transpose(0, 2, 3, 1)
    return h.reshape(h.shape[0], -1) @ v["fc/kernel"] + v["fc/bias"]


# ---- the checks -------------------------------------------------------------

def custom_step_checks(d):
    run_dir = os.path.join(d, "custom")
    run([os.path.join(BUILD, "examples", "custom_step"), run_dir, 200])
    ckpt = os.path.join(run_dir, "model.ckpt-200.h5")
    variables = ckpt_variables(ckpt)
    st = os.path.join(d, "custom.safetensors")
    keel("export", ckpt, "--format=safetensors", "-o", st)
    tensors, meta, data_start = read_safetensors(st)
    check(set(tensors) == set(variables) == {"linear/w", "linear/b"},
          "custom_step: safetensors names %s" % sorted(tensors))
    check(all(tensors[n][0] == variables[n].shape and
              tensors[n][1] == variables[n].tobytes() for n in tensors),
          "custom_step: safetensors bit for bit")
    with h5py.File(ckpt, "r") as f:
        version = f["meta"].attrs["keel_version"]
        version = version.decode() if hasattr(version, "decode") else version
    check(meta.get("global_step") == "200" and
          meta.get("keel_version") == version,
          "custom_step: safetensors metadata %s" % meta)
    check(data_start % 8 == 0, "custom_step: data at %d, 8-byte aligned"
          % data_start)
    # the directory form and the default output name
    keel("export", run_dir, "--format", "safetensors")
    check(os.path.exists(os.path.join(run_dir, "model.ckpt-200.safetensors")),
          "custom_step: default output name")

    for fmt in ("onnx", "keras-h5"):
        out = os.path.join(d, "custom." + fmt)
        r = keel("export", ckpt, "--format", fmt, "-o", out, ok=False)
        check(r.returncode == 2 and "model.ckpt-200.h5 has no layer "
              "description" in r.stderr and "safetensors" in r.stderr and
              "keras-h5 and onnx need one" in r.stderr and
              "keel_model_desc" in r.stderr,
              "custom_step: %s says what is missing (%d %s)"
              % (fmt, r.returncode, r.stderr.strip()))
        check(not os.path.exists(out) and
              not [f for f in os.listdir(d) if f.startswith(".custom")],
              "custom_step: a refused %s export writes nothing" % fmt)


def described_checks(d, kind):
    out_dir = os.path.join(d, kind)
    r = run([os.path.join(BUILD, "tests", "export_desc"), out_dir, kind])
    refusals = [l for l in r.stdout.splitlines() if l.startswith("refused")]
    check(len(refusals) == 2 and all("invalid argument" in l
                                     for l in refusals),
          "%s: the builder refuses what does not fit: %s" % (kind, refusals))
    ckpt = os.path.join(out_dir, "model.ckpt-7.h5")
    variables = ckpt_variables(ckpt)
    layer_vars = {n for n in variables if not n.startswith("extra/")}
    with h5py.File(ckpt, "r") as f:
        arch = json.loads(f["meta"].attrs["architecture"])
    want = (["hidden", "dense"] if kind == "mlp" else
            ["conv2d", "max_pooling2d", "flatten", "dense"])
    check([L["name"] for L in arch["layers"]] == want,
          "%s: the stored description's layers %s" % (kind, arch["layers"]))

    # safetensors: every variable, the description in the metadata
    st = os.path.join(d, kind + ".safetensors")
    keel("export", ckpt, "--format", "safetensors", "-o", st)
    tensors, meta, _ = read_safetensors(st)
    check(set(tensors) == set(variables) and
          all(tensors[n][1] == variables[n].tobytes() for n in tensors),
          "%s: safetensors holds every variable" % kind)
    check(json.loads(meta["architecture"]) == arch and
          meta["global_step"] == "7", "%s: safetensors metadata" % kind)

    # onnx
    from onnx import numpy_helper
    ox = os.path.join(d, kind + ".onnx")
    model = onnx_export_checked(check, ckpt, ox, kind)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    check(set(inits) == layer_vars and
          all(same_bits(inits[n], variables[n]) for n in inits),
          "%s: onnx initializers = the layers' variables" % kind)
    in_dims = [dd.dim_value for dd in
               model.graph.input[0].type.tensor_type.shape.dim[1:]]
    shape = [6] if kind == "mlp" else [9, 8, 2]
    check(in_dims == shape and model.graph.output[0].name == "output",
          "%s: onnx input %s, output %s" % (kind, in_dims,
                                            model.graph.output[0].name))
    x = np.random.default_rng(5).uniform(-1, 1, [11] + shape)
    got, ref = onnx_run(model, x), reference(kind, variables, x)
    check(got.shape == ref.shape and np.allclose(got, ref, atol=1e-6),
          "%s: the onnx graph computes the program's model (max diff %g)"
          % (kind, np.abs(got - ref).max() if got.shape == ref.shape
             else -1))
    try:
        from onnx.reference import ReferenceEvaluator
    except ImportError:
        ReferenceEvaluator = None      # onnx before 1.13
    if ReferenceEvaluator is not None:
        (ev,) = ReferenceEvaluator(model).run(
            None, {"input": x.astype(np.float32)})
        check(np.allclose(ev, ref, atol=1e-4),
              "%s: onnx's reference evaluator agrees" % kind)

    # keras-h5: the Keras weight layout under the program's names
    kh5 = os.path.join(d, kind + ".h5")
    keel("export", ckpt, "--format", "keras-h5", "-o", kh5)
    with h5py.File(kh5, "r") as f:
        names = attr_list(f, "layer_names")
        check(names == want, "%s: keras-h5 layer_names %s" % (kind, names))
        ok = True
        for L in arch["layers"]:
            wn = attr_list(f[L["name"]], "weight_names") \
                if len(f[L["name"]].attrs["weight_names"]) else []
            if "weights" not in L:
                ok &= wn == []
                continue
            ok &= wn == [L["name"] + "/kernel:0", L["name"] + "/bias:0"]
            for w, v in zip(wn, L["weights"]):
                ok &= same_bits(f[L["name"]][w][()], variables[v])
        check(ok, "%s: keras-h5 weights are the variables' bits" % kind)

    # keel predict runs keel train's models only: it says so
    r = keel("predict", ckpt, st, ok=False)
    check(r.returncode == 2 and "layer description" in r.stderr,
          "%s: predict of a program's model says why not (%d %s)"
          % (kind, r.returncode, r.stderr.strip()))
    return ckpt, arch


def corrupt_description_checks(d, ckpt, arch):
    bad = os.path.join(d, "bad.h5")
    shutil.copy(ckpt, bad)
    arch["layers"][-1]["weights"] = ["conv/kernel", "fc/bias"]
    with h5py.File(bad, "r+") as f:
        del f["meta"].attrs["architecture"]
        f["meta"].attrs["architecture"] = np.bytes_(json.dumps(arch))
    r = keel("export", bad, "--format", "onnx", "-o",
             os.path.join(d, "bad.onnx"), ok=False)
    check(r.returncode != 0 and "layer dense" in r.stderr and
          "conv/kernel" in r.stderr and not os.path.exists(
              os.path.join(d, "bad.onnx")),
          "a description that does not fit its variables is refused "
          "naming the layer (%d %s)" % (r.returncode, r.stderr.strip()))


def main():
    try:
        import onnx  # noqa: F401
    except ImportError:
        print("SKIP: python3-onnx is not installed (quickstart.sh installs "
              "it)")
        return 77
    d = tempfile.mkdtemp(prefix="keel-export-any-")
    try:
        custom_step_checks(d)
        described_checks(d, "mlp")
        ckpt, arch = described_checks(d, "cnn")
        corrupt_description_checks(d, ckpt, arch)
    finally:
        shutil.rmtree(d)
    return check.report()


if __name__ == "__main__":
    sys.exit(main())
