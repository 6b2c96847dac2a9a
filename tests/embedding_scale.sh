#!/bin/sh
# embedding_scale.sh - not part of `make check`: examples/embedding with a
# large row-variable table (default 16777216 rows x 64 floats, 4 GiB, and
# Adagrad's accumulator of the same size) on 4 ps, the chief and 2
# workers, sharded checkpoints; prints every task's peak RSS
# (/usr/bin/time -v) and the chief's bytes pushed and pulled per step.
# The table lives on one ps: that ps needs about three times its size
# (the table, the accumulator, the chief's INIT message); check the
# memory available first.
#   KEEL_BUILDDIR=_build tests/embedding_scale.sh [rows] [dim] [steps]
set -eu
rows=${1:-16777216}
dim=${2:-64}
steps=${3:-20}
: "${KEEL_BUILDDIR:?set KEEL_BUILDDIR to the build directory}"
: "${KEEL_SRCDIR:=$(cd "$(dirname "$0")/.." && pwd)}"
bin=$(cd "$KEEL_BUILDDIR" && pwd)/examples/embedding
keel=$(cd "$KEEL_BUILDDIR" && pwd)/keel
py="${PYTHON3:-/usr/bin/python3}"
dir=$(mktemp -d "${TMPDIR:-/tmp}/keel-embedding-scale-XXXXXX")
trap 'rm -rf "$dir"' EXIT
"$py" "$KEEL_SRCDIR/examples/make_clicks.py" "$dir/clicks.h5" --n 20000 \
    --vocab "$rows" --seed 1
# each task under /usr/bin/time -v, its report named by its role
cat >"$dir/timed.sh" <<'WRAP'
#!/bin/sh
role=$(/usr/bin/python3 -c 'import json, os
t = json.loads(os.environ["TF_CONFIG"])["task"]
print("%s%d" % (t["type"], t["index"]))')
exec /usr/bin/time -v -o "$TIMED_DIR/time.$role" "$@"
WRAP
chmod +x "$dir/timed.sh"
cd "$dir"
start=$(date +%s)
TIMED_DIR=$dir timeout 1800 "$keel" launch --ps 4 --workers 2 --no-status \
    -- "$dir/timed.sh" "$bin" "$dir/clicks.h5" "$dir/run" "$steps" "$rows" \
    sharded "$dim" >"$dir/launch" 2>&1 || {
    echo "embedding_scale: keel launch failed:"; tail -30 "$dir/launch"
    exit 1
}
echo "embedding_scale: $rows x $dim floats ($((rows * dim * 4 / 1048576))" \
     "MiB table), $steps steps in $(( $(date +%s) - start )) s"
grep 'per step' "$dir/launch" || true
for f in "$dir"/time.*; do
    kb=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$f")
    echo "  ${f##*/time.}: peak RSS $((kb / 1024)) MiB"
done
ls "$dir/run" | head -20
