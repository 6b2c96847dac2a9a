#!/bin/sh
# docs_commands.sh - the shell blocks of README.md and docs/*.md run as
# written. Every ```sh block follows one of two marker lines (at most two
# lines above it):
#   <!-- run by tests/docs_commands.sh -->
#   <!-- not run by tests/docs_commands.sh: REASON -->
# A block without one fails the test (file and line named), so a new block
# is either run or says why not; so does a command line in an indented code
# block (four spaces after a blank line, starting with keel, ./, cc, make,
# python3, srun, sbatch, mpirun, kubectl and the like), which no block
# marker can reach. Run blocks execute line by line (set -e)
# in a temporary directory holding examples/*.c, with the build's keel on
# PATH, pkg-config answering for the build tree and /tmp/ rewritten to the
# temporary directory (in a sanitizer build, keel.pc carries the
# sanitizer flags, as a program linking that libkeel needs). The compile
# lines in the examples' headers
# (" *   cc ...") are run the same way.
set -eu
src="$KEEL_SRCDIR"
build="$KEEL_BUILDDIR"
dir=$(mktemp -d "${TMPDIR:-/tmp}/keel-docs-XXXXXX")
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/pc" "$dir/bin" "$dir/tmp"
cat >"$dir/pc/keel.pc" <<PC
Name: keel
Description: keel from its build tree
Version: 0
Cflags: -I$build/include -I$src/include ${KEEL_SAN_LDFLAGS:-}
Libs: -L$build/.libs -lkeel ${KEEL_SAN_LDFLAGS:-}
PC
ln -s "$build/keel" "$dir/bin/keel"
cp "$src"/examples/*.c "$dir/"
PATH="$dir/bin:$PATH"
PKG_CONFIG_PATH="$dir/pc"
LD_LIBRARY_PATH="$build/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH PKG_CONFIG_PATH LD_LIBRARY_PATH
unset TF_CONFIG SLURM_PROCID || true

# Each block as "FILE:LINE<TAB>MODE" then its lines, ending "@@end".
for f in "$src/README.md" "$src"/docs/*.md; do
    awk -v F="${f#"$src"/}" '
        /<!-- run by tests\/docs_commands.sh -->/ { mark = "run"; at = NR }
        /<!-- not run by tests\/docs_commands.sh: / { mark = "skip"; at = NR }
        /^```sh$/ {
            m = (mark != "" && NR - at <= 2) ? mark : "none"
            print F ":" NR "\t" m; on = 1; mark = ""; next }
        on && /^```$/ { print "@@end"; on = 0; next }
        on { print; next }
        /^```/ { fence = !fence; next }
        !fence && prev ~ /^[ \t]*$/ && /^    (\.\/[^ ]+|keel|cc|make|python3|sh|srun|sbatch|salloc|mpirun|kubectl|export|[A-Z_]+=)[ ]/ {
            print F ":" NR "\tindented"; print "@@end" }
        { prev = $0 }' "$f"
done >"$dir/blocks"

fail=0 ran=0 skipped=0 head= mode=
while IFS= read -r line; do
    case "$line" in
    @@end)
        if [ "$mode" = run ]; then
            if ! (cd "$dir" && sh -e "$dir/block.sh") >"$dir/out" 2>&1; then
                echo "FAIL $head:"; cat "$dir/block.sh"; tail -20 "$dir/out"
                fail=$((fail + 1))
            else
                ran=$((ran + 1))
            fi
        elif [ "$mode" = none ]; then
            echo "FAIL $head: a sh block with no run / not-run marker"
            fail=$((fail + 1))
        elif [ "$mode" = indented ]; then
            echo "FAIL $head: a command in an indented code block: make it" \
                 "a \`\`\`sh block with a run / not-run marker"
            fail=$((fail + 1))
        else
            skipped=$((skipped + 1))
        fi
        mode= ;;
    *"	run"|*"	skip"|*"	none"|*"	indented")
        head=${line%"	"*}; mode=${line##*"	"}; : >"$dir/block.sh" ;;
    *)
        printf '%s\n' "$line" | sed "s|/tmp/|$dir/tmp/|g" >>"$dir/block.sh" ;;
    esac
done <"$dir/blocks"

# The examples' compile lines, as their headers give them.
for ex in "$src"/examples/*.c; do
    sed -n 's|^ \*   \(cc .*\)$|\1|p' "$ex" >"$dir/block.sh"
    [ -s "$dir/block.sh" ] || continue
    if ! (cd "$dir" && sh -e "$dir/block.sh") >"$dir/out" 2>&1; then
        echo "FAIL examples/${ex##*/}'s compile line:"; cat "$dir/block.sh"
        tail -20 "$dir/out"; fail=$((fail + 1))
    else
        ran=$((ran + 1))
    fi
done
[ "$ran" -ge 3 ] || { echo "docs_commands: only $ran blocks ran"; fail=$((fail + 1)); }
echo "docs_commands: $ran run, $skipped not run (marked), $fail failed"
[ "$fail" -eq 0 ]
