#!/usr/bin/env bash
# smoke.sh BUILDDIR - install keel into a temporary DESTDIR, then compile and
# run an outside program with `cc $(pkg-config --cflags --libs keel)` only.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")" && pwd)
dest=$(mktemp -d "${TMPDIR:-/tmp}/keel-install-XXXXXX")
trap 'rm -rf "$dest"' EXIT
make -C "$build" --no-print-directory install DESTDIR="$dest" >/dev/null
. "$src/../common.sh"
libdir=$(keel_pc_libdir "$build")
prefix=$(sed -n 's/^prefix=//p' "$build/keel.pc")
export PKG_CONFIG_PATH="$dest$libdir/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$dest"
# shellcheck disable=SC2046
cc -o "$dest/smoke" "$src/smoke.c" $(pkg-config --cflags --libs keel)
out=$(LD_LIBRARY_PATH="$dest$libdir" "$dest/smoke")
# README's library example compiles, warning-free, against what was installed.
awk '/^```c$/ { on = 1; next } /^```$/ { if (on) exit } on' \
    "$src/../../README.md" > "$dest/readme_snippet.c"
test -s "$dest/readme_snippet.c"
# shellcheck disable=SC2046
cc -Wall -Wextra -Werror -c -o "$dest/readme_example.o" -I"$dest" \
   "$src/readme_example.c" $(pkg-config --cflags keel)
# So do the doc blocks marked "compiled by tests/install/smoke.sh".
for doc in "$src"/../../docs/*.md; do
    awk '/<!-- compiled by tests\/install\/smoke.sh -->/ { want = 1; next }
         want && /^```c$/ { on = 1; want = 0; next }
         on && /^```$/ { on = 0; next } on' "$doc" > "$dest/doc_block.c"
    [ -s "$dest/doc_block.c" ] || continue
    { echo '#include <math.h>'; echo '#include <keel/keel.h>';
      cat "$dest/doc_block.c"; } > "$dest/doc_example.c"
    # shellcheck disable=SC2046
    cc -Wall -Wextra -Werror -c -o "$dest/doc_example.o" "$dest/doc_example.c" \
       $(pkg-config --cflags keel) ||
        { echo "install smoke: a code block of $doc does not compile" >&2; exit 1; }
    n_docs=$((${n_docs:-0} + 1))
done
[ "${n_docs:-0}" -ge 1 ]
# The trainer app's umbrella and the launcher's header are installed, and
# compile warning-free beside keel/keel.h.
printf '%s\n' '#include <keel/keel.h>' '#include <keel/app.h>' \
    '#include <keel/launch.h>' \
    'int main(void) { keel_config_free(NULL); keel_launch_free(NULL); return 0; }' \
    > "$dest/app_example.c"
# shellcheck disable=SC2046
cc -Wall -Wextra -Werror -c -o "$dest/app_example.o" "$dest/app_example.c" \
   $(pkg-config --cflags keel)
echo "$out"
grep -q '1 variable, 802816 bytes' <<<"$out"
test -f "$dest$prefix/share/man/man1/keel.1"
# The generated version header is installed, and agrees with keel.pc.
test -f "$dest$prefix/include/keel/version.h"
version=$(sed -n 's/^Version: //p' "$build/keel.pc")
grep -q "keel $version (built against $version)" <<<"$out"
test -x "$dest$prefix/bin/keel"
# Only keel_* symbols are exported.
bad=$(nm -D --defined-only "$dest$libdir/libkeel.so" | awk '{print $3}' | grep -v -E '^(keel_[a-z]|_init$|_fini$)' || true)
if [ -n "$bad" ]; then echo "install smoke: libkeel exports non-keel symbols: $bad" >&2; exit 1; fi
echo "install smoke: 2 passed, 0 failed"
