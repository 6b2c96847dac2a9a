/* vars_int.h - the variable store's one internal that session/'s step path
 * uses (train/vars.c); the layers above train/ include this, never
 * train_int.h's kernels. */
#ifndef KEEL_VARS_INT_H
#define KEEL_VARS_INT_H

#include <stdint.h>
#include <keel/train.h>

/* Where vs keeps its global step (valid while vs lives): the session reads
 * and bumps it around every step without a call. */
int64_t *keel__vars_global_step_ptr(keel_vars *vs);

#endif
