/* smoke.c - the 10-line outside program: built against an installed keel
 * with only pkg-config's flags (tests/install/smoke.sh). */
#include <stdio.h>
#include <keel/keel.h>

int main(void)
{
    keel_vars *vs;
    int64_t shape[2] = { 784, 256 };
    if (KEEL_VERSION_CHECK() != KEEL_OK || keel_vars_new(&vs) != KEEL_OK ||
        keel_vars_create(vs, "dense/kernel", 2, shape, KEEL_VAR_TRAINABLE,
                         NULL) != KEEL_OK) {
        fprintf(stderr, "smoke: %s\n", keel_last_error());
        return 1;
    }
    printf("keel %s (built against %s): %zu variable, %zu bytes\n",
           keel_version(), KEEL_VERSION_STRING,
           keel_vars_count(vs), keel_vars_bytes(vs, 0));
    keel_vars_free(vs);
    return 0;
}
