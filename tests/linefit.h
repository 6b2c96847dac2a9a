/* linefit.h - the model the small test programs train (session_child,
 * cluster_child), as a user's own step would: y = 3x + 1 fitted by the
 * variables "w" and "b" on the samples x = (position % 10) / 10. */
#ifndef KEEL_TESTS_LINEFIT_H
#define KEEL_TESTS_LINEFIT_H

#include <keel/keel.h>

/* The squared error's gradients at sample position into the step's
 * gradients; returns the error. */
static inline double
linefit_grads(keel_step *st, int64_t position)
{
    keel_vars *vs = keel_step_vars(st);
    keel_grads *g = keel_step_grads(st);
    const float *w = keel_var_tensor(keel_vars_find(vs, "w"))->data;
    const float *b = keel_var_tensor(keel_vars_find(vs, "b"))->data;
    double x = (double)(position % 10) / 10.0, y = 3 * x + 1;
    double err = (w[0] * x + b[0]) - y;
    keel_grads_find(g, "w")->data[0] = (float)(2 * err * x);
    keel_grads_find(g, "b")->data[0] = (float)(2 * err);
    return err;
}

#endif
