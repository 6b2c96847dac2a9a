#!/bin/sh
# layering_plant.sh - tests/layering.py fails on a planted upward call and
# a planted upward #include, naming the symbol or header and both layers,
# and passes without them. Skips (77) only when nm is missing.
set -u
: "${KEEL_SRCDIR:?}" "${KEEL_BUILDDIR:?}"
py=${PYTHON3:-python3}
check="$KEEL_SRCDIR/tests/layering.py"
nm=${NM:-nm}
command -v "${nm%% *}" >/dev/null 2>&1 || { echo "SKIP: no nm"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/keel-layering-XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
pass=0
fail=0

# expect NAME WANT_RC PATTERN... -- ARGS: layering.py ARGS exits WANT_RC
# and its output holds every PATTERN (fixed strings).
expect() {
    name=$1 want=$2
    shift 2
    pats=
    while test "$1" != --; do pats="$pats
$1"; shift; done
    shift
    "$py" "$check" "$@" >"$dir/out" 2>&1
    rc=$?
    ok=1
    test "$rc" = "$want" || { echo "$name: exit $rc, expected $want"; ok=0; }
    printf '%s\n' "$pats" | while IFS= read -r p; do
        test -z "$p" && continue
        grep -qF -- "$p" "$dir/out" || { echo "$name: no '$p' in:"; exit 1; }
    done || ok=0
    if test $ok = 1; then pass=$((pass + 1)); else
        fail=$((fail + 1)); sed 's/^/  | /' "$dir/out"; fi
}

# The tree as it is passes (the baseline the plants must break).
expect clean 0 "0 violations" --

# A session/ object calling the parameter server (cluster/, rank 4).
cat >"$dir/plant_call.c" <<'EOF'
int keel_ps_run(void *cfg);
int plant_call(void) { return keel_ps_run(0); }
EOF
${CC:-cc} -c -o "$dir/plant_call.o" "$dir/plant_call.c" || exit 1
expect upward_call 1 "keel_ps_run" "session/plant_call.c" \
    "layer session (rank 3) uses layer cluster (rank 4)" -- \
    --extra-object "session=$dir/plant_call.o"

# The same object as a launch/ object (rank 5) is legal.
expect downward_call 0 "0 violations" -- \
    --extra-object "launch=$dir/plant_call.o"

# A hooks/ object calling the cluster: siblings of rank 4.
expect sibling_call 1 "keel_ps_run" \
    "layer hooks (rank 4) uses layer cluster (rank 4); siblings" -- \
    --extra-object "hooks=$dir/plant_call.o"

# Two files of one folder using each other: an error (every folder is in
# MUTUAL_STRICT).
printf 'int plant_b(int);\nint plant_a(int n) { return n ? plant_b(n - 1) : 0; }\n' \
    >"$dir/plant_a.c"
printf 'int plant_a(int);\nint plant_b(int n) { return n ? plant_a(n - 1) : 1; }\n' \
    >"$dir/plant_b.c"
${CC:-cc} -c -o "$dir/plant_a.o" "$dir/plant_a.c" || exit 1
${CC:-cc} -c -o "$dir/plant_b.o" "$dir/plant_b.c" || exit 1
expect mutual_strict 1 \
    "cluster/plant_a.c and cluster/plant_b.c use each other's symbols" -- \
    --extra-object "cluster=$dir/plant_a.o" \
    --extra-object "cluster=$dir/plant_b.o"
expect mutual_strict_app 1 \
    "app/plant_a.c and app/plant_b.c use each other's symbols" -- \
    --extra-object "app=$dir/plant_a.o" --extra-object "app=$dir/plant_b.o"
expect mutual_strict_launch 1 \
    "launch/plant_a.c and launch/plant_b.c use each other's symbols" -- \
    --extra-object "launch=$dir/plant_a.o" \
    --extra-object "launch=$dir/plant_b.o"

# A train/ source including the session's public header.
printf '#include <keel/session.h>\n' >"$dir/plant_incl.c"
expect upward_include 1 "train/plant_incl.c:1: #include <keel/session.h>" \
    "layer train (rank 2) uses layer session (rank 3)" -- \
    --extra-source "train=$dir/plant_incl.c"

# ... and a private header of another folder, not a listed seam.
printf '#include "../cluster/cluster_int.h"\n' >"$dir/plant_priv.c"
expect private_include 1 "cluster/cluster_int.h is private to cluster/" -- \
    --extra-source "app=$dir/plant_priv.c"

echo "layering_plant: $pass passed, $fail failed"
test $fail = 0
