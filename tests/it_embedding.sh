#!/bin/sh
# it_embedding.sh - examples/embedding (a click model on hashed features in
# an embedding table whose gradient is rows, lazy Adagrad) on a data set
# examples/make_clicks.py draws from a known model: the loss falls from
# ln 2 towards the set's Bayes loss in 300 steps; the same program as the
# chief of 4 ps (keel launch) ends with the bits of the run alone (Adagrad's
# lazy update is the dense one's bits, and one replica's example-weighted
# mean is its own gradient), pushing the table's gradient as rows and
# pulling only the rows a step reads: far fewer bytes per step than the
# dense table.
set -eu
bin="$KEEL_BUILDDIR/examples/embedding"
keel="$KEEL_BUILDDIR/keel"
py="${PYTHON3:-python3}"
if ! "$py" -c 'import h5py, numpy' 2>/dev/null; then
    echo "it_embedding: skipped: $py has no h5py or numpy"
    exit 77
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/keel-embedding-XXXXXX")
trap 'rm -rf "$dir"' EXIT
"$py" "$KEEL_SRCDIR/examples/make_clicks.py" "$dir/clicks.h5" --n 20000 \
    --vocab 4096 --seed 1
timeout 120 "$bin" "$dir/clicks.h5" "$dir/r1" 300 4096 >"$dir/r1.out" \
    2>"$dir/r1.err" || { cat "$dir/r1.err"; exit 1; }
cat "$dir/r1.out"
first=$(awk '$1 == "step" { print $4; exit }' "$dir/r1.out")
last=$(awk '$1 == "step" && $2 == "300:" { print $4 }' "$dir/r1.out")
if ! awk -v f="$first" -v l="$last" 'BEGIN { exit !(f != "" && l != "" &&
        l < f - 0.1 && l < 0.55) }'; then
    echo "embedding: the loss went from $first to $last in 300 steps" \
         "(want a fall of 0.1 or more, to below 0.55)"
    exit 1
fi
cd "$dir"
if ! timeout 120 "$keel" launch --ps 4 --workers 0 --no-status -- \
        "$bin" "$dir/clicks.h5" "$dir/r4" 300 4096 >"$dir/launch" 2>&1; then
    echo "keel launch with 4 ps failed:"; tail -20 "$dir/launch"
    exit 1
fi
if ! "$keel" ckpt diff "$dir/r1/model.ckpt-300.h5" \
        "$dir/r4/model.ckpt-300.h5"; then
    echo "embedding: the chief of 4 ps differs from one process"
    exit 1
fi
# the table's gradient is pushed as rows: a step's 128 examples x 8
# fields touch at most 1024 of its 4096 rows (40 bytes each with the id),
# so the push is far below the dense table (4096 x 8 floats)
dense=$((4096 * 8 * 4))
pushed=$(sed -n 's/.*chief 0: per step.*bytes pushed \([0-9]*\).*/\1/p' \
    "$dir/launch" | tail -1)
if [ -z "$pushed" ] || [ "$pushed" -ge $((dense / 2)) ]; then
    echo "embedding: the chief pushed '${pushed:-?}' bytes per step; the" \
         "table alone is $dense dense (want under half: rows, not the" \
         "table)"
    grep 'per step' "$dir/launch"
    exit 1
fi
# and pulls only the rows a step reads (a row variable, PULL_ROWS): at
# most 1024 rows of 32 bytes, w and b, against the table's 131072 bytes
# that each push's reply carried before
pulled=$(sed -n 's/.*chief 0: per step.*, pulled \([0-9]*\).*/\1/p' \
    "$dir/launch" | tail -1)
if [ -z "$pulled" ] || [ "$pulled" -gt $((1024 * 32 + 64)) ] ||
        [ "$pulled" -lt 1024 ]; then
    echo "embedding: the chief pulled '${pulled:-?}' bytes per step (want" \
         "the rows the step read: at most $((1024 * 32 + 64)))"
    grep 'per step' "$dir/launch"
    exit 1
fi
echo "embedding: the chief pushed $pushed and pulled $pulled bytes per" \
     "step (the table is $dense dense)"
echo "embedding: 4 passed, 0 failed"
