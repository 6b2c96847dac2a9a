/* kfac_inverse.c - the inverses of K-FAC's factors: factored Tikhonov
 * damping (the trace-norm pi) and LAPACK's Cholesky (spotrf + spotri),
 * every layer's for keel_kfac_apply and one layer's for the distributed
 * modes (keel_kfac_invert_layer). On kfac_factors.c (kfac_int.h). */
#include <config.h>

#include <math.h>
#include <string.h>

#include <cblas.h>

#include "util.h"
#include "kfac_int.h"

/* LAPACK (Fortran ABI, as OpenBLAS ships it): Cholesky factorization and
 * the inverse from it, of a symmetric positive definite matrix. */
extern void spotrf_(const char *uplo, const blasint *n, float *a,
                    const blasint *lda, blasint *info, size_t uplo_len);
extern void spotri_(const char *uplo, const blasint *n, float *a,
                    const blasint *lda, blasint *info, size_t uplo_len);

static double
trace_of(const float *a, size_t n)
{
    double t = 0.0;
    for (size_t i = 0; i < n; i++)
        t += (double)a[i * n + i];
    return t;
}

/* inv = (acc / w + damp I)^-1 by Cholesky; a full symmetric result. */
static keel_status
damped_inverse(const float *acc, size_t n, float w, float damp, float *inv,
               const char *scope, const char *which)
{
    blasint bn = (blasint)n, info = 0;
    for (size_t i = 0; i < n * n; i++)
        inv[i] = acc[i] / w;
    for (size_t i = 0; i < n; i++)
        inv[i * n + i] += damp;
    spotrf_("U", &bn, inv, &bn, &info, 1);
    if (info == 0)
        spotri_("U", &bn, inv, &bn, &info, 1);
    if (info != 0)
        return keel__fail(KEEL_EINVAL, "K-FAC: the damped %s factor of '%s' "
                          "is not positive definite (LAPACK info %d): the "
                          "training diverged, or raise kfac.damping", which,
                          scope, (int)info);
    /* column-major upper = row-major lower: mirror it up */
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            inv[i * n + j] = inv[j * n + i];
    return KEEL_OK;
}

/* pi, damping and both inverses of layer L from the accumulators A, G
 * (weight w) into Ainv_new, Ginv_new. */
static keel_status
invert_layer(const keel_kfac *k, kf_layer *L, const float *A, const float *G,
             float w)
{
    size_t a = L->info.a_dim, g = L->info.g_dim;
    double ta = trace_of(A, a) / (double)w;
    double tg = trace_of(G, g) / (double)w;
    double lam = k->cfg.damping / (double)L->info.locations;
    double pi = ta * tg == 0.0 ? 1.0
                               : sqrt((ta / (double)a) / (tg / (double)g));
    keel_status st;
    if (!isfinite(pi) || !(pi > 0.0))
        return keel__fail(KEEL_EINVAL, "K-FAC: factors of '%s' have traces "
                          "%g and %g (pi %g): the training diverged",
                          L->scope, ta, tg, pi);
    L->pi = pi;
    st = damped_inverse(A, a, w, (float)(pi * sqrt(lam)), L->Ainv_new,
                        L->scope, "A");
    if (st == KEEL_OK)
        st = damped_inverse(G, g, w, (float)(sqrt(lam) / pi),
                            L->Ginv_new, L->scope, "G");
    return st;
}

/* Every layer's inverses into its workspaces, from the new factors: in
 * the sums' buffers after an EMA, else the state's own. */
keel_status
keel__kfac_invert_layers(keel_kfac *k, const apply_plan *p)
{
    keel_status st = KEEL_OK;
    KEEL__PROF_BEGIN();
    for (int i = 0; i < k->nl && st == KEEL_OK; i++) {
        kf_layer *L = &k->l[i];
        st = invert_layer(k, L, p->cov ? L->Asum : L->A->data,
                          p->cov ? L->Gsum : L->G->data, p->w_new);
    }
    KEEL__PROF_END(kfac_invert_ns);
    return st;
}

static keel_status
kfac_invert_layer_fp(keel_kfac *k, int i)
{
    kf_layer *L;
    size_t a, g;
    float w;
    keel_status st;
    if (k == NULL || i < 0 || i >= k->nl)
        return keel__fail(KEEL_EINVAL, "K-FAC invert: no layer %d", i);
    if (keel__kfac_any_pending(k))
        return keel__fail(KEEL_ESTATE, "K-FAC invert: statistics of a step "
                          "are pending (this task also observes)");
    L = &k->l[i];
    a = L->info.a_dim;
    g = L->info.g_dim;
    w = k->ema_w->data[0];
    if (!(w > 0.0f))
        return keel__fail(KEEL_ESTATE, "K-FAC invert: the factors of '%s' "
                          "have no statistics yet (EMA weight %g)", L->scope,
                          (double)w);
    st = invert_layer(k, L, L->A->data, L->G->data, w);
    if (st != KEEL_OK)
        return st;
    {
        keel_tensor *valid = keel_var_slot(k->flag_var, "precond_valid");
        if (valid != NULL)
            keel__kfac_set_all(valid, 0.0f);
    }
    memcpy(L->Ainv->data, L->Ainv_new, a * a * sizeof(float));
    memcpy(L->Ginv->data, L->Ginv_new, g * g * sizeof(float));
    return KEEL_OK;
}

keel_status
keel_kfac_invert_layer(keel_kfac *k, int i)
{
    return KEEL__FLUSHED(kfac_invert_layer_fp(k, i));
}
