/* placement.c - which ps holds each variable: the same placement on every
 * task, computed from the variable list alone (names, shapes, order). */
#include <config.h>

#include <stdint.h>
#include <stdlib.h>

#include "cluster_int.h"
#include "role_int.h"

keel_status
keel__cluster_place(const keel_vars *vs, int n_ps, int round_robin,
                    int *ps_of)
{
    size_t n = keel_vars_count(vs), rr = 0;
    uint64_t *load;
    if (n_ps < 1)
        return keel__fail(KEEL_EINVAL, "placement: the cluster has no ps");
    load = calloc((size_t)n_ps, sizeof *load);
    if (load == NULL)
        return keel__fail(KEEL_ENOMEM, "placement: %d ps", n_ps);
    for (size_t i = 0; i < n; i++) {
        keel_var *v = keel_vars_at(vs, i);
        int best = 0;
        if (keel_var_flags(v) & KEEL_VAR_LOCAL) {
            ps_of[i] = -1;
            continue;
        }
        if (round_robin) {
            best = (int)(rr++ % (size_t)n_ps);
        } else {                /* least loaded so far; ties: lowest */
            for (int p = 1; p < n_ps; p++)
                if (load[p] < load[best])
                    best = p;
        }
        load[best] += keel_var_tensor(v)->count;
        ps_of[i] = best;
    }
    free(load);
    return KEEL_OK;
}
