/* vars_int.h - the variable store's one internal that session/'s step path
 * uses (numeric/vars.c). */
#ifndef KEEL_VARS_INT_H
#define KEEL_VARS_INT_H

#include <stdint.h>
#include <keel/tensor.h>

/* Where vs keeps its global step (valid while vs lives): the session reads
 * and bumps it around every step without a call. */
int64_t *keel__vars_global_step_ptr(keel_vars *vs);

#endif
