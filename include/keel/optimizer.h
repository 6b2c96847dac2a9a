/* keel/optimizer.h - learning-rate schedules and optimizers (SGD,
 * Momentum/Nesterov, Adagrad, Adam, RMSProp) over the variable store of
 * keel/tensor.h, their state in checkpointed variable slots. Configured by
 * plain structs filled with defaults by the matching _config_init().
 * Handles are not thread-safe. */
#ifndef KEEL_OPTIMIZER_H
#define KEEL_OPTIMIZER_H

#include <stddef.h>
#include <stdint.h>
#include <keel/status.h>
#include <keel/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- learning-rate schedules and optimizers ----------------------------- */

typedef enum keel_lr_kind {
    KEEL_LR_CONSTANT = 0,   /* learning_rate */
    KEEL_LR_PIECEWISE,      /* values[i] for boundaries[i-1] <= step <
                             * boundaries[i] (see docs/train.md) */
    KEEL_LR_EXPONENTIAL     /* learning_rate * decay_rate^(step/decay_steps),
                             * integer division when staircase */
} keel_lr_kind;

#define KEEL_LR_MAX_PIECES 16

typedef struct keel_lr_schedule {
    uint32_t struct_size;          /* set by keel_lr_schedule_init() */
    keel_lr_kind kind;             /* default constant */
    double learning_rate;          /* default 0.001 */
    int n_boundaries;              /* piecewise: values has n_boundaries+1 */
    int64_t boundaries[KEEL_LR_MAX_PIECES - 1];   /* strictly increasing */
    double values[KEEL_LR_MAX_PIECES];
    int64_t decay_steps;           /* exponential; default 1000 */
    double decay_rate;             /* exponential; default 0.96 */
    int staircase;                 /* exponential; default 0 */
} keel_lr_schedule;

void keel_lr_schedule_init(keel_lr_schedule *s);
/* "constant" | "piecewise" | "exponential". */
keel_status keel_lr_kind_from_name(const char *name, keel_lr_kind *out);
const char *keel_lr_kind_name(keel_lr_kind k);
/* Check a schedule (positive steps, increasing boundaries, finite values). */
keel_status keel_lr_schedule_validate(const keel_lr_schedule *s);
/* Learning rate at a global step (negative steps count as 0). */
double keel_lr_at(const keel_lr_schedule *s, int64_t step);
/* Parse "1000,2000" into boundaries and "1e-3,1e-4,1e-5" into values. */
keel_status keel_lr_parse_piecewise(const char *boundaries,
                                    const char *values, keel_lr_schedule *s);

typedef enum keel_optimizer_kind {
    KEEL_OPT_SGD = 0,
    KEEL_OPT_MOMENTUM,
    KEEL_OPT_ADAGRAD,
    KEEL_OPT_ADAM,
    KEEL_OPT_RMSPROP
} keel_optimizer_kind;

typedef struct keel_optimizer_config {
    uint32_t struct_size;          /* set by keel_optimizer_config_init() */
    keel_optimizer_kind kind;      /* default adam */
    keel_lr_schedule schedule;     /* the learning rate, per step */
    double momentum;               /* momentum, rmsprop; default 0.9 / 0.0 */
    int use_nesterov;              /* momentum; default 0 */
    double beta1, beta2;           /* adam; default 0.9, 0.999 */
    double epsilon;                /* adam, adagrad, rmsprop; default 1e-7 */
    double rho;                    /* rmsprop decay; default 0.9 */
    double initial_accumulator_value;   /* adagrad; default 0.1 */
} keel_optimizer_config;

typedef struct keel_optimizer keel_optimizer;

/* Defaults for kind (momentum 0.9 for momentum, 0.0 for rmsprop). */
void keel_optimizer_config_init(keel_optimizer_config *cfg,
                                keel_optimizer_kind kind);
/* "sgd" | "momentum" | "adagrad" | "adam" | "rmsprop". */
keel_status keel_optimizer_kind_from_name(const char *name,
                                          keel_optimizer_kind *out);
const char *keel_optimizer_kind_name(keel_optimizer_kind k);
/* Validate and copy cfg. Caller owns *out: keel_optimizer_free(). */
keel_status keel_optimizer_new(const keel_optimizer_config *cfg,
                               keel_optimizer **out);
void keel_optimizer_free(keel_optimizer *o);
const keel_optimizer_config *keel_optimizer_get_config(
    const keel_optimizer *o);
/* Create the slots of every trainable variable of vs ("momentum"; "m", "v";
 * "accumulator" filled with initial_accumulator_value; "rms", "mom").
 * Idempotent: existing slots keep their values. */
keel_status keel_optimizer_prepare(keel_optimizer *o, keel_vars *vs);
/* Apply grads to every trainable variable (a variable whose gradient has
 * rows, keel_grads_add_rows: those rows only, as
 * keel_optimizer_apply_rows), with the learning rate and Adam
 * bias correction of global_step (t = global_step + 1). Does not change the
 * store's global step. Slots must exist (prepare). */
keel_status keel_optimizer_apply(keel_optimizer *o, keel_vars *vs,
                                 keel_grads *grads, int64_t global_step);
/* keel_optimizer_apply, then every gradient of grads is zero: zeroed block
 * by block while the update has it in cache, so the keel_grads_zero before
 * the next step has nothing left to do. The same bits as apply followed by
 * keel_grads_zero. On failure grads are unchanged. */
keel_status keel_optimizer_apply_and_zero(keel_optimizer *o, keel_vars *vs,
                                          keel_grads *grads,
                                          int64_t global_step);
/* The same for one variable (a parameter server's shard). */
keel_status keel_optimizer_apply_var(keel_optimizer *o, keel_var *v,
                                     const keel_tensor *grad,
                                     int64_t global_step);
/* The lazy (sparse) update of one variable of shape [R, d1, ...]: n rows
 * of d1*... floats, ids strictly increasing in [0, R) (keel_grads_rows
 * gives them so). Only those rows of the variable and of its slots
 * change, each as the dense update of that row with that gradient row
 * (TF's SparseApply*; Adam is LazyAdam: the moments of the other rows do
 * not decay). SGD and Adagrad give the bits of the dense update with the
 * rows scattered into a zero gradient. ids and rows: caller owns.
 * KEEL_EINVAL naming the variable and the id for a bad id. */
keel_status keel_optimizer_apply_rows(keel_optimizer *o, keel_var *v,
                                      size_t n, const int64_t *ids,
                                      const float *rows,
                                      int64_t global_step);

#ifdef __cplusplus
}
#endif
#endif
