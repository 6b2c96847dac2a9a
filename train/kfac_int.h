/* kfac_int.h - private to K-FAC's optimizer files: kfac.c (the
 * optimizer object, its construction and its update) on kfac_inverse.c
 * (damping and the factors' inverses) on kfac_factors.c (the running
 * Kronecker factors: the statistics observed, their EMAs). Each file
 * uses only the files after it. */
#ifndef KEEL_TRAIN_KFAC_INT_H
#define KEEL_TRAIN_KFAC_INT_H

#include <stddef.h>
#include <stdint.h>
#include <keel/train.h>
#include <keel/kfac.h>
#include "train_int.h"

typedef struct kf_layer {
    keel__kfac_layer info;
    char scope[KEEL_NAME_MAX];
    keel_tensor *A, *G;           /* EMA accumulators (state) */
    keel_tensor *Ainv, *Ginv;     /* damped inverses (state) */
    keel_tensor *vw, *vb;         /* velocity slots of kernel and bias */
    float *Asum, *Gsum;           /* this step's sums (upper triangles) */
    float *Ainv_new, *Ginv_new;   /* inversion workspaces */
    float *T, *V;                 /* a_dim x g_dim: [kernel; bias] G^-1,
                                   * preconditioned (V: regular momentum) */
    float *Vw, *Vb;               /* F^-1 m of kernel and bias: V, or the
                                   * precond slots (adam momentum) */
    keel_tensor *pw, *pb;         /* adam with model_grads: the "precond"
                                   * slots, F^-1 of the velocity (state) */
    size_t fmax;                  /* model_grads, a dense layer: the most
                                   * examples its factored update has
                                   * fewer flops for (0: none) */
    float *X1, *DY;               /* the observed step's [in, 1] (fmax x
                                   * a_dim) and dy (fmax x g_dim) */
    float *U, *W;                 /* X1 A^-1 and DY G^-1 */
    double pi;                    /* of the last inversion */
    int64_t pending;              /* examples observed this step */
    float *col;                   /* a user's conv2d: im2col workspace */
} kf_layer;

struct keel_kfac {
    keel_kfac_config cfg;
    keel_model *m;
    keel_vars *vs;
    kf_layer *l;
    int nl;
    float **Ap, **Gp;             /* the layers' Asum/Gsum, for the model */
    keel_tensor *ema_w;           /* "kfac/ema_weight" */
    int32_t *targets;             /* max_batch (a model's) */
    keel_var **extra;             /* trainable variables of no layer */
    keel_tensor **extra_v;        /* their "velocity" slots */
    size_t n_extra;
    int update_only;              /* keel_kfac_apply_update's call: no
                                   * EMA, inversion at step 0 only */
    int64_t rng_step;             /* the step rng was seeded for */
    keel__rng rng;
    /* model_grads: the step keel_kfac_observe captured the factored
     * gradient of (-1: none), its examples and gradients */
    int64_t cap_step;
    int64_t obs_step;             /* of the last keel_kfac_observe */
    size_t cap_n;
    const keel_grads *cap_grads;
    keel_var *flag_var;           /* the first layer's bias: its slot
                                   * "precond_valid" (every element 1:
                                   * the precond slots hold F^-1 v for the
                                   * store's inverses and velocity) rides
                                   * on a trainable variable, so every
                                   * mode's chief commits it */
    uint64_t factored;            /* the last apply's layers (bit i) that
                                   * took the factored update */
};

/* One apply's schedule: whether it folds statistics into the factors,
 * whether it inverts them, and the EMA's decay and weight after it. */
typedef struct apply_plan {
    int cov;                      /* a statistics step */
    int invert;                   /* an inversion is due */
    float d;                      /* the EMA's decay per update */
    float w_new;                  /* "kfac/ema_weight" after the step */
} apply_plan;

/* Every element of t to v. */
static inline void
keel__kfac_set_all(keel_tensor *t, float v)
{
    for (size_t i = 0; i < t->count; i++)
        t->data[i] = v;
}

/* ---- kfac_factors.c ---- */
/* Whether global_step updates the factors: every cov_update_every steps,
 * and always while they have no statistics (a fresh store). */
int keel__kfac_cov_step(const keel_kfac *k, int64_t global_step);
/* The next observe starts the sums afresh (overwrites them). */
void keel__kfac_clear_pending(keel_kfac *k);
/* Whether any layer has statistics pending. */
int keel__kfac_any_pending(const keel_kfac *k);
/* The first layer without statistics this step, -1 if every layer has. */
int keel__kfac_unobserved_layer(const keel_kfac *k);
/* The step's sums into the factors' EMAs: with an inversion due, into the
 * sums' own buffers (committed after it succeeds); otherwise straight
 * into the state. */
void keel__kfac_fold_statistics(keel_kfac *k, const apply_plan *p);

/* ---- kfac_inverse.c ---- */
/* Every layer's inverses into its workspaces, from the new factors: in
 * the sums' buffers after an EMA, else the state's own. */
keel_status keel__kfac_invert_layers(keel_kfac *k, const apply_plan *p);

#endif
