#!/usr/bin/env python3
"""layering.py - fails when a file includes a header of, or calls a
function of, a higher layer or a sibling.

The layers (rank, layer, folders, public headers) are the table in
docs/architecture.md, which also states the rules; this script holds only
the exceptions: SEAMS (private headers another folder may include) and
CALL_ALLOW (known upward calls). tests/ and bench/ are not checked.

The include check reads the sources. The call check runs nm on libkeel's
objects in the build directory (KEEL_BUILDDIR): each defined global
symbol belongs to its object's file and layer; an object using a symbol
defined in a higher layer or a sibling fails. Undefined symbols no keel
object defines (libc, HDF5, the sanitizers' runtime) are ignored. Pairs of
files of one folder that use each other's symbols are printed, and fail
for the folders in MUTUAL_STRICT.

usage: layering.py [--srcdir D] [--builddir D] [--extra-source F=PATH.c]
                   [--extra-object F=PATH.o]
  --extra-*: check PATH as if it were a file of folder F (tests plant one).
Exits 77 when nm (NM, first word) is missing or KEEL_BUILDDIR unset and
the include check passes.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

# Private headers other folders may include: header -> folders.
SEAMS = {
    # keel__fail, logging, paths: libkeel's own helpers
    "util/util.h": ["numeric", "train", "checkpoint", "session", "hooks",
                    "cluster", "supervise", "app", "launch"],
    # the defaults every layer shares (waits, grace periods)
    "util/defaults.h": ["numeric", "train", "checkpoint", "session", "hooks",
                        "cluster", "supervise", "app", "launch"],
    # closing any HDF5 handle, a failed one skipped: the readers and
    # writers of HDF5 files
    "util/h5util.h": ["train", "checkpoint", "app"],
    # room for one more element by doubling: the lists the variable store,
    # the checkpoint code, the cluster spec and the wire receiver build
    "util/grow.h": ["numeric", "train", "checkpoint", "cluster"],
    # the global step the session's step path reads and bumps in place
    "numeric/vars_int.h": ["session"],
    # the vectorized kernels the ps and the collective sum with and the
    # model library builds on; the thread pool the session runs replicas
    # on and applies the optimizer on (keel__optimizer_apply_pooled); the
    # reduction tree replicas' gradients are added along
    "numeric/numeric_int.h": ["train", "session", "cluster"],
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

# Known upward calls: (object's source file, folder it calls into) ->
# reason. An entry that matches no call is an error, so it goes when the
# call does.
CALL_ALLOW = {
}

# Folders whose files never use each other's symbols both ways: a file
# of one is either below or above each other file it talks to.
MUTUAL_STRICT = {"util", "numeric", "train", "checkpoint", "session",
                 "hooks", "cluster", "supervise", "app", "launch"}

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
TABLE_HEAD = re.compile(r"^\|\s*rank\s*\|\s*layer\s*\|\s*folders\s*\|"
                        r"\s*public headers\s*\|")
TICKED = re.compile(r"`([^`]+)`")


class Layout:
    """The table of docs/architecture.md: layer of a folder, file, header."""

    def __init__(self, src):
        self.rank, self.folder, self.file, self.public = {}, {}, {}, {}
        doc = os.path.join(src, "docs/architecture.md")
        with open(doc, encoding="utf-8") as fh:
            lines = fh.read().split("\n")
        head = [i for i, line in enumerate(lines) if TABLE_HEAD.match(line)]
        if len(head) != 1:
            sys.exit("layering: %s: expected one table headed "
                     "'| rank | layer | folders | public headers |'" % doc)
        for no in range(head[0] + 2, len(lines)):
            if not lines[no].startswith("|"):
                break
            cells = [c.strip() for c in lines[no].strip("|").split("|")]
            try:
                rank, layer = int(cells[0]), cells[1]
            except (ValueError, IndexError):
                sys.exit("layering: %s:%d: a row starts | rank | layer |"
                         % (doc, no + 1))
            self.rank[layer] = rank
            for f in TICKED.findall(cells[2]):
                if f.endswith("/"):
                    self.folder[f[:-1]] = layer
                else:
                    self.file[f] = layer
            for h in TICKED.findall(cells[3]):
                self.public["include/keel/" + h] = layer

    def of(self, rel):
        """The layer of a repository path, None when it is in none."""
        if rel in self.file:
            return self.file[rel]
        folder = os.path.dirname(rel)
        if folder == "include/keel":
            return self.public.get(rel)
        return self.folder.get(folder)

    def breaks(self, me, them):
        """Why layer me may not use layer them, or None when it may."""
        if me == them or self.rank[them] < self.rank[me]:
            return None
        return "layer %s (rank %d) uses layer %s (rank %d)%s" % (
            me, self.rank[me], them, self.rank[them],
            "; siblings use neither each other"
            if self.rank[them] == self.rank[me] else "")


def include_check(src, lay, extra, errors):
    files = [(f + "/" + fn, os.path.join(src, f, fn))
             for f in sorted(lay.folder) + ["include/keel"]
             if os.path.isdir(os.path.join(src, f))
             for fn in sorted(os.listdir(os.path.join(src, f)))
             if fn.endswith((".c", ".h"))]
    files += [(f + "/" + os.path.basename(p), p) for f, p in extra]
    for rel, _ in files:
        if rel.startswith("include/keel/") and rel not in lay.public:
            errors.append("%s: public header in no layer (add it to the "
                          "table in docs/architecture.md)" % rel)
    checked = 0
    for rel, path in files:
        folder, me = os.path.dirname(rel), lay.of(rel)
        if me is None:
            continue
        with open(path, encoding="utf-8") as fh:
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
                if target not in lay.public:
                    errors.append("%s: no such public header" % where)
                    continue
            else:
                target = os.path.normpath(os.path.join(folder, name))
                if not os.path.exists(os.path.join(src, target)):
                    alt = os.path.normpath(os.path.join("util", name))
                    if not os.path.exists(os.path.join(src, alt)):
                        errors.append("%s: header not found" % where)
                        continue
                    target = alt        # -I util: "util.h"
            checked += 1
            tfolder, them = os.path.dirname(target), lay.of(target)
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
            why = lay.breaks(me, them)
            if why:
                errors.append("%s: %s" % (where, why))
    return len(files), checked


PREFIX = "libkeel_core_la-"


def objects(src, build, lay):
    """(source path, object path) of libkeel_core's objects per folder;
    an object whose source is gone (a stale build) is left out."""
    found = []
    for folder in sorted(lay.folder):
        for d in (os.path.join(build, folder, ".libs"),
                  os.path.join(build, folder)):
            if not os.path.isdir(d):
                continue
            names = sorted(n for n in os.listdir(d)
                           if n.startswith(PREFIX) and n.endswith(".o"))
            if names:
                found += [(rel, os.path.join(d, n)) for n in names
                          for rel in [folder + "/" + n[len(PREFIX):-2] + ".c"]
                          if os.path.exists(os.path.join(src, rel))]
                break
    return found


def symbols(nm, path):
    """(defined, used) global symbols of one object file."""
    out = subprocess.run([nm, "-P", "-g", path], check=True,
                         stdout=subprocess.PIPE,
                         universal_newlines=True).stdout
    defined, used = set(), set()
    for line in out.split("\n"):
        f = line.split()
        if len(f) < 2:
            continue
        (used if f[1] in ("U", "w", "v") else defined).add(f[0])
    return defined, used


def call_check(nm, objs, lay, errors):
    syms = {rel: symbols(nm, path) for rel, path in objs}
    owner = {}
    for rel, (defined, _) in syms.items():
        for s in defined:
            owner.setdefault(s, rel)
    uses, allowed, n = {}, set(), 0
    for rel, path in objs:
        me = lay.of(rel)
        for s in sorted(syms[rel][1]):
            other = owner.get(s)
            if other is None or other == rel:
                continue                # libc, HDF5, __asan_*: not keel's
            n += 1
            uses.setdefault(rel, set()).add(other)
            them = lay.of(other)
            why = lay.breaks(me, them)
            key = (rel, os.path.dirname(other))
            if why and key in CALL_ALLOW:
                allowed.add(key)
            elif why:
                errors.append("%s (%s): uses %s, defined in %s: %s" % (
                    os.path.relpath(path), rel, s, other, why))
    for key in sorted(set(CALL_ALLOW) - allowed):
        errors.append("CALL_ALLOW %s -> %s/ matches no call: remove it"
                      % key)
    mutual = sorted((a, b) for a in uses for b in uses[a]
                    if a < b and os.path.dirname(a) == os.path.dirname(b)
                    and a in uses.get(b, ()))
    for a, b in mutual:
        msg = "%s and %s use each other's symbols" % (a, b)
        if os.path.dirname(a) in MUTUAL_STRICT:
            errors.append(msg + " (%s/ is in MUTUAL_STRICT)"
                          % os.path.dirname(a))
        else:
            print("layering: note: " + msg)
    return n


def main():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--srcdir", default=os.environ.get("KEEL_SRCDIR") or here)
    ap.add_argument("--builddir", default=os.environ.get("KEEL_BUILDDIR"))
    ap.add_argument("--extra-source", action="append", default=[])
    ap.add_argument("--extra-object", action="append", default=[])
    a = ap.parse_args()
    src = os.path.abspath(a.srcdir)
    lay = Layout(src)

    def pairs(opts, what):
        out = [tuple(o.split("=", 1)) for o in opts]
        for o in out:
            if len(o) != 2 or o[0] not in lay.folder:
                sys.exit("layering: --extra-%s wants FOLDER=PATH, FOLDER a "
                         "folder of the table" % what)
        return out

    extra_src, extra_obj = pairs(a.extra_source, "source"), \
        pairs(a.extra_object, "object")
    errors = []
    nfiles, nincl = include_check(src, lay, extra_src, errors)
    summary = "%d files, %d keel includes" % (nfiles, nincl)
    nm = shutil.which((os.environ.get("NM") or "nm").split()[0])
    skipped = None
    if nm is None:
        skipped = "no nm"
    elif not a.builddir:
        skipped = "KEEL_BUILDDIR is not set"
    else:
        objs = objects(src, a.builddir, lay)
        if not objs:
            errors.append("no %s*.o under %s: build libkeel_core first"
                          % (PREFIX, a.builddir))
        objs += [(f + "/" + os.path.basename(p)[:-2] + ".c", p)
                 for f, p in extra_obj]
        nused = call_check(nm, objs, lay, errors)
        summary += ", %d objects, %d symbol uses" % (len(objs), nused)
    for e in errors:
        print("layering: " + e)
    print("layering: %s checked, %d violations" % (summary, len(errors)))
    if skipped:
        print("layering: call check skipped: " + skipped)
    if errors:
        return 1
    return 77 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
