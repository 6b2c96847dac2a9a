#!/usr/bin/env python3
"""layering.py - fails when a file includes a header of a higher layer.

The layers, lowest first (docs/architecture.md explains them). A file may
include headers of its own layer and of lower layers only; layers of equal
rank are siblings and include neither each other. A header belongs to the
layer of its folder; the public headers include/keel/*.h are mapped below.
A folder's private headers (every quoted include) are its own: another
folder may include one only where SEAMS lists it. programs (tools/,
examples/) use the public headers only. tests/ and bench/ test internals
and are not checked.

usage: layering.py [SRCDIR]   (default: KEEL_SRCDIR, else this file's ..)
"""
import os
import re
import sys

# (layer, rank, folders, public headers in include/keel/)
LAYERS = [
    ("util", 0, ["util"], ["status.h", "log.h", "version.h"]),
    ("core", 1, ["core"], ["tensor.h", "optimizer.h"]),
    # the model library: layers, models, K-FAC, Hogwild, data readers
    ("train", 2, ["train"], ["train.h"]),
    ("checkpoint", 2, ["checkpoint"], ["checkpoint.h"]),
    # keel_hook, the run context and the timer are the session's interface
    # (session.h includes hooks.h); the standard hooks declared there are
    # built in hooks/ on that interface, and MonitoredTrainingSession calls
    # their public constructors.
    ("session", 3, ["session"], ["session.h", "hooks.h"]),
    ("hooks", 4, ["hooks"], ["events.h"]),
    ("cluster", 4, ["cluster"], ["cluster.h", "distributed.h"]),
    # MonitoredTrainingSession and the Supervisor compose the session with
    # the standard hooks and the cluster's backend: above both.
    ("supervise", 5, ["supervise"], ["supervise.h"]),
    ("app", 6, ["app"], ["config.h", "job.h", "export.h"]),
    ("launch", 6, ["launch"], ["launch.h"]),
    # the umbrellas: keel.h (the framework), app.h (the trainer app)
    ("programs", 7, ["tools", "examples"], ["keel.h", "app.h"]),
]

# Files above their folder's layer: file -> (layer name, rank).
FILE_LAYERS = {
}

# Private headers other folders may include: header -> folders.
SEAMS = {
    # keel__fail, logging, paths: libkeel's own helpers
    "util/util.h": ["core", "train", "checkpoint", "session", "hooks",
                    "cluster", "supervise", "app", "launch"],
    # the defaults every layer shares (waits, grace periods)
    "util/defaults.h": ["core", "train", "checkpoint", "session", "hooks",
                        "cluster", "supervise", "app", "launch"],
    # closing any HDF5 handle, a failed one skipped: the readers and
    # writers of HDF5 files
    "util/h5util.h": ["train", "checkpoint", "app"],
    # room for one more element by doubling: the lists the variable store,
    # the checkpoint code, the cluster spec and the wire receiver build
    "util/grow.h": ["core", "train", "checkpoint", "cluster"],
    # the global step the session's step path reads and bumps in place
    "core/vars_int.h": ["session"],
    # the vectorized kernels the ps and the collective sum with and the
    # model library builds on; the thread pool the session runs replicas
    # on and applies the optimizer on (keel__optimizer_apply_pooled); the
    # reduction tree replicas' gradients are added along
    "core/core_int.h": ["train", "session", "cluster"],
    # the model's internals the trainer builds on: its architecture for
    # export, replicas, pieces and pool
    "train/train_int.h": ["app"],
    # the threads a mirrored session runs its replicas on, which the
    # trainer's update uses between steps
    "session/step_pool.h": ["app"],
    # the session's own constructor with the hooks it owns, the backend
    # check and copy, and the cleanup a session runs at its free: what
    # MonitoredTrainingSession and the Supervisor build their sessions with
    "session/session_int.h": ["supervise"],
    # the checkpoint call table tests swap (session's saver, the
    # CheckpointSaverHook)
    "checkpoint/ckpt_ops.h": ["session", "hooks"],
    # the cluster defaults the INI schema documents
    "cluster/defaults.h": ["app"],
}

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def main():
    src = (sys.argv[1] if len(sys.argv) > 1
           else os.environ.get("KEEL_SRCDIR")
           or os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    src = os.path.abspath(src)
    layer_of_folder, rank, layer_of_public = {}, {}, {}
    for name, r in FILE_LAYERS.values():
        rank[name] = r
    for name, r, folders, headers in LAYERS:
        rank[name] = r
        for f in folders:
            layer_of_folder[f] = name
        for h in headers:
            layer_of_public["include/keel/" + h] = name
    errors = []
    checked = 0
    files = []
    for folder in sorted(layer_of_folder) + ["include/keel"]:
        d = os.path.join(src, folder)
        if not os.path.isdir(d):
            continue
        for fn in sorted(os.listdir(d)):
            if fn.endswith((".c", ".h")):
                files.append(folder + "/" + fn)
    for h in sorted(os.listdir(os.path.join(src, "include/keel"))):
        if h.endswith(".h") and "include/keel/" + h not in layer_of_public:
            errors.append("include/keel/%s: public header in no layer (add "
                          "it to LAYERS in tests/layering.py)" % h)
    for rel in files:
        folder = os.path.dirname(rel)
        me = (layer_of_public.get(rel) if folder == "include/keel"
              else layer_of_folder[folder])
        if rel in FILE_LAYERS:
            me = FILE_LAYERS[rel][0]
        if me is None:
            continue
        with open(os.path.join(src, rel), encoding="utf-8") as fh:
            lines = fh.read().split("\n")
        for no, line in enumerate(lines, 1):
            m = INCLUDE.match(line)
            if m is None:
                continue
            kind, name = m.groups()
            where = "%s:%d: #include %s%s%s" % (
                rel, no, kind, name, ">" if kind == "<" else '"')
            if kind == "<":
                if not name.startswith("keel/"):
                    continue            # system and library headers
                target = "include/" + name
                if target not in layer_of_public:
                    errors.append("%s: no such public header" % where)
                    continue
            else:
                target = os.path.normpath(os.path.join(folder, name))
                if not os.path.exists(os.path.join(src, target)):
                    # -I util: "util.h"
                    alt = os.path.normpath(os.path.join("util", name))
                    if os.path.exists(os.path.join(src, alt)):
                        target = alt
                    else:
                        errors.append("%s: header not found" % where)
                        continue
            checked += 1
            tfolder = os.path.dirname(target)
            them = (layer_of_public[target] if tfolder == "include/keel"
                    else layer_of_folder.get(tfolder))
            if them is None:
                errors.append("%s: %s is in no layer" % (where, target))
                continue
            if tfolder != "include/keel" and tfolder != folder:
                if me == "programs" or folder == "include/keel":
                    errors.append("%s: %s may include public headers only "
                                  "(<keel/...>)" % (where, rel))
                    continue
                if folder not in SEAMS.get(target, []):
                    errors.append("%s: %s is private to %s/ (use the public "
                                  "API, or list the seam in SEAMS)"
                                  % (where, target, tfolder))
                    continue
            if them != me and rank[them] >= rank[me]:
                errors.append("%s: layer %s (rank %d) includes %s of layer "
                              "%s (rank %d)%s" % (
                                  where, me, rank[me], target, them,
                                  rank[them],
                                  "; siblings include neither each other"
                                  if rank[them] == rank[me] else ""))
    for e in errors:
        print("layering: " + e)
    print("layering: %d files, %d keel includes checked, %d violations"
          % (len(files), checked, len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
