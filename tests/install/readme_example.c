/* readme_example.c - README's "library in ten lines" compiled as it stands
 * against the installed headers (tests/install/smoke.sh pastes the block
 * in as readme_snippet.c), so the example cannot drift from the API. */
#include <stdio.h>
#include <keel/keel.h>

static keel_status
step(void *ctx, keel_step *st)
{
    (void)ctx;
    (void)st;
    return KEEL_OK;
}

int readme_example(keel_vars *vs, keel_cluster_spec *spec,
                   const keel_optimizer_config *opt, const keel_hook *hook);

int
readme_example(keel_vars *vs, keel_cluster_spec *spec,
               const keel_optimizer_config *opt, const keel_hook *hook)
{
    keel_optimizer_config sgd = *opt;
    keel_hook stop = *hook;
    keel_session *s = NULL;
#include "readme_snippet.c"
    keel_session_free(s);
    return 0;
}
