/* kfac.c - K-FAC (Kronecker-factored approximate curvature) for the layers
 * of a layer collection (keel/kfac.h: a program's own, or a keel_model's,
 * registered by keel_kfac_new): per layer with parameters, the factors
 *   A = E[a a^T]  (inputs with a 1 appended for the bias; a convolution's
 *                  im2col patches, averaged over examples and locations)
 *   G = E[g g^T]  (gradients of -log p(target) at the pre-activation
 *                  outputs; per location for a convolution)
 * kept as zero-debiased EMAs, inverted with factored Tikhonov damping (the
 * trace-norm pi) every invert_every steps with LAPACK's Cholesky
 * (spotrf + spotri), and the update F^-1 g = A^-1 g G^-1 / locations with
 * regular or adam momentum and the KL-norm constraint (docs/kfac.md); with
 * model_grads, a dense layer's F^-1 g from the step's batch when that is
 * cheaper, (X A^-1)^T (D G^-1), and adam's F^-1 v continued from the
 * "precond" slots between inversions.
 * All state is variables and slots of the store: checkpointed as they are,
 * so a restored run continues bit for bit.
 * This file is the optimizer object, its construction and its update; the
 * factors' statistics are kfac_factors.c's, their damped inverses
 * kfac_inverse.c's (kfac_int.h). */
#include <config.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "kfac_int.h"

/* The trainable variables of no layer: momentum SGD, v = mu v + grad,
 * x -= lr v (the identity as their preconditioner, outside the KL-norm
 * constraint). */
static void
update_extra(keel_kfac *k, keel_grads *grads, float lr, float mu)
{
    for (size_t i = 0; i < k->n_extra; i++) {
        float *x = keel_var_tensor(k->extra[i])->data;
        float *v = k->extra_v[i]->data;
        const float *gv =
            keel_grads_at(grads, keel_var_index(k->extra[i]))->data;
        for (size_t j = 0; j < k->extra_v[i]->count; j++) {
            v[j] = mu * v[j] + gv[j];
            x[j] -= lr * v[j];
        }
    }
}

static const char *const mom_names[] = { "regular", "adam" };
static const char *const est_names[] = { "gradients", "empirical" };

void
keel_kfac_config_init(keel_kfac_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
    keel_lr_schedule_init(&cfg->schedule);
    cfg->schedule.learning_rate = 0.0001;
    cfg->damping = 0.001;
    cfg->cov_ema_decay = 0.95;
    cfg->momentum = 0.9;
    cfg->momentum_type = KEEL_KFAC_MOMENTUM_ADAM;
    cfg->estimation = KEEL_KFAC_GRADIENTS;
    cfg->norm_constraint = 0.0;
    cfg->invert_every = 10;
    cfg->seed = 0;
    cfg->cov_update_every = 1;
}


KEEL__FROM_NAME(keel_kfac_momentum_type_from_name, keel_kfac_momentum_type,
                "K-FAC momentum type", mom_names)

KEEL__FROM_NAME(keel_kfac_estimation_from_name, keel_kfac_estimation,
                "K-FAC estimation mode", est_names)


static keel_status
check_config(const keel_kfac_config *c)
{
    keel_status st = keel_lr_schedule_validate(&c->schedule);
    if (st != KEEL_OK)
        return keel__wrap(st, "K-FAC");
    if (!(c->damping > 0.0) || !isfinite(c->damping))
        return keel__fail(KEEL_EINVAL, "K-FAC: damping %g must be finite "
                          "and > 0", c->damping);
    if (!(c->cov_ema_decay >= 0.0 && c->cov_ema_decay < 1.0))
        return keel__fail(KEEL_EINVAL, "K-FAC: cov_ema_decay %g must be in "
                          "[0, 1)", c->cov_ema_decay);
    if (!(c->momentum >= 0.0 && c->momentum < 1.0))
        return keel__fail(KEEL_EINVAL, "K-FAC: momentum %g must be in "
                          "[0, 1)", c->momentum);
    if (!(c->norm_constraint >= 0.0) || !isfinite(c->norm_constraint))
        return keel__fail(KEEL_EINVAL, "K-FAC: norm_constraint %g must be "
                          "finite and >= 0 (0: off)", c->norm_constraint);
    if (c->invert_every < 1)
        return keel__fail(KEEL_EINVAL, "K-FAC: invert_every %lld must be "
                          ">= 1", (long long)c->invert_every);
    if (c->cov_update_every < 1)
        return keel__fail(KEEL_EINVAL, "K-FAC: cov_update_every %lld must "
                          "be >= 1", (long long)c->cov_update_every);
    if ((unsigned)c->momentum_type > KEEL_KFAC_MOMENTUM_ADAM ||
        (unsigned)c->estimation > KEEL_KFAC_EMPIRICAL)
        return keel__fail(KEEL_EINVAL, "K-FAC: unknown momentum type or "
                          "estimation mode");
    return KEEL_OK;
}


void
keel_kfac_free(keel_kfac *k)
{
    if (k == NULL)
        return;
    for (int i = 0; i < k->nl && k->l != NULL; i++) {
        kf_layer *L = &k->l[i];
        keel_aligned_free(L->Asum);
        keel_aligned_free(L->Gsum);
        keel_aligned_free(L->Ainv_new);
        keel_aligned_free(L->Ginv_new);
        keel_aligned_free(L->T);
        keel_aligned_free(L->V);
        keel_aligned_free(L->X1);
        keel_aligned_free(L->DY);
        keel_aligned_free(L->U);
        keel_aligned_free(L->W);
        keel_aligned_free(L->col);
    }
    free(k->l);
    free(k->extra);
    free(k->extra_v);
    free(k->Ap);
    free(k->Gp);
    free(k->targets);
    free(k);
}

static keel_status
alloc_f(float **p, size_t count, const char *what, const char *scope)
{
    if (count > KEEL_TENSOR_MAX_BYTES / sizeof(float))
        return keel__fail(KEEL_EINVAL, "K-FAC: %s of '%s' (%zu floats) too "
                          "large", what, scope, count);
    *p = keel_aligned_alloc(count * sizeof(float));
    if (*p == NULL)
        return keel__fail(KEEL_ENOMEM, "K-FAC: %s of '%s' (%zu floats)",
                          what, scope, count);
    memset(*p, 0, count * sizeof(float));
    return KEEL_OK;
}

/* The state variable scope/leaf: found (a restored or earlier store) or
 * created zero; marked initialized either way (zero is its initial value). */
static keel_status
state_var(keel_vars *vs, const char *scope, const char *leaf, int ndim,
          const int64_t *shape, keel_tensor **out)
{
    char name[KEEL_NAME_MAX];
    keel_var *v;
    keel_tensor *t;
    keel_status st = keel__fmt(name, sizeof name, "K-FAC variable name",
                               "%s/%s", scope, leaf);
    if (st != KEEL_OK)
        return st;
    v = keel_vars_find(vs, name);
    if (v == NULL) {
        st = keel_vars_create(vs, name, ndim, shape, 0, &v);
        if (st != KEEL_OK)
            return keel__wrap(st, "K-FAC state");
        keel_var_set_initialized(v, 1);
    }
    t = keel_var_tensor(v);
    if (!keel_shape_equal(t->ndim, t->shape, ndim, shape) ||
        keel_var_is_trainable(v))
        return keel__fail(KEEL_EINVAL, "K-FAC: variable '%s' exists with "
                          "another shape or as a trainable variable", name);
    *out = t;
    return KEEL_OK;
}

/* L->scope: the layer's name, its weight's name up to the last '/'. */
static keel_status
layer_scope(kf_layer *L)
{
    const char *wname = keel_var_name(L->info.w);
    const char *slash = strrchr(wname, '/');
    size_t len = slash != NULL ? (size_t)(slash - wname) : strlen(wname);
    if (len >= sizeof L->scope)
        return keel__fail(KEEL_EINVAL, "K-FAC: layer name of '%s' too long",
                          wname);
    memcpy(L->scope, wname, len);
    L->scope[len] = '\0';
    return KEEL_OK;
}

/* The state a checkpoint keeps: the factors and their inverses as
 * variables of the layer's scope, the velocity as slots. */
static keel_status
layer_state(keel_kfac *k, kf_layer *L)
{
    size_t a = L->info.a_dim, g = L->info.g_dim;
    int64_t as[2] = { (int64_t)a, (int64_t)a };
    int64_t gs[2] = { (int64_t)g, (int64_t)g };
    keel_status st;
    if ((st = state_var(k->vs, L->scope, "kfac_A", 2, as, &L->A)) != KEEL_OK ||
        (st = state_var(k->vs, L->scope, "kfac_G", 2, gs, &L->G)) != KEEL_OK ||
        (st = state_var(k->vs, L->scope, "kfac_A_inv", 2, as, &L->Ainv)) !=
            KEEL_OK ||
        (st = state_var(k->vs, L->scope, "kfac_G_inv", 2, gs, &L->Ginv)) !=
            KEEL_OK)
        return st;
    if ((st = keel_var_add_slot(L->info.w, "velocity", &L->vw)) != KEEL_OK ||
        (L->info.b != NULL &&
         (st = keel_var_add_slot(L->info.b, "velocity", &L->vb)) != KEEL_OK))
        return keel__wrap(st, "K-FAC: velocity of '%s'", L->scope);
    if (L->vw->count + (L->vb != NULL ? L->vb->count : 0) != a * g)
        return keel__fail(KEEL_EINTERNAL, "K-FAC: '%s' has %zu + %zu "
                          "parameters, not %zu x %zu", L->scope,
                          L->vw->count, L->vb != NULL ? L->vb->count : 0, a,
                          g);
    return KEEL_OK;
}

/* Working memory: the statistics being summed, the inverses being formed,
 * the update and a workspace. */
static keel_status
layer_buffers(kf_layer *L)
{
    size_t a = L->info.a_dim, g = L->info.g_dim;
    keel_status st;
    if ((st = alloc_f(&L->Asum, a * a, "A statistics", L->scope)) != KEEL_OK ||
        (st = alloc_f(&L->Gsum, g * g, "G statistics", L->scope)) != KEEL_OK ||
        (st = alloc_f(&L->Ainv_new, a * a, "A inverse", L->scope)) !=
            KEEL_OK ||
        (st = alloc_f(&L->Ginv_new, g * g, "G inverse", L->scope)) !=
            KEEL_OK ||
        (st = alloc_f(&L->T, a * g, "workspace", L->scope)) != KEEL_OK ||
        (st = alloc_f(&L->V, a * g, "update", L->scope)) != KEEL_OK)
        return st;
    L->Vw = L->V;
    L->Vb = L->info.b != NULL ? L->V + (a - 1) * g : NULL;
    return KEEL_OK;
}

/* With the model's own gradients: adam momentum's preconditioned velocity
 * (precond slots), and for a dense layer the observed batch the factored
 * update is formed from when the batch is smaller than the layer. */
static keel_status
layer_model_grads(keel_kfac *k, kf_layer *L)
{
    size_t a = L->info.a_dim, g = L->info.g_dim;
    keel_status st;
    if (k->cfg.momentum_type == KEEL_KFAC_MOMENTUM_ADAM) {
        if ((st = keel_var_add_slot(L->info.w, "precond", &L->pw)) !=
                KEEL_OK ||
            (st = keel_var_add_slot(L->info.b, "precond", &L->pb)) !=
                KEEL_OK)
            return keel__wrap(st, "K-FAC: preconditioned velocity of '%s'",
                              L->scope);
        L->Vw = L->pw->data;
        L->Vb = L->pb->data;
    }
    if (!L->info.is_conv) {
        size_t n = (size_t)keel_model_get_config(k->m)->max_batch;
        /* the factored update, 2 n (a^2 + g^2 + a g) flops, against
         * 2 a g (a + g) of A^-1 M G^-1: fewer for n < fmax */
        double lim = (double)a * (double)g * (double)(a + g) /
                     ((double)a * a + (double)g * g + (double)a * g);
        size_t fm = (size_t)ceil(lim) - 1;
        L->fmax = fm < n ? fm : n;
        if (L->fmax > 0 &&
            ((st = alloc_f(&L->X1, L->fmax * a, "observed inputs",
                           L->scope)) != KEEL_OK ||
             (st = alloc_f(&L->DY, L->fmax * g, "observed output gradients",
                           L->scope)) != KEEL_OK ||
             (st = alloc_f(&L->U, L->fmax * a, "workspace", L->scope)) !=
                 KEEL_OK ||
             (st = alloc_f(&L->W, L->fmax * g, "workspace", L->scope)) !=
                 KEEL_OK))
            return st;
    }
    return KEEL_OK;
}

static keel_status
layer_new(keel_kfac *k, kf_layer *L)
{
    keel_status st;
    if ((st = layer_scope(L)) != KEEL_OK ||
        (st = layer_state(k, L)) != KEEL_OK ||
        (st = layer_buffers(L)) != KEEL_OK)
        return st;
    for (int i = 0; i < k->nl && &k->l[i] != L; i++)
        if (strcmp(k->l[i].scope, L->scope) == 0)
            return keel__fail(KEEL_EINVAL, "K-FAC: layers %d and %d are "
                              "both '%s' (their state is named after the "
                              "kernel's scope: give them different ones)",
                              i, (int)(L - k->l), L->scope);
    /* a user's convolution: the im2col workspace of its statistics */
    if (k->m == NULL && L->info.is_conv &&
        (st = alloc_f(&L->col, keel__conv_col_size(&L->info.cg, SIZE_MAX),
                      "im2col workspace", L->scope)) != KEEL_OK)
        return st;
    return k->cfg.model_grads ? layer_model_grads(k, L) : KEEL_OK;
}

/* Every trainable variable no layer registers, with a "velocity" slot:
 * they take momentum SGD. */
static keel_status
extra_vars(keel_kfac *k)
{
    size_t nv = keel_vars_count(k->vs), n = 0;
    k->extra = calloc(nv + 1, sizeof *k->extra);
    k->extra_v = calloc(nv + 1, sizeof *k->extra_v);
    if (k->extra == NULL || k->extra_v == NULL)
        return keel__fail(KEEL_ENOMEM, "K-FAC: %zu variables", nv);
    for (size_t i = 0; i < nv; i++) {
        keel_var *v = keel_vars_at(k->vs, i);
        int reg = !keel_var_is_trainable(v);
        keel_status st;
        for (int j = 0; j < k->nl && !reg; j++)
            reg = v == k->l[j].info.w || v == k->l[j].info.b;
        if (reg)
            continue;
        st = keel_var_add_slot(v, "velocity", &k->extra_v[n]);
        if (st != KEEL_OK)
            return keel__wrap(st, "K-FAC: velocity of '%s'",
                              keel_var_name(v));
        k->extra[n++] = v;
    }
    k->n_extra = n;
    return KEEL_OK;
}

keel_status
keel__kfac_new(const keel_kfac_config *cfg, const keel_kfac_layers *lc,
               keel_model *m, keel_vars *vs, keel_kfac **out)
{
    keel_kfac *k;
    keel_status st;
    int n;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC: out is NULL");
    *out = NULL;
    if (cfg == NULL || lc == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC: NULL argument");
    if ((st = KEEL__STRUCT_CHECK(cfg, keel_kfac_config)) != KEEL_OK)
        return keel__wrap(st, "K-FAC");
    if ((st = check_config(cfg)) != KEEL_OK)
        return st;
    if (m == NULL && cfg->model_grads)
        return keel__fail(KEEL_EINVAL, "K-FAC: model_grads describes a "
                          "keel_model's step (keel_kfac_new); a layer "
                          "collection's optimizer takes model_grads = 0");
    n = lc->n;
    if (n < 1 || n > 4096)
        return keel__fail(KEEL_EINVAL, "K-FAC: %d layers with parameters "
                          "registered (1 to 4096)", n);
    k = calloc(1, sizeof *k);
    if (k == NULL)
        return keel__fail(KEEL_ENOMEM, "K-FAC");
    k->cfg = *cfg;
    k->m = m;
    k->vs = vs;
    k->rng_step = -1;
    k->cap_step = -1;
    k->obs_step = -1;
    k->l = calloc((size_t)n, sizeof *k->l);
    k->Ap = calloc((size_t)n, sizeof *k->Ap);
    k->Gp = calloc((size_t)n, sizeof *k->Gp);
    if (m != NULL)
        k->targets = calloc((size_t)keel_model_get_config(m)->max_batch,
                            sizeof *k->targets);
    if (k->l == NULL || k->Ap == NULL || k->Gp == NULL ||
        (m != NULL && k->targets == NULL)) {
        keel_kfac_free(k);
        return keel__fail(KEEL_ENOMEM, "K-FAC: layer list");
    }
    k->nl = n;
    for (int i = 0; i < n; i++) {
        k->l[i].info = lc->l[i];
        if ((st = layer_new(k, &k->l[i])) != KEEL_OK) {
            keel_kfac_free(k);
            return st;
        }
        k->Ap[i] = k->l[i].Asum;
        k->Gp[i] = k->l[i].Gsum;
    }
    st = state_var(vs, "kfac", "ema_weight", 0, NULL, &k->ema_w);
    k->flag_var = k->l[0].info.b != NULL ? k->l[0].info.b : k->l[0].info.w;
    if (st == KEEL_OK && cfg->model_grads &&
        cfg->momentum_type == KEEL_KFAC_MOMENTUM_ADAM)
        st = keel_var_add_slot(k->flag_var, "precond_valid",
                               &(keel_tensor *){ NULL });
    if (st == KEEL_OK)
        st = extra_vars(k);
    if (st != KEEL_OK) {
        keel_kfac_free(k);
        return st;
    }
    *out = k;
    return KEEL_OK;
}

/* A keel_model's layers with parameters, registered in the collection a
 * program's own layers go through. */
keel_status
keel_kfac_new(const keel_kfac_config *cfg, keel_model *m, keel_vars *vs,
              keel_kfac **out)
{
    keel__kfac_layer info[KEEL_MODEL_MAX_HIDDEN + 8];
    keel_kfac_layers *lc = NULL;
    keel_status st;
    int n;
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC: out is NULL");
    *out = NULL;
    if (cfg == NULL || m == NULL || vs == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC: NULL argument");
    n = keel__model_kfac_layers(m, info, (int)(sizeof info / sizeof *info));
    if (n < 1 || n > (int)(sizeof info / sizeof *info))
        return keel__fail(KEEL_EINVAL, "K-FAC: the model has %d layers with "
                          "parameters", n);
    st = keel_kfac_layers_new(&lc);
    for (int i = 0; i < n && st == KEEL_OK; i++)
        st = keel__kfac_layers_add(lc, &info[i], NULL);
    if (st == KEEL_OK)
        st = keel__kfac_new(cfg, lc, m, vs, out);
    keel_kfac_layers_free(lc);
    return st;
}

keel_status
keel_kfac_new_from_layers(const keel_kfac_config *cfg,
                          const keel_kfac_layers *lc, keel_vars *vs,
                          keel_kfac **out)
{
    return keel__kfac_new(cfg, lc, NULL, vs, out);
}

const keel_kfac_config *
keel_kfac_get_config(const keel_kfac *k)
{
    return k != NULL ? &k->cfg : NULL;
}

/* s + <x, y>, summed in double in index order. */
static double
dot(double s, const float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * (double)y[i];
    return s;
}

/* [Vw; Vb] = A^-1 [kernel; bias] G^-1 / locations: the kernel's rows and
 * the bias row go through G^-1 in place (no copy of them into one
 * matrix), then A^-1 takes the whole a x g product (one sgemm where Vw
 * and Vb are one matrix). Without a bias, Vw = A^-1 kernel G^-1 /
 * locations. */
static void
precondition(kf_layer *L, const float *kernel, const float *bias)
{
    size_t a = L->info.a_dim, g = L->info.g_dim;
    size_t ak = a - (bias != NULL);   /* the kernel's rows */
    float s = (float)(1.0 / (double)L->info.locations);
    const float *Ai = L->Ainv->data;
    keel__sgemm(0, 0, ak, g, g, 1.0f, kernel, g, L->Ginv->data, g, 0.0f,
                L->T, g);
    if (bias == NULL) {
        keel__sgemm(0, 0, a, g, a, s, Ai, a, L->T, g, 0.0f, L->Vw, g);
        return;
    }
    keel__sgemm(0, 0, 1, g, g, 1.0f, bias, g, L->Ginv->data, g, 0.0f,
                L->T + (a - 1) * g, g);
    if (L->Vb == L->Vw + (a - 1) * g) {
        keel__sgemm(0, 0, a, g, a, s, Ai, a, L->T, g, 0.0f, L->Vw, g);
        return;
    }
    keel__sgemm(0, 0, a - 1, g, a, s, Ai, a, L->T, g, 0.0f, L->Vw, g);
    keel__sgemm(0, 0, 1, g, a, s, Ai + (a - 1) * a, a, L->T, g, 0.0f, L->Vb,
                g);
}

/* A dense layer whose gradient is [kernel; bias] = X1^T DY (X1 = [in, 1],
 * n rows): [Vw; Vb] = (X1 A^-1)^T (DY G^-1) + beta [Vw; Vb], the same
 * A^-1 X1^T DY G^-1 in 2 n (a^2 + g^2 + a g) flops (A^-1 is symmetric). */
static void
precondition_factored(kf_layer *L, size_t n, float beta)
{
    size_t a = L->info.a_dim, g = L->info.g_dim;
    keel__sgemm(0, 0, n, a, a, 1.0f, L->X1, a, L->Ainv->data, a, 0.0f, L->U,
                a);
    keel__sgemm(0, 0, n, g, g, 1.0f, L->DY, g, L->Ginv->data, g, 0.0f, L->W,
                g);
    keel__sgemm(1, 0, a - 1, g, n, 1.0f, L->U, a, L->W, g, beta, L->Vw, g);
    keel__sgemm(1, 0, 1, g, n, 1.0f, L->U + a - 1, a, L->W, g, beta, L->Vb,
                g);
}

static keel_status
check_apply(const keel_kfac *k, keel_vars *vs, keel_grads *grads,
            int64_t global_step)
{
    if (k == NULL || vs == NULL || grads == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC apply: NULL argument");
    if (vs != k->vs || keel_grads_vars(grads) != vs)
        return keel__fail(KEEL_EINVAL, "K-FAC apply: gradients or store are "
                          "not the optimizer's");
    if (global_step < 0)
        return keel__fail(KEEL_EINVAL, "K-FAC apply: negative global step "
                          "%lld", (long long)global_step);
    return KEEL_OK;
}

static keel_status
check_layer_grads(const keel_kfac *k, keel_grads *grads)
{
    for (int i = 0; i < k->nl; i++) {
        const kf_layer *L = &k->l[i];
        keel_tensor *gw = keel_grads_at(grads, keel_var_index(L->info.w));
        keel_tensor *gb = L->info.b != NULL
            ? keel_grads_at(grads, keel_var_index(L->info.b)) : NULL;
        if (gw == NULL || gw->count != L->vw->count ||
            (L->info.b != NULL && (gb == NULL || gb->count != L->vb->count)))
            return keel__fail(KEEL_EINVAL, "K-FAC apply: no gradient of the "
                              "right shape for '%s'", L->scope);
    }
    for (size_t i = 0; i < k->n_extra; i++) {
        keel_tensor *gv = keel_grads_at(grads, keel_var_index(k->extra[i]));
        if (gv == NULL || gv->count != k->extra_v[i]->count)
            return keel__fail(KEEL_EINVAL, "K-FAC apply: no gradient of the "
                              "right shape for '%s'",
                              keel_var_name(k->extra[i]));
    }
    return KEEL_OK;
}

static void
plan_apply(const keel_kfac *k, int64_t global_step, apply_plan *p)
{
    float w_old = k->ema_w->data[0];
    p->cov = !k->update_only && keel__kfac_cov_step(k, global_step);
    /* kfac's decay per update with cov_update_every: the decay per step
     * to that power (pow(d, 1) is d exactly) */
    p->d = (float)pow(k->cfg.cov_ema_decay, (double)k->cfg.cov_update_every);
    p->w_new = p->cov ? p->d * w_old + (1.0f - p->d) : w_old;
    p->invert = (k->update_only ? global_step == 0
                                : global_step % k->cfg.invert_every == 0) ||
                w_old == 0.0f;
}

/* The new weight, factors and inverses into the state; cannot fail. */
static void
commit_factors(keel_kfac *k, const apply_plan *p)
{
    k->ema_w->data[0] = p->w_new;
    for (int i = 0; i < k->nl; i++) {
        kf_layer *L = &k->l[i];
        size_t a = L->info.a_dim, g = L->info.g_dim;
        if (p->invert && p->cov) {
            memcpy(L->A->data, L->Asum, a * a * sizeof(float));
            memcpy(L->G->data, L->Gsum, g * g * sizeof(float));
        }
        if (p->invert) {
            memcpy(L->Ainv->data, L->Ainv_new, a * a * sizeof(float));
            memcpy(L->Ginv->data, L->Ginv_new, g * g * sizeof(float));
        }
    }
    keel__kfac_clear_pending(k);
}

/* F^-1 m of layer i into its Vw, Vb, m being the gradient or, with adam
 * momentum, the velocity this gradient updates first. fact: the factored
 * update may serve (the observed step's own gradients); cont: adam's
 * precond slots hold F^-1 of the previous velocity. Returns <m, F^-1 m>
 * in the order of [kernel; bias] when the norm constraint needs it. */
static double
precondition_layer(keel_kfac *k, int i, keel_grads *grads, int fact,
                   int cont, float mu)
{
    kf_layer *L = &k->l[i];
    size_t g = L->info.g_dim, nw = L->vw->count;
    const float *mw = keel_grads_at(grads, keel_var_index(L->info.w))->data;
    const float *mb = L->info.b != NULL
        ? keel_grads_at(grads, keel_var_index(L->info.b))->data : NULL;
    size_t nb = mb != NULL ? g : 0;
    int f = fact && k->cap_n <= L->fmax;
    if (k->cfg.momentum_type == KEEL_KFAC_MOMENTUM_ADAM) {
        /* v = mu v + g, then the update is F^-1 v */
        float *vw = L->vw->data, *vb = L->vb != NULL ? L->vb->data : NULL;
        for (size_t j = 0; j < nw; j++)
            vw[j] = mu * vw[j] + mw[j];
        for (size_t j = 0; j < nb; j++)
            vb[j] = mu * vb[j] + mb[j];
        mw = vw;
        mb = vb;
        f = f && cont && L->pw != NULL;
        if (f)
            precondition_factored(L, k->cap_n, mu);
    } else if (f) {
        precondition_factored(L, k->cap_n, 0.0f);
    }
    if (!f)
        precondition(L, mw, mb);
    else if (i < 64)
        k->factored |= (uint64_t)1 << i;
    if (!(k->cfg.norm_constraint > 0.0))
        return 0.0;
    return nb > 0 ? dot(dot(0.0, mw, L->Vw, nw), mb, L->Vb, g)
                  : dot(0.0, mw, L->Vw, nw);
}

/* Every layer's F^-1 m; returns the sum of their <m, F^-1 m>. The
 * factored update: grads are the observed step's own (model_grads, the
 * gradients keel_model_step wrote, one batch); with adam momentum
 * F^-1 v = mu F^-1 v_prev + F^-1 grad, continued from the precond slots
 * while they hold F^-1 v_prev for these inverses (valid: the flag slot,
 * 0 after an inversion or on a store of another mode). */
static double
precondition_layers(keel_kfac *k, keel_grads *grads, int64_t global_step,
                    int invert, float mu)
{
    double s = 0.0;
    int fact = k->cfg.model_grads && !k->update_only &&
               k->cap_step == global_step && grads == k->cap_grads;
    keel_tensor *valid;
    int cont;
    k->cap_step = -1;
    valid = keel_var_slot(k->flag_var, "precond_valid");
    k->factored = 0;
    cont = fact && !invert && valid != NULL && valid->data[0] == 1.0f;
    for (int i = 0; i < k->nl; i++)
        s += precondition_layer(k, i, grads, fact, cont, mu);
    /* the precond slots now hold F^-1 v for the store's inverses, except
     * after keel_kfac_apply_update, whose inverses others replace */
    if (valid != NULL)
        keel__kfac_set_all(valid, k->cfg.model_grads && !k->update_only &&
                           k->cfg.momentum_type == KEEL_KFAC_MOMENTUM_ADAM &&
                           k->l[0].pw != NULL ? 1.0f : 0.0f);
    return s;
}

/* The KL-norm constraint's factor on the update, from s = sum <m, F^-1 m>
 * and the learning rate lr: min(1, sqrt(norm_constraint / (lr^2 s))). */
static float
norm_scale(const keel_kfac *k, double s, double lr)
{
    double r;
    if (!(k->cfg.norm_constraint > 0.0 && s > 0.0 && lr > 0.0))
        return 1.0f;
    r = sqrt(k->cfg.norm_constraint / (lr * lr * s));
    return r < 1.0 ? (float)r : 1.0f;
}

/* The variables take their step along c F^-1 m: directly with adam
 * momentum (m is already the velocity), through the velocity with
 * regular momentum. */
static void
update_vars(keel_kfac *k, float lr, float mu, float c)
{
    for (int i = 0; i < k->nl; i++) {
        kf_layer *L = &k->l[i];
        float *x = keel_var_tensor(L->info.w)->data;
        float *xb = L->info.b != NULL ? keel_var_tensor(L->info.b)->data
                                      : NULL;
        size_t nw = L->vw->count, g = L->info.b != NULL ? L->info.g_dim : 0;
        const float *Vw = L->Vw, *Vb = L->Vb;
        if (k->cfg.momentum_type == KEEL_KFAC_MOMENTUM_ADAM) {
            for (size_t j = 0; j < nw; j++)
                x[j] -= lr * (c * Vw[j]);
            for (size_t j = 0; j < g; j++)
                xb[j] -= lr * (c * Vb[j]);
        } else {
            float *vw = L->vw->data, *vb = L->vb != NULL ? L->vb->data
                                                         : NULL;
            for (size_t j = 0; j < nw; j++) {
                vw[j] = mu * vw[j] + c * Vw[j];
                x[j] -= lr * vw[j];
            }
            for (size_t j = 0; j < g; j++) {
                vb[j] = mu * vb[j] + c * Vb[j];
                xb[j] -= lr * vb[j];
            }
        }
    }
}

/* Validate, fold the step's statistics into the factors, invert them
 * when due (nothing is committed before all inversions succeed), then
 * precondition, constrain and apply the update. */
static keel_status
kfac_apply_fp(keel_kfac *k, keel_vars *vs, keel_grads *grads,
              int64_t global_step)
{
    apply_plan p;
    double lr, s;
    float mu;
    keel_status st = check_apply(k, vs, grads, global_step);
    if (st != KEEL_OK)
        return st;
    plan_apply(k, global_step, &p);
    if (p.cov && !keel__kfac_any_pending(k))
        return keel__fail(KEEL_ESTATE, "K-FAC apply at step %lld: no factor "
                          "statistics observed (call keel_kfac_observe "
                          "first)", (long long)global_step);
    if (p.cov && keel__kfac_unobserved_layer(k) >= 0) {
        int i = keel__kfac_unobserved_layer(k);
        keel__kfac_clear_pending(k);
        return keel__fail(KEEL_ESTATE, "K-FAC apply at step %lld: no factor "
                          "statistics of layer %d '%s' (call "
                          "keel_kfac_observe_layer for every layer)",
                          (long long)global_step, i, k->l[i].scope);
    }
    st = check_layer_grads(k, grads);
    if (st != KEEL_OK) {
        keel__kfac_clear_pending(k);
        return st;
    }
    if (p.cov)
        keel__kfac_fold_statistics(k, &p);
    if (p.invert) {
        st = keel__kfac_invert_layers(k, &p);
        if (st != KEEL_OK) {
            keel__kfac_clear_pending(k);
            return keel__wrap(st, "K-FAC apply at step %lld",
                              (long long)global_step);
        }
    }
    KEEL__PROF_BEGIN();
    commit_factors(k, &p);
    lr = keel_lr_at(&k->cfg.schedule, global_step);
    mu = (float)k->cfg.momentum;
    s = precondition_layers(k, grads, global_step, p.invert, mu);
    update_vars(k, (float)lr, mu, norm_scale(k, s, lr));
    update_extra(k, grads, (float)lr, mu);
    KEEL__PROF_END(kfac_precond_ns);
    return KEEL_OK;
}

keel_status
keel_kfac_apply(keel_kfac *k, keel_vars *vs, keel_grads *grads,
                int64_t global_step)
{
    return KEEL__FLUSHED(kfac_apply_fp(k, vs, grads, global_step));
}

/* For tests: pi of layer i's last inversion (0 if none), its last
 * preconditioned matrix, the targets of the last observed batch. */
double
keel__kfac_pi(const keel_kfac *k, int i)
{
    return k != NULL && i >= 0 && i < k->nl ? k->l[i].pi : 0.0;
}

void
keel__kfac_precond(const keel_kfac *k, int i, float *out)
{
    const kf_layer *L = &k->l[i];
    size_t nw = L->vw->count;
    memcpy(out, L->Vw, nw * sizeof(float));
    if (L->Vb != NULL)
        memcpy(out + nw, L->Vb, L->info.g_dim * sizeof(float));
}

uint64_t
keel__kfac_factored(const keel_kfac *k)
{
    return k != NULL ? k->factored : 0;
}

const int32_t *
keel__kfac_targets(const keel_kfac *k)
{
    return k != NULL ? k->targets : NULL;
}

/* ---- the pieces of a step, for the distributed modes (docs/kfac.md) ---- */

int
keel_kfac_num_layers(const keel_kfac *k)
{
    return k != NULL ? k->nl : 0;
}

keel_status
keel_kfac_layer(const keel_kfac *k, int i, const char **scope, size_t *a_dim,
                size_t *g_dim)
{
    if (k == NULL || i < 0 || i >= k->nl)
        return keel__fail(KEEL_EINVAL, "K-FAC: no layer %d (of %d)", i,
                          k != NULL ? k->nl : 0);
    if (scope != NULL)
        *scope = k->l[i].scope;
    if (a_dim != NULL)
        *a_dim = k->l[i].info.a_dim;
    if (g_dim != NULL)
        *g_dim = k->l[i].info.g_dim;
    return KEEL_OK;
}

static keel_status
kfac_apply_update_fp(keel_kfac *k, keel_vars *vs, keel_grads *grads,
                     int64_t global_step)
{
    keel_status st;
    if (k == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC update: NULL argument");
    if (keel__kfac_any_pending(k))
        return keel__fail(KEEL_ESTATE, "K-FAC update at step %lld: "
                          "statistics are pending (use keel_kfac_apply)",
                          (long long)global_step);
    if (!(k->ema_w->data[0] > 0.0f))
        return keel__fail(KEEL_ESTATE, "K-FAC update at step %lld: no "
                          "factors yet (EMA weight 0)",
                          (long long)global_step);
    /* keel_kfac_apply with no statistics step (the factors and their
     * weight stay as they are, untouched: no pass over them) and no
     * inversion due: exactly the preconditioned, momentum and clipped
     * update with the store's inverses (at step 0, whose step number
     * keel_kfac_apply always inverts at, with the inverses of the store's
     * factors) */
    k->update_only = 1;
    st = keel_kfac_apply(k, vs, grads, global_step);
    k->update_only = 0;
    return st;
}

keel_status
keel_kfac_apply_update(keel_kfac *k, keel_vars *vs, keel_grads *grads,
                       int64_t global_step)
{
    return KEEL__FLUSHED(kfac_apply_update_fp(k, vs, grads, global_step));
}
