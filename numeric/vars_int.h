/* vars_int.h - the variable store's internals other layers use
 * (numeric/vars.c): the global step session/'s step path bumps, and the
 * row source the cluster worker gives a row variable. */
#ifndef KEEL_VARS_INT_H
#define KEEL_VARS_INT_H

#include <stdint.h>
#include <keel/tensor.h>

/* Where vs keeps its global step (valid while vs lives): the session reads
 * and bumps it around every step without a call. */
int64_t *keel__vars_global_step_ptr(keel_vars *vs);

/* Where a row variable's rows come from instead of its tensor
 * (keel_var_gather_rows): the cluster worker's row pull. fn gets n
 * checked ids (in range, may repeat) and fills out with n rows. NULL fn:
 * the tensor again. ctx is borrowed until the source is replaced. */
typedef keel_status (*keel__row_source)(void *ctx, keel_var *v, size_t n,
                                        const int64_t *ids, float *out);
void keel__var_set_row_source(keel_var *v, keel__row_source fn, void *ctx);

#endif
