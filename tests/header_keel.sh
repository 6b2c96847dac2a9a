#!/bin/sh
# header_keel.sh - keel/keel.h compiles on its own, warning-free, against
# the source and build include directories, and declares nothing of the
# trainer app or the launcher (tests/header_keel.c says how).
set -eu
: "${KEEL_SRCDIR:?}" "${KEEL_BUILDDIR:?}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/keel-header-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cc=${KEEL_CC:-cc}
for std in gnu11 c11; do
    # shellcheck disable=SC2086
    if ! $cc -std=$std -Wall -Wextra -Werror -c -o "$tmp/header_keel.o" \
         -I"$KEEL_SRCDIR/include" -I"$KEEL_BUILDDIR/include" \
         "$KEEL_SRCDIR/tests/header_keel.c"; then
        echo "header_keel: keel/keel.h alone does not compile (-std=$std)," \
             "or it declares the app's or the launcher's names" >&2
        exit 1
    fi
done
echo "header_keel: keel/keel.h alone compiles (gnu11, c11) and declares" \
     "no app or launcher names"
