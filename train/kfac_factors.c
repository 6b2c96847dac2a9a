/* kfac_factors.c - K-FAC's running Kronecker factors: per layer with
 * parameters the step's sums of A = E[a a^T] and G = E[g g^T], observed
 * from a keel_model's batch (keel_kfac_observe, with model_grads also the
 * factored gradient of the step) or given by a program for its own layers
 * (keel_kfac_observe_layer), the sampled targets, and the sums folded into
 * the zero-debiased EMAs the state keeps or handed out for the distributed
 * modes (keel_kfac_take_statistics). Uses no other K-FAC file (kfac_int.h).
 */
#include <config.h>

#include <string.h>

#include "util.h"
#include "kfac_int.h"

/* Whether global_step updates the factors: every cov_update_every steps,
 * and always while they have no statistics (a fresh store). */
int
keel__kfac_cov_step(const keel_kfac *k, int64_t global_step)
{
    return global_step % k->cfg.cov_update_every == 0 ||
           k->ema_w->data[0] == 0.0f;
}

/* model_grads: the factored gradient of the step keel_model_step just
 * computed on batch ([in, 1] and dy of the dense layers it pays for),
 * copied out of the model's workspaces before the statistics pass reuses
 * them. A second observe of one step drops it: the step's gradient is
 * then not one batch's. */
static void
capture(keel_kfac *k, const keel_batch *batch, int64_t global_step)
{
    const keel_grads *g0 = NULL;
    int again = k->obs_step == global_step;
    k->obs_step = global_step;
    k->cap_step = -1;
    if (!k->cfg.model_grads || again)
        return;
    for (int i = 0; i < k->nl; i++) {
        kf_layer *L = &k->l[i];
        const keel_grads *g;
        const float *in, *dy;
        size_t a = L->info.a_dim;
        if (batch->n > L->fmax)
            continue;
        if (!keel__model_step_io(k->m, batch, i, &g, &in, &dy))
            return;
        for (size_t r = 0; r < batch->n; r++) {
            memcpy(L->X1 + r * a, in + r * (a - 1), (a - 1) * sizeof(float));
            L->X1[r * a + a - 1] = 1.0f;
        }
        memcpy(L->DY, dy, batch->n * L->info.g_dim * sizeof(float));
        g0 = g;
    }
    if (g0 != NULL) {
        k->cap_step = global_step;
        k->cap_n = batch->n;
        k->cap_grads = g0;
    }
}

/* The target stream of global_step: one per step, so a resumed run draws
 * the same targets. */
static void
seed_rng(keel_kfac *k, int64_t global_step)
{
    if (global_step != k->rng_step) {
        uint64_t s = k->cfg.seed ^ 0x6b666163ULL;
        s ^= keel__splitmix64(&(uint64_t){ (uint64_t)global_step });
        keel__rng_seed(&k->rng, s);
        k->rng_step = global_step;
    }
}

static keel_status
kfac_observe_fp(keel_kfac *k, keel_vars *vs, const keel_batch *batch,
                int64_t global_step)
{
    keel_status st;
    if (k == NULL || vs == NULL || batch == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC observe: NULL argument");
    if (vs != k->vs)
        return keel__fail(KEEL_EINVAL, "K-FAC observe: another variable "
                          "store than the optimizer's");
    if (global_step < 0)
        return keel__fail(KEEL_EINVAL, "K-FAC observe: negative global step "
                          "%lld", (long long)global_step);
    if (k->m == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC observe: this optimizer has "
                          "no model (keel_kfac_new_from_layers): give each "
                          "layer's statistics with keel_kfac_observe_layer");
    capture(k, batch, global_step);
    if (!keel__kfac_cov_step(k, global_step))
        return KEEL_OK;
    seed_rng(k, global_step);
    KEEL__PROF_BEGIN();
    st = keel__model_kfac_stats(k->m, batch,
                                k->cfg.estimation == KEEL_KFAC_GRADIENTS
                                    ? &k->rng : NULL,
                                k->targets, k->l[0].pending > 0,
                                k->cfg.model_grads, k->Ap, k->Gp);
    KEEL__PROF_END(kfac_stats_ns);
    if (st != KEEL_OK)
        return keel__wrap(st, "K-FAC observe");
    for (int i = 0; i < k->nl; i++)
        k->l[i].pending += (int64_t)batch->n;
    return KEEL_OK;
}

keel_status
keel_kfac_observe(keel_kfac *k, keel_vars *vs, const keel_batch *batch,
                  int64_t global_step)
{
    return KEEL__FLUSHED(kfac_observe_fp(k, vs, batch, global_step));
}

/* The next observe starts the sums afresh (overwrites them). */
void
keel__kfac_clear_pending(keel_kfac *k)
{
    for (int i = 0; i < k->nl; i++)
        k->l[i].pending = 0;
}

/* Whether any layer has statistics pending. */
int
keel__kfac_any_pending(const keel_kfac *k)
{
    for (int i = 0; i < k->nl; i++)
        if (k->l[i].pending > 0)
            return 1;
    return 0;
}

/* The first layer without statistics this step, -1 if every layer has. */
int
keel__kfac_unobserved_layer(const keel_kfac *k)
{
    for (int i = 0; i < k->nl; i++)
        if (k->l[i].pending <= 0)
            return i;
    return -1;
}

/* A user's layer's statistics: the upper triangles of [in, 1]^T [in, 1]
 * (a convolution's im2col patches) and dy^T dy, added to the pending
 * sums. */
static keel_status
kfac_observe_layer_fp(keel_kfac *k, int layer, const float *inputs,
                      const float *output_grads, size_t n,
                      int64_t global_step)
{
    kf_layer *L;
    int acc, hb;
    if (k == NULL || inputs == NULL || output_grads == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC observe_layer: NULL argument");
    if (k->m != NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC observe_layer: this optimizer "
                          "observes its model's batches (keel_kfac_observe)");
    if (layer < 0 || layer >= k->nl)
        return keel__fail(KEEL_EINVAL, "K-FAC observe_layer: no layer %d "
                          "(%d registered)", layer, k->nl);
    if (global_step < 0)
        return keel__fail(KEEL_EINVAL, "K-FAC observe_layer: negative "
                          "global step %lld", (long long)global_step);
    if (n == 0 || n > (size_t)INT32_MAX)
        return keel__fail(KEEL_EINVAL, "K-FAC observe_layer '%s': %zu "
                          "examples", k->l[layer].scope, n);
    if (!keel__kfac_cov_step(k, global_step))
        return KEEL_OK;
    L = &k->l[layer];
    acc = L->pending > 0;
    hb = L->info.b != NULL;
    KEEL__PROF_BEGIN();
    if (L->info.is_conv) {
        keel__conv_patch_cov(&L->info.cg, inputs, n, L->col, hb, acc,
                             L->Asum);
        keel__cov_add(output_grads, n * L->info.locations, L->info.g_dim,
                      L->info.g_dim, 0, acc, L->Gsum);
    } else {
        size_t din = L->info.a_dim - (size_t)hb;
        keel__cov_add(inputs, n, din, din, hb, acc, L->Asum);
        keel__cov_add(output_grads, n, L->info.g_dim, L->info.g_dim, 0, acc,
                      L->Gsum);
    }
    KEEL__PROF_END(kfac_stats_ns);
    L->pending += (int64_t)n;
    return KEEL_OK;
}

keel_status
keel_kfac_observe_layer(keel_kfac *k, int layer, const float *inputs,
                        const float *output_grads, size_t n,
                        int64_t global_step)
{
    return KEEL__FLUSHED(kfac_observe_layer_fp(k, layer, inputs,
                                               output_grads, n,
                                               global_step));
}

keel_status
keel_kfac_sample_targets(keel_kfac *k, const float *logits, size_t n,
                         size_t classes, const int32_t *labels,
                         int64_t global_step, int32_t *targets)
{
    int gradients;
    if (k == NULL || logits == NULL || targets == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC targets: NULL argument");
    gradients = k->cfg.estimation == KEEL_KFAC_GRADIENTS;
    if (!gradients && labels == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC targets: the empirical Fisher "
                          "takes the labels (labels is NULL)");
    if (classes < 1 || global_step < 0)
        return keel__fail(KEEL_EINVAL, "K-FAC targets: %zu classes at step "
                          "%lld", classes, (long long)global_step);
    if (gradients)
        seed_rng(k, global_step);
    keel__kfac_draw_targets(logits, n, classes, labels,
                            gradients ? &k->rng : NULL, targets);
    return KEEL_OK;
}

/* The factor's EMA, dst = d acc + (1 - d) scale sum, from the upper
 * triangle of sum (the row-major upper triangle keel__cov_add leaves) into
 * both triangles of dst, in 32 x 32 tiles: the full symmetric matrix of
 * mirroring sum first, in one pass over half the elements. acc is
 * symmetric; dst may be acc or sum (every element is read before it is
 * written, and only upper elements are read). */
static void
ema_sym(float *dst, const float *acc, const float *sum, size_t n, float d,
        float scale)
{
    const float e = 1.0f - d;
    for (size_t i0 = 0; i0 < n; i0 += 32)
        for (size_t j0 = i0; j0 < n; j0 += 32) {
            size_t i1 = i0 + 32 < n ? i0 + 32 : n;
            size_t j1 = j0 + 32 < n ? j0 + 32 : n;
            for (size_t i = i0; i < i1; i++)
                for (size_t j = j0 > i ? j0 : i; j < j1; j++) {
                    float v = d * acc[i * n + j] + e * (sum[i * n + j] * scale);
                    dst[i * n + j] = v;
                    dst[j * n + i] = v;
                }
        }
}

/* The step's sums into the factors' EMAs: with an inversion due, into the
 * sums' own buffers (committed after it succeeds); otherwise straight
 * into the state. */
void
keel__kfac_fold_statistics(keel_kfac *k, const apply_plan *p)
{
    KEEL__PROF_BEGIN();
    for (int i = 0; i < k->nl; i++) {
        kf_layer *L = &k->l[i];
        float sc = (float)(1.0 / ((double)L->pending *
                                  (double)L->info.locations));
        ema_sym(p->invert ? L->Asum : L->A->data, L->A->data, L->Asum,
                L->info.a_dim, p->d, sc);
        ema_sym(p->invert ? L->Gsum : L->G->data, L->G->data, L->Gsum,
                L->info.g_dim, p->d, sc);
    }
    KEEL__PROF_END(kfac_stats_ns);
}

static keel_status
kfac_take_statistics_fp(keel_kfac *k, float *const *A, float *const *G)
{
    if (k == NULL || A == NULL || G == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC statistics: NULL argument");
    if (keel__kfac_unobserved_layer(k) >= 0)
        return keel__fail(KEEL_ESTATE, "K-FAC statistics: none observed "
                          "of layer '%s' (call keel_kfac_observe first)",
                          k->l[keel__kfac_unobserved_layer(k)].scope);
    for (int i = 0; i < k->nl; i++) {
        const kf_layer *L = &k->l[i];
        double sc = 1.0 / ((double)L->pending * (double)L->info.locations);
        const float *src[2] = { L->Asum, L->Gsum };
        float *dst[2] = { A[i], G[i] };
        size_t dim[2] = { L->info.a_dim, L->info.g_dim };
        for (int f = 0; f < 2; f++) {
            size_t n = dim[f];
            /* the sums' upper triangle, mirrored, scaled once */
            for (size_t r = 0; r < n; r++)
                for (size_t c = r; c < n; c++) {
                    float v = (float)((double)src[f][r * n + c] * sc);
                    dst[f][r * n + c] = v;
                    dst[f][c * n + r] = v;
                }
        }
    }
    keel__kfac_clear_pending(k);
    return KEEL_OK;
}

keel_status
keel_kfac_take_statistics(keel_kfac *k, float *const *A, float *const *G)
{
    return KEEL__FLUSHED(kfac_take_statistics_fp(k, A, G));
}
