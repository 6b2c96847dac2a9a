#!/usr/bin/env python3
"""deploy_manifest.py - the TFJob manifest of docs/deploy.md works as written.

The YAML block after the "<!-- deploy manifest -->" line of docs/deploy.md
must parse and hold what the page promises: a ConfigMap with the job's
config, a PersistentVolumeClaim, and a kubeflow.org/v1 TFJob with Chief, PS,
Worker and Evaluator replica specs whose container is named "tensorflow"
(the one the operator writes TF_CONFIG into), runs `keel train` on the
ConfigMap's file, sets OUTPUT_DIR to the claim's mount and takes
KEEL_CLUSTER_TOKEN from a Secret.

Then, for every pod of the job, the TF_CONFIG the training operator writes
(its genClusterSpec and genTFConfigJSONStr: every replica type but the
evaluator in the cluster, lower-cased, NAME-TYPE-INDEX.NAMESPACE.svc:PORT
with the port of the container's "tfjob-port", else 2222; the task; the
"environment": "cloud" member) goes to `keel config check` with the
ConfigMap's config, which must accept it and name the pod's task. The
service names resolve, as in the pod, through a private /etc/hosts in a
mount namespace of its own (the pod's own name to 127.0.0.1, the others to
other loopback addresses); without one (not root, no unshare) keel must
fail on nothing but the names' resolution.

Exit 77 (skip) without PyYAML.

usage: deploy_manifest.py   (KEEL_SRCDIR and KEEL_BUILDDIR set, as by make)
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    print("SKIP: deploy_manifest.py: PyYAML is not installed "
          "(apt-get install python3-yaml)")
    sys.exit(77)

SRC = os.environ.get("KEEL_SRCDIR",
                     os.path.join(os.path.dirname(__file__), ".."))
BUILD = os.environ.get("KEEL_BUILDDIR", ".")
KEEL = os.path.join(BUILD, "keel")
OPERATOR_TYPES = ("Chief", "Master", "PS", "Worker", "Evaluator")
DEFAULT_PORT = 2222
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def manifest_text():
    lines = open(os.path.join(SRC, "docs", "deploy.md")).read().split("\n")
    for i, line in enumerate(lines):
        if line.strip() == "<!-- deploy manifest -->":
            if lines[i + 1] != "```yaml":
                sys.exit("docs/deploy.md:%d: no ```yaml block after the "
                         "marker" % (i + 2))
            end = lines.index("```", i + 2)
            return "\n".join(lines[i + 2:end])
    sys.exit("docs/deploy.md: no '<!-- deploy manifest -->' line")


def container(spec):
    for c in spec["template"]["spec"]["containers"]:
        if c.get("name") == "tensorflow":
            return c
    return None


def port_of(spec):
    """The operator's GetPortFromTFJob."""
    c = container(spec)
    for p in (c or {}).get("ports", []) or []:
        if p.get("name") == "tfjob-port":
            return p["containerPort"]
    return DEFAULT_PORT


def check_objects(docs):
    kinds = {d["kind"]: d for d in docs if d}
    for k in ("ConfigMap", "PersistentVolumeClaim", "TFJob"):
        if k not in kinds:
            sys.exit("the manifest has no %s" % k)
    cm, pvc, job = kinds["ConfigMap"], kinds["PersistentVolumeClaim"], \
        kinds["TFJob"]
    if job.get("apiVersion") != "kubeflow.org/v1":
        fail("TFJob apiVersion %r, want kubeflow.org/v1"
             % job.get("apiVersion"))
    specs = job["spec"]["tfReplicaSpecs"]
    for rtype in specs:
        if rtype not in OPERATOR_TYPES:
            fail("replica type %r (the operator knows %s)"
                 % (rtype, ", ".join(OPERATOR_TYPES)))
    for rtype in ("Chief", "PS", "Worker", "Evaluator"):
        if rtype not in specs:
            fail("no %s replica spec" % rtype)
    if specs.get("Evaluator", {}).get("replicas", 1) != 1:
        fail("more than one evaluator")
    if "ReadWriteMany" not in pvc["spec"].get("accessModes", []):
        fail("the output claim is not ReadWriteMany (chief and evaluator "
             "are different pods)")
    config_file = None
    for rtype, spec in specs.items():
        c = container(spec)
        if c is None:
            fail("%s: no container named 'tensorflow'" % rtype)
            continue
        if spec.get("restartPolicy") not in (None, "Always", "OnFailure",
                                             "Never", "ExitCode"):
            fail("%s: restartPolicy %r" % (rtype, spec.get("restartPolicy")))
        cmd = c.get("command", [])
        if cmd[:2] != ["keel", "train"] or len(cmd) != 3:
            fail("%s: command %r is not keel train CONFIG" % (rtype, cmd))
            continue
        vols = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
        mounts = {m["mountPath"]: vols.get(m["name"], {})
                  for m in c.get("volumeMounts", [])}
        env = {e["name"]: e for e in c.get("env", [])}
        cdir, cname = os.path.split(cmd[2])
        cvol = mounts.get(cdir, {})
        if cvol.get("configMap", {}).get("name") != cm["metadata"]["name"] \
                or cname not in cm["data"]:
            fail("%s: %s is not the ConfigMap's %s" % (rtype, cmd[2], cname))
        config_file = cname
        out = env.get("OUTPUT_DIR", {}).get("value")
        ovol = mounts.get(out, {})
        if ovol.get("persistentVolumeClaim", {}).get("claimName") != \
                pvc["metadata"]["name"]:
            fail("%s: OUTPUT_DIR %r is not the claim's mount" % (rtype, out))
        ref = env.get("KEEL_CLUSTER_TOKEN", {}).get("valueFrom", {}) \
            .get("secretKeyRef", {})
        if not ref.get("name") or not ref.get("key"):
            fail("%s: KEEL_CLUSTER_TOKEN does not come from a Secret"
                 % rtype)
    return job, cm["data"][config_file]


def operator_cluster(job):
    """genClusterSpec: every replica type but the evaluator."""
    name = job["metadata"]["name"]
    ns = job["metadata"].get("namespace", "default")
    cluster = {}
    for rtype, spec in job["spec"]["tfReplicaSpecs"].items():
        if rtype == "Evaluator":
            continue
        rt = rtype.lower()
        port = port_of(spec)
        cluster[rt] = ["%s-%s-%d.%s.svc:%d" % (name, rt, i, ns, port)
                       for i in range(spec.get("replicas", 1))]
    return cluster


def tf_config(cluster, rt, index):
    """genTFConfigJSONStr (Go's encoding/json: struct order, sorted map
    keys, no spaces)."""
    return json.dumps({"cluster": dict(sorted(cluster.items())),
                       "task": {"type": rt, "index": index},
                       "environment": "cloud"}, separators=(",", ":"))


def hosts_file(path, cluster, own):
    names = [a.rsplit(":", 1)[0] for job in sorted(cluster)
             for a in cluster[job]]
    with open(path, "w") as f:
        f.write("127.0.0.1 localhost\n")
        k = 2
        for n in names:
            if n == own:
                f.write("127.0.0.1 %s\n" % n)
            else:
                f.write("127.0.0.%d %s\n" % (k, n))
                k += 1


def can_unshare():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True,
                          timeout=30).returncode == 0


def main():
    if not os.access(KEEL, os.X_OK):
        sys.exit("deploy_manifest.py: no keel in KEEL_BUILDDIR (%s)" % BUILD)
    docs = list(yaml.safe_load_all(manifest_text()))
    job, config = check_objects(docs)
    cluster = operator_cluster(job)
    private = can_unshare()
    if not private:
        print("deploy_manifest.py: no mount namespace (needs root and "
              "unshare): checking that only name resolution fails")
    tmp = tempfile.mkdtemp(prefix="keel-deploy-")
    try:
        cfg = os.path.join(tmp, "job.ini")
        with open(cfg, "w") as f:
            f.write(config)
        out_dir = os.path.join(tmp, "output")
        pods = [(rt, i) for rt in sorted(cluster)
                for i in range(len(cluster[rt]))] + [("evaluator", 0)]
        for rt, i in pods:
            tf = tf_config(cluster, rt, i)
            env = dict(os.environ, TF_CONFIG=tf, OUTPUT_DIR=out_dir,
                       KEEL_CLUSTER_TOKEN="0123456789abcdef0123456789abcdef")
            env.pop("SLURM_PROCID", None)
            own = cluster[rt][i].rsplit(":", 1)[0] if rt in cluster else ""
            argv = [KEEL, "config", "check", cfg]
            if private:
                hosts = os.path.join(tmp, "hosts")
                hosts_file(hosts, cluster, own)
                argv = ["unshare", "-m", "sh", "-c",
                        'mount --bind "$0" /etc/hosts && exec "$@"',
                        hosts] + argv
            else:
                argv += ["-s", "cluster.max_wait_secs=1"]
            r = subprocess.run(argv, env=env, capture_output=True, text=True,
                               timeout=120)
            who = "%s %d (TF_CONFIG=%s)" % (rt, i, tf)
            if private:
                want = "# cluster (this task: %s %d" % (rt, i)
                if r.returncode != 0 or want not in r.stdout:
                    fail("%s: keel config check exit %d, want '%s':\n%s%s"
                         % (who, r.returncode, want, r.stdout[-800:],
                            r.stderr))
                elif out_dir not in r.stdout:
                    fail("%s: checkpoint.dir is not OUTPUT_DIR:\n%s"
                         % (who, r.stdout))
                elif (rt == "chief") != ("%d, chief)" % i in r.stdout):
                    fail("%s: the chief is not the Chief pod:\n%s"
                         % (who, r.stdout))
            else:
                problems = re.sub(r"host '[^']*' does not resolve[^;]*", "",
                                  r.stderr)
                if r.returncode != 2 or "does not resolve" not in r.stderr \
                        or "problem" in problems:
                    fail("%s: want exit 2 for the names alone, got %d:\n%s"
                         % (who, r.returncode, r.stderr))
        print("deploy_manifest.py: %d pods' TF_CONFIG checked%s"
              % (len(pods), "" if private else " (names unresolved)"))
    finally:
        shutil.rmtree(tmp)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
