#!/usr/bin/env bash
# bench/before_after.sh - keel's hot paths before and after a change, in
# one run: builds keel at git revision REV (before) in a temporary
# directory, then measures it against the build in BUILD_DIR (after),
# the two alternating within every round and taking turns going first:
#   - the one-process training step (bench/train.sh with KEEL_BEFORE:
#     bench/train_bench, OpenBLAS threads 1 and 2, 2 model threads);
#   - a sync and an async parameter-server cluster, 1 ps + 2 workers
#     (bench/cluster_train.sh with KEEL_BEFORE_BIN, `keel train` with
#     TF_CONFIG, PyTorch left out).
# Prints the machine and the OpenBLAS kernel, then per case the medians
# over rounds, after/before, the per-round ratios' range and in how many
# rounds after was the slower one.
# The old tree needs only `make keel bench/train_bench` to build them, and
# both programs to take the options the current scripts pass.
#   usage: bench/before_after.sh REV [BUILD_DIR]
#          (REV: any git revision of this repository; BUILD_DIR: the
#          configured build of the working tree, default ../_build)
#   env:   ROUNDS=5 MODELS=mlp BATCHES=64 SEG=1 (train_bench's seconds a
#          segment) CORETYPES=<the kernel OpenBLAS picks on this CPU>
#          MODES="sync async" CLUSTER_BATCHES=64 EXAMPLES=12800 (a
#          cluster run's examples) RUN_TIMEOUT=300 (seconds one process
#          or cluster run may take) BUILD_TIMEOUT=1800
#          CONFIGURE_FLAGS=<none> BENCH_OUT=<a fresh mktemp -d, kept>
#          BEFORE_DIR=<a directory for REV's build, kept and reused by
#          the next run with the same commit; default a temporary one,
#          removed on exit>
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
me=before_after.sh
if [ $# -lt 1 ] || [ $# -gt 2 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
fi
rev=$1
build=$(cd "${2:-$here/../_build}" 2>/dev/null && pwd) || {
    echo "$me: no build directory ${2:-$here/../_build}: configure one first" \
         "(./autogen.sh && mkdir _build && cd _build && ../configure)" >&2
    exit 2
}
[ -f "$build/Makefile" ] || {
    echo "$me: $build has no Makefile: run configure there first" >&2; exit 2; }
repo=$(git -C "$here" rev-parse --show-toplevel)
commit=$(git -C "$repo" rev-parse --verify --quiet "$rev^{commit}") || {
    echo "$me: '$rev' is no commit of $repo (git log --oneline lists them)" >&2
    exit 2
}
ROUNDS=${ROUNDS:-5}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-1800}
. "$here/common.sh"
if [ -z "${CORETYPES:-}" ]; then
    CORETYPES=${OPENBLAS_CORETYPE:-$(bench_blas_core)}
    [ "$CORETYPES" != unknown ] || CORETYPES=$(bench_coretypes | cut -d' ' -f1)
fi
# The old tree's build: BEFORE_DIR/{src,build}, marked as ours by
# BEFORE_DIR/.keel-before-after so that no other directory is emptied.
if [ -n "${BEFORE_DIR:-}" ]; then
    mkdir -p "$BEFORE_DIR"
    tmp=$(cd "$BEFORE_DIR" && pwd)
    if [ ! -e "$tmp/.keel-before-after" ] && [ -n "$(ls -A "$tmp")" ]; then
        echo "$me: BEFORE_DIR=$tmp is neither empty nor an earlier" \
             "$me build directory" >&2
        exit 2
    fi
else
    tmp=$(mktemp -d /tmp/keel-before.XXXXXX)
    cleanup() { rm -rf "$tmp"; }
    trap cleanup EXIT
fi
trap 'exit 130' INT TERM
touch "$tmp/.keel-before-after"
OUT=$(bench_out_dir keel-before-after)

build_before() {   # called as a condition: no set -e here, hence the &&
    rm -rf "$tmp/src" "$tmp/build" "$tmp/built-commit" &&
    mkdir -p "$tmp/src" "$tmp/build" &&
    git -C "$repo" archive "$commit" | tar -x -C "$tmp/src" &&
    timeout "$BUILD_TIMEOUT" bash -c '
        set -e
        cd "$1/src" && ./autogen.sh
        cd "$1/build" && "$1/src/configure" --quiet $2
        make -j2 keel bench/train_bench' _ "$tmp" "${CONFIGURE_FLAGS:-}"
}

short=$(git -C "$repo" rev-parse --short "$commit")
echo "$me: before = $rev ($short), built in $tmp; after = $build;" \
     "logs in $OUT" >&2
if [ "$(cat "$tmp/built-commit" 2>/dev/null)" = "$commit" ]; then
    echo "$me: reusing the build of $short in $tmp" >&2
elif build_before > "$OUT/build-before.log" 2>&1; then
    echo "$commit" > "$tmp/built-commit"
else
    tail -n 20 "$OUT/build-before.log" >&2
    echo "$me: building $rev ($short) failed or took over ${BUILD_TIMEOUT}s;" \
         "its log: $OUT/build-before.log" >&2
    exit 1
fi
if ! make -s -C "$build" keel bench/train_bench > "$OUT/build-after.log" 2>&1
then
    tail -n 20 "$OUT/build-after.log" >&2
    echo "$me: building $build failed; its log: $OUT/build-after.log" >&2
    exit 1
fi
for f in keel bench/train_bench; do
    for d in "$tmp/build" "$build"; do
        [ -x "$d/$f" ] || { echo "$me: the build left no $d/$f" >&2; exit 1; }
    done
done

bench_machine | tee "$OUT/machine.txt" >&2
failed=""
echo "== one-process training step (bench/train.sh, CORETYPES=$CORETYPES)" >&2
if ! KEEL_BEFORE="$tmp/build/bench/train_bench" TORCH=0 ROUNDS=$ROUNDS \
        CORETYPES=$CORETYPES MODELS=${MODELS:-mlp} BATCHES=${BATCHES:-64} \
        SEG=${SEG:-1} RUN_TIMEOUT=$RUN_TIMEOUT BENCH_OUT="$OUT/train" \
        "$here/train.sh" throughput "$build" > "$OUT/train.txt"; then
    failed="$failed train"
fi
echo "== ps clusters (bench/cluster_train.sh, MODES=${MODES:-sync async})" >&2
if ! KEEL_BEFORE_BIN="$tmp/build/keel" DDP=0 LAT_REPS=0 ROUNDS=$ROUNDS \
        MODES=${MODES:-sync async} BATCHES=${CLUSTER_BATCHES:-64} \
        EXAMPLES=${EXAMPLES:-12800} RUN_TIMEOUT=$RUN_TIMEOUT \
        BENCH_OUT="$OUT/cluster" "$here/cluster_train.sh" "$build" \
        > "$OUT/cluster.txt"; then
    failed="$failed cluster"
    cat "$OUT/cluster.txt" >&2
fi

# the tree BUILD_DIR was configured from, and its commit
asrc=$(cd "$(sed -n 's/^abs_top_srcdir = //p' "$build/Makefile")" && pwd)
ahead=$(git -C "$asrc" rev-parse --short HEAD 2>/dev/null || echo '?')
git -C "$asrc" diff --quiet HEAD 2>/dev/null || ahead="$ahead + uncommitted changes"
echo
echo "before: $rev ($short); after: $asrc at $ahead, built in $build"
cat "$OUT/machine.txt"
/usr/bin/python3 - "$OUT" <<'PY'
import json, os, statistics, sys
from collections import defaultdict
out = sys.argv[1]
def rows(path):
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.strip()]
cases = defaultdict(lambda: {"before": {}, "after": {}})   # case -> kind -> round -> ex/s
kernels = {}
for kind, f in (("after", "train/keel.jsonl"), ("before", "train/before.jsonl")):
    for r in rows(f"{out}/{f}"):
        if r.get("bench") != "keel_train_tput":
            continue
        kernels[r["coretype"]] = r.get("corename", "?")
        case = "step %s b%d threads=%s (%s)" % (r["model"], r["batch"], r["threads"], r["coretype"])
        cases[case][kind][r["round"]] = r["median"]
for r in rows(f"{out}/cluster/keel.jsonl"):
    if "examples_per_s" not in r or any(r["rcs"]) or "timeout_s" in r:
        continue
    case = "%s ps cluster 1ps+2w b%d" % (r["mode"], r["global_batch"])
    cases[case][r["kind"]][r["round"]] = r["examples_per_s"]
for core, name in sorted(kernels.items()):
    print(f"OpenBLAS kernel of the one-process runs: OPENBLAS_CORETYPE={core} -> {name}")
print("cluster runs: OPENBLAS_CORETYPE=%s" % os.environ.get("OPENBLAS_CORETYPE", "unset (the machine line's kernel)"))
print()
print("| case (examples/s) | before | after | after/before | per-round after/before | rounds after slower |")
print("|---|---|---|---|---|---|")
for case, v in cases.items():
    b, a = v["before"], v["after"]
    common = sorted(set(b) & set(a))
    if not common:
        print(f"| {case} | - | - | - | no complete round | - |")
        continue
    mb = statistics.median(b[i] for i in common)
    ma = statistics.median(a[i] for i in common)
    ratios = [a[i] / b[i] for i in common]
    slower = sum(x < 1 for x in ratios)
    print(f"| {case} | {mb:.0f} | {ma:.0f} | {ma / mb:.3f} | "
          f"{min(ratios):.3f}..{max(ratios):.3f} | {slower}/{len(common)} |")
PY
if [ -n "$failed" ]; then
    echo "$me: failed:$failed (logs in $OUT)" >&2
    exit 1
fi
